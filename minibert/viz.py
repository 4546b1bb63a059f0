"""Pictures of a model and a run (matplotlib, Agg backend: no display needed).

* :func:`plot_attention_grid` -- one heat map per (layer, head) of the attention
  probabilities of one sequence, tokens labelled on both axes (rows = query position,
  columns = key position, as in Clark et al. 2019, "What Does BERT Look At?").
* :func:`plot_cls_attention` -- per layer, a bar chart of what [CLS] attends to, averaged
  over heads (``attn[:, 0, :]`` of each layer).
* :func:`plot_training_curves` -- training loss per step and the dev metrics per evaluation.

Files are written atomically (temporary file, then rename).
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
