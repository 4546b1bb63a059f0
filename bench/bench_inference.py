"""Benchmark: inference speed of several BERTs on the same sentences, e.g. a distilled
student against its teacher (issue 14: "student inference >= 4x the teacher's tokens/s").

Usage::

    python bench/bench_inference.py TEACHER STUDENT [MORE ...] \\
        [--data data/classify/en/movie_reviews/test.tsv] [--max-seq-length 64] \\
        [--batch-size 64] [--repeats 2]

A model is anything ``finetune.py --init`` takes (a train_mlm.py or finetune.py run, a
Hugging Face directory). Each tokenizes the split's sentences with its own vocabulary
(truncated to ``--max-seq-length``), and its encoder (``BertModel``, eval mode: no
dropout; the heads are a negligible part) runs over all of them in batches of rows sorted
by length, as a serving loop would. The models take turns within every repeat (the first
one goes first in even repeats, last in odd ones), so all see the same machine load.
Reported per model and repeat: real (non-padding) tokens per second and the ratio to the
first model. One JSON line per model and repeat, then a summary line per model.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minibert.auto import model_class  # noqa: E402
from minibert.finetuning import read_tsv  # noqa: E402
from minibert.hf import load_pretrained_weights  # noqa: E402
from minibert.modeling import BertModel  # noqa: E402
from minibert.runs import load_start  # noqa: E402
from minibert.tokenization import BertTokenizer  # noqa: E402


class Subject:
    """One model: its encoder and its length-sorted, padded batches."""

    def __init__(self, start: str, texts: list[str], max_len: int, batch_size: int):
        pre = load_start(start)
        self.name = start
        self.encoder = model_class(pre.config, BertModel)(pre.config, add_pooling_layer=False)
        load_pretrained_weights(self.encoder, pre.state, pre.source)
        self.encoder.eval()
        tok = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
        ids = [tok(t, truncation=True, max_length=min(max_len,
                                                      pre.config.max_position_embeddings)
                   )["input_ids"] for t in texts]
        ids.sort(key=len)
        self.batches = []
        for i in range(0, len(ids), batch_size):
            rows = ids[i:i + batch_size]
            T = len(rows[-1])
            x = np.zeros((len(rows), T), dtype=np.int64)
            m = np.zeros_like(x)
            for r, row in enumerate(rows):
                x[r, :len(row)], m[r, :len(row)] = row, 1
            self.batches.append((x, m))
        self.tokens = sum(len(r) for r in ids)
        self.layers, self.hidden = pre.config.num_hidden_layers, pre.config.hidden_size

    def run(self) -> float:
        """Seconds for one pass over every batch."""
        t0 = time.perf_counter()
        for x, m in self.batches:
            self.encoder(x, np.zeros_like(x), m)
        return time.perf_counter() - t0


def main(argv=None) -> int:
    from minibert.fast import set_fast_paths
    set_fast_paths(True)  # what the jobs run
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", metavar="MODEL")
    p.add_argument("--data", default=str(ROOT / "data/classify/en/movie_reviews/test.tsv"))
    p.add_argument("--max-seq-length", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    texts = [e.text_a for e in read_tsv(args.data)]
    subjects = [Subject(m, texts, args.max_seq_length, args.batch_size) for m in args.models]
    for s in subjects:
        s.run()                                                   # warm-up
    rates: dict[str, list[float]] = {s.name: [] for s in subjects}
    for rep in range(args.repeats):
        order = subjects if rep % 2 == 0 else subjects[::-1]
        seconds = {s.name: s.run() for s in order}
        for s in subjects:
            rates[s.name].append(s.tokens / seconds[s.name])
        first = rates[subjects[0].name][-1]
        for s in subjects:
            print(json.dumps({"repeat": rep, "model": s.name, "layers": s.layers,
                              "hidden": s.hidden, "rows": len(texts), "real_tokens": s.tokens,
                              "seconds": round(seconds[s.name], 3),
                              "tokens_per_s": round(rates[s.name][-1], 1),
                              "ratio_to_first": round(rates[s.name][-1] / first, 2)}))
    for s in subjects:
        ratios = [a / b for a, b in zip(rates[s.name], rates[subjects[0].name])]
        print(json.dumps({"summary": s.name, "tokens_per_s": [round(r, 1) for r in rates[s.name]],
                          "ratio_to_first": [round(r, 2) for r in ratios],
                          "median_ratio": round(statistics.median(ratios), 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
