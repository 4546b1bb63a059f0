#!/usr/bin/env python
"""Held-out masked-LM loss of several pretraining runs on ONE evaluation set.

Each train_mlm.py run evaluates on sequences cut by its own objective (NSP pairs, ALBERT
segments, RoBERTa full sentences), so the "eval_mlm_loss" of runs with different
--objective values are measured on different sequences. This script rebuilds the held-out
documents exactly as train_mlm.py does (same corpus, vocab, --seed and --eval-fraction),
cuts them with one objective's format, masks them with one seed, and evaluates every run
on those same masked positions.

    python bench/eval_mlm.py runs/nsp runs/mlm runs/sop --format mlm+nsp
    python bench/eval_mlm.py runs/nsp runs/mlm runs/sop --format mlm

Prints one row per run: held-out MLM loss (nats), MLM accuracy, and the unigram baseline
of the same positions.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minibert.auto import model_class  # noqa: E402
from minibert.modeling import BertForPreTraining  # noqa: E402
from minibert.objectives import OBJECTIVES, get_objective  # noqa: E402
from minibert.pretraining import (VocabInfo, build_or_load_store, make_eval_batches,  # noqa: E402
                                  resolve_corpus_files, split_documents, token_counts,
                                  unigram_cross_entropy)
from minibert.runs import load_start  # noqa: E402
from minibert.tokenization import BertTokenizer  # noqa: E402


def main(argv=None) -> int:
    from minibert.fast import set_fast_paths
    set_fast_paths(True)  # what the jobs run
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="train_mlm.py run directories (same corpus and vocab)")
    p.add_argument("--format", choices=sorted(OBJECTIVES), default="mlm+nsp",
                   help="the objective whose sequence format the evaluation set uses")
    p.add_argument("--eval-instances", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=128)
    args = p.parse_args(argv)

    first = json.loads((Path(args.runs[0]) / "args.json").read_text())
    vocab_bytes = (Path(args.runs[0]) / "vocab.txt").read_bytes()
    for r in args.runs[1:]:
        other = json.loads((Path(r) / "args.json").read_text())
        for k in ("corpus", "seed", "eval_fraction", "max_seq_length", "lowercase"):
            if other[k] != first[k]:
                p.error(f"{r}: {k} {other[k]!r} differs from {args.runs[0]}'s {first[k]!r}")
        if (Path(r) / "vocab.txt").read_bytes() != vocab_bytes:
            p.error(f"{r}: another vocab than {args.runs[0]}")
    objective = get_objective(args.format)
    tokenizer = BertTokenizer(str(Path(args.runs[0]) / "vocab.txt"),
                              do_lower_case=first["lowercase"])
    files = resolve_corpus_files(first["corpus"])
    store = build_or_load_store(files, tokenizer, cache_dir=Path(args.runs[0]) / "cache",
                                show_progress=False, min_documents=objective.min_documents)
    train_store, eval_store = split_documents(store, eval_fraction=first["eval_fraction"],
                                              seed=first["seed"],
                                              min_documents=objective.min_documents)
    batches = make_eval_batches(eval_store, VocabInfo.from_tokenizer(tokenizer),
                                args.batch_size, first["max_seq_length"], seed=first["seed"] + 1,
                                objective=objective, max_instances=args.eval_instances,
                                masked_lm_prob=first["masked_lm_prob"],
                                max_predictions_per_seq=first["max_predictions_per_seq"])
    baseline = unigram_cross_entropy(token_counts(train_store, len(tokenizer)),
                                     [b.masked_lm_ids for b in batches],
                                     [b.masked_lm_weights for b in batches])
    print(f"evaluation set: {sum(len(b.input_ids) for b in batches)} sequences in the "
          f"{args.format} format; unigram baseline {baseline:.3f} nats")
    print("| run | objective | steps | held-out MLM loss | MLM accuracy |\n|---|---|---|---|---|")
    for r in args.runs:
        start = load_start(r, "run")
        sentence_head = any(k.startswith(("cls.seq_relationship.", "sop_classifier."))
                            for k in start.state)
        model = model_class(start.config, BertForPreTraining)(  # an ALBERT run: its class
            start.config, seq_relationship_head=sentence_head)
        model.load_state_dict(start.state)
        model.eval()
        mlm_only = get_objective("mlm")   # its stats read only the MLM outputs
        sums: dict = {}
        for b in batches:
            inputs = b.model_inputs()
            inputs.pop("next_sentence_label", None)
            for k, v in mlm_only.stats(model(**inputs), inputs).items():
                sums[k] = sums.get(k, 0) + float(v)
        m = mlm_only.summarize(sums)
        run_args = json.loads((Path(r) / "args.json").read_text())
        print(f"| {r} | {run_args.get('objective')} | {start.trainer.get('step')} | "
              f"{m['mlm_loss']:.3f} | {m['mlm_acc']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
