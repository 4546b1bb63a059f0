#!/usr/bin/env python
"""Measure what a starting point is worth downstream: fine-tune it on the shipped
classification, tagging and question-answering tasks at several label budgets and seeds,
and compare with the same architecture from random weights and a floor beside every row
(a bag of words and probes on frozen states, the most frequent tag, the first sentence).

    python evaluate.py runs/pretrain random:runs/pretrain          # ours vs random init
    python evaluate.py runs/pretrain $MINILM --budgets 500 all --seeds 3
    python evaluate.py runs/zh --tasks product_reviews

Starts: a train_mlm.py run directory (or checkpoint), a finetune.py output, a Hugging Face
BERT directory, or ``random:START`` (START's architecture and vocab, fresh weights). Tasks
(English / Chinese; default: the English ones, or the Chinese ones for a start whose vocab
is mostly CJK characters): movie_reviews, sms_spam, trec_questions / product_reviews
(data/classify/, test accuracy), brown_pos (data/tag/en, part-of-speech token accuracy) /
peoples_daily_ner (data/tag/zh, entity F1), squad_v1 (data/qa/en, SQuAD F1 and exact
match); a --task-dir is read as finetune.py reads it, its kind told by its files
(minibert/evaluation/downstream.py). A budget N trains on N rows, sentences or questions
drawn at random from the train split (a fresh draw per seed; ``all`` or N at least the
split = the whole split); dev picks the best epoch (fine-tuning) or the L2 weight
(probes); the reported number is the test score. Given several ``--lr``, each start
fine-tunes at every one of them and reports, per task and budget, the rate with the best
mean dev score over seeds (the protocol of Devlin et al. 2019, §4.1), so that a
pretrained start and a random one are each compared at their own best rate.

For every (task, budget, seed): ``finetune.py`` for each start (a process of its own, its log
in OUTPUT_DIR/runs/.../NAME.log) and the floors: for classification a softmax-regression
probe on each start's frozen, mean-pooled final states (minibert.evaluation.probe; random
starts included) and a bag-of-words softmax regression; for tagging each word's most
frequent train tag (the overall most frequent one for an unseen word); for QA the first
sentence of the context. Prints mean ± std over seeds per task and budget, the margin over
random init (for a start S when ``random:S`` is among the starts) and over the floor;
writes OUTPUT_DIR/results.json (every run and the summary) and OUTPUT_DIR/accuracy_vs_labels.png
(a panel per task).
A finished fine-tuning run (its summary.json present) is reused when the harness is run
again with the same settings in the same OUTPUT_DIR and the start's content is the same
(runs are named by its content fingerprint, not its path: a start replaced at its path runs
again); ``--lr`` may differ between such runs (a rate added later fine-tunes only at that
rate; the report covers the rates named).
"""
from __future__ import annotations

import argparse
import sys

from minibert.cli import add_options, float_in, int_at_least, positive_int
from minibert.evaluation import EvaluationConfig, run_evaluation
from minibert.evaluation.config import CHINESE, ENGLISH, TASKS, budget


def parse_args(argv=None) -> EvaluationConfig:
    """The options as an :class:`~minibert.evaluation.EvaluationConfig`; a bad
    ``--task-dir`` or ``--tasks`` ends in argparse's error exit."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("starts", nargs="+", metavar="START",
                   help="run dir, checkpoint, finetune.py output, HF BERT dir, or random:START")
    p.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                   help=f"of {', '.join(TASKS)} and any --task-dir; default: "
                        f"{', '.join(ENGLISH)}, or {', '.join(CHINESE)} for a Chinese vocab")
    p.add_argument("--task-dir", action="append", default=[], metavar="NAME=DIR",
                   help="another task (or another directory for a shipped one): DIR holds "
                        "train, dev and test files as finetune.py reads them (train.tsv "
                        "with a label header: classification; other TSV: tagging; "
                        "train.jsonl: question answering)")
    p.add_argument("--budgets", nargs="+", type=budget, default=[500, 2000, None],
                   metavar="N|all", help="train rows (sentences for tagging, questions "
                        "for QA) per run")
    p.add_argument("--seeds", type=positive_int, default=3, help="seeds 0 .. N-1")
    p.add_argument("--epochs", type=positive_int, default=3)
    p.add_argument("--lr", nargs="+", type=float_in(0.0, low_open=True), default=[5e-5],
                   metavar="LR", help="fine-tuning learning rates; with several, each start "
                   "reports the one with the best mean dev score (the task's metric) per task "
                   "and budget")
    add_options(p, batch_size=32)
    p.add_argument("--max-seq-length", type=int_at_least(3), default=128)
    p.add_argument("--pooling", choices=["cls", "mean"], default="cls",
                   help="what the fine-tuned classifier reads: the pooled [CLS] vector or the "
                        "mean of the last hidden states (finetune.py --pooling)")
    p.add_argument("--no-finetune", dest="finetune", action="store_false",
                   help="the floors only (probes and bag of words, most frequent tag, first "
                   "sentence)")
    p.add_argument("--no-probe", dest="probe", action="store_false",
                   help="no probes on frozen states: fine-tuning and the floors")
    add_options(p, output_dir="runs/evaluate", device=None, fast_cpu=True, overwrite=dict(
        default=False, help="start afresh in an OUTPUT_DIR that holds a run with other "
                            "settings"))
    cfg = EvaluationConfig(**vars(p.parse_args(argv))).with_defaults()
    try:
        cfg.task_dirs()
    except ValueError as e:
        p.error(str(e))
    return cfg


def main(argv=None) -> int:
    run_evaluation(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
