"""The run directory: what it holds, when a job may write into it, and where a run starts.

A run directory (``--output-dir``) belongs to one run of one job (``pretrain`` or
``finetune``) and holds:

    checkpoint.npz   the latest resumable state: model, optimizer, trainer record
                     (job, step, epoch, position in the epoch, the run's fixed arguments)
    checkpoint-stable.npz  pretraining with ``--lr-scheduler-type warmup_stable_decay``:
                     the state at the start of the decay phase, from which ``--resume
                     --max-steps N`` continues a longer run (pretraining/extension.py)
    best_model.npz   fine-tuning only: the model with the best dev metric so far
    vocab.txt        the WordPiece vocabulary the model reads
    config.json      the model's config (BertConfig or AlbertConfig) and its model_type
    args.json        the job's command-line arguments
    metrics.jsonl    one JSON record per line: {"kind": "train" | "eval" | ..., "step",
                     "elapsed_s", ...}
    summary.json     the job's final numbers
    cache/           pretraining only: the token store derived from the corpus and vocab,
                     with its size and SHA-256 records (docs/reliability.md)

    .lock            while a job runs: its lock (:func:`lock_run_dir`), holding its pid

Rules (:func:`prepare_run_dir`): a directory has one owner at a time: every job that
writes one takes an exclusive lock on its ``.lock`` file first (``fcntl.flock``; on Windows
``msvcrt.locking``), before it reads, cleans or writes anything there, and holds it to its
end (the operating system lets it go when the process dies); a second job is refused and
touches nothing. A job never writes into a directory that holds another run's checkpoint
unless ``--overwrite`` is given, so a fine-tuning run can never replace a pretraining
checkpoint; ``--resume`` continues the run whose checkpoint is there (same job); stale
``*.tmp`` files of a killed write are removed, by the owner only. No job writes where its
own inputs are (:func:`check_inputs`). A Hugging Face export goes to an empty or new
directory or over an earlier export of the same model (:func:`prepare_export_dir`). Every
file is written through :mod:`minibert.atomic`.

Starting points (:func:`load_start`, used by ``finetune.py --init`` and ``train_mlm.py
--init-checkpoint``): a run directory, a checkpoint file with ``vocab.txt`` beside it, or a
Hugging Face BERT directory.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .atomic import WriteError, atomic_write_bytes, atomic_write_json, remove_stale_tmp
from .checkpoint import CheckpointError, load_checkpoint
from .modeling import ModelConfig

try:                     # POSIX: flock, held by the open file, let go when it is closed
    import fcntl
except ImportError:      # Windows: a byte-range lock of msvcrt instead
    fcntl = None
try:
    import msvcrt
except ImportError:
    msvcrt = None

CHECKPOINT = "checkpoint.npz"
STABLE_CHECKPOINT = "checkpoint-stable.npz"
BEST_MODEL = "best_model.npz"
VOCAB = "vocab.txt"
CONFIG = "config.json"
ARGS = "args.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
LOCK = ".lock"
EXPORT_MARK = ".minibert-export.json"
# What a run derives from its inputs and reads back (the token store, pretraining/corpus.py):
# --overwrite discards it with the run it replaces.
DERIVED_DIRS = ("cache",)


class RunError(ValueError):
    """A run directory or starting point that cannot be used; the message names the
    option and the path."""


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory (see the module docstring)."""

    path: Path
    job: str

    checkpoint = property(lambda self: self.path / CHECKPOINT)
    stable_checkpoint = property(lambda self: self.path / STABLE_CHECKPOINT)
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


# ---------------------------------------------------------------------------------------
# One owner per directory
# ---------------------------------------------------------------------------------------

@dataclass
class _Held:
    fd: int
    path: Path
    job: str | None = None


_HELD: dict[Path, _Held] = {}  # resolved directory -> this process's lock on it


def lock_run_dir(path: str | os.PathLike, option: str = "--output-dir",
                 job: str | None = None) -> Path:
    """Make this process the one owner of the directory ``path`` (created with its parents
    when missing) before anything there is read, cleaned or written: an exclusive,
    non-blocking lock on ``path/.lock`` (:func:`_lock_file`), which then holds this
    process's pid.

    The lock is held until :func:`release_run_dirs` (the end of the job: the ``.lock`` file
    is removed then) or the end of the process; the operating system lets it go when the
    process dies, so a killed job leaves an unlocked ``.lock`` file that the next owner
    takes over, never a stale lock. A directory this process owns already is returned at
    once (``job``, when given, is recorded for :func:`held_runs`).

    Returns:
        ``path`` as a Path.
    Raises:
        RunError: ``path`` is a file or cannot be created; its lock file cannot be opened
            or written (read-only, permission, disk full); another process holds the lock
            (the message names its pid). Nothing in the directory is changed then.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunError(f"{option} {path}: is a file, not a directory")
    if (held := _HELD.get(path.resolve())) is None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunError(f"{option} {path}: cannot be created ({e.strerror or e})") from None
        held = _HELD[path.resolve()] = _Held(_take_lock(path, option), path)
    held.job = job or held.job
    return path


def _take_lock(path: Path, option: str) -> int:
    """The descriptor of ``path/.lock``, exclusively locked, with this pid written in it.

    The file locked must still be the one at ``path/.lock``: an owner removes it when it
    lets go (:func:`release_run_dirs`), and a file opened just before that is not the
    lock any more, so the open is tried again."""
    lock = path / LOCK
    for _ in range(100):
        try:
            fd = os.open(lock, _LOCK_FLAGS, 0o666)
        except OSError as e:
            raise RunError(f"{option} {path}: not writable ({e.strerror or e})") from None
        try:
            _lock_file(fd)
        except OSError as e:
            holder = _holder(fd) if e.errno in _HELD_ERRNOS else None
            os.close(fd)
            if holder is None:
                raise RunError(f"{option} {path}: cannot be locked ({e.strerror or e})") from None
            raise RunError(f"{option} {path}: in use by another job (pid {holder}); wait for "
                           "it to end, or choose another directory") from None
        if _same_file(fd, lock):
            break
        os.close(fd)
    else:
        raise RunError(f"{option} {path}: cannot be locked (its {LOCK} keeps changing)")
    mine = f"{os.getpid()}\n".encode()
    try:  # in place, not atomically: the lock belongs to this file, not to its name
        _write_start(fd, mine)
        os.ftruncate(fd, len(mine))
    except OSError as e:
        _let_go(fd, lock)
        raise RunError(f"{option} {path}: not writable ({e.strerror or e})") from None
    return fd


# the lock file is opened for reading and writing, created when missing, not inherited by
# child processes (POSIX's O_CLOEXEC; Python's descriptors are not inherited anyway) and
# in binary mode (Windows' O_BINARY: the pid's newline as written)
_LOCK_FLAGS = (os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))
# the byte msvcrt locks: far past the pid at the start, because a Windows lock is
# mandatory (a locked byte cannot even be read) and a second job reads the holder's pid
_MSVCRT_LOCK_AT = 1 << 30
# the errors that mean "another process holds the lock": flock's EWOULDBLOCK / EAGAIN,
# msvcrt.locking's EACCES (EDEADLOCK after retries)
_HELD_ERRNOS = ((errno.EWOULDBLOCK, errno.EAGAIN) if fcntl is not None else
                (errno.EACCES, getattr(errno, "EDEADLOCK", errno.EDEADLK)))


def _lock_file(fd: int) -> None:
    """Lock the open file ``fd`` exclusively, without waiting: ``fcntl.flock`` where there
    is one (Linux, macOS), else one byte of it with ``msvcrt.locking`` (Windows). Both
    locks go when the file is closed or the process dies.

    Raises:
        OSError: another process holds the lock (an errno of :data:`_HELD_ERRNOS`), the
            file cannot be locked, or the system has neither (errno ENOLCK).
    """
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    elif msvcrt is not None:
        os.lseek(fd, _MSVCRT_LOCK_AT, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    else:
        raise OSError(errno.ENOLCK, "this system has no file locks (neither fcntl nor msvcrt)")


def _unlock_file(fd: int) -> None:
    """Let go of :func:`_lock_file`'s lock before ``fd`` is closed: msvcrt's lock is
    released at once this way (Windows may keep it a while after the close); flock's
    goes with the close."""
    if fcntl is None and msvcrt is not None:
        try:
            os.lseek(fd, _MSVCRT_LOCK_AT, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        except OSError:
            pass


def _write_start(fd: int, data: bytes) -> None:
    """Write ``data`` at the start of the file ``fd`` (``os.pwrite``; a seek and a write
    where there is no pwrite: Windows)."""
    if hasattr(os, "pwrite"):
        os.pwrite(fd, data, 0)
        return
    os.lseek(fd, 0, os.SEEK_SET)
    while data:
        data = data[os.write(fd, data):]


def _read_start(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes from the start of the file ``fd`` (``os.pread``, or a seek and a
    read)."""
    if hasattr(os, "pread"):
        return os.pread(fd, n, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, n)


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _let_go(fd: int, lock: Path) -> None:
    """Remove the lock file (while it is still locked, so that no other process can hold
    it) and close it, which releases the lock. On Windows an open file cannot be removed:
    the file stays there, unlocked, and the next owner takes it over."""
    try:
        lock.unlink(missing_ok=True)
    except OSError:  # a read-only directory, or Windows: the file stays, unlocked
        pass
    _unlock_file(fd)
    os.close(fd)


def _holder(fd: int) -> str:
    """The pid written in a lock file that another process holds (it writes its pid just
    after it takes the lock: wait up to half a second for it), or "unknown"."""
    for _ in range(50):
        first, newline, _ = _read_start(fd, 64).decode("ascii", "replace").partition("\n")
        if newline and first.strip().isdigit():
            return first.strip()
        time.sleep(0.01)
    return "unknown"


def release_run_dirs() -> None:
    """Let go of every directory this process owns (:func:`lock_run_dir`): its ``.lock``
    file is removed and the lock released. The end of a job (:func:`minibert.cli.job_main`)."""
    while _HELD:
        held = _HELD.popitem()[1]
        _let_go(held.fd, held.path / LOCK)


def held_runs() -> list[RunDir]:
    """The run directories this process owns, with the job recorded for each, in the
    order they were locked."""
    return [RunDir(h.path, h.job) for h in _HELD.values() if h.job]


def check_inputs(output: str | os.PathLike, inputs: Mapping[str, Any],
                 option: str = "--output-dir") -> None:
    """Refuse an output where the job's own inputs are: no input path (that exists) may be
    ``output`` itself (the same file or directory) or lie inside it. Only paths are
    compared; nothing is read.

    Args:
        output: the directory (or file) the job writes.
        inputs: option name -> a path, a list of paths, or None.
    Raises:
        RunError: naming the output option and the input.
    """
    out = Path(output)
    resolved = out.resolve()
    for name, values in inputs.items():
        for value in [values] if isinstance(values, (str, os.PathLike)) else values or ():
            p = Path(value)
            if not p.exists():
                continue
            r = p.resolve()
            same = r == resolved or (out.exists() and p.samefile(out))
            if same or resolved in r.parents:
                raise RunError(f"{option} {output}: {'is' if same else 'holds'} an input of "
                               f"this job ({name} {value}); a job does not write over its own "
                               f"inputs: choose another {option}")


# What a Hugging Face loader reads from a BERT directory: an export replacing another
# model (--overwrite) removes them all, so that none of the old model's files is read
# beside the new one's (an old tokenizer.json would win over the new vocab.txt).
HF_MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json",
                  "pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5",
                  "flax_model.msgpack", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "added_tokens.json")


def prepare_export_dir(path: str | os.PathLike, source: str | os.PathLike, *,
                       inputs: Mapping[str, Any], overwrite: bool = False,
                       option: str = "--export-hf") -> Path:
    """Take (:func:`lock_run_dir`) and check the directory of a Hugging Face export of the
    model in ``source`` (a run directory), then mark it as that model's export
    (``.minibert-export.json``: ``{"exported_from": the resolved source}``).

    An export goes into a new or empty directory, or over an earlier export of the same
    source; anything else only with ``overwrite``, which first removes the files of
    :data:`HF_MODEL_FILES` there (other files are left alone).

    Args:
        inputs: the job's inputs (option -> path(s)), ``source`` among them; none may be
            the directory or lie inside it (:func:`check_inputs`).
    Returns:
        the directory, created and owned by this process.
    Raises:
        RunError: an input is there, or ``source`` (which a new run creates later); another
            job owns it; it holds files that are not an earlier export of ``source`` and
            ``overwrite`` is not set.
    """
    path = Path(path)
    check_inputs(path, inputs, option)
    target, source = path.resolve(), Path(source).resolve()
    if source == target or target in source.parents:  # source may not exist yet: a new run
        raise RunError(f"{option} {path}: is the directory of the model it exports "
                       f"({source}) or holds it: choose another {option}")
    lock_run_dir(path, option)
    remove_stale_tmp(path)
    mark, source = path / EXPORT_MARK, str(source)
    try:
        earlier = json.loads(mark.read_text(encoding="utf-8")).get("exported_from")
    except (OSError, ValueError, AttributeError):
        earlier = None
    others = sorted(p.name for p in path.iterdir() if p.name not in (LOCK, EXPORT_MARK))
    if others and earlier != source and not overwrite:
        what = (f"the export of another model ({earlier})" if isinstance(earlier, str) else
                f"files that are not a minibert export ({', '.join(others[:4])}"
                f"{', ...' if len(others) > 4 else ''})")
        raise RunError(f"{option} {path}: holds {what}; pass --overwrite to replace them, or "
                       f"choose another {option}")
    if overwrite:
        for name in HF_MODEL_FILES:
            (path / name).unlink(missing_ok=True)
    atomic_write_json(mark, {"exported_from": source})
    return path


def prepare_run_dir(output_dir: str | os.PathLike, job: str, *, resume: bool = False,
                    overwrite: bool = False, option: str = "--output-dir") -> RunDir:
    """Take (:func:`lock_run_dir`), check and create a run directory for ``job`` before
    anything is written there.

    Args:
        output_dir: the directory.
        job: "pretrain", "finetune" or "evaluate".
        resume: the run continues from the checkpoint there.
        overwrite: replace another run: its checkpoint, metrics, summary and other
            outputs are deleted first (its vocab.txt is rewritten by the new run), and so
            is what it derived (:data:`DERIVED_DIRS`: the token store cache).
    Returns:
        the :class:`RunDir`, created, owned by this process, writable, without stale
        ``*.tmp`` files.
    Raises:
        RunError: the path is a file or cannot be created or written; another job owns
            it (nothing there is touched then); it holds another
            run's checkpoint and neither ``resume`` nor ``overwrite`` is set; ``resume``
            without a checkpoint, or with the checkpoint of another job.
    """
    path = Path(output_dir)
    if resume and not path.exists():
        raise RunError(f"--resume {path}: no such run directory")
    lock_run_dir(path, option, job)
    if not os.access(path, os.W_OK | os.X_OK):
        raise RunError(f"{option} {path}: not writable")
    run = RunDir(path, job)
    remove_stale_tmp(path)
    if overwrite and not resume:  # derived state of the run it replaces is not reused
        for name in DERIVED_DIRS:
            shutil.rmtree(path / name, ignore_errors=True)
    if (path / "cache").is_dir():
        remove_stale_tmp(path / "cache")
    if run.checkpoint.exists():
        if resume:
            try:
                trainer = load_checkpoint(run.checkpoint, arrays=False)["trainer"]
            except CheckpointError as e:
                raise RunError(f"--resume: {e}{unusable_checkpoint(run.checkpoint)}") from None
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
            for f in (run.checkpoint, run.stable_checkpoint, run.best_model, run.metrics,
                      run.summary, run.args,
                      run.config, *path.glob("predictions_*.tsv"),
                      *path.glob("predictions_*.json"), *path.glob("*.png"),
                      path / "labels.json"):
                f.unlink(missing_ok=True)
    elif resume:
        raise RunError(f"--resume {path}: no {CHECKPOINT} to resume from")
    return run


def unusable_checkpoint(path: str | os.PathLike) -> str:
    """What to do about the run's checkpoint ``path`` that cannot be read, appended to the
    error: it is the run's state, not derived from anything, so it cannot be rebuilt."""
    return (f"; the checkpoint cannot be rebuilt: restore {path} from a copy, or start the "
            "run again with --overwrite (which deletes it)")


# Arguments that belong to an invocation, not to the run: never taken from a checkpoint.
INVOCATION_ARGS = ("output_dir", "resume", "overwrite", "progress", "device",
                   "allow_data_change", "fast_cpu")


def resume_args(options, saved: Mapping[str, Any], fixed: Sequence[str], given: set[str],
                source: str) -> None:
    """Take into ``options`` (the job's config, :class:`~minibert.cli.JobOptions`, changed in
    place) the run's own value of every saved argument the command line did not give
    (``given``: the names it did; :data:`INVOCATION_ARGS` excepted), so a bare
    ``--resume DIR`` continues the run as it was started.

    Raises:
        RunError: naming every argument in ``fixed`` given with a value other than the
            run's: those decide the data stream, the schedule and the model, so a changed
            value would not continue the same curve.
    """
    diffs = [f"--{k.replace('_', '-')}: checkpoint {saved[k]!r}, now {getattr(options, k)!r}"
             for k in fixed if k in saved and k in given and saved[k] != getattr(options, k)]
    if diffs:
        raise RunError(f"cannot resume {source}: the run's settings differ: " + "; ".join(diffs))
    for k, v in saved.items():
        if k not in given and k not in INVOCATION_ARGS and hasattr(options, k):
            setattr(options, k, v)


def write_args(run: RunDir, values: Mapping[str, Any]) -> None:
    """args.json: the job's options by name (``config.to_dict()``; JSON-able values)."""
    atomic_write_json(run.args, dict(values))


class MetricsLog:
    """``metrics.jsonl``: one JSON record per line, appended and flushed one line at a time.

    A new run starts the file empty. A resumed run keeps the records up to its checkpoint's
    step and drops the rest, including a torn last line left by a crash, so the file stays
    one curve. A line before the last that is not a JSON record with an integer step was
    damaged after it was written: it is left out and the records around it are kept, and
    a ``note:`` line on stderr names the file and the lines (so does a missing or empty
    file of a run resumed past step 0: its records before the checkpoint are gone).

    With ``report_to="tensorboard"`` every record also goes to TensorBoard event files in
    ``tensorboard/`` beside the file (:class:`minibert.reporting.TensorBoardLog`, rebuilt
    from the records kept here, so a resumed run has no step twice there either).

    Args:
        path: the file.
        resume_step: the step the run starts from (0 for a new run, which keeps nothing),
            or None to start the file empty.
        report_to: ``"none"`` or ``"tensorboard"`` (:data:`minibert.reporting.REPORT_TO`).
    """

    def __init__(self, path: str | os.PathLike, resume_step: int | None = None,
                 report_to: str = "none"):
        self.path = Path(path)
        kept: list[str] = []
        damaged: list[int] = []
        lines = (self.path.read_bytes().decode("utf-8", "replace").splitlines()
                 if resume_step is not None and self.path.exists() else [])
        for n, line in enumerate(lines, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                rec = None
            step = rec.get("step", 0) if isinstance(rec, dict) else None
            if not isinstance(step, int) or isinstance(step, bool):
                if n < len(lines):    # the last line may be torn by a crash: no news
                    damaged.append(n)
                continue
            if step <= resume_step:
                kept.append(line)
        if damaged:
            shown = ", ".join(map(str, damaged[:5])) + (", ..." if len(damaged) > 5 else "")
            print(f"note: {self.path}: line(s) {shown} cannot be read (damaged) and are "
                  "left out; the other records are kept", file=sys.stderr)
        elif resume_step and not lines:
            print(f"note: {self.path} is missing or empty; the records before step "
                  f"{resume_step} are lost", file=sys.stderr)
        atomic_write_bytes(self.path, "".join(k + "\n" for k in kept).encode("utf-8"))
        self._file = self.path.open("a", encoding="utf-8")
        self.tensorboard = None
        if report_to == "tensorboard":
            from .reporting import TensorBoardLog
            self.tensorboard = TensorBoardLog(self.path.parent / "tensorboard",
                                              [json.loads(k) for k in kept])

    def write(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` as one line. Raises: WriteError (disk full ...), naming the
        file; a torn line it may leave is dropped on resume."""
        try:
            self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._file.flush()
        except OSError as e:
            raise WriteError(e.errno, e.strerror or str(e), str(self.path)) from e
        if self.tensorboard is not None:
            self.tensorboard.write(record)

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
        """Close the file. Every line was flushed by :meth:`write`, so only a line whose
        write failed (and was reported there) can still be pending: it is dropped."""
        try:
            self._file.close()
        except OSError:
            pass
        if self.tensorboard is not None:
            self.tensorboard.close()


# ---------------------------------------------------------------------------------------
# Starting points
# ---------------------------------------------------------------------------------------

@dataclass
class Pretrained:
    """A starting model resolved by :func:`load_start`.

    config: its BertConfig, or AlbertConfig for an ALBERT (the checkpoint's or
    config.json's ``model_type``); state: name -> array (``bert.*``, ``albert.*`` ...);
    vocab_file: Path;
    tokenizer_options: BertTokenizer keyword arguments; labels: the label list when the
    source is a fine-tuned classifier, else None; trainer: the checkpoint's trainer record
    ({} for Hugging Face); source: a description for messages; architecture: the class
    whose head the weights carry (``"BertForSequenceClassification"``,
    ``"BertForTokenClassification"``, ``"BertForQuestionAnswering"`` ...): config.json's
    first ``architectures`` entry, a fine-tuning checkpoint's ``architecture`` record
    (``"BertForSequenceClassification"`` for one written before that record, which has
    labels), else None (a pretraining checkpoint).
    """

    config: ModelConfig
    state: dict[str, np.ndarray]
    vocab_file: Path
    tokenizer_options: dict[str, Any]
    labels: list[str] | None
    trainer: dict[str, Any]
    source: str
    architecture: str | None = None

    def build(self, role: type, *, random_init: bool = False, **kwargs):
        """A model of ``role`` (a BERT class: ``BertModel``, ``BertForPreTraining``, a head)
        in this start's family (its ALBERT class for an ALBERT start,
        :func:`minibert.auto.model_class`), built on :attr:`config` with ``kwargs`` (e.g.
        ``add_pooling_layer=False``, ``dtype``, ``seed``) and given this start's weights
        unless ``random_init`` (fresh weights: the same architecture and vocab).

        Returns:
            (model, report): ``report`` as :func:`minibert.hf.load_pretrained_weights`
            returns it (which tensors were new, which unused), None with ``random_init``.
        Raises:
            HFFormatError: weights that do not fit the config. ValueError: a role with no
                class in this start's family.
        """
        from .auto import model_class
        from .hf import load_pretrained_weights
        model = model_class(self.config, role)(self.config, **kwargs)
        if random_init:
            return model, None
        return model, load_pretrained_weights(model, self.state, self.source)


def _hf_start(path: Path, option: str) -> Pretrained:
    """:func:`load_start` of a Hugging Face directory (its labels only with a classifier)."""
    from .hf import HFFormatError, load_hf_directory
    from .tokenization.vocab import VocabError
    from .untrusted import UntrustedFileError
    try:
        ck = load_hf_directory(path)
    except (HFFormatError, UntrustedFileError, VocabError) as e:
        raise RunError(f"{option} {e}") from None
    labels = ([ck.id2label[i] for i in range(len(ck.id2label))]
              if ck.id2label and any(k.startswith("classifier.") for k in ck.state) else None)
    return Pretrained(ck.config, ck.state, ck.vocab_file, ck.tokenizer_options, labels, {},
                      f"Hugging Face directory {path}",
                      ck.architectures[0] if ck.architectures else None)


def load_start(path: str | os.PathLike, option: str = "--init") -> Pretrained:
    """Resolve a starting model.

    Accepted, in this order:
        * a Hugging Face BERT or ALBERT directory (config.json with model_type bert or
          albert, weights, vocab.txt or a WordPiece tokenizer.json; see :mod:`minibert.hf`)
          that is not a minibert run;
        * a fine-tuning run directory: its ``best_model.npz``;
        * a run directory with ``checkpoint.npz``;
        * a checkpoint ``.npz`` file with ``vocab.txt`` beside it.
    The tokenizer's lower-casing comes from the checkpoint's ``tokenizer`` record or the
    run's ``lowercase`` argument, default lower-case.

    Every file is checked before its arrays are read (:mod:`minibert.untrusted`), and
    the vocabulary may not be longer than the model's ``vocab_size``.

    Raises:
        RunError: nothing usable at ``path``, no vocab.txt beside a checkpoint, or a file
            that cannot be read or fails a check (the message starts with ``option`` and
            names the file).
    """
    from .hf import is_hf_directory
    from .tokenization.vocab import VocabError, check_vocab_fits
    from .untrusted import UntrustedFileError

    path = Path(path)
    if path.is_dir() and is_hf_directory(path) and not (path / CHECKPOINT).is_file():
        return _hf_start(path, option)
    if path.is_dir():
        ckpt = path / BEST_MODEL if (path / BEST_MODEL).is_file() else path / CHECKPOINT
    else:
        ckpt = path
    if not ckpt.is_file():
        raise RunError(
            f"{option} {path}: not a Hugging Face BERT directory (config.json + "
            "model.safetensors + vocab.txt or tokenizer.json), a run directory with "
            "checkpoint.npz, or a checkpoint file")
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
