"""Benchmark: fine-tuning with transformers (the peer of ``finetune.py``) and a
bag-of-words logistic-regression baseline, on the same TSV splits.

Usage::

    python bench/bench_finetune.py transformers --init DIR [--epochs 1 --max-seq-length 64]
    python bench/bench_finetune.py bow [--data data/classify/en/movie_reviews]

``transformers``: transformers' ``BertForSequenceClassification`` from the same checkpoint
with the *same* recipe as ``finetune.py``: the same tokenization (our ``BertTokenizer``,
identical to transformers' on this vocab, see tests), the same batches in the same order
(``minibert.finetuning.iterate_batches`` with the same seed, dynamic padding), the same
classifier initialisation (copied from ``minibert``'s new head for that seed), torch's
bias-corrected AdamW with the same lr / eps / weight decay (not on biases and LayerNorm),
warmup + linear decay (``minibert.optim.linear_schedule_with_warmup``), global-norm
clipping 1.0, dropout on. Only the dropout masks differ. Reports dev/test metrics of the
best-dev epoch and training seconds per epoch, with ``torch.set_num_threads`` = --threads.

``bow``: scikit-learn ``CountVectorizer`` over the words of our ``BasicTokenizer`` (lower-cased,
punctuation split off, each CJK character a word; unigrams + bigrams, binary) and
``LogisticRegression`` (C picked on dev among 0.1, 0.3, 1, 3, 10); dev/test metrics with our
metric code. scikit-learn is used only here, never in minibert/.

Prints one JSON object per result line.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minibert.finetuning import (build_classifier, classification_metrics, encode_split,  # noqa: E402
                                 iterate_batches, label_list, read_tsv)
from minibert.runs import load_start  # noqa: E402
from minibert.optim import decays, linear_schedule_with_warmup  # noqa: E402
from minibert.tokenization import BertTokenizer  # noqa: E402

DEFAULT_DATA = ROOT / "data" / "classify" / "en" / "movie_reviews"


def splits(data: Path):
    return {s: read_tsv(data / f"{s}.tsv") for s in ("train", "dev", "test")}


def run_transformers(args) -> dict:
    import torch
    import transformers
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    ex = splits(Path(args.data))
    if args.max_train_examples:
        ex["train"] = ex["train"][:args.max_train_examples]
    labels = label_list(ex["train"])
    pre = load_start(args.init)
    tok = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    max_len = min(args.max_seq_length, pre.config.max_position_embeddings)
    enc = {s: encode_split(tok, e, max_len, labels) for s, e in ex.items()}
    model = transformers.BertForSequenceClassification.from_pretrained(
        args.init, num_labels=len(labels), attn_implementation="eager")
    ours, _ = build_classifier(pre, labels, seed=args.seed)  # same new-head initialisation
    with torch.no_grad():
        model.classifier.weight.copy_(torch.from_numpy(ours.classifier.weight.data))
        model.classifier.bias.copy_(torch.from_numpy(ours.classifier.bias.data))
    groups = [
        {"params": [p for p in model.parameters() if decays(p)],
         "weight_decay": args.weight_decay},
        {"params": [p for p in model.parameters() if not decays(p)],
         "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, eps=args.adam_eps)
    steps_per_epoch = -(-len(enc["train"]) // args.batch_size)
    total = steps_per_epoch * args.epochs
    warmup = int(args.warmup_proportion * total)

    def evaluate(split):
        model.eval()
        preds = np.zeros(len(split), dtype=np.int64)
        with torch.no_grad():
            for b in iterate_batches(split, 64, pad_id=tok.pad_token_id):
                logits = model(input_ids=torch.from_numpy(b.input_ids),
                               token_type_ids=torch.from_numpy(b.token_type_ids),
                               attention_mask=torch.from_numpy(b.attention_mask)).logits
                preds[b.index] = logits.argmax(-1).numpy()
        model.train()
        return classification_metrics(split.labels, preds, len(labels))

    step, best, result, secs = 0, -1.0, None, []
    model.train()
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        # the same batch order as finetune.py: a permutation per (seed, epoch)
        for b in iterate_batches(enc["train"], args.batch_size, tok.pad_token_id,
                                 seed=args.seed, epoch=epoch):
            for g in opt.param_groups:
                g["lr"] = linear_schedule_with_warmup(step, args.lr, warmup, total)
            out = model(input_ids=torch.from_numpy(b.input_ids),
                        token_type_ids=torch.from_numpy(b.token_type_ids),
                        attention_mask=torch.from_numpy(b.attention_mask),
                        labels=torch.from_numpy(b.labels))
            opt.zero_grad()
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            opt.step()
            step += 1
        secs.append(time.perf_counter() - t0)
        dev = evaluate(enc["dev"])
        if dev["accuracy"] > best:
            best, result = dev["accuracy"], {"dev": dev, "test": evaluate(enc["test"]),
                                             "epoch": epoch + 1}
    return {"system": f"transformers {transformers.__version__} / torch {torch.__version__}",
            "init": args.init, "epochs": args.epochs, "max_seq_length": max_len,
            "batch_size": args.batch_size, "lr": args.lr,
            "train_examples": len(enc["train"]), "threads": args.threads,
            "train_seconds_per_epoch": secs, **result}


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("which", choices=["transformers", "bow"])
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--init", help="HF BERT directory (transformers)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-seq-length", type=int, default=64)
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
    args = p.parse_args(argv)
    if args.which == "transformers" and not args.init:
        p.error("transformers needs --init DIR")
    res = run_transformers(args) if args.which == "transformers" else run_bow(args)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
