"""The fine-tuning job (``finetune.py``): from its parsed options to the task's data, the
model, the :class:`~.tasks.FinetuneTask` that :func:`minibert.training.train` runs, and
what is written after it (test metrics, predictions, curves, summary).

The script is the table of contents; each step is one function here:

1. :func:`load_init` (before anything is written): the starting point (``--init``);
2. :func:`read_data`: the task (:mod:`.tasks`), its splits read and encoded;
3. :func:`build_model`: the task's model from the start, resumed weights, frozen parts;
4. :func:`write_run_files` and :func:`schedule`: vocab, labels, config and arguments;
   optimizer steps per epoch and in all;
5. :func:`write_results`: the best dev model on dev and test, predictions, curves and
   ``summary.json``;
6. :func:`use_model`: ``--predict``, ``--plot-attention`` and ``--export-hf`` with a ready
   model (after training, or ``--model DIR`` without it).

Tasks (``--task``; the per-task parts live in :mod:`.tasks`):
sequence-classification (default): TSV with a header, ``label<TAB>sentence`` or
``label<TAB>sentence_a<TAB>sentence_b``; accuracy, macro-F1, MCC.
token-classification: CoNLL ``word<TAB>tag`` files, a blank line between sentences; token
accuracy, and entity precision / recall / F1 (micro and per type) for BIO-like tags; the
most-frequent-tag baseline is printed first.
question-answering: SQuAD v1.1 as JSON lines or nested JSON (train.jsonl, dev.jsonl,
test.jsonl if present); exact match and F1 (percent).

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

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from .. import viz
from ..backend import get_device
from ..atomic import atomic_copy, atomic_write_bytes, atomic_write_json
from ..checkpoint import check_same_config
from ..hf import HFFormatError, save_hf_directory
from ..optim import AdamW
from ..pipelines import for_finetune_task
from ..runs import MetricsLog, RunError, load_start, lock_run_dir, write_args
from ..tokenization import BertTokenizer
from .tasks import make_task, task_for_model

DEFAULT_INIT = "runs/pretrain"
# Arguments a resumed run may change; every other one must match the checkpoint's run.
RESUME_FREE = ("output_dir", "overwrite", "resume", "device", "tf32", "distributed",
               "cuda_aware_mpi", "progress", "log_every", "max_nonfinite_steps",
               "eval_batch_size", "model", "predict", "plot_attention", "export_hf", "test",
               "pooling", "teacher", "distill_alpha", "temperature", "transfer_data")
METRICS = ("auto", "accuracy", "macro_f1", "mcc", "f1", "precision", "recall", "exact_match")
# The value of an argument added later, for checkpoints written before it existed.
RESUME_DEFAULTS = {"group_by_length": False,   # older runs batched unsorted
                   "dtype": "float32",          # and trained in float32,
                   "task": "sequence-classification",  # classified sentences,
                   "label_all_tokens": False, "doc_stride": 128, "max_query_length": 64,
                   "n_best_size": 20, "max_answer_length": 30,
                   "freeze_embeddings": False, "freeze_layers": 0,  # froze nothing
                   "labels": None}              # and had no labels file


def load_init(args):
    """The ``--init`` start (:class:`~minibert.runs.Pretrained`) and its tokenizer.

    Raises:
        RunError: nothing usable there (with a hint when the default ``--init`` has not
            been made yet by ``train_mlm.py``).
    """
    try:
        pre = load_start(args.init)
    except RunError as e:
        if args.init == DEFAULT_INIT and not Path(args.init).exists():
            raise RunError(f"{e} (the default --init is the output of `python "
                           "train_mlm.py`; run that first, or pass --init DIR)") from None
        raise
    return pre, BertTokenizer(pre.vocab_file, **pre.tokenizer_options)


def split_paths(args, task) -> dict[str, Path | None]:
    """The train / dev / test files: ``--train`` / ``--dev`` / ``--test``, else
    DATA/SPLIT.EXT (a task with an optional test split skips a missing DATA/test.EXT;
    ``--test none`` skips it always)."""
    data = Path(args.data)
    paths = {s: Path(getattr(args, s)) if getattr(args, s) else data / f"{s}.{task.ext}"
             for s in ("train", "dev", "test")}
    if args.test and args.test.lower() == "none":
        paths["test"] = None
    elif not args.test and task.test_optional and not paths["test"].exists():
        paths["test"] = None
    return paths


def read_data(args, pre, tokenizer, data_root: Path):
    """The task of ``--task`` and its data: (task, :class:`~.tasks.TaskData`, max_len).
    Fills in ``args.data`` (DATA_ROOT/the task's sample) and ``args.max_seq_length`` (the
    task's default) when not given; max_len is the latter capped at the model's
    positions. Warnings (e.g. sentences cut into windows) go to stderr.

    Raises:
        DatasetError: a missing, empty or malformed split file. ValueError: a ``--metric``
            the task does not have, ``--predict`` with the wrong number of texts.
    """
    task = make_task(args.task, args)
    if args.data is None:
        args.data = str(data_root / task.data_subdir)
    if args.max_seq_length is None:
        args.max_seq_length = task.default_max_seq_length
    max_len = min(args.max_seq_length, pre.config.max_position_embeddings)
    if args.task == "question-answering" and args.predict and len(args.predict) != 2:
        raise ValueError("--predict: question-answering takes QUESTION CONTEXT")
    data = task.read(split_paths(args, task), tokenizer, max_len, args.max_train_examples)
    task.resolve_metric(args.metric, data.labels)
    for line in data.warnings:
        print(f"finetune.py: warning: {line}", file=sys.stderr)
    return task, data, max_len


def freeze(model, args) -> str:
    """Apply ``--freeze-embeddings`` / ``--freeze-layers``; returns a note for the log
    ("" when nothing is frozen).

    Raises:
        ValueError: ``--freeze-layers`` beyond the model's layers.
    """
    L = model.config.num_hidden_layers
    if args.freeze_layers > L:
        raise ValueError(f"--freeze-layers {args.freeze_layers}: the model has {L} encoder "
                         f"layers; give 0 to {L}")
    model.freeze(embeddings=args.freeze_embeddings, layers=args.freeze_layers)
    if not (args.freeze_embeddings or args.freeze_layers):
        return ""
    parts = (["embeddings"] if args.freeze_embeddings else []) + (
        [f"layers 0-{args.freeze_layers - 1}"] if args.freeze_layers else [])
    n = sum(p.data.size for p in model.trainable_parameters())
    return f" (frozen: {' + '.join(parts)}; {n:,} trainable)"


@dataclass
class Built:
    """What :func:`build_model` returns: the model, the log line that describes it and
    the number of trainable parameters."""

    model: Any
    description: str
    trainable: int


def build_model(args, task, pre, data, resumed: dict | None, checkpoint: str) -> Built:
    """The task's model from the start (``--random-init``: its architecture only), with the
    resumed run's weights, frozen as asked, on the current device in ``--dtype``.

    Raises:
        HFFormatError, CheckpointError, KeyError, ValueError: weights or a config that do
            not fit; ``--freeze-layers`` too large.
    """
    model, report = task.build_model(pre, data.labels, seed=args.seed,
                                     random_init=args.random_init,
                                     classifier_dropout=args.classifier_dropout,
                                     classifier_pooling=args.pooling)
    if resumed is not None:
        check_same_config(resumed["config"], model.config, checkpoint)
        model.load_state_dict(resumed["model"])
    frozen = freeze(model, args)
    trainable = int(sum(p.data.size for p in model.trainable_parameters()))
    model.to(get_device(), dtype=np.dtype(args.dtype))
    fresh = ("all weights new (architecture only, random init)" if args.random_init
             else f"new: {report['new']}; not used: {report['unused'] or 'none'}")
    labels, test = data.labels, data.test
    line = (f"{task.name}: {pre.source}, {model.num_parameters():,} parameters{frozen}; "
            f"{fresh}; " + (f"labels {labels}; " if labels and len(labels) <= 20 else "")
            + f"train {len(data.train)}, dev {len(data.dev)}, test "
              f"{len(test) if test else 0} rows; max_seq_length "
              f"{min(args.max_seq_length, pre.config.max_position_embeddings)}; dev metric "
              f"{task.metric}")
    return Built(model, "\n".join([line, *data.notes]), trainable)


def make_optimizer(model, args) -> AdamW:
    """The job's AdamW over the trainable parameters (all of them unless the model was
    frozen in part): ``--lr``, ``--adam-eps``, ``--weight-decay``, ``--no-correct-bias``."""
    return AdamW(model.named_trainable_parameters(), lr=args.lr, eps=args.adam_eps,
                 weight_decay=args.weight_decay, correct_bias=args.correct_bias)


def schedule(args, train_rows: int) -> tuple[int, int]:
    """(optimizer steps per epoch, steps of the run): ceil(ceil(rows / batch) / k) per
    epoch with k = ``--gradient-accumulation-steps``, times ``--epochs``, capped by
    ``--max-steps``."""
    k = args.gradient_accumulation_steps
    per_epoch = -(-(-(-train_rows // args.batch_size)) // k)
    total = per_epoch * args.epochs
    return per_epoch, min(total, args.max_steps) if args.max_steps else total


def write_run_files(args, run, pre, labels, model) -> None:
    """vocab.txt (the start's), labels.json (when there are labels), config.json and
    args.json, each atomically."""
    atomic_copy(pre.vocab_file, run.vocab)
    if labels:
        atomic_write_json(run.path / "labels.json", labels)
    atomic_write_bytes(run.config, model.config.to_json().encode())
    write_args(run, vars(args))


def write_results(args, run, task, data, pre, loop_task, state, timing: dict, built: Built,
                  xp):
    """Rebuild the best dev model (``best_model.npz``), evaluate it on dev and test, write
    the predictions, ``training_curves.png`` and ``summary.json``; returns the model.

    ``timing``: ``seconds`` of this run, ``steps`` it made and ``per_epoch`` steps."""
    model, _ = task.build_model(load_start(run.path), data.labels)
    model.to(get_device())
    seconds, train_s = timing["seconds"], timing["seconds"] - loop_task.eval_seconds
    summary = {"task": task.name, "init": pre.source, "random_init": args.random_init,
               "labels": data.labels, "metric": task.metric,
               "best_step": loop_task.best["step"], "dev": None, "test": None,
               "steps": state.step, "epochs": args.epochs, "teacher": args.teacher,
               "pooling": model.config.classifier_pooling,
               "seconds_this_run": round(seconds, 1),
               "seconds_total": round(state.elapsed_s, 1),
               "max_seq_length": min(args.max_seq_length, pre.config.max_position_embeddings),
               "freeze_embeddings": args.freeze_embeddings,
               "freeze_layers": args.freeze_layers, "trainable_parameters": built.trainable,
               "train_seconds_this_run": round(train_s, 1),
               "train_seconds_per_epoch": round(train_s / max(timing["steps"], 1)
                                                * timing["per_epoch"], 1)}
    if data.label_set is not None:
        summary.update(data.label_set.record())
    if data.baseline is not None:
        summary["most_frequent_tag_baseline"] = data.baseline
    for name, split in (("dev", data.dev), ("test", data.test)):
        if split is not None:
            summary[name], pred = task.evaluate(model, split, args.eval_batch_size, xp)
            task.write_predictions(run.path, name, split, pred, data.labels)
    if data.test is not None:
        print(f"test (best step {loop_task.best['step']}): {task.describe(summary['test'])}")
    log = MetricsLog.read(run.metrics)
    real = sum(r.get("real_tokens", 0) for r in log if r["kind"] == "train")
    padded = sum(r.get("padded_tokens", 0) for r in log if r["kind"] == "train")
    summary["group_by_length"] = args.group_by_length
    summary["padding_fraction"] = round(1.0 - real / padded, 4) if padded else None
    viz.plot_training_curves([r for r in log if r["kind"] == "train"],
                             [{k.removeprefix("dev_"): v for k, v in r.items()}
                              for r in log if r["kind"] == "eval"],
                             run.path / "training_curves.png", metrics=task.curve_metrics,
                             title=f"fine-tuning ({task.name}) from {pre.source}")
    atomic_write_json(run.summary, summary)
    print(f"wrote {run.best_model} (best dev {task.metric} {loop_task.best['metric']:.4f} at "
          f"step {loop_task.best['step']}), predictions, training_curves.png, summary.json")
    return model


def load_model(args, given: set[str]):
    """``--model DIR``: the fine-tuned model, its task (options given on the command line
    override the saved settings), tokenizer and start, on the current device.

    Raises:
        RunError: not a fine-tuned model, or another task than ``--task``.
        HFFormatError, KeyError, ValueError: weights that do not fit.
    """
    pre = load_start(args.model, "--model")
    task = task_for_model(pre, SimpleNamespace(**{k: getattr(args, k) for k in given}))
    if task is None:
        raise RunError(f"--model {args.model}: not a fine-tuned model (no task and label set "
                       "saved)")
    if "task" in given and args.task != task.name:
        raise RunError(f"--task {args.task}: --model {args.model} is a {task.name} model")
    try:
        model, _ = task.build_model(pre, pre.labels)
        tokenizer = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    except (HFFormatError, KeyError, ValueError) as e:
        raise RunError(f"--model {args.model}: {e}") from None
    model.to(get_device())
    return task, model, tokenizer, pre


def use_model(args, task, model, tokenizer, labels, pre, xp, out: Path) -> None:
    """``--predict`` (the pipeline's result, one JSON line), ``--plot-attention`` (attention.png
    and attention_cls.png in ``out``) and ``--export-hf`` with a ready model, its
    ``labels`` (None for QA) and the start ``pre`` whose vocab and tokenizer options it uses.

    Raises:
        ValueError: texts the task cannot take (``--predict: ...``). HFFormatError,
            OSError: the export directory cannot be written (``--export-hf DIR: ...``).
    """
    if args.predict:
        pipe = for_finetune_task(task, model, tokenizer, labels)
        t = args.predict
        if task.name == "question-answering" and len(t) != 2:
            raise ValueError("--predict: question-answering takes QUESTION CONTEXT")
        if task.name == "sequence-classification" and len(t) > 2:
            raise ValueError("--predict: sequence-classification takes TEXT [TEXT_B]")
        inputs = {"question-answering": lambda: {"question": t[0], "context": t[1]},
                  "token-classification": lambda: " ".join(t),
                  "sequence-classification": lambda: {"text": t[0], "text_pair": (
                      t[1] if len(t) > 1 else None)}}[task.name]()
        options = {"top_k": None} if task.name == "sequence-classification" else {}
        try:
            result = pipe(inputs, **options)
        except ValueError as e:
            raise ValueError(f"--predict: {e}") from None
        print(json.dumps(result, ensure_ascii=False))
    if args.plot_attention:
        lock_run_dir(out)  # its one writer (RunError: another job owns it)
        for path in viz.plot_attention(model, tokenizer, args.plot_attention,
                                       task.max_len(model.config), xp, out):
            print(f"wrote {path}")
    if args.export_hf:
        try:
            d = save_hf_directory(model, args.export_hf, pre.vocab_file,
                                  dict(enumerate(labels)) if labels else None,
                                  pre.tokenizer_options)
        except (HFFormatError, OSError) as e:
            raise ValueError(f"--export-hf {args.export_hf}: {e}") from None
        print(f"wrote Hugging Face directory {d}")
