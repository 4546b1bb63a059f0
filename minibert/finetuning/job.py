"""The fine-tuning job (``finetune.py``): from its parsed options to the task's data, the
model, the :class:`~.tasks.FinetuningWorkload` that :func:`minibert.training.train` runs, and
what is written after it (test metrics, predictions, curves, summary).

The script is the table of contents; each step is one function here:

1. :func:`load_init` (before anything is written): the starting point (``--init``);
2. :func:`read_data`: the task (:mod:`.tasks`), its splits read and encoded;
3. :func:`build_finetuning_model`: the task's model from the start, resumed weights, frozen parts;
4. :func:`write_run_files` and :func:`schedule`: vocab, labels, config and arguments;
   optimizer steps per epoch and in all;
5. :func:`write_results`: the best dev model on dev and test, predictions, curves and
   ``summary.json``;
6. :func:`use_finetuned`: ``--predict``, ``--plot-attention`` and ``--export-hf`` with a ready
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
config.json, cfg.json, metrics.jsonl, summary.json, predictions_{dev,test}.tsv (QA also
predictions_{dev,test}.json), training_curves.png.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import distributed, viz
from ..cli import fail, fast_paths_line, job_main, start_job
from ..graphs import status_line, step_function
from ..distillation.task import soft_targets
from ..training import TrainingConfig, TrainingError, train
from ..backend import get_device, resolve_dtype
from ..atomic import atomic_copy, atomic_write_bytes, atomic_write_json
from ..checkpoint import check_same_config
from ..hf import HFFormatError, save_hf_directory
from ..optim import AdamW
from ..pipelines import for_finetune_task
from ..runs import MetricsLog, RunError, load_start, lock_run_dir, write_args
from ..tokenization import BertTokenizer
from .config import DATA_ROOT, DEFAULT_INIT, FinetuningConfig
from .tasks import FinetuningWorkload, make_task, task_for_model

# Arguments a resumed run may change; every other one must match the checkpoint's run.
RESUME_FREE = ("output_dir", "overwrite", "resume", "device", "tf32", "fast_cpu",
               "cuda_graphs", "distributed",
               "cuda_aware_mpi", "progress", "log_every", "max_nonfinite_steps",
               "eval_batch_size", "model", "predict", "plot_attention", "export_hf", "export_dtype",
               "test", "explain_dev", "report_to",
               "pooling", "teacher", "distill_alpha", "temperature", "transfer_data")
# The value of an argument added later, for checkpoints written before it existed.
RESUME_DEFAULTS = {"group_by_length": False,   # older runs batched unsorted
                   "dtype": "float32",          # and trained in float32,
                   "task": "sequence-classification",  # classified sentences,
                   "label_all_tokens": False, "doc_stride": 128, "max_query_length": 64,
                   "n_best_size": 20, "max_answer_length": 30,
                   "freeze_embeddings": False, "freeze_layers": 0,  # froze nothing
                   "labels": None}              # and had no labels file


def load_init(cfg: FinetuningConfig):
    """The ``--init`` start (:class:`~minibert.runs.Pretrained`) and its tokenizer.

    Raises:
        RunError: nothing usable there (with a hint when the default ``--init`` has not
            been made yet by ``train_mlm.py``).
    """
    try:
        pre = load_start(cfg.init)
    except RunError as e:
        if cfg.init == DEFAULT_INIT and not Path(cfg.init).exists():
            raise RunError(f"{e} (the default --init is the output of `python "
                           "train_mlm.py`; run that first, or pass --init DIR)") from None
        raise
    return pre, BertTokenizer(pre.vocab_file, **pre.tokenizer_options)


def split_paths(cfg: FinetuningConfig, task) -> dict[str, Path | None]:
    """The train / dev / test files: ``--train`` / ``--dev`` / ``--test``, else
    DATA/SPLIT.EXT (a task with an optional test split skips a missing DATA/test.EXT;
    ``--test none`` skips it always)."""
    data = Path(cfg.data)
    given = {"train": cfg.train, "dev": cfg.dev, "test": cfg.test}
    paths = {s: Path(f) if f else data / f"{s}.{task.ext}" for s, f in given.items()}
    if cfg.test and cfg.test.lower() == "none":
        paths["test"] = None
    elif not cfg.test and task.test_optional and not paths["test"].exists():
        paths["test"] = None
    return paths


def read_data(cfg: FinetuningConfig, pre, tokenizer, data_root: Path = DATA_ROOT):
    """The task of ``--task`` and its data: (task, :class:`~.tasks.TaskData`, max_len).
    Fills in ``cfg.data`` (DATA_ROOT/the task's sample) and ``cfg.max_seq_length`` (the
    task's default, or the tokenizer's ``model_max_length`` when smaller) when not given;
    max_len is the latter capped at the model's positions. Warnings (e.g. sentences cut into windows) go to stderr.

    Raises:
        DatasetError: a missing, empty or malformed split file. ValueError: a ``--metric``
            the task does not have, ``--predict`` with the wrong number of texts.
    """
    task = make_task(cfg.task, cfg.to_dict())
    if cfg.data is None:
        cfg.data = str(data_root / task.data_subdir)
    if cfg.max_seq_length is None:
        cfg.max_seq_length = min(task.default_max_seq_length,
                                 tokenizer.model_max_length or task.default_max_seq_length)
    max_len = min(cfg.max_seq_length, pre.config.max_position_embeddings)
    if cfg.task == "question-answering" and cfg.predict and len(cfg.predict) != 2:
        raise ValueError("--predict: question-answering takes QUESTION CONTEXT")
    data = task.read(split_paths(cfg, task), tokenizer, max_len, cfg.max_train_examples)
    task.resolve_metric(cfg.metric, data.labels)
    for line in data.warnings:
        print(f"finetune.py: warning: {line}", file=sys.stderr)
    return task, data, max_len


def freeze(model, cfg) -> str:
    """Apply ``--freeze-embeddings`` / ``--freeze-layers``; returns a note for the log
    ("" when nothing is frozen).

    Raises:
        ValueError: ``--freeze-layers`` beyond the model's layers.
    """
    L = model.config.num_hidden_layers
    if cfg.freeze_layers > L:
        raise ValueError(f"--freeze-layers {cfg.freeze_layers}: the model has {L} encoder "
                         f"layers; give 0 to {L}")
    model.freeze(embeddings=cfg.freeze_embeddings, layers=cfg.freeze_layers)
    if not (cfg.freeze_embeddings or cfg.freeze_layers):
        return ""
    parts = (["embeddings"] if cfg.freeze_embeddings else []) + (
        [f"layers 0-{cfg.freeze_layers - 1}"] if cfg.freeze_layers else [])
    n = sum(p.data.size for p in model.trainable_parameters())
    return f" (frozen: {' + '.join(parts)}; {n:,} trainable)"


@dataclass
class Built:
    """What :func:`build_finetuning_model` returns: the model, the log line that describes it and
    the number of trainable parameters."""

    model: Any
    description: str
    trainable: int


def build_finetuning_model(cfg: FinetuningConfig, task, pre, data, resumed: dict | None,
                           checkpoint: str) -> Built:
    """The task's model from the start (``--random-init``: its architecture only), with the
    resumed run's weights, frozen as asked, on the current device in ``--dtype``.

    Raises:
        HFFormatError, CheckpointError, KeyError, ValueError: weights or a config that do
            not fit; ``--freeze-layers`` too large.
    """
    model, report = task.model_from_start(pre, data.labels, seed=cfg.seed,
                                     random_init=cfg.random_init,
                                     classifier_dropout=cfg.classifier_dropout,
                                     classifier_pooling=cfg.pooling)
    if resumed is not None:
        check_same_config(resumed["config"], model.config, checkpoint)
        model.load_state_dict(resumed["model"])
    frozen = freeze(model, cfg)
    trainable = int(sum(p.data.size for p in model.trainable_parameters()))
    model.to(get_device(), dtype=resolve_dtype(cfg.dtype))
    fresh = ("all weights new (architecture only, random init)" if cfg.random_init
             else f"new: {report['new']}; not used: {report['unused'] or 'none'}")
    labels, test = data.labels, data.test
    line = (f"{task.name}: {pre.source}, {model.num_parameters():,} parameters{frozen}; "
            f"{fresh}; " + (f"labels {labels}; " if labels and len(labels) <= 20 else "")
            + f"train {len(data.train)}, dev {len(data.dev)}, test "
              f"{len(test) if test else 0} rows; max_seq_length "
              f"{min(cfg.max_seq_length, pre.config.max_position_embeddings)}; dev metric "
              f"{task.metric}")
    return Built(model, "\n".join([line, *data.notes]), trainable)


def make_optimizer(model, cfg) -> AdamW:
    """The job's AdamW over the trainable parameters (all of them unless the model was
    frozen in part): ``--lr``, ``--adam-eps``, ``--weight-decay``, ``--no-correct-bias``."""
    return AdamW(model.named_trainable_parameters(), lr=cfg.lr, eps=cfg.adam_eps,
                 weight_decay=cfg.weight_decay, correct_bias=cfg.correct_bias)


def schedule(cfg: FinetuningConfig, train_rows: int) -> tuple[int, int]:
    """(optimizer steps per epoch, steps of the run): ceil(ceil(rows / batch) / k) per
    epoch with k = ``--gradient-accumulation-steps``, times ``--epochs``, capped by
    ``--max-steps``."""
    k = cfg.gradient_accumulation_steps
    per_epoch = -(-(-(-train_rows // cfg.batch_size)) // k)
    total = per_epoch * cfg.epochs
    return per_epoch, min(total, cfg.max_steps) if cfg.max_steps else total


def write_run_files(cfg: FinetuningConfig, run, pre, labels, model) -> None:
    """vocab.txt (the start's), labels.json (when there are labels), config.json and
    cfg.json, each atomically."""
    atomic_copy(pre.vocab_file, run.vocab)
    if labels:
        atomic_write_json(run.path / "labels.json", labels)
    atomic_write_bytes(run.config, model.config.to_json().encode())
    write_args(run, cfg.to_dict())


def write_results(cfg: FinetuningConfig, run, task, data, pre, workload, state, timing: dict,
                  built: Built, xp):
    """Rebuild the best dev model (``best_model.npz``), evaluate it on dev and test, write
    the predictions, ``training_curves.png`` and ``summary.json``; returns (the model, the
    summary).

    ``timing``: ``seconds`` of this run, ``steps`` it made and ``per_epoch`` steps."""
    model, _ = task.model_from_start(load_start(run.path, "the run's best model:"),
                                     data.labels)
    model.to(get_device())
    seconds, train_s = timing["seconds"], timing["seconds"] - workload.eval_seconds
    summary = {"task": task.name, "init": pre.source, "random_init": cfg.random_init,
               "labels": data.labels, "metric": task.metric,
               "best_step": workload.best["step"], "dev": None, "test": None,
               "steps": state.step, "epochs": cfg.epochs, "teacher": cfg.teacher,
               "pooling": model.config.classifier_pooling,
               "seconds_this_run": round(seconds, 1),
               "seconds_total": round(state.elapsed_s, 1),
               "max_seq_length": min(cfg.max_seq_length, pre.config.max_position_embeddings),
               "freeze_embeddings": cfg.freeze_embeddings,
               "freeze_layers": cfg.freeze_layers, "trainable_parameters": built.trainable,
               "train_seconds_this_run": round(train_s, 1),
               "train_seconds_per_epoch": round(train_s / max(timing["steps"], 1)
                                                * timing["per_epoch"], 1)}
    if data.label_set is not None:
        summary.update(data.label_set.record())
    if data.baseline is not None:
        summary["most_frequent_tag_baseline"] = data.baseline
    for name, split in (("dev", data.dev), ("test", data.test)):
        if split is not None:
            summary[name], pred = task.evaluate(model, split, cfg.eval_batch_size, xp)
            task.write_predictions(run.path, name, split, pred, data.labels)
    if data.test is not None:
        print(f"test (best step {workload.best['step']}): {task.describe(summary['test'])}")
    log = MetricsLog.read(run.metrics)
    real = sum(r.get("real_tokens", 0) for r in log if r["kind"] == "train")
    padded = sum(r.get("padded_tokens", 0) for r in log if r["kind"] == "train")
    summary["group_by_length"] = cfg.group_by_length
    summary["padding_fraction"] = round(1.0 - real / padded, 4) if padded else None
    viz.plot_training_curves([r for r in log if r["kind"] == "train"],
                             [{k.removeprefix("dev_"): v for k, v in r.items()}
                              for r in log if r["kind"] == "eval"],
                             run.path / "training_curves.png", metrics=task.curve_metrics,
                             title=f"fine-tuning ({task.name}) from {pre.source}")
    atomic_write_json(run.summary, summary)
    print(f"wrote {run.best_model} (best dev {task.metric} {workload.best['metric']:.4f} at "
          f"step {workload.best['step']}), predictions, training_curves.png, summary.json")
    return model, summary


def load_finetuned(cfg: FinetuningConfig, given: set[str]):
    """``--model DIR``: the fine-tuned model, its task (options given on the command line
    override the saved settings), tokenizer and start, on the current device.

    Raises:
        RunError: not a fine-tuned model, or another task than ``--task``.
        HFFormatError, KeyError, ValueError: weights that do not fit.
    """
    pre = load_start(cfg.model, "--model")
    values = cfg.to_dict()
    task = task_for_model(pre, {k: values[k] for k in given if k in values})
    if task is None:
        raise RunError(f"--model {cfg.model}: not a fine-tuned model (no task and label set "
                       "saved)")
    if "task" in given and cfg.task != task.name:
        raise RunError(f"--task {cfg.task}: --model {cfg.model} is a {task.name} model")
    try:
        model, _ = task.model_from_start(pre, pre.labels)
        tokenizer = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    except (HFFormatError, KeyError, ValueError) as e:
        raise RunError(f"--model {cfg.model}: {e}") from None
    model.to(get_device())
    return task, model, tokenizer, pre


def use_finetuned(cfg: FinetuningConfig, task, model, tokenizer, labels, pre, xp,
                  out: Path) -> None:
    """``--predict`` (the pipeline's result, one JSON line), ``--plot-attention`` (attention.png
    and attention_cls.png in ``out``) and ``--export-hf`` with a ready model, its
    ``labels`` (None for QA) and the start ``pre`` whose vocab and tokenizer options it uses.

    Raises:
        ValueError: texts the task cannot take (``--predict: ...``). HFFormatError,
            OSError: the export directory cannot be written (``--export-hf DIR: ...``).
    """
    if cfg.predict:
        pipe = for_finetune_task(task, model, tokenizer, labels)
        t = cfg.predict
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
    if cfg.plot_attention:
        lock_run_dir(out)  # its one writer (RunError: another job owns it)
        for path in viz.plot_attention(model, tokenizer, cfg.plot_attention,
                                       task.max_len(model.config), xp, out):
            print(f"wrote {path}")
    if cfg.export_hf:
        try:
            d = save_hf_directory(model, cfg.export_hf, pre.vocab_file,
                                  dict(enumerate(labels)) if labels else None,
                                  pre.tokenizer_options, dtype=cfg.export_dtype)
        except (HFFormatError, OSError) as e:
            raise ValueError(f"--export-hf {cfg.export_hf}: {e}") from None
        print(f"wrote Hugging Face directory {d}")


@job_main("finetune.py")  # a fault ends in one line; the run directory is let go
def run_finetuning(cfg: FinetuningConfig, given: set[str] | None = None,
                   prog: str = "finetune.py") -> dict | None:
    """Run a fine-tuning job: what ``finetune.py`` does with its options, from Python::

        run_finetuning(FinetuningConfig(init="runs/pretrain", output_dir="runs/ft"))

    With ``cfg.model`` set, no training: ``--predict`` / ``--plot-attention`` /
    ``--export-hf`` with that fine-tuned model (:func:`use_finetuned`).

    Args:
        cfg: the options (``data``, ``max_seq_length`` and, with ``resume``, the run's own
            are filled in place; written to ``args.json``).
        given: the options chosen explicitly (the command line's); a resumed run takes the
            others from its checkpoint, and with ``model`` they override its saved
            settings. Default: the fields that differ from the defaults.
        prog: the name in error lines.
    Returns:
        ``summary.json``'s dict on rank 0 after training; None otherwise.
    Raises:
        SystemExit: bad options or input end the job as the script does, with one
            ``PROG: error: ...`` line on stderr (status 2): the ranges and choices of
            :attr:`FinetuningConfig.CHECKS`, the combinations of
            :meth:`FinetuningConfig.check_combinations`, the start and the data; a fault
            (memory, a failed write, Ctrl-C) ends as :func:`minibert.cli.job_main` says.
    """
    given = cfg.prepare(given, prog)
    if cfg.model:
        _use_saved(cfg, given, prog)
        return None
    job = start_job(cfg, given, prog, "finetune",
                    resume_fixed=[k for k in cfg.to_dict() if k not in RESUME_FREE],
                    resume_defaults=RESUME_DEFAULTS, check=lambda _: load_init(cfg))
    print(fast_paths_line(cfg.fast_cpu, cfg.device))
    print(status_line(cfg.cuda_graphs, cfg.device, job.comm.world_size))
    task, data, built, train_split, soft = _prepare(cfg, job, prog)
    model, comm, run = built.model, job.comm, job.run
    print(built.description)
    if comm.world_size > 1:
        print(distributed.describe(comm, cfg.batch_size))
    pre = job.checked[0]
    if comm.is_leader:
        write_run_files(cfg, run, pre, data.labels, model)
    per_epoch, total = schedule(cfg, len(train_split))
    opt = make_optimizer(model, cfg)
    best = job.resumed["trainer"].get("best") if job.resumed is not None else None
    state = job.train_state(opt, prog)
    workload = FinetuningWorkload(cfg, run, model, train_split, data.dev, data.labels, pre,
                                  job.xp, best, task, soft)
    t0, step0 = time.perf_counter(), state.step
    try:
        state, _ = train(model, opt, workload, training_config(cfg, total, per_epoch), state,
                         metrics_path=run.metrics, checkpoint_path=run.checkpoint, comm=comm,
                         device=job.device, make_step=step_function)
    except TrainingError as e:
        fail(prog, str(e))
    if not comm.is_leader:
        return None
    timing = {"seconds": time.perf_counter() - t0, "steps": state.step - step0,
              "per_epoch": per_epoch}
    return _finish(cfg, job, task, data, workload, state, timing, built, prog)


def _finish(cfg: FinetuningConfig, job, task, data, workload, state, timing: dict,
            built: Built, prog: str) -> dict:
    """After training (rank 0): the best model on dev and test (:func:`write_results`),
    then ``--predict`` / ``--plot-attention`` / ``--export-hf`` with it; the summary."""
    pre, tokenizer = job.checked
    if not job.run.best_model.exists():  # e.g. --resume of a run whose best was lost
        workload.evaluate(state.step)
    try:
        model, summary = write_results(cfg, job.run, task, data, pre, workload, state, timing,
                                       built, job.xp)
    except RunError as e:   # a damaged best_model.npz: the best weights cannot be rebuilt
        best = job.run.best_model
        fail(prog, f"{e}; {best} cannot be rebuilt (the run's checkpoint, {job.run.checkpoint}, "
             f"is kept): delete {best} and go on with python {prog} --resume "
             f"{job.run.path} (the model it ends with then stands in for the best), "
             "or start again with --overwrite")
    try:
        use_finetuned(cfg, task, model, tokenizer, data.labels, pre, job.xp, job.run.path)
    except ValueError as e:
        fail(prog, str(e))
    if cfg.explain_dev:
        explain_dev(model, tokenizer, data.labels, data.dev, cfg.explain_dev,
                    job.run.path / "explain", task.max_len(model.config))
    return summary


def explain_dev(model, tokenizer, labels, dev, n: int, out: Path, max_len: int) -> None:
    """``--explain-dev N``: ``out/dev-K.html`` (K from 1) for the first ``n`` dev rows of
    a sequence classifier, each explaining the row's gold label by integrated gradients
    (:mod:`minibert.attribution`, :mod:`minibert.explain_page`); a row with a text pair
    is explained on its first text."""
    from ..attribution import explain
    from ..explain_page import write_page
    for k, ex in enumerate(dev.examples[:n], 1):
        target = ex.label if ex.label in labels else None
        e = explain(model, tokenizer, ex.text_a, target=target, labels=labels,
                    max_length=max_len)
        path = write_page(e, out / f"dev-{k}.html")
        print(f"wrote {path} (gold {ex.label}, predicted {e.predicted} "
              f"{e.predicted_probability:.3f})")


def _prepare(cfg: FinetuningConfig, job, prog: str):
    """:func:`run_finetuning`'s task, data, model and train rows: (task, data,
    :class:`Built`, train split, soft targets or None); bad input ends the job with
    ``PROG: error: ...``."""
    pre, tokenizer = job.checked
    try:
        task, data, max_len = read_data(cfg, pre, tokenizer)
        train_split, soft = data.train, None
        if cfg.teacher:
            train_split, soft = soft_targets(cfg, tokenizer, data.train, data.labels, max_len,
                                             job.xp)
        built = build_finetuning_model(cfg, task, pre, data, job.resumed,
                                       str(job.run.checkpoint))
    except (ValueError, KeyError) as e:
        fail(prog, str(e))
    return task, data, built, train_split, soft


def _use_saved(cfg: FinetuningConfig, given: set[str], prog: str) -> None:
    """``--model DIR``: predict, plot or export with a fine-tuned model, no training."""
    if (job := start_job(cfg, given, prog)).comm.world_size > 1:
        fail(prog, "--model (predict / plot / export) runs in one process; start it "
                   "without mpirun")
    out = Path(cfg.output_dir) if cfg.output_dir != "runs/finetune" else Path(cfg.model)
    try:
        task, model, tokenizer, pre = load_finetuned(cfg, given)
        use_finetuned(cfg, task, model, tokenizer, pre.labels, pre, job.xp, out)
    except ValueError as e:
        fail(prog, str(e))


def training_config(cfg: FinetuningConfig, total: int, per_epoch: int) -> TrainingConfig:
    """The loop's :class:`~minibert.training.TrainingConfig` of a fine-tuning run of
    ``total`` steps, ``per_epoch`` of them per epoch (dev evaluation and a checkpoint each
    epoch, or every ``eval_every`` steps)."""
    return TrainingConfig(max_steps=total, lr=cfg.lr,
                          warmup_steps=int(cfg.warmup_proportion * total),
                          max_grad_norm=cfg.max_grad_norm,
                          gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                          seed=cfg.seed, log_every=cfg.log_every,
                          eval_every=cfg.eval_every or per_epoch, save_every=per_epoch,
                          max_nonfinite_steps=cfg.max_nonfinite_steps, progress=cfg.progress,
                          desc="fine-tune", report_to=cfg.report_to,
                          cuda_graphs=cfg.cuda_graphs)
