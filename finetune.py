#!/usr/bin/env python
"""Fine-tune a BERT for sentence (pair) classification, token classification or extractive
question answering (Devlin et al. 2019, 4.1, 4.2, 5.3).

    python finetune.py --init runs/pretrain                 # our train_mlm.py run, movie reviews
    python finetune.py --init path/to/hf-bert-dir --data data/classify/en/sms_spam
    python finetune.py --task token-classification --init DIR      # Brown POS tags
    python finetune.py --task token-classification --init DIR --data data/tag/zh/peoples_daily_ner
    python finetune.py --task question-answering --init DIR        # SQuAD v1.1 sample
    python finetune.py --model runs/finetune --predict "a gripping, beautiful film"
    python finetune.py --model runs/qa --predict "Who wrote it?" "It was written by Ann."
    python finetune.py --model runs/finetune --plot-attention "a gripping, beautiful film"

Tasks (--task): sequence-classification (default), token-classification and
question-answering; their file formats and metrics: minibert/finetuning/job.py.
Splits: --train/--dev/--test, or --data DIR with train/dev/test files (default: the
embedded sample of each task). The label (tag) set comes from all splits (or --labels FILE)
and is saved with the model; a label that dev or test has and train has not is reported,
not fatal. --help describes every option.
Training, checkpoints and what is written: minibert/finetuning/job.py.
"""
from __future__ import annotations

import argparse
import sys

from minibert import distillation, distributed
from minibert.cli import (add_options, dropout_probability, explicit_options, float_in,
                          int_at_least, positive_float, positive_int)
from minibert.finetuning import FinetuningConfig, run_finetuning
from minibert.finetuning.config import METRICS
from minibert.finetuning.tasks import TASKS


def add_data_arguments(p) -> None:
    """The task, its files and how its texts become sequences."""
    g = p.add_argument_group("data")
    g.add_argument("--task", choices=list(TASKS), default="sequence-classification",
                   help="what to fine-tune for: a label per sentence (pair), a tag per word "
                        "(NER, part of speech), or an answer span in a context (SQuAD)")
    g.add_argument("--data", default=None,
                   help="directory with the train, dev and test files (train.tsv ... for "
                        "the classification tasks, train.jsonl ... for QA); default: "
                        + "; ".join(f"{n}: data/{t.data_subdir}" for n, t in TASKS.items()))
    g.add_argument("--train", help="train file (overrides DATA/train.EXT)")
    g.add_argument("--dev", help="dev file (overrides DATA/dev.EXT)")
    g.add_argument("--test", help="test file (overrides DATA/test.EXT); 'none' to skip "
                                  "(question answering: skipped when DATA/test.jsonl is absent)")
    g.add_argument("--labels", metavar="FILE", default=None,
                   help="classification and tagging: the label (tag) set, one per line in "
                        "class-id order; every label of the data must be in it (default: "
                        "the labels of train, dev and test, sorted; a label only dev or "
                        "test has is reported)")
    g.add_argument("--max-seq-length", type=int_at_least(3), default=None,
                   help="tokens per sequence, [CLS]/[SEP] included (default: 128; 384 for "
                        "question-answering; at most the tokenizer's model_max_length). Classification: longest-first truncation; "
                        "tagging: longer sentences are cut into windows at word boundaries "
                        "(with a warning); QA: the context is cut into overlapping windows")
    g.add_argument("--label-all-tokens", action="store_true",
                   help="token-classification: train on every WordPiece of a word (B-X "
                        "becomes I-X on the continuation pieces), not only the first")
    g.add_argument("--doc-stride", type=int_at_least(0), default=128,
                   help="question-answering: tokens two consecutive context windows share")
    g.add_argument("--max-query-length", type=positive_int, default=64,
                   help="question-answering: questions are cut to this many tokens")
    g.add_argument("--n-best-size", type=positive_int, default=20,
                   help="question-answering: start and end candidates per window")
    g.add_argument("--max-answer-length", type=positive_int, default=30,
                   help="question-answering: longest answer, in tokens")


def add_model_arguments(p) -> None:
    """The starting point, the head and what is frozen."""
    g = p.add_argument_group("model")
    g.add_argument("--init", default="runs/pretrain",
                   help="train_mlm.py run dir / checkpoint .npz, finetune.py output dir, or "
                        "Hugging Face BERT dir")
    g.add_argument("--random-init", action="store_true",
                   help="take only the architecture and vocab from --init; fresh weights")
    g.add_argument("--classifier-dropout", type=dropout_probability, default=None,
                   help="dropout before the classifier (default: the model's hidden dropout)")
    g.add_argument("--model", default=None,
                   help="a finetune.py output dir to use for --predict / --plot-attention / "
                        "--export-hf without training (its task and labels come with it)")
    g.add_argument("--pooling", choices=["cls", "mean"], default=None,
                   help="sequence classification: the head reads the pooled [CLS] vector "
                        "(cls) or the mean of the last hidden states over the real tokens "
                        "(mean, no pooler); default: the start's (cls for a pretraining run)")
    g.add_argument("--freeze-embeddings", action="store_true",
                   help="do not train the embeddings (word, position, token type, LayerNorm)")
    g.add_argument("--freeze-layers", type=int_at_least(0), default=0, metavar="N",
                   help="do not train the lowest N encoder layers (0 to num_hidden_layers); "
                        "with --freeze-embeddings too, no backward runs below layer N")


def add_output_arguments(p) -> None:
    """Where the run goes, and what is done with the model afterwards."""
    g = p.add_argument_group("output")
    add_options(g, output_dir="runs/finetune", resume=None, log_every=10, progress=True,
                report_to="none",
                overwrite=dict(default=False, help="replace the run in --output-dir and what "
                               "--export-hf DIR holds (default: refuse to write over them)"))
    g.add_argument("--predict", nargs="+", metavar="TEXT",
                   help="sequence-classification: print each label's probability for TEXT "
                        "(or a pair TEXT_A TEXT_B); token-classification: print word/TAG "
                        "for each word of TEXT (each character for a character-level "
                        "tagger such as Chinese NER); question-answering: QUESTION CONTEXT, "
                        "print the answer span and its score")
    g.add_argument("--plot-attention", nargs="+", metavar="TEXT",
                   help="write OUTPUT_DIR/attention.png (layers x heads maps for TEXT "
                        "[TEXT_B]) and OUTPUT_DIR/attention_cls.png (per layer, what [CLS] "
                        "attends to, averaged over heads)")
    g.add_argument("--explain-dev", type=int_at_least(0), default=0, metavar="N",
                   help="sequence-classification: after training, write OUTPUT_DIR/explain/"
                        "dev-K.html for the first N dev rows (python -m minibert explain)")
    g.add_argument("--export-hf", metavar="DIR",
                   help="also write the best model as a Hugging Face directory: a new or "
                        "empty one, or an earlier export of the same model (else --overwrite)")
    g.add_argument("--export-dtype", choices=["float32", "float16", "bfloat16"],
                   default="float32",
                   help="the weights' type in the --export-hf directory (bfloat16 and float16 "
                        "are rounded to nearest even; the model trains in --dtype either way)")


def parse_args(argv=None) -> tuple[FinetuningConfig, set[str]]:
    """The options as a :class:`~minibert.finetuning.FinetuningConfig`, and the names of
    those given on the command line; options that do not go together end in argparse's
    error exit."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_data_arguments(p)
    add_model_arguments(p)
    distillation.add_task_arguments(
        p.add_argument_group("task distillation (sequence classification)"))
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=positive_int, default=3, help="passes over the train split")
    g.add_argument("--max-train-examples", type=positive_int, default=None,
                   help="use only the first N train rows, sentences (tagging) or "
                        "questions (QA) (quick runs)")
    g.add_argument("--group-by-length", action="store_true",
                   help="batch train rows of similar length (sorted within shuffled "
                        "mega-batches of up to 50 batches, batch order random per epoch; "
                        "HF Trainer's group_by_length): far less padding, faster epochs")
    add_options(g, max_steps=dict(default=None, help="stop after this many optimizer steps "
                                                     "(default: all epochs)"),
                batch_size=32, gradient_accumulation_steps=1, lr=5e-5)
    g.add_argument("--eval-batch-size", type=positive_int, default=64,
                   help="sequences per eval batch")
    g.add_argument("--warmup-proportion", type=float_in(0.0, 1.0), default=0.1,
                   help="share of the steps with linear warmup")
    g.add_argument("--adam-eps", type=positive_float, default=1e-6, help="AdamW epsilon")
    add_options(g, weight_decay=0.01, correct_bias=True, max_grad_norm=1.0,
                max_nonfinite_steps=5,
                eval_every=dict(default=None, help="evaluate on dev (and keep the best "
                                "model) every N steps instead of once per epoch"),
                seed=0, device=None, tf32=False, fast_cpu=True, cuda_graphs=False,
                dtype=dict(default="float32", choices=["float32", "float16", "bfloat16"]))
    g.add_argument("--metric", choices=METRICS, default="auto",
                   help="dev metric that picks the best checkpoint; auto: entity f1 for O / "
                        "B-X / I-X tags, f1 for question-answering, else accuracy. Also "
                        "macro_f1, mcc (sequence-classification); f1, precision, recall "
                        "(token-classification); exact_match (question-answering)")
    distributed.add_arguments(g)
    add_output_arguments(p)
    cfg = FinetuningConfig(**vars(p.parse_args(argv))).with_defaults()
    given = explicit_options(p, argv)
    try:
        cfg.check_combinations(given)
    except ValueError as e:
        p.error(str(e))
    return cfg, given


def main(argv=None) -> int:
    cfg, given = parse_args(argv)
    run_finetuning(cfg, given)
    return 0


if __name__ == "__main__":
    sys.exit(main())
