"""The evaluation harness (``evaluate.py``): what a starting point is worth downstream,
measured as ``../shared/DESIGN.md`` section 8 asks.

For every (task, label budget, seed) the harness draws the train rows (:func:`draw`),
fine-tunes every start at every learning rate (:func:`run_finetune`: ``finetune.py`` in a
process of its own, as a user runs it), fits a probe on each start's frozen mean-pooled
states and a bag-of-words floor (:mod:`.probe`, :func:`probe_records`), then reports each
start at the rate with the best mean dev accuracy over seeds (:func:`best_lr_runs`, the
protocol of Devlin et al. 2019, section 4.1), with the margins over random init and the bag
of words (:func:`summarize`, :func:`print_table`).

Records (one dict per run): ``task``, ``budget`` (train rows, None = all), ``seed``,
``start``, ``kind`` ("finetune" | "probe" | "bow"), ``accuracy`` (test, in [0, 1]); a
fine-tuning record also ``lr`` and ``dev_accuracy``.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_bytes, atomic_write_json
from ..backend import get_device, xp_for
from ..finetuning import read_tsv
from ..hf import load_pretrained_weights
from ..auto import model_class
from ..modeling import BertModel
from ..provenance import start_fingerprint
from ..runs import RunError, check_inputs, prepare_run_dir
from ..tokenization import BertTokenizer
from .probe import bag_of_words, fit_probe, mean_pooled_features

BOW = "bag of words"
SETTINGS = "settings.json"


def open_output(path, settings: dict, overwrite: bool) -> Path:
    """The harness's output directory (:func:`minibert.runs.prepare_run_dir`, job
    "evaluate": owned by this process from here on), with its ``settings.json``. Finished
    runs there are reused when the settings match but for ``lr`` (each rate has run
    directories of its own). ``settings["starts"]`` and ``settings["task_dirs"]`` are the
    job's inputs: none may be in the directory (:func:`minibert.runs.check_inputs`).

    Raises:
        RunError: an input is there, another job owns it or has its run there, or a
            harness run with other settings is there and ``overwrite`` is not set (with
            it, the old runs are deleted first).
    """
    path = Path(path)
    check_inputs(path, {"START": [s.removeprefix("random:") for s in settings.get("starts", ())],
                        "--task-dir": list(settings.get("task_dirs", {}).values())})
    run = prepare_run_dir(path, "evaluate")
    saved_file = path / SETTINGS
    same = True
    if saved_file.is_file():
        try:
            saved = json.loads(saved_file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            saved = None
        same = isinstance(saved, dict) and {**saved, "lr": None} == {**settings, "lr": None}
    if not same and not overwrite:
        raise RunError(f"--output-dir {path} holds a harness run with other settings "
                       f"({saved_file}); pass --overwrite or another --output-dir")
    if not same:
        shutil.rmtree(path / "runs", ignore_errors=True)
    atomic_write_json(run.path / SETTINGS, settings)
    return run.path


def is_chinese_vocab(vocab_file: Path) -> bool:
    """True when most of the vocab's tokens are single CJK characters (bert-base-chinese)."""
    tokens = Path(vocab_file).read_text(encoding="utf-8").split("\n")
    cjk = sum(1 for t in tokens if len(t) == 1 and "\u4e00" <= t <= "\u9fff")
    return cjk > 0.5 * len(tokens)


def draw(n_rows: int, size: int | None, seed: int, labels: list[str]) -> np.ndarray:
    """The train rows of one run: all (in order) or ``size`` drawn without replacement,
    re-drawn (up to 100 times) until at least two classes are present.

    Returns:
        int array of row indices, sorted. Raises: ValueError when no draw holds two classes.
    """
    if size is None or size >= n_rows:
        return np.arange(n_rows)
    rng = np.random.default_rng([seed, size])
    for _ in range(100):
        idx = np.sort(rng.choice(n_rows, size=size, replace=False))
        if len({labels[i] for i in idx}) > 1:
            return idx
    raise ValueError(f"cannot draw {size} train rows holding two classes")


def write_subset(path: Path, examples, idx: np.ndarray) -> Path:
    """The drawn rows as a train.tsv that finetune.py reads (atomically)."""
    pair = examples[0].text_b is not None
    header = "label\tsentence_a\tsentence_b" if pair else "label\tsentence"
    rows = [f"{e.label}\t{e.text_a}" + (f"\t{e.text_b}" if pair else "")
            for e in (examples[i] for i in idx)]
    atomic_write_bytes(path, ("\n".join([header, *rows]) + "\n").encode("utf-8"))
    return path


def start_key(start: str, pre) -> str:
    """What the fine-tuning runs of a start are reused by: the content of the start
    (:func:`minibert.provenance.start_fingerprint`), not its path, so a start replaced at
    the same path runs again; ``random:`` starts are kept apart from the trained ones."""
    return ("random:" if start.startswith("random:") else "") + start_fingerprint(pre)


def name_of(key: str, lr: float) -> str:
    """The run directory name of a start (its :func:`start_key`) fine-tuned at a learning
    rate."""
    return f"{hashlib.sha1(key.encode()).hexdigest()[:10]}-lr{lr:g}"


def run_finetune(script: Path, argv: list[str], out: Path) -> tuple[float, float]:
    """(dev, test) accuracy of one ``finetune.py`` run at its best dev epoch: the script
    run with ``argv`` and ``--output-dir out`` in a process of its own, its output in
    ``out.log`` beside ``out``; a run whose summary.json exists is reused.

    Raises:
        RuntimeError: the run failed (the message names its command and log).
    """
    summary = out / "summary.json"
    if not summary.is_file():
        out.mkdir(parents=True, exist_ok=True)
        log = out.parent / f"{out.name}.log"
        command = [sys.executable, str(script), *argv, "--output-dir", str(out), "--overwrite"]
        with open(log, "wb") as f:
            code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT).returncode
        if code != 0:
            raise RuntimeError(f"finetune.py {' '.join(argv)} failed (exit {code}); its log: "
                               f"{log}")
    result = json.loads(summary.read_text())
    return float(result["dev"]["accuracy"]), float(result["test"]["accuracy"])


def encoder(pre, random_init: bool, device: str):
    """The frozen encoder of a start (fresh weights for ``random:``) and its tokenizer.

    Raises:
        HFFormatError: weights that do not fit the start's config.
    """
    model = model_class(pre.config, BertModel)(pre.config, add_pooling_layer=False, seed=0)
    if not random_init:
        load_pretrained_weights(model, pre.state, pre.source)
    model.to(device)
    return model, BertTokenizer(pre.vocab_file, **pre.tokenizer_options)


def probe_records(features: dict, y: dict, idx: np.ndarray, texts: dict, n_labels: int,
                  **where) -> list[dict]:
    """One seed's probe records: a probe per start on its frozen features (``features``:
    start -> split -> (N, C) host array) and the bag-of-words floor, each fitted on the
    drawn train rows ``idx``, its L2 weight picked on dev, scored on test. ``y``: split ->
    (N,) class ids; ``texts``: split -> list of texts (a pair joined by a space); ``where``:
    task, budget and seed, copied into every record."""
    records = []
    for start, f in features.items():
        probe, _ = fit_probe(f["train"][idx], y["train"][idx], f["dev"], y["dev"], n_labels)
        records.append({**where, "start": start, "kind": "probe",
                        "accuracy": float((probe.predict(f["test"]) == y["test"]).mean())})
    X, vocab = bag_of_words([texts["train"][i] for i in idx])
    Xd, _ = bag_of_words(texts["dev"], vocab)
    Xt, _ = bag_of_words(texts["test"], vocab)
    probe, _ = fit_probe(X, y["train"][idx], Xd, y["dev"], n_labels,
                         l2_grid=(1e-3, 1e-2, 1e-1, 1.0))
    records.append({**where, "start": BOW, "kind": "bow",
                    "accuracy": float((probe.predict(Xt) == y["test"]).mean())})
    return records


def finetune_argv(args, start: str, seed: int, lr: float, train: Path, task: Path) -> list:
    """finetune.py's options for one run of ``start`` (``random:`` = fresh weights)."""
    return ["--init", start.removeprefix("random:"), "--train", str(train),
            "--dev", str(task / "dev.tsv"), "--test", str(task / "test.tsv"),
            "--seed", str(seed), "--epochs", str(args.epochs), "--lr", str(lr),
            "--batch-size", str(args.batch_size), "--max-seq-length", str(args.max_seq_length),
            "--pooling", args.pooling, "--group-by-length", "--no-progress",
            *(["--random-init"] if start.startswith("random:") else []),
            *(["--device", args.device] if args.device else [])]


def evaluate_task(args, task: str, d: Path, starts: dict, out: Path, script: Path):
    """Every run of one task (its train.tsv, dev.tsv and test.tsv in ``d``): per budget and
    seed, each start (name -> :class:`~minibert.runs.Pretrained`) fine-tuned by ``script``
    (finetune.py) at each rate, the probes and the bag of words; run directories under
    ``out/runs``, named by the start's content (:func:`start_key`), so a finished run is
    reused only for the same start. ``args``: evaluate.py's options.

    Returns:
        (the records, as the module docstring says; the rows of the train split).
    Raises:
        DatasetError: a split that cannot be read. RuntimeError: a failed fine-tuning run.
    """
    splits = {s: read_tsv(d / f"{s}.tsv") for s in ("train", "dev", "test")}
    labels = sorted({e.label for e in splits["train"]})
    y = {s: np.array([labels.index(e.label) for e in ex]) for s, ex in splits.items()}
    texts = {s: [e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in ex]
             for s, ex in splits.items()}
    keys = {s: start_key(s, pre) for s, pre in starts.items()}
    features = {}
    for s, pre in starts.items() if args.probe else ():
        print(f"{task}: encoding with {s} (frozen, mean-pooled)", flush=True)
        model, tokenizer = encoder(pre, s.startswith("random:"), get_device())
        features[s] = {k: mean_pooled_features(model, tokenizer, texts[k], args.max_seq_length,
                                               xp=xp_for()) for k in texts}
    flat = {k: [t if isinstance(t, str) else " ".join(t) for t in v] for k, v in texts.items()}
    records = []
    for b in args.budgets:
        for seed in range(args.seeds):
            idx = draw(len(splits["train"]), b, seed, [e.label for e in splits["train"]])
            tag = f"{task}/{'all' if b is None else b}/seed{seed}"
            subset = write_subset(out / "runs" / tag / "train.tsv", splits["train"], idx)
            where = {"task": task, "budget": b, "seed": seed}
            for s in starts:
                for lr in args.lr if args.finetune else ():
                    dev_acc, acc = run_finetune(
                        script, finetune_argv(args, s, seed, lr, subset, d),
                        out / "runs" / tag / name_of(keys[s], lr))
                    records.append({**where, "start": s, "kind": "finetune", "lr": lr,
                                    "dev_accuracy": dev_acc, "accuracy": acc})
            records += probe_records(features, y, idx, flat, len(labels), **where)
            print(f"{tag}: " + ", ".join(f"{r['start'][-30:]} {r['kind']}"
                                         + (f" lr {r['lr']:g}" if "lr" in r else "")
                                         + f" {r['accuracy']:.3f}" for r in records
                                         if r["budget"] == b and r["seed"] == seed), flush=True)
    return records, len(splits["train"])


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def best_lr_runs(records: list[dict]) -> list[dict]:
    """The records without the fine-tuning runs of every learning rate but the one with the
    best mean dev accuracy over seeds, per (task, budget, start); a tie goes to the rate
    given first. Probe and bag-of-words records pass through."""
    dev: dict[tuple, dict[float, list[float]]] = {}
    for r in records:
        if r["kind"] == "finetune":
            key = (r["task"], r["budget"], r["start"])
            dev.setdefault(key, {}).setdefault(r["lr"], []).append(r["dev_accuracy"])
    best = {key: max(by_lr, key=lambda lr: statistics.fmean(by_lr[lr]))
            for key, by_lr in dev.items()}
    return [r for r in records if r["kind"] != "finetune"
            or r["lr"] == best[(r["task"], r["budget"], r["start"])]]


def summarize(records: list[dict]) -> list[dict]:
    """Mean and std of test accuracy per (task, budget, start, kind), with margins over
    ``random:START`` and the bag of words; the fine-tuning rows at each start's best
    learning rate (:func:`best_lr_runs`)."""
    groups: dict[tuple, list[dict]] = {}
    for r in best_lr_runs(records):
        groups.setdefault((r["task"], r["budget"], r["start"], r["kind"]), []).append(r)
    accs = {key: [r["accuracy"] for r in rs] for key, rs in groups.items()}
    rows = []
    for (task, b, start, kind), rs in groups.items():
        m, s = mean_std(accs[task, b, start, kind])
        row = {"task": task, "budget": b, "start": start, "kind": kind, "mean": m, "std": s,
               "seeds": len(rs)}
        if "lr" in rs[0]:  # one rate per fine-tuning group, after best_lr_runs
            row["lr"] = rs[0]["lr"]
        rand = accs.get((task, b, "random:" + start, kind))
        if rand:
            row["margin_over_random"] = m - statistics.fmean(rand)
            row["random_std"] = mean_std(rand)[1]
        bow = accs.get((task, b, BOW, "bow"))
        if bow and kind != "bow":
            row["margin_over_bow"] = m - statistics.fmean(bow)
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    """The summary rows as a table on stdout (accuracies in percent)."""
    print(f"{'task':<16}{'labels':>7}  {'start':<44}{'kind':<10}{'lr':>8}{'test acc':>16}"
          f"{'vs random':>11}{'vs BoW':>9}")
    for r in sorted(rows, key=lambda r: (r["task"], r["budget"] or 10 ** 9, r["kind"] == "bow",
                                         r["start"], r["kind"])):
        b = "all" if r["budget"] is None else r["budget"]
        vr = f"{100 * r['margin_over_random']:+.1f}" if "margin_over_random" in r else ""
        vb = f"{100 * r['margin_over_bow']:+.1f}" if "margin_over_bow" in r else ""
        lr = f"{r['lr']:g}" if "lr" in r else ""
        print(f"{r['task']:<16}{b:>7}  {r['start'][-44:]:<44}{r['kind']:<10}{lr:>8}"
              f"{100 * r['mean']:>9.1f} ± {100 * r['std']:<4.1f}{vr:>11}{vb:>9}")
