"""The run directory: what it holds, when a job may write into it, and where a run starts.

A run directory (``--output-dir``) belongs to one run of one job (``pretrain`` or
``finetune``) and holds:

    checkpoint.npz   the latest resumable state: model, optimizer, trainer record
                     (job, step, epoch, position in the epoch, the run's fixed arguments)
    best_model.npz   fine-tuning only: the model with the best dev metric so far
    vocab.txt        the WordPiece vocabulary the model reads
    config.json      the model's BertConfig
    args.json        the job's command-line arguments
    metrics.jsonl    one JSON record per line: {"kind": "train" | "eval" | ..., "step",
                     "elapsed_s", ...}
    summary.json     the job's final numbers

Rules (:func:`prepare_run_dir`): a job never writes into a directory that holds another
run's checkpoint unless ``--overwrite`` is given, so a fine-tuning run can never replace a
pretraining checkpoint; ``--resume`` continues the run whose checkpoint is there (same
job); stale ``*.tmp`` files of a killed write are removed. Every file is written through
:mod:`minibert.atomic`.

Starting points (:func:`load_start`, used by ``finetune.py --init`` and ``train_mlm.py
--init-checkpoint``): a run directory, a checkpoint file with ``vocab.txt`` beside it, or a
Hugging Face BERT directory.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .atomic import atomic_write_bytes, atomic_write_json, remove_stale_tmp
from .checkpoint import CheckpointError, load_checkpoint
from .modeling import BertConfig

CHECKPOINT = "checkpoint.npz"
BEST_MODEL = "best_model.npz"
VOCAB = "vocab.txt"
CONFIG = "config.json"
ARGS = "args.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"


class RunError(ValueError):
    """A run directory or starting point that cannot be used; the message names the
    option and the path."""


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory (see the module docstring)."""

    path: Path
    job: str

    checkpoint = property(lambda self: self.path / CHECKPOINT)
    best_model = property(lambda self: self.path / BEST_MODEL)
    vocab = property(lambda self: self.path / VOCAB)
    config = property(lambda self: self.path / CONFIG)
    args = property(lambda self: self.path / ARGS)
    metrics = property(lambda self: self.path / METRICS)
    summary = property(lambda self: self.path / SUMMARY)


def checkpoint_job(path: str | os.PathLike) -> tuple[str, int]:
    """(job, step) recorded in a checkpoint's trainer record; ("unknown", -1) when the file
    cannot be read (a damaged file still counts as another run's)."""
    try:
        t = load_checkpoint(path, arrays=False)["trainer"]
    except CheckpointError:
        return "unknown", -1
    return _job_of(t), int(t.get("step", -1))


def _job_of(trainer: Mapping[str, Any]) -> str:
    # checkpoints written before the "job" field: a fine-tuned one carries its labels
    return str(trainer.get("job") or ("finetune" if "labels" in trainer else "pretrain"))


def prepare_run_dir(output_dir: str | os.PathLike, job: str, *, resume: bool = False,
                    overwrite: bool = False, option: str = "--output-dir") -> RunDir:
    """Check and create a run directory for ``job`` before anything is written.

    Args:
        output_dir: the directory.
        job: "pretrain" or "finetune".
        resume: the run continues from the checkpoint there.
        overwrite: replace another run: its checkpoint, metrics, summary and other
            outputs are deleted first (its vocab.txt is rewritten by the new run).
    Returns:
        the :class:`RunDir`, created, writable, without stale ``*.tmp`` files.
    Raises:
        RunError: the path is a file or cannot be created or written; it holds another
            run's checkpoint and neither ``resume`` nor ``overwrite`` is set; ``resume``
            without a checkpoint, or with the checkpoint of another job.
    """
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise RunError(f"{option} {path}: is a file, not a directory")
    if resume and not path.is_dir():
        raise RunError(f"--resume {path}: no such run directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(f"{option} {path}: cannot be created ({e.strerror or e})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise RunError(f"{option} {path}: not writable")
    run = RunDir(path, job)
    remove_stale_tmp(path)
    if (path / "cache").is_dir():
        remove_stale_tmp(path / "cache")
    if run.checkpoint.exists():
        if resume:
            try:
                trainer = load_checkpoint(run.checkpoint, arrays=False)["trainer"]
            except CheckpointError as e:
                raise RunError(f"--resume: {e}") from None
            other = _job_of(trainer)
            if other != job:
                raise RunError(f"--resume {path}: its checkpoint is from a {other} run, not "
                               f"{job}")
        elif not overwrite:
            other, step = checkpoint_job(run.checkpoint)
            raise RunError(f"{option} {path}: holds the checkpoint of a {other} run (step "
                           f"{step}); pass --resume to continue it, --overwrite to replace "
                           f"it, or another {option}")
        else:  # nothing of the old run may be read as the new one's (vocab.txt is rewritten)
            for f in (run.checkpoint, run.best_model, run.metrics, run.summary, run.args,
                      run.config, *path.glob("predictions_*.tsv"),
                      *path.glob("predictions_*.json"), *path.glob("*.png"),
                      path / "labels.json"):
                f.unlink(missing_ok=True)
    elif resume:
        raise RunError(f"--resume {path}: no {CHECKPOINT} to resume from")
    return run


# Arguments that belong to an invocation, not to the run: never taken from a checkpoint.
INVOCATION_ARGS = ("output_dir", "resume", "overwrite", "progress", "device",
                   "allow_data_change")


def resume_args(args, saved: Mapping[str, Any], fixed: Sequence[str], given: set[str],
                source: str) -> None:
    """Take into ``args`` (an argparse Namespace, changed in place) the run's own value of
    every saved argument the command line did not give (``given``: the names it did;
    :data:`INVOCATION_ARGS` excepted), so a bare ``--resume DIR`` continues the run as it
    was started.

    Raises:
        RunError: naming every argument in ``fixed`` given with a value other than the
            run's: those decide the data stream, the schedule and the model, so a changed
            value would not continue the same curve.
    """
    diffs = [f"--{k.replace('_', '-')}: checkpoint {saved[k]!r}, now {getattr(args, k)!r}"
             for k in fixed if k in saved and k in given and saved[k] != getattr(args, k)]
    if diffs:
        raise RunError(f"cannot resume {source}: the run's settings differ: " + "; ".join(diffs))
    for k, v in saved.items():
        if k not in given and k not in INVOCATION_ARGS and hasattr(args, k):
            setattr(args, k, v)


def write_args(run: RunDir, args: Mapping[str, Any]) -> None:
    """args.json: the job's arguments as given (JSON-able values)."""
    atomic_write_json(run.args, dict(args))


class MetricsLog:
    """``metrics.jsonl``: one JSON record per line, appended and flushed one line at a time.

    A new run starts the file empty. A resumed run keeps the records up to its checkpoint's
    step and drops the rest, including a torn last line left by a crash (a line that is not
    valid JSON ends the kept part), so the file stays one curve.

    Args:
        path: the file.
        resume_step: the step the run starts from (0 for a new run, which keeps nothing),
            or None to start the file empty.
    """

    def __init__(self, path: str | os.PathLike, resume_step: int | None = None):
        self.path = Path(path)
        kept: list[str] = []
        if resume_step is not None and self.path.exists():
            for line in self.path.read_bytes().decode("utf-8", "replace").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    break
                if isinstance(rec, dict) and int(rec.get("step", 0)) <= resume_step:
                    kept.append(line)
        atomic_write_bytes(self.path, "".join(k + "\n" for k in kept).encode("utf-8"))
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    @staticmethod
    def read(path: str | os.PathLike) -> list[dict]:
        """The records of a metrics.jsonl file, in order (a torn last line is left out)."""
        out = []
        for line in Path(path).read_text("utf-8", "replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return out

    def close(self) -> None:
        self._file.close()


# ---------------------------------------------------------------------------------------
# Starting points
# ---------------------------------------------------------------------------------------

@dataclass
class Pretrained:
    """A starting model resolved by :func:`load_start`.

    config: its BertConfig; state: name -> array (``bert.*`` ...); vocab_file: Path;
    tokenizer_options: BertTokenizer keyword arguments; labels: the label list when the
    source is a fine-tuned classifier, else None; trainer: the checkpoint's trainer record
    ({} for Hugging Face); source: a description for messages; architecture: the class
    whose head the weights carry (``"BertForSequenceClassification"``,
    ``"BertForTokenClassification"``, ``"BertForQuestionAnswering"`` ...): config.json's
    first ``architectures`` entry, a fine-tuning checkpoint's ``architecture`` record
    (``"BertForSequenceClassification"`` for one written before that record, which has
    labels), else None (a pretraining checkpoint).
    """

    config: BertConfig
    state: dict[str, np.ndarray]
    vocab_file: Path
    tokenizer_options: dict[str, Any]
    labels: list[str] | None
    trainer: dict[str, Any]
    source: str
    architecture: str | None = None


def load_start(path: str | os.PathLike, option: str = "--init") -> Pretrained:
    """Resolve a starting model.

    Accepted, in this order:
        * a Hugging Face BERT directory (config.json with model_type bert, weights,
          vocab.txt; see :mod:`minibert.hf`) that is not a minibert run;
        * a fine-tuning run directory: its ``best_model.npz``;
        * a run directory with ``checkpoint.npz``;
        * a checkpoint ``.npz`` file with ``vocab.txt`` beside it.
    The tokenizer's lower-casing comes from the checkpoint's ``tokenizer`` record or the
    run's ``lowercase`` argument, default lower-case.

    Every file is checked before its arrays are read (:mod:`minibert.validation`), and
    the vocabulary may not be longer than the model's ``vocab_size``.

    Raises:
        RunError: nothing usable at ``path``, no vocab.txt beside a checkpoint, or a file
            that cannot be read or fails a check (the message starts with ``option`` and
            names the file).
    """
    from .hf import HFFormatError, is_hf_directory, load_hf_directory
    from .tokenization.vocab import VocabError
    from .validation import UntrustedFileError, check_vocab_fits

    path = Path(path)
    if path.is_dir() and is_hf_directory(path) and not (path / CHECKPOINT).is_file():
        try:
            ck = load_hf_directory(path)
        except (HFFormatError, UntrustedFileError, VocabError) as e:
            raise RunError(f"{option} {e}") from None
        labels = ([ck.id2label[i] for i in range(len(ck.id2label))]
                  if ck.id2label and any(k.startswith("classifier.") for k in ck.state)
                  else None)
        return Pretrained(ck.config, ck.state, ck.vocab_file, ck.tokenizer_options, labels, {},
                          f"Hugging Face directory {path}",
                          ck.architectures[0] if ck.architectures else None)
    if path.is_dir():
        ckpt = path / BEST_MODEL if (path / BEST_MODEL).is_file() else path / CHECKPOINT
    else:
        ckpt = path
    if not ckpt.is_file():
        raise RunError(
            f"{option} {path}: not a Hugging Face BERT directory (config.json + "
            "model.safetensors + vocab.txt), a run directory with checkpoint.npz, or a "
            "checkpoint file")
    vocab = ckpt.parent / VOCAB
    if not vocab.is_file():
        raise RunError(f"{option} {path}: no vocab.txt beside {ckpt}")
    try:
        c = load_checkpoint(ckpt)
        check_vocab_fits(vocab, c["config"].vocab_size, str(ckpt))
    except (CheckpointError, UntrustedFileError, VocabError) as e:
        raise RunError(f"{option} {e}") from None
    trainer = c["trainer"]
    tok = dict(trainer.get("tokenizer") or {})
    if not tok and "lowercase" in trainer.get("args", {}):
        tok = {"do_lower_case": bool(trainer["args"]["lowercase"])}
    tok.setdefault("do_lower_case", True)
    labels = trainer.get("labels")
    arch = trainer.get("architecture") or ("BertForSequenceClassification" if labels else None)
    return Pretrained(c["config"], c["model"], vocab, tok, labels, trainer,
                      f"minibert checkpoint {ckpt}", arch)
