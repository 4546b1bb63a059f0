#!/usr/bin/env python
"""Measure what a starting point is worth downstream: fine-tune it on the shipped
classification tasks at several label budgets and seeds, probe its frozen mean-pooled
states, and compare with the same architecture from random weights and a bag of words.

    python evaluate.py runs/pretrain random:runs/pretrain          # ours vs random init
    python evaluate.py runs/pretrain $MINILM --budgets 500 all --seeds 3
    python evaluate.py runs/zh --tasks product_reviews

Starts: a train_mlm.py run directory (or checkpoint), a finetune.py output, a Hugging Face
BERT directory, or ``random:START`` (START's architecture and vocab, fresh weights). Tasks:
movie_reviews, sms_spam, trec_questions (English) and product_reviews (Chinese), from
data/classify/ (default: the English ones, or the Chinese one for a start whose vocab is
mostly CJK characters). A budget N trains on N rows drawn at random from the train split
(a fresh draw per seed; ``all`` = the whole split); dev picks the best epoch (fine-tuning)
or the L2 weight (probes); the reported number is test accuracy. Given several ``--lr``,
each start fine-tunes at every one of them and reports, per task and budget, the rate
with the best mean dev accuracy over seeds (the protocol of Devlin et al. 2019, §4.1), so
that a pretrained start and a random one are each compared at their own best rate.

For every (task, budget, seed): ``finetune.py`` for each start (in this process, its log in
OUTPUT_DIR/runs/.../finetune.log), a softmax-regression probe on each start's frozen,
mean-pooled final states (minibert.probe; random starts included), and a bag-of-words
softmax regression. Prints mean ± std over seeds per task and budget, the margin over
random init (for a start S when ``random:S`` is among the starts) and over the bag of words;
writes OUTPUT_DIR/results.json (every run and the summary) and OUTPUT_DIR/accuracy_vs_labels.png.
A finished fine-tuning run (its summary.json present) is reused when the harness is run
again with the same settings in the same OUTPUT_DIR; ``--lr`` may differ between such runs
(a rate added later fine-tunes only at that rate; the report covers the rates named).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from minibert import backend  # noqa: E402
from minibert.atomic import atomic_write_bytes, atomic_write_json  # noqa: E402
from minibert.cli import fail as _fail, float_in, int_at_least, positive_int  # noqa: E402
from minibert.finetuning import DatasetError, read_tsv  # noqa: E402
from minibert.hf import HFFormatError, load_pretrained_weights  # noqa: E402
from minibert.modeling import BertModel  # noqa: E402
from minibert.probe import bag_of_words, fit_probe, mean_pooled_features  # noqa: E402
from minibert.runs import RunError, load_start  # noqa: E402
from minibert.tokenization import BertTokenizer  # noqa: E402

DATA = ROOT / "data" / "classify"
TASKS = {"movie_reviews": DATA / "en" / "movie_reviews", "sms_spam": DATA / "en" / "sms_spam",
         "trec_questions": DATA / "en" / "trec_questions",
         "product_reviews": DATA / "zh" / "product_reviews"}
ENGLISH = ("movie_reviews", "sms_spam", "trec_questions")
CHINESE = ("product_reviews",)
BOW = "bag of words"


def fail(message: str):
    _fail("evaluate.py", message)


def budget(text: str) -> int | None:
    """argparse type: a label budget, an integer >= 2 or ``all`` (None)."""
    if text == "all":
        return None
    return int_at_least(2)(text)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("starts", nargs="+", metavar="START",
                   help="run dir, checkpoint, finetune.py output, HF BERT dir, or random:START")
    p.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                   help=f"of {', '.join(TASKS)} and any --task-dir; default: the English "
                        "tasks, or product_reviews for a Chinese vocab")
    p.add_argument("--task-dir", action="append", default=[], metavar="NAME=DIR",
                   help="another task (or another directory for a shipped one): DIR holds "
                        "train.tsv, dev.tsv and test.tsv as finetune.py reads them")
    p.add_argument("--budgets", nargs="+", type=budget, default=[500, 2000, None],
                   metavar="N|all", help="train rows per run")
    p.add_argument("--seeds", type=positive_int, default=3, help="seeds 0 .. N-1")
    p.add_argument("--epochs", type=positive_int, default=3)
    p.add_argument("--lr", nargs="+", type=float_in(0.0, low_open=True), default=[5e-5],
                   metavar="LR", help="fine-tuning learning rates; with several, each start "
                   "reports the one with the best mean dev accuracy per task and budget")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--max-seq-length", type=int_at_least(3), default=128)
    p.add_argument("--pooling", choices=["cls", "mean"], default="cls",
                   help="what the fine-tuned classifier reads: the pooled [CLS] vector or the "
                        "mean of the last hidden states (finetune.py --pooling)")
    p.add_argument("--no-finetune", dest="finetune", action="store_false",
                   help="probes and bag of words only")
    p.add_argument("--no-probe", dest="probe", action="store_false",
                   help="fine-tuning and bag of words only")
    p.add_argument("--output-dir", default="runs/evaluate")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in an OUTPUT_DIR that holds a run with other settings")
    p.add_argument("--device", choices=list(backend.DEVICES), default=None)
    args = p.parse_args(argv)
    args.lr = list(dict.fromkeys(args.lr))  # a rate named twice runs once
    args.task_dirs = dict(TASKS)
    for item in args.task_dir:
        name, sep, d = item.partition("=")
        if not sep or not name or not d:
            p.error(f"--task-dir: expected NAME=DIR, got {item!r}")
        args.task_dirs[name] = Path(d)
    for t in args.tasks or ():
        if t not in args.task_dirs:
            p.error(f"--tasks: unknown task {t!r} (expected one of "
                    f"{', '.join(args.task_dirs)}, or add it with --task-dir {t}=DIR)")
    return args


def resolve(start: str):
    """(Pretrained, random_init) of a START argument."""
    random_init = start.startswith("random:")
    try:
        pre = load_start(start.removeprefix("random:"), "START")
    except RunError as e:
        fail(str(e))
    return pre, random_init


def is_chinese_vocab(vocab_file: Path) -> bool:
    """True when most of the vocab's tokens are single CJK characters (bert-base-chinese)."""
    tokens = Path(vocab_file).read_text(encoding="utf-8").split("\n")
    cjk = sum(1 for t in tokens if len(t) == 1 and "\u4e00" <= t <= "\u9fff")
    return cjk > 0.5 * len(tokens)


def draw(n_rows: int, size: int | None, seed: int, labels: list[str]) -> np.ndarray:
    """The train rows of one run: all (in order) or ``size`` drawn without replacement,
    re-drawn (up to 100 times) until at least two classes are present."""
    if size is None or size >= n_rows:
        return np.arange(n_rows)
    rng = np.random.default_rng([seed, size])
    for _ in range(100):
        idx = np.sort(rng.choice(n_rows, size=size, replace=False))
        if len({labels[i] for i in idx}) > 1:
            return idx
    fail(f"cannot draw {size} train rows holding two classes")


def write_subset(path: Path, examples, idx: np.ndarray) -> Path:
    pair = examples[0].text_b is not None
    header = "label\tsentence_a\tsentence_b" if pair else "label\tsentence"
    rows = [f"{e.label}\t{e.text_a}" + (f"\t{e.text_b}" if pair else "")
            for e in (examples[i] for i in idx)]
    atomic_write_bytes(path, ("\n".join([header, *rows]) + "\n").encode("utf-8"))
    return path


def name_of(start: str, lr: float) -> str:
    """The run directory name of a start fine-tuned at a learning rate."""
    return f"{hashlib.sha1(start.encode()).hexdigest()[:10]}-lr{lr:g}"


def run_finetune(args, pre_path: str, random_init: bool, train: Path, task: Path, seed: int,
                 lr: float, out: Path) -> tuple[float, float]:
    """(dev, test) accuracy of one finetune.py run at its best dev epoch (reused when its
    summary.json exists)."""
    import finetune
    summary = out / "summary.json"
    if not summary.is_file():
        argv = ["--init", pre_path, "--train", str(train), "--dev", str(task / "dev.tsv"),
                "--test", str(task / "test.tsv"), "--output-dir", str(out), "--overwrite",
                "--seed", str(seed), "--epochs", str(args.epochs), "--lr", str(lr),
                "--batch-size", str(args.batch_size), "--max-seq-length",
                str(args.max_seq_length), "--pooling", args.pooling, "--group-by-length",
                "--no-progress",
                *(["--random-init"] if random_init else []),
                *(["--device", args.device] if args.device else [])]
        out.mkdir(parents=True, exist_ok=True)
        log = out.parent / f"{out.name}.log"
        with open(log, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            try:
                code = finetune.main(argv)
            except SystemExit as e:
                code = e.code
        if code not in (0, None):
            fail(f"finetune.py {' '.join(argv)} failed (exit {code}); its log: {log}")
    result = json.loads(summary.read_text())
    return float(result["dev"]["accuracy"]), float(result["test"]["accuracy"])


def encoder(start_pre, random_init: bool, device: str):
    """The frozen encoder of a start (fresh weights for ``random:``) and its tokenizer."""
    model = BertModel(start_pre.config, add_pooling_layer=False, seed=0)
    if not random_init:
        try:
            load_pretrained_weights(model, start_pre.state, start_pre.source)
        except HFFormatError as e:
            fail(str(e))
    model.to(device)
    return model, BertTokenizer(start_pre.vocab_file, **start_pre.tokenizer_options)


def mean_std(values: list[float]) -> tuple[float, float]:
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
    """Mean and std of test accuracy per (task, budget, start, kind), with margins; the
    fine-tuning rows at each start's best learning rate (``best_lr_runs``)."""
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


def plot(rows: list[dict], sizes: dict[str, int], path: Path) -> None:
    """Test accuracy against the number of train labels: one panel per task, one line per
    start and kind (fine-tuning solid, probe dashed, bag of words dotted)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    style = {"finetune": "-", "probe": "--", "bow": ":"}
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
                        label=f"{start[-30:]} ({kind})" if kind != "bow" else BOW)
        ax.set_xscale("log")
        ax.set_title(task)
        ax.set_xlabel("train labels")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        device = backend.set_device(args.device)
    except backend.BackendError as e:
        fail(str(e))
    xp = backend.xp_for(device)
    starts = {s: resolve(s) for s in dict.fromkeys(args.starts)}
    chinese = {s: is_chinese_vocab(pre.vocab_file) for s, (pre, _) in starts.items()}
    if args.tasks is None:
        if len(set(chinese.values())) > 1:
            fail("the starts mix Chinese and English vocabularies; name the --tasks")
        args.tasks = list(CHINESE if next(iter(chinese.values())) else ENGLISH)
    out = Path(args.output_dir)
    settings = {k: getattr(args, k) for k in ("starts", "tasks", "budgets", "seeds", "epochs",
                                               "lr", "batch_size", "max_seq_length", "pooling")}
    settings["task_dirs"] = {t: str(args.task_dirs[t]) for t in args.tasks}
    cfg_path = out / "settings.json"
    # each rate has run directories of its own, so rates may be added or left out
    if cfg_path.is_file() and {**json.loads(cfg_path.read_text()), "lr": None} != \
            {**settings, "lr": None}:
        if not args.overwrite:
            fail(f"--output-dir {out} holds a harness run with other settings "
                 f"({cfg_path}); pass --overwrite or another --output-dir")
        import shutil
        shutil.rmtree(out / "runs", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(cfg_path, settings)

    records, sizes = [], {}
    for task in args.tasks:
        d = args.task_dirs[task]
        try:
            train, dev, test = (read_tsv(d / f"{s}.tsv") for s in ("train", "dev", "test"))
        except DatasetError as e:
            fail(str(e))
        labels = sorted({e.label for e in train})
        y = {s: np.array([labels.index(e.label) for e in ex]) for s, ex in
             (("train", train), ("dev", dev), ("test", test))}
        sizes[task] = len(train)
        texts = {s: [e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in ex]
                 for s, ex in (("train", train), ("dev", dev), ("test", test))}
        feats = {}
        if args.probe:
            for s, (pre, rnd) in starts.items():
                print(f"{task}: encoding with {s} (frozen, mean-pooled)", flush=True)
                model, tokenizer = encoder(pre, rnd, device)
                feats[s] = {k: mean_pooled_features(model, tokenizer, texts[k],
                                                    args.max_seq_length, xp=xp)
                            for k in ("train", "dev", "test")}
        for b in args.budgets:
            for seed in range(args.seeds):
                idx = draw(len(train), b, seed, [e.label for e in train])
                tag = f"{task}/{'all' if b is None else b}/seed{seed}"
                subset = write_subset(out / "runs" / tag / "train.tsv", train, idx)
                for s, (pre, rnd) in starts.items():
                    for lr in args.lr if args.finetune else ():
                        dev_acc, acc = run_finetune(args, s.removeprefix("random:"), rnd,
                                                    subset, d, seed, lr,
                                                    out / "runs" / tag / name_of(s, lr))
                        records.append({"task": task, "budget": b, "seed": seed, "start": s,
                                        "kind": "finetune", "lr": lr, "dev_accuracy": dev_acc,
                                        "accuracy": acc})
                    if args.probe:
                        f = feats[s]
                        probe, _ = fit_probe(f["train"][idx], y["train"][idx], f["dev"],
                                             y["dev"], len(labels))
                        acc = float((probe.predict(f["test"]) == y["test"]).mean())
                        records.append({"task": task, "budget": b, "seed": seed, "start": s,
                                        "kind": "probe", "accuracy": acc})
                flat = {k: [t if isinstance(t, str) else " ".join(t) for t in v]
                        for k, v in texts.items()}
                X, vocab = bag_of_words([flat["train"][i] for i in idx])
                Xd, _ = bag_of_words(flat["dev"], vocab)
                Xt, _ = bag_of_words(flat["test"], vocab)
                probe, _ = fit_probe(X, y["train"][idx], Xd, y["dev"], len(labels),
                                     l2_grid=(1e-3, 1e-2, 1e-1, 1.0))
                records.append({"task": task, "budget": b, "seed": seed, "start": BOW,
                                "kind": "bow",
                                "accuracy": float((probe.predict(Xt) == y["test"]).mean())})
                print(f"{tag}: " + ", ".join(f"{r['start'][-30:]} {r['kind']}"
                                             + (f" lr {r['lr']:g}" if "lr" in r else "")
                                             + f" {r['accuracy']:.3f}" for r in records
                                             if r["task"] == task and r["budget"] == b
                                             and r["seed"] == seed), flush=True)
    rows = summarize(records)
    print_table(rows)
    atomic_write_json(out / "results.json", {"settings": settings, "summary": rows,
                                             "runs": records, "train_rows": sizes})
    plot(rows, sizes, out / "accuracy_vs_labels.png")
    print(f"wrote {out / 'results.json'} and {out / 'accuracy_vs_labels.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
