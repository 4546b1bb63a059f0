#!/usr/bin/env python
"""Fine-tune a BERT for sentence (pair) classification, token classification or extractive
question answering (Devlin et al. 2019, 4.1, 4.2, 5.3).

    python finetune.py --init runs/pretrain                 # our train_mlm.py run, movie reviews
    python finetune.py --init path/to/hf-bert-dir --data ../shared/data/classify/en/sms_spam
    python finetune.py --task token-classification --init DIR      # Brown POS tags
    python finetune.py --task token-classification --init DIR --data data/tag/zh/peoples_daily_ner
    python finetune.py --task question-answering --init DIR        # SQuAD v1.1 sample
    python finetune.py --model runs/finetune --predict "a gripping, beautiful film"
    python finetune.py --model runs/qa --predict "Who wrote it?" "It was written by Ann."
    python finetune.py --model runs/finetune --plot-attention "a gripping, beautiful film"

Tasks (--task; the per-task parts live in minibert/finetuning/tasks.py):
sequence-classification (default): TSV with a header, ``label<TAB>sentence`` or
``label<TAB>sentence_a<TAB>sentence_b``; accuracy, macro-F1, MCC.
token-classification: CoNLL ``word<TAB>tag`` files, a blank line between sentences; token
accuracy, and entity precision / recall / F1 (micro and per type) for BIO-like tags; the
most-frequent-tag baseline is printed first.
question-answering: SQuAD v1.1 as JSON lines or nested JSON (train.jsonl, dev.jsonl,
test.jsonl if present); exact match and F1 (percent).
Splits: --train/--dev/--test, or --data DIR with train/dev/test files (default: the
embedded sample of each task). The label (tag) set comes from the train split and is saved
with the model. Start: --init a train_mlm.py run directory or checkpoint, a finetune.py
output, or a Hugging Face BERT directory (the head is new unless it is the same task's
head with the same labels). --freeze-embeddings / --freeze-layers N train only the layers
above. --pooling mean: the sentence classifier reads the mean of the last hidden states
instead of the pooled [CLS]. --teacher DIR (task distillation): a fine-tuned classifier's
soft labels join the gold ones (--distill-alpha, --temperature; --transfer-data adds
unlabelled rows that only the teacher labels; minibert/distillation/task.py).
Training: minibert.training's loop (AdamW with warmup and linear decay, global-norm
clipping, gradient accumulation), dynamic padding per batch
(--group-by-length: batches of rows of similar length, as HF's Trainer; train records
then show little padding, see ``padding_fraction``); dev metrics after every epoch; the
best dev model is kept in OUTPUT_DIR/best_model.npz and the resumable state in
OUTPUT_DIR/checkpoint.npz (--resume); then test metrics and predictions. Writes to
--output-dir (see minibert.runs): checkpoint.npz, best_model.npz, vocab.txt, labels.json,
config.json, args.json, metrics.jsonl, summary.json, predictions_{dev,test}.tsv (QA also
predictions_{dev,test}.json), training_curves.png.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from minibert import backend, distributed
from minibert.atomic import atomic_copy, atomic_write_bytes, atomic_write_json
from minibert.backend import to_numpy
from minibert.checkpoint import CheckpointError, check_same_config, load_checkpoint
from minibert.cli import (dropout_probability, explicit_options, fail as _fail, float_in,
                          int_at_least,
                          non_negative_float, positive_float, positive_int)
from minibert.finetuning import DatasetError
from minibert.distillation import SoftTargets, read_transfer, teacher_logits, with_transfer_rows
from minibert.finetuning.tasks import TASKS, FinetuneTask, make_task, task_for_model
from minibert.hf import HFFormatError, save_hf_directory
from minibert.optim import AdamW
from minibert.runs import (MetricsLog, RunDir, RunError, load_start, prepare_run_dir, resume_args,
                           write_args)
from minibert.tokenization import BertTokenizer
from minibert.training import (TrainingConfig, TrainingError, TrainState, resume_state,
                               train)

DATA_ROOT = Path(__file__).resolve().parent / "data"
DEFAULT_DATA = DATA_ROOT / TASKS["sequence-classification"].data_subdir
METRICS = ("auto", "accuracy", "macro_f1", "mcc", "f1", "precision", "recall", "exact_match")


def parse_args(argv=None) -> tuple[argparse.Namespace, set[str]]:
    """The arguments, and the names of those given on the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
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
    g.add_argument("--max-seq-length", type=int_at_least(3), default=None,
                   help="tokens per sequence, [CLS]/[SEP] included (default: 128; 384 for "
                        "question-answering). Classification: longest-first truncation; "
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
    g = p.add_argument_group("task distillation (sequence classification)")
    g.add_argument("--teacher", metavar="DIR", default=None,
                   help="a fine-tuned sequence classifier (finetune.py output or Hugging "
                        "Face directory) with the same labels: the student also learns from "
                        "its soft labels (Hinton et al. 2015)")
    g.add_argument("--distill-alpha", type=float_in(0.0, 1.0), default=0.5,
                   help="weight of the soft-label loss; 1 - it weighs the gold-label loss")
    g.add_argument("--temperature", type=positive_float, default=2.0,
                   help="softmax temperature of the soft labels (the loss is scaled by T^2)")
    g.add_argument("--transfer-data", metavar="FILE", default=None,
                   help="unlabelled in-domain text, one 'sentence' or 'sentence_a<TAB>"
                        "sentence_b' per line, added to the train rows with the teacher's "
                        "soft labels only (the transfer set of Turc et al. 2019)")
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=positive_int, default=3, help="passes over the train split")
    g.add_argument("--max-steps", type=positive_int, default=None,
                   help="stop after this many optimizer steps (default: all epochs)")
    g.add_argument("--max-train-examples", type=positive_int, default=None,
                   help="use only the first N train rows, sentences (tagging) or "
                        "questions (QA) (quick runs)")
    g.add_argument("--batch-size", type=positive_int, default=32,
                   help="sequences per micro-batch (per step: batch size x accumulation)")
    g.add_argument("--gradient-accumulation-steps", type=positive_int, default=1,
                   help="micro-batches whose gradients are summed (each weighted 1/k) per step")
    g.add_argument("--group-by-length", action="store_true",
                   help="batch train rows of similar length (sorted within shuffled "
                        "mega-batches of up to 50 batches, batch order random per epoch; "
                        "HF Trainer's group_by_length): far less padding, faster epochs")
    g.add_argument("--eval-batch-size", type=positive_int, default=64, help="sequences per eval batch")
    g.add_argument("--lr", type=non_negative_float, default=5e-5, help="peak learning rate")
    g.add_argument("--warmup-proportion", type=float_in(0.0, 1.0), default=0.1,
                   help="share of the steps with linear warmup")
    g.add_argument("--weight-decay", type=non_negative_float, default=0.01, help="decoupled weight decay")
    g.add_argument("--adam-eps", type=positive_float, default=1e-6, help="AdamW epsilon")
    g.add_argument("--no-correct-bias", dest="correct_bias", action="store_false",
                   help="BERT's AdamW without bias correction (default: bias-corrected, as "
                        "torch.optim.AdamW)")
    g.add_argument("--max-grad-norm", type=non_negative_float, default=1.0,
                   help="global-norm clipping threshold (0: no clipping)")
    g.add_argument("--max-nonfinite-steps", type=positive_int, default=5,
                   help="stop after this many steps in a row with a non-finite loss or "
                        "gradient norm (each such step is skipped)")
    g.add_argument("--metric", choices=METRICS, default="auto",
                   help="dev metric that picks the best checkpoint; auto: accuracy "
                        "(sequence-classification; token-classification with tags that are "
                        "not entity tags, e.g. part of speech), entity f1 "
                        "(token-classification with O / B-X / I-X tags), f1 "
                        "(question-answering). accuracy, macro_f1, mcc: "
                        "sequence-classification; accuracy, f1, precision, recall: "
                        "token-classification; exact_match, f1: question-answering")
    g.add_argument("--eval-every", type=positive_int, default=None,
                   help="evaluate on dev (and keep the best model) every N steps instead "
                        "of once per epoch")
    g.add_argument("--seed", type=int_at_least(0), default=0, help="seed of head init, shuffling, dropout")
    g.add_argument("--device", choices=list(backend.DEVICES), default=None,
                   help="cpu or cuda (default: $MINIBERT_DEVICE or cpu)")
    g.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                   help="training dtype; float16 is mixed precision: float16 compute, float32 "
                        "master weights, dynamic loss scaling (for GPUs; NumPy's float16 is slow)")
    distributed.add_arguments(g)
    g.add_argument("--tf32", action="store_true",
                   help="let float32 matmuls use TF32 tensor cores (--device cuda, Ampere+)")
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", default="runs/finetune", help="where everything is written")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the run in --output-dir (default: refuse to write over it)")
    g.add_argument("--resume", nargs="?", const="", default=None, metavar="DIR",
                   help="continue the fine-tuning run in DIR (default: --output-dir) from "
                        "its checkpoint")
    g.add_argument("--log-every", type=positive_int, default=10, help="steps between train records")
    g.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars")
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
    g.add_argument("--export-hf", metavar="DIR",
                   help="also write the best model as a Hugging Face directory")
    args = p.parse_args(argv)
    given = explicit_options(p, argv)
    if args.resume:
        args.output_dir = args.resume
    if not args.teacher and (stray := [n for n in ("distill_alpha", "temperature",
                                                   "transfer_data") if n in given]):
        p.error(f"--{stray[0].replace('_', '-')} goes with --teacher")
    if args.teacher and args.task != "sequence-classification":
        p.error(f"--teacher: task distillation is for --task sequence-classification, "
                f"not {args.task}")
    if args.pooling and args.task != "sequence-classification":
        p.error(f"--pooling: for --task sequence-classification, not {args.task}")
    for name in ("predict", "plot_attention"):
        if getattr(args, name) and len(getattr(args, name)) > 2:
            p.error(f"--{name.replace('_', '-')} takes one text or a pair of texts")
    return args, given


def fail(message: str):
    _fail("finetune.py", message)


def split_paths(args, task) -> dict[str, Path | None]:
    """The train / dev / test files: --train / --dev / --test, else DATA/SPLIT.EXT (a
    task with an optional test split skips a missing DATA/test.EXT)."""
    data = Path(args.data)
    paths = {s: Path(getattr(args, s)) if getattr(args, s) else data / f"{s}.{task.ext}"
             for s in ("train", "dev", "test")}
    if args.test and args.test.lower() == "none":
        paths["test"] = None
    elif not args.test and task.test_optional and not paths["test"].exists():
        paths["test"] = None
    return paths


def encode_texts(tokenizer, texts, max_len, xp):
    enc = tokenizer(texts[0], texts[1] if len(texts) > 1 else None, truncation=True,
                    max_length=max_len, return_tensors="np")
    ids, tt = enc["input_ids"][None], enc["token_type_ids"][None]
    return xp.asarray(ids), xp.asarray(tt), xp.asarray(np.ones_like(ids)), ids[0]


def plot_attention(model, tokenizer, texts, max_len, xp, out: Path) -> list[Path]:
    """OUTPUT_DIR/attention.png (layers x heads) and attention_cls.png ([CLS] per layer)."""
    from minibert.viz import plot_attention_grid, plot_cls_attention
    ids, tt, mask, host_ids = encode_texts(tokenizer, texts, max_len, xp)
    model.eval()
    maps = [to_numpy(a) for a in model(ids, tt, mask, output_attentions=True).attentions]
    tokens = tokenizer.convert_ids_to_tokens([int(i) for i in host_ids])
    title = " | ".join(texts)
    return [plot_attention_grid(maps, tokens, out / "attention.png", title=title),
            plot_cls_attention(maps, tokens, out / "attention_cls.png",
                               title=f"what [CLS] attends to, mean over heads: {title}")]


# Arguments that must match between a checkpoint's run and a resumed run.
RESUME_FIXED = ("task", "data", "train", "dev", "max_seq_length", "label_all_tokens",
                "doc_stride", "max_query_length", "n_best_size", "max_answer_length", "init",
                "random_init", "classifier_dropout", "freeze_embeddings", "freeze_layers",
                "epochs", "max_steps", "max_train_examples", "batch_size",
                "gradient_accumulation_steps", "group_by_length", "lr", "warmup_proportion",
                "weight_decay", "adam_eps", "correct_bias", "max_grad_norm", "metric",
                "eval_every", "seed", "dtype")
# The value of an argument added later for checkpoints written before it existed.
RESUME_DEFAULTS = {"group_by_length": False,   # older runs batched unsorted
                   "dtype": "float32",          # and trained in float32,
                   "task": "sequence-classification",  # classified sentences,
                   "label_all_tokens": False, "doc_stride": 128, "max_query_length": 64,
                   "n_best_size": 20, "max_answer_length": 30,
                   "freeze_embeddings": False, "freeze_layers": 0}  # froze nothing


def soft_targets(args, tokenizer, train_split, labels, max_len, xp):
    """(train split with the --transfer-data rows, SoftTargets) for --teacher: the teacher
    labels every train row once, before training."""
    try:
        teacher = load_start(args.teacher)
    except (RunError, CheckpointError, HFFormatError, ValueError) as e:
        fail(f"--teacher {args.teacher}: {e}")
    try:
        if args.transfer_data:
            rows = read_transfer(args.transfer_data)
            train_split = with_transfer_rows(train_split, tokenizer, rows, max_len)
        logits = teacher_logits(teacher, train_split.examples, labels, max_len,
                                args.eval_batch_size, xp)
    except (HFFormatError, DatasetError, ValueError) as e:
        fail(f"--transfer-data {e}" if isinstance(e, DatasetError) else str(e))
    gold = np.asarray(train_split.labels) >= 0
    agree = float((logits[gold].argmax(-1) == np.asarray(train_split.labels)[gold]).mean())
    print(f"teacher {teacher.source}: soft labels for {len(train_split)} train rows "
          f"({int((~gold).sum())} from --transfer-data), its train accuracy {agree:.4f}; "
          f"loss = {1 - args.distill_alpha:g} * CE + {args.distill_alpha:g} * "
          f"{args.temperature:g}^2 * KL at T = {args.temperature:g}")
    return train_split, SoftTargets(logits, args.distill_alpha, args.temperature)


def make_optimizer(model, args) -> AdamW:
    """finetune.py's AdamW over the trainable parameters (all of them unless the model
    was frozen in part; also bench/bench_finetune.py's minibert side)."""
    return AdamW(model.named_trainable_parameters(), lr=args.lr, eps=args.adam_eps,
                 weight_decay=args.weight_decay, correct_bias=args.correct_bias)


def freeze(model, args) -> str:
    """Apply --freeze-embeddings / --freeze-layers; returns a note for the log ("" when
    nothing is frozen). Stops with an error line when N exceeds the model's layers."""
    L = model.config.num_hidden_layers
    if args.freeze_layers > L:
        fail(f"--freeze-layers {args.freeze_layers}: the model has {L} encoder layers; give "
             f"0 to {L}")
    model.freeze(embeddings=args.freeze_embeddings, layers=args.freeze_layers)
    if not (args.freeze_embeddings or args.freeze_layers):
        return ""
    parts = (["embeddings"] if args.freeze_embeddings else []) + (
        [f"layers 0-{args.freeze_layers - 1}"] if args.freeze_layers else [])
    n = sum(p.data.size for p in model.trainable_parameters())
    return f" (frozen: {' + '.join(parts)}; {n:,} trainable)"


def use_model(args, given, xp, device) -> int:
    """--model DIR: predict, plot or export with a fine-tuned model, no training. The
    task, labels and settings come from the model; options given here override them."""
    try:
        pre = load_start(args.model, "--model")
    except RunError as e:
        fail(str(e))
    task = task_for_model(pre, SimpleNamespace(**{k: getattr(args, k) for k in given}))
    if task is None:
        fail(f"--model {args.model}: not a fine-tuned model (no task and label set saved)")
    if "task" in given and args.task != task.name:
        fail(f"--task {args.task}: --model {args.model} is a {task.name} model")
    try:
        model, _ = task.build_model(pre, pre.labels)
        tokenizer = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    except (HFFormatError, KeyError, ValueError) as e:
        fail(f"--model {args.model}: {e}")
    model.to(device)
    out = Path(args.output_dir) if args.output_dir != "runs/finetune" else Path(args.model)
    finish(args, task, model, tokenizer, pre.labels, pre.vocab_file, pre.tokenizer_options,
           xp, out)
    return 0


def main(argv=None) -> int:
    args, given = parse_args(argv)
    if args.export_hf and Path(args.export_hf).exists() and not Path(args.export_hf).is_dir():
        fail(f"--export-hf {args.export_hf}: is a file, not a directory")
    comm = distributed.start(args, fail)
    leader = comm.is_leader
    if args.model and comm.world_size > 1:
        fail("--model (predict / plot / export) runs in one process; start it without mpirun")
    try:
        device = backend.set_device(args.device)
        if args.tf32:
            backend.set_tf32(True)
    except backend.BackendError as e:
        fail(str(e))
    xp = backend.xp_for(device)
    if args.model:
        return use_model(args, given, xp, device)

    # ---- starting point, run directory, data ------------------------------------------
    resume = args.resume is not None
    resumed = None
    if not leader:  # rank 0 checks and prepares the run directory first
        comm.barrier()
    try:
        if resume:  # the run's own arguments, unless given here
            run = (prepare_run_dir(args.output_dir, "finetune", resume=True) if leader
                   else RunDir(Path(args.output_dir), "finetune"))
            resumed = load_checkpoint(run.checkpoint)
            resume_args(args, RESUME_DEFAULTS | resumed["trainer"].get("args", {}),
                        RESUME_FIXED, given, str(run.checkpoint))
        pre = load_start(args.init)
        if not resume:
            run = (prepare_run_dir(args.output_dir, "finetune", overwrite=args.overwrite)
                   if leader else RunDir(Path(args.output_dir), "finetune"))
        tokenizer = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    except (RunError, CheckpointError, ValueError) as e:
        msg = str(e)
        if args.init == "runs/pretrain" and not Path(args.init).exists():
            msg += (" (the default --init is the output of `python train_mlm.py`; run that "
                    "first, or pass --init DIR)")
        fail(msg)
    if leader:
        comm.barrier()
    if args.batch_size < comm.world_size:
        fail(f"--batch-size {args.batch_size} is the global batch, split over "
             f"{comm.world_size} ranks: it must be at least {comm.world_size}")
    task = make_task(args.task, args)
    if args.data is None:
        args.data = str(DATA_ROOT / task.data_subdir)
    if args.max_seq_length is None:
        args.max_seq_length = task.default_max_seq_length
    max_len = min(args.max_seq_length, pre.config.max_position_embeddings)
    if args.task == "question-answering" and args.predict and len(args.predict) != 2:
        fail("--predict: question-answering takes QUESTION CONTEXT")
    paths = split_paths(args, task)
    try:
        data = task.read(paths, tokenizer, max_len, args.max_train_examples)
        task.resolve_metric(args.metric, data.labels)
    except (DatasetError, ValueError) as e:
        fail(str(e))
    labels, train_split, dev, test = data.labels, data.train, data.dev, data.test
    for line in data.warnings:
        print(f"finetune.py: warning: {line}", file=sys.stderr)
    soft = None
    if args.teacher:
        train_split, soft = soft_targets(args, tokenizer, train_split, labels, max_len, xp)
    try:
        model, report = task.build_model(pre, labels, seed=args.seed,
                                         random_init=args.random_init,
                                         classifier_dropout=args.classifier_dropout,
                                         classifier_pooling=args.pooling)
        if resumed is not None:
            check_same_config(resumed["config"], model.config, str(run.checkpoint))
            model.load_state_dict(resumed["model"])
    except (HFFormatError, CheckpointError, KeyError, ValueError) as e:
        fail(str(e))
    frozen = freeze(model, args)
    n_trainable = int(sum(p.data.size for p in model.trainable_parameters()))
    model.to(device, dtype=np.dtype(args.dtype))
    fresh = "all weights new (architecture only, random init)" if args.random_init \
        else f"new: {report['new']}; not used: {report['unused'] or 'none'}"
    print(f"{task.name}: {pre.source}, {model.num_parameters():,} parameters{frozen}; {fresh}; "
          + (f"labels {labels}; " if labels and len(labels) <= 20 else "")
          + f"train {len(train_split)}, dev {len(dev)}, test {len(test) if test else 0} "
            f"rows; max_seq_length {max_len}; dev metric {task.metric}")
    for line in data.notes:
        print(line)
    if comm.world_size > 1:
        print(distributed.describe(comm, args.batch_size))
    if leader:
        atomic_copy(pre.vocab_file, run.vocab)
        if labels:
            atomic_write_json(run.path / "labels.json", labels)
        atomic_write_bytes(run.config, model.config.to_json().encode())
        write_args(run, vars(args))

    # ---- training -------------------------------------------------------------------
    k = args.gradient_accumulation_steps
    steps_per_epoch = -(-(-(-len(train_split) // args.batch_size)) // k)
    total = steps_per_epoch * args.epochs
    if args.max_steps:
        total = min(total, args.max_steps)
    opt = make_optimizer(model, args)
    state = TrainState()
    best = None
    if resumed is not None:
        try:
            state = resume_state(resumed, opt)
        except TrainingError as e:
            fail(f"checkpoint {run.checkpoint}: {e}")
        best = resumed["trainer"].get("best")
        print(f"resuming {run.checkpoint} at step {state.step}")
        if note := distributed.resume_notice(state.world_size, comm):
            print(note)
        resumed = None
    loop_task = FinetuneTask(args, run, model, train_split, dev, labels, pre, xp, best, task,
                             soft)
    cfg = TrainingConfig(max_steps=total, lr=args.lr,
                         warmup_steps=int(args.warmup_proportion * total),
                         max_grad_norm=args.max_grad_norm, gradient_accumulation_steps=k,
                         seed=args.seed, log_every=args.log_every,
                         eval_every=args.eval_every or steps_per_epoch, save_every=steps_per_epoch,
                         max_nonfinite_steps=args.max_nonfinite_steps, progress=args.progress,
                         desc="fine-tune")
    t0 = time.perf_counter()
    step0 = state.step
    try:
        state, _ = train(model, opt, loop_task, cfg, state, metrics_path=run.metrics,
                         checkpoint_path=run.checkpoint, comm=comm, device=device)
    except TrainingError as e:
        fail(str(e))
    if not leader:
        return 0
    seconds = time.perf_counter() - t0
    if not run.best_model.exists():  # e.g. --resume of a run whose best was lost
        loop_task.evaluate(state.step)

    # ---- best model: test metrics, predictions, plots ---------------------------------
    best_pre = load_start(run.path)
    model, _ = task.build_model(best_pre, labels)
    model.to(device)
    train_s = seconds - loop_task.eval_seconds
    summary = {"task": task.name, "init": pre.source, "random_init": args.random_init,
               "labels": labels, "metric": task.metric, "best_step": loop_task.best["step"],
               "dev": None, "test": None, "steps": state.step, "epochs": args.epochs,
               "teacher": args.teacher, "pooling": model.config.classifier_pooling,
               "seconds_this_run": round(seconds, 1),
               "seconds_total": round(state.elapsed_s, 1), "max_seq_length": max_len,
               "freeze_embeddings": args.freeze_embeddings,
               "freeze_layers": args.freeze_layers,
               "trainable_parameters": n_trainable,
               "train_seconds_this_run": round(train_s, 1),
               "train_seconds_per_epoch": round(train_s / max(state.step - step0, 1)
                                                * steps_per_epoch, 1)}
    if data.baseline is not None:
        summary["most_frequent_tag_baseline"] = data.baseline
    summary["dev"], dev_pred = task.evaluate(model, dev, args.eval_batch_size, xp)
    task.write_predictions(run.path, "dev", dev, dev_pred, labels)
    if test is not None:
        summary["test"], test_pred = task.evaluate(model, test, args.eval_batch_size, xp)
        task.write_predictions(run.path, "test", test, test_pred, labels)
        print(f"test (best step {loop_task.best['step']}): {task.describe(summary['test'])}")
    from minibert.viz import plot_training_curves
    log = MetricsLog.read(run.metrics)
    real = sum(r.get("real_tokens", 0) for r in log if r["kind"] == "train")
    padded = sum(r.get("padded_tokens", 0) for r in log if r["kind"] == "train")
    summary["group_by_length"] = args.group_by_length
    summary["padding_fraction"] = round(1.0 - real / padded, 4) if padded else None
    plot_training_curves([r for r in log if r["kind"] == "train"],
                         [{k.removeprefix("dev_"): v for k, v in r.items()}
                          for r in log if r["kind"] == "eval"],
                         run.path / "training_curves.png", metrics=task.curve_metrics,
                         title=f"fine-tuning ({task.name}) from {pre.source}")
    atomic_write_json(run.summary, summary)
    print(f"wrote {run.best_model} (best dev {task.metric} {loop_task.best['metric']:.4f} at "
          f"step {loop_task.best['step']}), predictions, training_curves.png, summary.json")
    finish(args, task, model, tokenizer, labels, pre.vocab_file, pre.tokenizer_options, xp,
           run.path)
    return 0


def finish(args, task, model, tokenizer, labels, vocab_file, tok_opts, xp, out: Path) -> None:
    """--predict, --plot-attention and --export-hf with a ready model."""
    if args.predict:
        try:
            lines = task.predict(model, tokenizer, labels, args.predict, xp)
        except ValueError as e:
            fail(f"--predict: {e}")
        for line in lines:
            print(line)
    if args.plot_attention:
        for path in plot_attention(model, tokenizer, args.plot_attention,
                                   task.max_len(model.config), xp, out):
            print(f"wrote {path}")
    if args.export_hf:
        try:
            d = save_hf_directory(model, args.export_hf, vocab_file,
                                  dict(enumerate(labels)) if labels else None, tok_opts)
        except (HFFormatError, OSError) as e:
            fail(f"--export-hf {args.export_hf}: {e}")
        print(f"wrote Hugging Face directory {d}")


if __name__ == "__main__":
    sys.exit(main())
