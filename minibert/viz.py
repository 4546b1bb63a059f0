"""Pictures of a model and a run (matplotlib, Agg backend: no display needed).

* :func:`plot_attention_grid` -- one heat map per (layer, head) of the attention
  probabilities of one sequence, tokens labelled on both axes (rows = query position,
  columns = key position, as in Clark et al. 2019, "What Does BERT Look At?").
* :func:`plot_cls_attention` -- per layer, a bar chart of what [CLS] attends to, averaged
  over heads (``attn[:, 0, :]`` of each layer).
* :func:`plot_attention` -- both of the above for a text run through a model.
* :func:`plot_explanation` -- one explanation (:mod:`minibert.attribution`): the word
  pieces coloured by attribution, the last layer's attention (mean of heads) and the
  rollout through it, the PNG twin of :mod:`minibert.explain_page`.
* :func:`plot_training_curves` -- training loss per step and the dev metrics per evaluation.
* :func:`plot_grad_flow` -- per-layer gradient norms and update/weight ratios per step
  (the records of :mod:`minibert.gradflow`).
* :func:`plot_accuracy_vs_labels` -- the evaluation harness's test accuracy against the
  number of train labels.
* :func:`plot_minimal_pairs` -- minimal-pair accuracy per field, several systems.
* :func:`plot_pretraining_runs` -- held-out MLM loss and minimal-pair accuracy of several
  pretraining runs against training minutes.

Every picture of the project is drawn here and written atomically (temporary file, then
rename).
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .atomic import atomic_write


def _pyplot():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: str | os.PathLike, dpi: int) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    _pyplot().close(fig)
    data = buf.getvalue()
    return atomic_write(path, lambda f: f.write(data))


def plot_attention_grid(attentions: Sequence[np.ndarray], tokens: Sequence[str],
                        path: str | os.PathLike, title: str | None = None,
                        cell_inches: float | None = None, dpi: int = 100) -> Path:
    """Write a PNG grid of attention maps, layers down, heads across.

    Args:
        attentions: one array per layer, each (NH, T, T) or (1, NH, T, T) float: the
            softmax probabilities of one sequence (``output_attentions=True``), rows =
            query token, columns = key token; rows sum to 1.
        tokens: the T token strings (axis labels).
        path: the PNG to write (parent directories are created).
        title: figure title.
        cell_inches: size of one map (default from T, between 1.6 and 4 inches).
    Returns:
        the path written.
    Raises:
        ValueError: no layers, layers of different shapes, or T != len(tokens).
    """
    maps = [np.asarray(a, dtype=np.float64) for a in attentions]
    if not maps:
        raise ValueError("plot_attention_grid: no attention maps")
    maps = [a[0] if a.ndim == 4 else a for a in maps]
    L, (NH, T, T2) = len(maps), maps[0].shape
    if any(a.shape != (NH, T, T2) for a in maps) or T != T2:
        raise ValueError(f"plot_attention_grid: every layer must be (NH, T, T), got "
                         f"{[a.shape for a in maps]}")
    if T != len(tokens):
        raise ValueError(f"plot_attention_grid: {len(tokens)} tokens for maps of length {T}")
    plt = _pyplot()
    cell = cell_inches or float(np.clip(0.16 * T, 1.6, 4.0))
    fig, axes = plt.subplots(L, NH, figsize=(cell * NH + 1, cell * L + 1), squeeze=False)
    fontsize = float(np.clip(70.0 / max(T, 1), 3, 8))
    for l in range(L):
        for h in range(NH):
            ax = axes[l][h]
            ax.imshow(maps[l][h], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
            # token labels on the outer axes only: queries down the left column,
            # keys along the bottom row (inner labels would overlap the next map)
            ax.set_xticks(range(T))
            ax.set_yticks(range(T))
            ax.set_xticklabels(tokens if l == L - 1 else [], rotation=90, fontsize=fontsize)
            ax.set_yticklabels(tokens if h == 0 else [], fontsize=fontsize)
            ax.tick_params(length=0)
            if l == 0:
                ax.set_title(f"head {h}", fontsize=9)
            if h == 0:
                ax.set_ylabel(f"layer {l}\nquery", fontsize=9)
            if l == L - 1:
                ax.set_xlabel("key", fontsize=9)
    if title:
        fig.suptitle(title)
    return _save(fig, path, dpi)


def cls_attention(attentions: Sequence[np.ndarray]) -> np.ndarray:
    """(L, T) float64: row 0 ([CLS] as the query) of each layer's attention, averaged over
    the heads; each row sums to 1.

    Args:
        attentions: one (NH, T, T) or (1, NH, T, T) array per layer (one sequence).
    Raises:
        ValueError: no layers, or layers of different shapes.
    """
    maps = [np.asarray(a, dtype=np.float64) for a in attentions]
    if not maps:
        raise ValueError("cls_attention: no attention maps")
    maps = [a[0] if a.ndim == 4 else a for a in maps]
    if any(a.ndim != 3 or a.shape != maps[0].shape or a.shape[1] != a.shape[2] for a in maps):
        raise ValueError(f"cls_attention: every layer must be (NH, T, T), got "
                         f"{[a.shape for a in maps]}")
    return np.stack([a[:, 0, :].mean(axis=0) for a in maps])      # (L, T)


def plot_cls_attention(attentions: Sequence[np.ndarray], tokens: Sequence[str],
                       path: str | os.PathLike, title: str | None = None,
                       dpi: int = 100) -> Path:
    """Write a PNG with one bar chart per layer (layer 0 on top): the attention of the
    [CLS] token (query position 0) over the T key tokens, averaged over the heads
    (:func:`cls_attention`), the view of what the pooled / classification input reads.

    Args:
        attentions: one (NH, T, T) or (1, NH, T, T) array per layer, one sequence.
        tokens: the T token strings (x-axis labels).
        path: the PNG to write.
    Returns:
        the path written.
    Raises:
        ValueError: as :func:`cls_attention`, or T != len(tokens).
    """
    cls = cls_attention(attentions)
    L, T = cls.shape
    if T != len(tokens):
        raise ValueError(f"plot_cls_attention: {len(tokens)} tokens for maps of length {T}")
    plt = _pyplot()
    width = float(np.clip(0.3 * T + 1.5, 4.0, 24.0))
    fig, axes = plt.subplots(L, 1, figsize=(width, 1.3 * L + 1), sharex=True, squeeze=False)
    fontsize = float(np.clip(300.0 / max(T, 1), 4, 9))
    top = max(float(cls.max()) * 1.1, 1e-6)
    for l in range(L):
        ax = axes[l][0]
        ax.bar(range(T), cls[l], color="tab:blue")
        ax.set_ylim(0, top)
        ax.set_ylabel(f"layer {l}", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[-1][0].set_xticks(range(T))
    axes[-1][0].set_xticklabels(tokens, rotation=90, fontsize=fontsize)
    fig.suptitle(title or "what [CLS] attends to (mean over heads)", fontsize=10)
    return _save(fig, path, dpi)


def plot_training_curves(train: Sequence[Mapping], evals: Sequence[Mapping],
                         path: str | os.PathLike, metrics: Sequence[str] = ("accuracy",
                                                                            "macro_f1", "mcc"),
                         title: str | None = None, dpi: int = 100) -> Path:
    """Write a PNG with two panels: training loss against step, and dev metrics against
    step.

    Args:
        train: records with ``step`` (optimizer steps) and ``loss`` (nats).
        evals: records with ``step`` and the ``metrics`` keys (and optionally ``loss``).
        path: the PNG to write.
    Returns:
        the path written.
    """
    plt = _pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        a1.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss",
                lw=1)
    if evals and all("loss" in r for r in evals):
        a1.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o-", label="dev loss")
    a1.set_xlabel("step")
    a1.set_ylabel("cross-entropy (nats)")
    a1.legend()
    a1.grid(alpha=0.3)
    for m in metrics:
        pts = [(r["step"], r[m]) for r in evals if m in r]
        if pts:
            a2.plot(*zip(*pts), "o-", label=f"dev {m}")
    a2.set_xlabel("step")
    a2.set_ylabel("dev metric")
    a2.legend()
    a2.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return _save(fig, path, dpi)


def _layer_order(name: str):
    head = ("embeddings", "encoder.layer", "encoder.ln", "pooler", "cls.predictions",
            "cls.seq_relationship")
    rank = next((i for i, h in enumerate(head) if name.startswith(h)), len(head))
    n = int(name.split(".")[2]) if name.startswith("encoder.layer.") else 0
    return rank, n, name


def plot_grad_flow(records: Sequence[Mapping], png_path: str | os.PathLike,
                   title: str | None = None, dpi: int = 100) -> Path:
    """Plot per-layer gradient norms and update/weight ratios against the step (PNG).

    Two panels sharing the step axis, log-scaled y, one line per layer coloured from the
    embeddings (dark) to the heads (light), a dotted reference line at ratio 1e-3 (cs231n).

    Args:
        records: ``grad_flow`` records in step order, each with ``step`` and ``grad_norm``
            (layer -> norm) and optionally ``update_ratio`` (layer -> ratio), as
            :func:`minibert.gradflow.read_grad_flow` returns them.
        png_path: output file; parent directories are created.
        title: figure title.
        dpi: resolution (the figure is 9 x 6.5 inches).
    Returns:
        The PNG path.
    Raises:
        ImportError without matplotlib.
    """
    plt = _pyplot()
    steps = [r["step"] for r in records]
    panels = [("grad_norm", "gradient L2 norm")]
    if any("update_ratio" in r for r in records):
        panels.append(("update_ratio", "update / weight ratio  ||dθ|| / ||θ||"))
    layers = sorted({k for r in records for k in r["grad_norm"]}, key=_layer_order)
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 6.5), sharex=True, squeeze=False)
    for ax, (key, label) in zip(axes[:, 0], panels):
        for i, layer in enumerate(layers):
            ys = [r.get(key, {}).get(layer, float("nan")) for r in records]
            ax.plot(steps, ys, label=layer, color=cmap(i / max(1, len(layers) - 1)),
                    marker="." if len(steps) < 40 else None)
        ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        if key == "update_ratio":
            ax.axhline(1e-3, color="grey", linestyle=":", label="1e-3 (rule of thumb)")
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    if len(panels) > 1:
        axes[1, 0].legend(handles=axes[1, 0].get_lines()[-1:], loc="lower left", fontsize=8)
    if title:
        fig.suptitle(title)
    Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, png_path, dpi)


def plot_attention(model, tokenizer, texts: Sequence[str], max_len: int, xp,
                   out: str | os.PathLike) -> list[Path]:
    """Run ``texts`` (one text or a pair) through ``model`` (eval mode, attention
    probabilities kept) and write OUT/attention.png (:func:`plot_attention_grid`, layers x
    heads) and OUT/attention_cls.png (:func:`plot_cls_attention`).

    Args:
        model: a minibert BERT model whose forward takes ``output_attentions=True`` and
            returns ``attentions``, (1, NH, T, T) per layer.
        tokenizer: its BertTokenizer; the pair is truncated to ``max_len`` tokens.
        xp: the array module of the model's device.
    Returns:
        the two paths written.
    """
    enc = tokenizer(texts[0], texts[1] if len(texts) > 1 else None, truncation=True,
                    max_length=max_len, return_tensors="np")
    ids, tt = enc["input_ids"][None], enc["token_type_ids"][None]       # (1, T)
    model.eval()
    out_ = model(xp.asarray(ids), xp.asarray(tt), xp.asarray(np.ones_like(ids)),
                 output_attentions=True)
    from .backend import to_numpy
    maps = [to_numpy(a) for a in out_.attentions]
    tokens = tokenizer.convert_ids_to_tokens([int(i) for i in ids[0]])
    title = " | ".join(texts)
    out = Path(out)
    return [plot_attention_grid(maps, tokens, out / "attention.png", title=title),
            plot_cls_attention(maps, tokens, out / "attention_cls.png",
                               title=f"what [CLS] attends to, mean over heads: {title}")]


def plot_accuracy_vs_labels(rows: Sequence[Mapping], sizes: Mapping[str, int],
                            path: str | os.PathLike, dpi: int = 110) -> Path:
    """The test score against the number of train labels (rows, sentences or questions):
    one panel per task, its y axis the task's metric, one line per start and kind
    (fine-tuning solid, probe dashed, bag of words and the task's floor dotted), error bars
    one standard deviation over seeds.

    Args:
        rows: summary rows of the evaluation harness, each with ``task``, ``budget``
            (labels, None = all), ``start``, ``kind`` ("finetune" | "probe" | "bow" |
            "floor"), ``mean`` and ``std`` (a score in [0, 1]) and ``metric`` (its name;
            "accuracy" when absent).
        sizes: task -> rows of its full train split (the x of budget None).
        path: the PNG to write.
    Returns:
        the path written.
    """
    plt = _pyplot()
    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    style = {"finetune": "-", "probe": "--", "bow": ":", "floor": ":"}
    for ax, task in zip(axes[0], tasks):
        lines: dict[tuple, list] = {}
        for r in rows:
            if r["task"] == task:
                n = r["budget"] if r["budget"] is not None else sizes[task]
                lines.setdefault((r["start"], r["kind"]), []).append((n, r["mean"], r["std"]))
        for (start, kind), pts in sorted(lines.items()):
            pts.sort()
            x, y, e = zip(*pts)
            ax.errorbar(x, y, yerr=e, linestyle=style[kind], marker="o", capsize=3,
                        label=f"{start[-30:]} ({kind})" if kind not in ("bow", "floor")
                        else start)
        metric = next(r["metric"] for r in rows if r["task"] == task)
        ax.set_xscale("log")
        ax.set_title(task)
        ax.set_xlabel("train labels")
        ax.set_ylabel(f"test {metric.replace('_', ' ')}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_minimal_pairs(results: Mapping[str, Mapping], path: str | os.PathLike,
                       dpi: int = 110) -> Path:
    """Minimal-pair accuracy per field: grouped bars, one colour per system (models and
    floors), the macro mean as the last group, a dashed line at chance (50%).

    Args:
        results: system name -> :func:`~minibert.evaluation.minimal_pairs.accuracy`'s
            dict (``fields``: field -> percent; ``macro``: percent).
        path: the PNG to write.
    Returns:
        the path written.
    """
    plt = _pyplot()
    names = list(results)
    groups = sorted({f for r in results.values() for f in r["fields"]}) + ["macro"]
    width = 0.8 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(groups) * max(len(names), 1) / 2), 4))
    x = np.arange(len(groups))
    for i, n in enumerate(names):
        r = results[n]
        y = [r["fields"].get(g, np.nan) if g != "macro" else r["macro"] for g in groups]
        ax.bar(x + (i - (len(names) - 1) / 2) * width, y, width, label=n[-40:])
    ax.axhline(50, linestyle="--", color="grey", linewidth=1)
    ax.set_xticks(x)
    ax.set_xticklabels(groups, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_pretraining_runs(runs: Mapping[str, Sequence[Mapping]], path: str | os.PathLike,
                          floors: Mapping[str, float] | None = None, dpi: int = 110,
                          probe: str = "pairs") -> Path:
    """Pretraining runs side by side against training minutes: held-out MLM loss (left)
    and minimal-pair accuracy (right), one line per run, the count floors dashed.

    Args:
        runs: run label -> its evaluation records in step order, each with ``minutes``
            (float, training time at that evaluation), ``mlm_loss`` (nats) and, where
            scored, ``PROBE_acc`` (macro %, :mod:`minibert.evaluation.minimal_pairs`).
        floors: floor name (``"word trigram"``) -> its macro % on the same pairs.
        probe: ``"pairs"`` (our pairs) or ``"blimp"`` (BLiMP dev), the panel's pairs.
        path: the PNG to write.
    Returns:
        the path written.
    """
    plt = _pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, recs in runs.items():
        a1.plot([r["minutes"] for r in recs], [r["mlm_loss"] for r in recs], "o-", ms=3,
                label=label)
        pts = [(r["minutes"], r[f"{probe}_acc"]) for r in recs
               if r.get(f"{probe}_acc") is not None]
        if pts:
            a2.plot(*zip(*pts), "o-", ms=3, label=label)
    for (name, value), style in zip((floors or {}).items(), ("--", "-.")):
        a2.axhline(value, linestyle=style, color="grey", linewidth=1, label=name)
    a2.axhline(50, linestyle=":", color="grey", linewidth=1)
    a1.set_ylabel("held-out MLM loss (nats)")
    a2.set_ylabel(("BLiMP dev" if probe == "blimp" else "minimal pairs")
                  + ", macro accuracy (%)")
    for a in (a1, a2):
        a.set_xlabel("training minutes")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_explanation(e, path: str | os.PathLike, dpi: int = 100) -> Path:
    """Write a PNG of the :class:`~minibert.attribution.Explanation` ``e``: on top the T
    word pieces in boxes coloured by attribution (green for the target, red against,
    strength |score| / max |score|), below the last layer's attention averaged over the
    heads and the attention rollout through the last layer (Abnar & Zuidema 2020),
    (T, T) each, rows = query token. Returns the path written."""
    plt = _pyplot()
    T = len(e.tokens)
    scores = np.asarray(e.scores, dtype=np.float64)
    scale = float(np.abs(scores).max()) or 1.0
    width = float(np.clip(0.45 * T + 2, 7.0, 24.0))
    fig = plt.figure(figsize=(width, width / 2 + 1.6))
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 5])
    top = fig.add_subplot(grid[0, :])
    top.axis("off")
    x, renderer = 0.0, fig.canvas.get_renderer()
    for tok, s in zip(e.tokens, scores):
        rgb = (0.16, 0.63, 0.24) if s >= 0 else (0.82, 0.2, 0.2)
        text = top.text(x, 0.5, tok, fontsize=10, family="monospace", va="center",
                        bbox=dict(facecolor=(*rgb, min(1.0, abs(s) / scale)), edgecolor="#ccc"))
        box = text.get_window_extent(renderer).transformed(top.transAxes.inverted())
        x = box.x1 + 0.022                       # the next box clear of this one (its pad)
    top.set_title(f"{e.method}: why {e.target_label} (p = {e.probability:.3f}); "
                  f"predicted {e.predicted} (p = {e.predicted_probability:.3f})", fontsize=10)
    fontsize = float(np.clip(200.0 / max(T, 1), 4, 9))
    for col, (m, name) in enumerate(((e.attentions[-1].mean(axis=0), "last layer, mean of heads"),
                                     (e.rollout[-1], "rollout through the last layer"))):
        ax = fig.add_subplot(grid[1, col])
        ax.imshow(m, cmap="Blues", vmin=0.0, vmax=max(float(m.max()), 1e-6))
        ax.set_xticks(range(T))
        ax.set_xticklabels(e.tokens, rotation=90, fontsize=fontsize)
        ax.set_yticks(range(T))
        ax.set_yticklabels(e.tokens, fontsize=fontsize)
        ax.set_title(name, fontsize=9)
    return _save(fig, path, dpi)
