"""Benchmark: fine-tuning with minibert (``finetune.py``'s step) and with transformers (its
peer), on the same TSV splits in one process, and a bag-of-words logistic-regression
baseline.

Usage::

    python bench/bench_finetune.py compare --init DIR [--epochs 1 --max-seq-length 64]
    python bench/bench_finetune.py transformers --init DIR
    python bench/bench_finetune.py minibert --init DIR
    python bench/bench_finetune.py bow [--data data/classify/en/movie_reviews]

``compare``: both models train side by side, one step of each in turn (which one goes
first alternates), so both see the same machine load. minibert trains as
``finetune.py --group-by-length`` (length-bucketed batches: ``iterate_batches(...,
group_by_length=True)``, ``FinetuningWorkload``'s forward,
``minibert.finetuning.job.make_optimizer``,
``minibert.training.train_step``); transformers trains as its users run it, bucketing off
(the shuffled, dynamically padded batches of ``finetune.py`` without the flag). Both get
the same rows each epoch, the same number of steps and the same learning-rate schedule.
``--no-minibert-group-by-length`` gives both the very same batches (a per-step
comparison); ``--transformers-group-by-length`` buckets the peer too (HF Trainer's
``group_by_length=True``). Reported per system: seconds of training steps per epoch (batch
building and evaluation not timed), real tokens/s (attention-mask ones over step
seconds), padded tokens/s (B x T), the padding fraction, the mean training loss of the last
epoch and dev/test metrics of the best-dev epoch; then one line with the ratio
minibert / transformers of real tokens/s. ``transformers`` and ``minibert`` run one system
alone the same way.

The transformers side: ``BertForSequenceClassification`` from the same checkpoint with the
*same* recipe as ``finetune.py``: the same tokenization (our ``BertTokenizer``, identical to
transformers' on this vocab, see tests), the same classifier initialisation (copied from
``minibert``'s new head for that seed), torch's bias-corrected AdamW with the same lr / eps
/ weight decay (not on biases and LayerNorm), warmup + linear decay
(``minibert.optim.linear_schedule_with_warmup``), global-norm clipping, dropout on. Only
the dropout masks differ. Threads: ``torch.set_num_threads(--threads)`` and, for NumPy's
BLAS, ``threadpoolctl.threadpool_limits(--threads)`` when threadpoolctl is installed.
CPU only.

``bow``: scikit-learn ``CountVectorizer`` over the words of our ``BasicTokenizer`` (lower-cased,
punctuation split off, each CJK character a word; unigrams + bigrams, binary) and
``LogisticRegression`` (C picked on dev among 0.1, 0.3, 1, 3, 10); dev/test metrics with our
metric code. scikit-learn is used only here, never in minibert/.

Prints one JSON object per result line.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minibert.finetuning import (classification_metrics, encode_split,  # noqa: E402
                                 iterate_batches, label_list, model_from_start, read_tsv)
from minibert.runs import load_start  # noqa: E402
from minibert.optim import decays, linear_schedule_with_warmup  # noqa: E402
from minibert.tokenization import BertTokenizer  # noqa: E402

DEFAULT_DATA = ROOT / "data" / "classify" / "en" / "movie_reviews"


def splits(data: Path):
    return {s: read_tsv(data / f"{s}.tsv") for s in ("train", "dev", "test")}


def prepare(args) -> SimpleNamespace:
    """The encoded splits, labels and starting point both systems use."""
    ex = splits(Path(args.data))
    if args.max_train_examples:
        ex["train"] = ex["train"][:args.max_train_examples]
    labels = label_list(ex["train"])
    pre = load_start(args.init)
    tok = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    max_len = min(args.max_seq_length, pre.config.max_position_embeddings)
    enc = {s: encode_split(tok, e, max_len, labels) for s, e in ex.items()}
    return SimpleNamespace(labels=labels, pre=pre, pad_id=tok.pad_token_id, max_len=max_len,
                           enc=enc)


class TransformersSystem:
    """transformers' BertForSequenceClassification with finetune.py's recipe."""

    name = "transformers"

    def __init__(self, args, data):
        import torch
        import transformers
        self.torch, self.args, self.data = torch, args, data
        torch.manual_seed(args.seed)
        self.model = transformers.BertForSequenceClassification.from_pretrained(
            args.init, num_labels=len(data.labels), attn_implementation="eager")
        ours, _ = model_from_start(data.pre, labels=data.labels, seed=args.seed)  # same new head
        with torch.no_grad():
            self.model.classifier.weight.copy_(torch.from_numpy(ours.classifier.weight.data))
            self.model.classifier.bias.copy_(torch.from_numpy(ours.classifier.bias.data))
        params = list(self.model.parameters())
        self.opt = torch.optim.AdamW(
            [{"params": [p for p in params if decays(p)], "weight_decay": args.weight_decay},
             {"params": [p for p in params if not decays(p)], "weight_decay": 0.0}],
            lr=args.lr, eps=args.adam_eps)
        self.model.train()
        self.system = f"transformers {transformers.__version__} / torch {torch.__version__}"

    def _inputs(self, b):
        t = self.torch.from_numpy
        return dict(input_ids=t(b.input_ids), token_type_ids=t(b.token_type_ids),
                    attention_mask=t(b.attention_mask))

    def step(self, batch, step: int, lr: float) -> float:
        for g in self.opt.param_groups:
            g["lr"] = lr
        out = self.model(**self._inputs(batch), labels=self.torch.from_numpy(batch.labels))
        self.opt.zero_grad()
        out.loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        self.opt.step()
        return out.loss.item()

    def evaluate(self, split) -> dict:
        self.model.eval()
        preds = np.zeros(len(split), dtype=np.int64)
        with self.torch.no_grad():
            for b in iterate_batches(split, 64, pad_id=self.data.pad_id):
                preds[b.index] = self.model(**self._inputs(b)).logits.argmax(-1).numpy()
        self.model.train()
        return classification_metrics(split.labels, preds, len(self.data.labels))


class MinibertSystem:
    """minibert as finetune.py trains it: its task's forward, its optimizer, the loop's
    train_step (one micro-batch per step, as finetune.py without accumulation)."""

    name = "minibert"

    def __init__(self, args, data):
        from minibert.finetuning import evaluate
        from minibert.finetuning.job import make_optimizer
        from minibert.finetuning import FinetuningConfig
        from minibert.finetuning.tasks import FinetuningWorkload
        from minibert.backend import DropoutRNG
        from minibert.fast import set_fast_paths
        from minibert.training import TrainingConfig, train_step
        set_fast_paths(True)  # what the jobs run
        self.data, self._evaluate, self._train_step = data, evaluate, train_step
        self.model, _ = model_from_start(data.pre, labels=data.labels, seed=args.seed)
        ft_args = FinetuningConfig(lr=args.lr, adam_eps=args.adam_eps, correct_bias=True,
                                   weight_decay=args.weight_decay, batch_size=args.batch_size,
                                   seed=args.seed,
                                   group_by_length=args.minibert_group_by_length)
        self.opt = make_optimizer(self.model, ft_args)
        self.task = FinetuningWorkload(ft_args, None, self.model, data.enc["train"],
                                       data.enc["dev"], data.labels, data.pre, np)
        self.cfg = TrainingConfig(max_steps=1, lr=args.lr, max_grad_norm=args.max_grad_norm,
                                  seed=args.seed)
        self.dropout_rng = DropoutRNG("cpu")      # one per run, as training.train makes
        self.model.train()
        self.system = f"minibert (numpy {np.__version__})"

    def step(self, batch, step: int, lr: float) -> float:
        loss, *_ = self._train_step(self.model, self.opt, self.task, [batch], step, lr,
                                    self.cfg, device="cpu", dropout_rng=self.dropout_rng)
        return float(loss)  # a host read, as the transformers side's loss.item()

    def evaluate(self, split) -> dict:
        return self._evaluate(self.model, split, 64, self.data.pad_id, np)[0]


def run_systems(args, names: list[str]) -> list[dict]:
    """Train the named systems side by side (one step of each in turn) for --epochs;
    returns one result per system, plus a ratio record when both ran."""
    data = prepare(args)
    grouped = {"minibert": args.minibert_group_by_length,
               "transformers": args.transformers_group_by_length}
    make = {"minibert": MinibertSystem, "transformers": TransformersSystem}
    systems = [make[n](args, data) for n in names]
    train = data.enc["train"]
    steps_per_epoch = -(-len(train) // args.batch_size)
    total = steps_per_epoch * args.epochs
    warmup = int(args.warmup_proportion * total)
    stats = {s.name: {"secs": [], "real": 0, "padded": 0, "losses": [], "best": -1.0,
                      "result": None} for s in systems}
    step = 0
    for epoch in range(args.epochs):
        streams = [iterate_batches(train, args.batch_size, data.pad_id, seed=args.seed,
                                   epoch=epoch, group_by_length=grouped[s.name])
                   for s in systems]
        secs = dict.fromkeys(stats, 0.0)
        for name in stats:
            stats[name]["losses"] = []
        for batches in zip(*streams):           # the same number of batches for each
            lr = linear_schedule_with_warmup(step, args.lr, warmup, total)
            pairs = list(zip(systems, batches))
            for system, b in (pairs if step % 2 == 0 else pairs[::-1]):
                t0 = time.perf_counter()
                loss = system.step(b, step, lr)
                secs[system.name] += time.perf_counter() - t0
                st = stats[system.name]
                st["real"] += int(b.attention_mask.sum())
                st["padded"] += b.attention_mask.size
                st["losses"].append(loss)
            step += 1
        for system in systems:
            st = stats[system.name]
            st["secs"].append(secs[system.name])
            dev = system.evaluate(data.enc["dev"])
            if dev["accuracy"] > st["best"]:
                st["best"], st["result"] = dev["accuracy"], {
                    "dev": dev, "test": system.evaluate(data.enc["test"]), "epoch": epoch + 1}
    results = []
    for system in systems:
        st = stats[system.name]
        seconds = sum(st["secs"])
        results.append({
            "name": system.name, "system": system.system, "init": args.init, "epochs": args.epochs,
            "max_seq_length": data.max_len, "batch_size": args.batch_size, "lr": args.lr,
            "train_examples": len(train), "threads": args.threads,
            "group_by_length": grouped[system.name], "alongside": [n for n in names
                                                                   if n != system.name],
            "train_seconds_per_epoch": [round(x, 2) for x in st["secs"]],
            "real_tokens": st["real"], "padded_tokens": st["padded"],
            "real_tokens_per_s": round(st["real"] / seconds, 1),
            "padded_tokens_per_s": round(st["padded"] / seconds, 1),
            "padding_fraction": round(1 - st["real"] / st["padded"], 4),
            "train_loss_last_epoch": round(float(np.mean(st["losses"])), 4),
            **st["result"]})
    if len(results) == 2:
        r = {x["name"]: x for x in results}
        results.append({
            "ratio_real_tokens_per_s_minibert_over_transformers": round(
                r["minibert"]["real_tokens_per_s"] / r["transformers"]["real_tokens_per_s"], 3),
            "ratio_seconds_per_epoch_transformers_over_minibert": round(
                sum(r["transformers"]["train_seconds_per_epoch"])
                / sum(r["minibert"]["train_seconds_per_epoch"]), 3)})
    return results


def run_bow(args) -> dict:
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    from minibert.tokenization import BasicTokenizer
    ex = splits(Path(args.data))
    labels = label_list(ex["train"])
    index = {l: i for i, l in enumerate(labels)}
    text = {s: [e.text_a + (" " + e.text_b if e.text_b else "") for e in v]
            for s, v in ex.items()}
    y = {s: np.array([index[e.label] for e in v]) for s, v in ex.items()}
    vec = CountVectorizer(tokenizer=BasicTokenizer(do_lower_case=True).tokenize, lowercase=False,
                          token_pattern=None, ngram_range=(1, 2), binary=True, min_df=1)
    X = {"train": vec.fit_transform(text["train"])}
    X.update({s: vec.transform(text[s]) for s in ("dev", "test")})
    best = None
    t0 = time.perf_counter()
    for C in (0.1, 0.3, 1.0, 3.0, 10.0):
        clf = LogisticRegression(C=C, max_iter=2000).fit(X["train"], y["train"])
        dev = classification_metrics(y["dev"], clf.predict(X["dev"]), len(labels))
        if best is None or dev["accuracy"] > best[1]["accuracy"]:
            best = (C, dev, classification_metrics(y["test"], clf.predict(X["test"]),
                                                   len(labels)))
    return {"system": "bag-of-words (BasicTokenizer 1-2 grams, binary) + logistic regression (sklearn)",
            "C": best[0], "dev": best[1], "test": best[2], "features": X["train"].shape[1],
            "seconds_all_C": time.perf_counter() - t0}


def add_recipe_arguments(p: argparse.ArgumentParser) -> None:
    """The optimisation options the fine-tuning benchmarks share, at finetune.py's
    defaults (bench_finetune_tasks.py takes them too)."""
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--warmup-proportion", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--adam-eps", type=float, default=1e-6)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-train-examples", type=int, default=None,
                   help="only the first N train rows (as finetune.py)")
    p.add_argument("--threads", type=int, default=2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("which", choices=["compare", "transformers", "minibert", "bow"])
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--init", help="HF BERT directory (compare, transformers, minibert)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-seq-length", type=int, default=64)
    add_recipe_arguments(p)
    p.add_argument("--minibert-group-by-length", action=argparse.BooleanOptionalAction,
                   default=True, help="minibert's batches bucketed by length")
    p.add_argument("--transformers-group-by-length", action=argparse.BooleanOptionalAction,
                   default=False, help="transformers' batches bucketed by length")
    args = p.parse_args(argv)
    if args.which != "bow" and not args.init:
        p.error(f"{args.which} needs --init DIR")
    if args.which == "bow":
        results = [run_bow(args)]
    else:
        with contextlib.suppress(ImportError):  # not needed by `minibert` alone
            import torch
            torch.set_num_threads(args.threads)
        try:
            from threadpoolctl import threadpool_limits
            limits = threadpool_limits(args.threads)
        except ImportError:
            limits = contextlib.nullcontext()
        names = ["minibert", "transformers"] if args.which == "compare" else [args.which]
        with limits:
            results = run_systems(args, names)
    for r in results:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
