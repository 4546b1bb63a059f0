"""What the job scripts share on the command line: range-checked argparse types, the options
several jobs take (defined once here, each with its one range check), the start-of-job
prologue (communicator, device, run directory and its lock, resume), the one way a job
stops on bad input (an ``error:`` line naming the problem, exit status 2, no traceback)
and the one top-level handler of faults (:func:`job_main`: a failed write, memory, Ctrl-C).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial, wraps
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn

from .reporting import report_to_choice


def _stop(line: str, status: int) -> NoReturn:
    """Print ``line`` to stderr and exit with ``status``; with several ranks the line names
    the rank and every rank is stopped (``MPI_Abort``), so none is left waiting in a
    collective."""
    from .distributed import current
    comm = current()
    where = f" [rank {comm.rank} of {comm.world_size}]" if comm.world_size > 1 else ""
    print(f"{line}{where}", file=sys.stderr)
    comm.abort(status)
    sys.exit(status)  # abort does not return


def fail(prog: str, message: str, status: int = 2) -> NoReturn:
    """Print ``PROG: error: MESSAGE`` to stderr and exit with ``status``: 2 (argparse's) for
    bad input, 1 for a fault of the machine (:func:`job_main`). In a data-parallel run the
    line names the rank, and every rank is stopped."""
    _stop(f"{prog}: error: {message}", status)


def _number(kind, text: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def int_at_least(low: int):
    """argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        value = _number(int, text)
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def float_in(low: float, high: float = math.inf, *, low_open: bool = False,
             high_open: bool = False):
    """argparse type: a finite float in [low, high] (ends open where asked)."""
    def parse(text: str) -> float:
        value = _number(float, text)
        if value < low or (low_open and value == low) or value > high or \
                (high_open and value == high):
            if high == math.inf:
                want = f"a number {'>' if low_open else '>='} {low:g}"
            else:
                lo, hi = "(" if low_open else "[", ")" if high_open else "]"
                want = f"a number in {lo}{low:g}, {high:g}{hi}"
            raise argparse.ArgumentTypeError(f"expected {want}, got {value:g}")
        return value
    parse.__name__ = "number"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
probability = float_in(0.0, 1.0)
dropout_probability = float_in(0.0, 1.0, high_open=True)
positive_float = float_in(0.0, low_open=True)
non_negative_float = float_in(0.0)


def explicit_options(parser: argparse.ArgumentParser, argv) -> set[str]:
    """The destinations (``args`` attribute names) of the options given in ``argv``, as
    opposed to those left at their defaults: a resumed run takes the rest from its
    checkpoint."""
    defaults = {a.dest: a.default for a in parser._actions}
    for a in parser._actions:
        a.default = argparse.SUPPRESS
    try:
        given, _ = parser.parse_known_args(argv)
    finally:
        for a in parser._actions:
            a.default = defaults[a.dest]
    return set(vars(given))


# ---------------------------------------------------------------------------------------
# The options several jobs take: flags, type (its range check) and help, defined once. A
# job adds those it takes with its own defaults (add_options); a dict instead of a default
# overrides keywords (e.g. the help text where the meaning of None differs).
# ---------------------------------------------------------------------------------------

def _devices():
    from .backend import DEVICES
    return list(DEVICES)


SHARED_OPTIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "max_steps": (("--max-steps",), dict(type=positive_int, help="optimizer steps")),
    "batch_size": (("--batch-size",), dict(
        type=positive_int, help="sequences per micro-batch (per step: batch size x "
                                "accumulation; the global batch when data parallel)")),
    "gradient_accumulation_steps": (("--gradient-accumulation-steps",), dict(
        type=positive_int,
        help="micro-batches whose gradients are summed (each weighted 1/k) per step")),
    "lr": (("--lr",), dict(type=non_negative_float, help="peak learning rate")),
    "weight_decay": (("--weight-decay",), dict(
        type=non_negative_float,
        help="decoupled weight decay (weight matrices only, not LayerNorm or biases)")),
    "correct_bias": (("--no-correct-bias",), dict(
        dest="correct_bias", action="store_false",
        help="Adam without bias correction, as BERT's optimizer (default: bias-corrected, "
             "as torch.optim.AdamW); over the first ~1000 steps that acts as a several "
             "times larger learning rate")),
    "max_grad_norm": (("--max-grad-norm",), dict(
        type=non_negative_float, help="global-norm clipping threshold (0: no clipping)")),
    "max_nonfinite_steps": (("--max-nonfinite-steps",), dict(
        type=positive_int, help="stop after this many steps in a row with a non-finite loss "
                                "or gradient norm (each such step is skipped)")),
    "seed": (("--seed",), dict(type=non_negative_int,
                               help="seed of weights, data order and dropout")),
    "device": (("--device",), dict(
        choices=_devices(), help="cpu (NumPy) or cuda (CuPy); default: $MINIBERT_DEVICE or cpu")),
    "dtype": (("--dtype",), dict(
        help="parameter and activation dtype; float16 is mixed precision: float16 compute, "
             "float32 master weights, dynamic loss scaling (for GPUs; NumPy's float16 is "
             "slow); bfloat16 (--device cuda only) is the same without loss scaling")),
    "tf32": (("--tf32",), dict(
        action="store_true",
        help="let float32 matmuls use TF32 tensor cores (--device cuda, Ampere+)")),
    "temperature": (("--temperature",), dict(
        type=positive_float,
        help="softmax temperature T of the soft targets (the loss is scaled by T^2)")),
    "eval_every": (("--eval-every",), dict(type=positive_int,
                                            help="steps between evaluations")),
    "output_dir": (("--output-dir",), dict(help="where everything is written")),
    "overwrite": (("--overwrite",), dict(
        action="store_true",
        help="replace the run in --output-dir (default: refuse to write over it)")),
    "resume": (("--resume",), dict(
        nargs="?", const="", metavar="DIR",
        help="continue the run in DIR (default: --output-dir) from its checkpoint")),
    "log_every": (("--log-every",), dict(type=positive_int,
                                         help="steps between train records")),
    "report_to": (("--report-to",), dict(
        type=report_to_choice,
        metavar="{none,tensorboard}",
        help="tensorboard: also write metrics.jsonl's records as TensorBoard event files "
             "in OUTPUT_DIR/tensorboard (needs tensorboardX: pip install "
             "'minibert[tensorboard]'); as the HF Trainer's report_to")),
    "progress": (("--no-progress",), dict(dest="progress", action="store_false",
                                          help="no progress bars")),
    "cuda_graphs": (("--cuda-graphs",), dict(
        action=argparse.BooleanOptionalAction,
        help="--device cuda: replay each training step from a CUDA graph captured once per "
             "batch shape (one launch a step instead of some 380; minibert/graphs.py), "
             "losses as without it to float32 round-off; a run that cannot be captured "
             "falls back with the reason in its log")),
    "fast_cpu": (("--fast-cpu",), dict(
        action=argparse.BooleanOptionalAction,
        help="on NumPy, run GELU, softmax, LayerNorm, cross-entropy and AdamW through the "
             "CPU fast paths (minibert/fast_cpu.py), on CuPy through the fused kernels "
             "(minibert/gpu_kernels.py), both tested equal to the formulas; --no-fast-cpu "
             "runs the formulas of minibert/nn/ and minibert/optim.py as written")),
}


def add_options(group, **defaults) -> None:
    """Add the shared options named by ``defaults`` (dest -> default, or dest -> dict of
    argparse keywords overriding the shared ones) to an argparse parser or group.

    Raises:
        KeyError: a name that is not in :data:`SHARED_OPTIONS`.
    """
    for dest, value in defaults.items():
        flags, kw = SHARED_OPTIONS[dest]
        extra = value if isinstance(value, dict) else {"default": value}
        group.add_argument(*flags, **{**kw, **extra})


def flag(dest: str) -> str:
    """The command-line spelling of an option's destination: ``alpha_ce`` -> ``--alpha-ce``."""
    return "--" + dest.replace("_", "-")


# ---------------------------------------------------------------------------------------
# A job's options as a dataclass: each field is an option's argparse destination, with
# the same default, so the script builds it with ``Config(**vars(parser.parse_args()))``
# and a Python caller with ``Config(max_steps=100, ...)``.
# ---------------------------------------------------------------------------------------

class JobOptions:
    """Base of the job configs (:class:`~minibert.pretraining.PretrainingConfig`,
    :class:`~minibert.finetuning.FinetuningConfig`,
    :class:`~minibert.evaluation.EvaluationConfig`): dataclasses whose fields are the
    script's options under their argparse destinations.

    ``CHECKS`` (a class attribute) maps a field to its range check, the same argparse
    type the script's option has (a callable taking the text), or to its choices (a
    tuple); :meth:`check` applies them to a config built in Python, where no parser ran.
    """

    CHECKS: dict[str, Any] = {}

    def to_dict(self) -> dict[str, Any]:
        """The options as ``vars(args)`` had them (``args.json``, a checkpoint's ``args``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]):
        """A config from :meth:`to_dict`'s dict (``args.json``); names that are not fields
        (options of an older or newer version) are left out."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def changed(self) -> set[str]:
        """The fields whose value differs from the default: what a Python caller chose,
        in the role of the options given on the command line."""
        fresh = type(self)()
        return {f.name for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(fresh, f.name)}

    def check(self) -> None:
        """Apply :attr:`CHECKS` (None values and list items of None pass).

        Raises:
            ValueError: ``--OPTION: expected ..., got ...`` for the first value out of
                range or not among the choices.
        """
        for name, check in self.CHECKS.items():
            value = getattr(self, name)
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if v is None:
                    continue
                if isinstance(check, tuple):
                    if v not in check:
                        raise ValueError(f"{flag(name)}: invalid choice {v!r} (choose from "
                                         f"{', '.join(map(str, check))})")
                    continue
                try:
                    check(str(v))
                except argparse.ArgumentTypeError as e:
                    raise ValueError(f"{flag(name)}: {e}") from None


    def check_combinations(self, given: set[str]) -> None:
        """Options that only mean something together (raises ValueError); none here."""

    def with_defaults(self):
        """Fill derived defaults in place and return self; none here."""
        return self

    def prepare(self, given: set[str] | None, prog: str) -> set[str]:
        """The start of a job's ``run_*`` function: :meth:`check`,
        :meth:`check_combinations`, :meth:`with_defaults`; a ValueError ends the job with
        ``PROG: error: MESSAGE`` (:func:`fail`). Returns ``given``, the options chosen
        explicitly, by default :meth:`changed`."""
        given = self.changed() if given is None else set(given)
        try:
            self.check()
            self.check_combinations(given)
        except ValueError as e:
            fail(prog, str(e))
        self.with_defaults()
        return given


def fast_paths_line(enabled: bool, device: str | None = "cpu") -> str:
    """The log line that names the fast-path setting (``--fast-cpu``) on ``device`` (None:
    $MINIBERT_DEVICE or cpu, as ``--device``): the CPU fast paths (minibert/fast_cpu.py), or
    on "cuda" the fused kernels (minibert/gpu_kernels.py) that the same switch installs.
    Once the CPU fast paths are on, the line also says how the products run and on which
    OpenBLAS kernel (:func:`minibert.fast_cpu.products_line`)."""
    from .backend import requested_device
    if requested_device(device) == "cuda":
        return ("fast paths: on (fused GPU kernels)" if enabled
                else "fast paths: off (the formulas of minibert/nn/ on the GPU)")
    if not enabled:
        return "fast CPU paths: off"
    from .fast import fast_paths_enabled
    if not fast_paths_enabled():            # named before they are switched on
        return "fast CPU paths: on"
    from .fast_cpu import products_line
    return f"fast CPU paths: on ({products_line()})"


# ---------------------------------------------------------------------------------------
# The start of every job
# ---------------------------------------------------------------------------------------

@dataclass
class Job:
    """What :func:`start_job` sets up: the communicator (``comm``), the device name and
    its array module (``xp``), the run directory (None for a job that writes no run), the
    resumed checkpoint (None for a fresh run) and what the job's ``check`` returned."""

    comm: Any
    device: str
    xp: Any
    run: Any = None
    resumed: dict | None = None
    checked: Any = None

    def train_state(self, optimizer, prog: str, ema=None):
        """The loop's :class:`~minibert.training.TrainState`: fresh, or the resumed
        checkpoint's (the optimizer's moments restored into ``optimizer``, the weight
        average into ``ema`` if given), which is then let go. Ends the job with
        ``PROG: error:`` on a checkpoint that does not fit."""
        from . import distributed
        from .training import TrainingError, TrainState, resume_state
        if self.resumed is None:
            return TrainState()
        try:
            state = resume_state(self.resumed, optimizer, ema)
        except TrainingError as e:
            fail(prog, f"checkpoint {self.run.checkpoint}: {e}")
        print(f"resuming {self.run.checkpoint} at step {state.step} (epoch {state.epoch}, "
              f"batch {state.batch_in_epoch})")
        if note := distributed.resume_notice(state.world_size, self.comm):
            print(note)
        self.resumed = None
        return state


@contextmanager
def leader_first(comm):
    """Rank 0 runs the block before every other rank (it creates the run directory, the
    vocab and the token store that the others then read); a single process just runs it."""
    if not comm.is_leader:
        comm.barrier()
    yield
    if comm.is_leader:
        comm.barrier()


# Options whose values a job reads (files or directories): no job writes where they are.
INPUT_OPTIONS = ("corpus", "vocab", "init_checkpoint", "init", "teacher", "model", "data",
                 "train", "dev", "test", "labels", "exclude_documents")


def input_paths(options: JobOptions) -> dict[str, Any]:
    """The job's inputs: option spelling -> value(s), of :data:`INPUT_OPTIONS` that the
    config ``options`` has and sets."""
    values = options.to_dict()
    return {flag(d): values[d] for d in INPUT_OPTIONS if values.get(d)}


def start_job(args: JobOptions, given: set[str], prog: str, job: str | None = None, *,
              resume_fixed=(), resume_defaults=None,
              check: Callable[[dict | None], Any] = lambda resumed: None) -> Job:
    """The prologue of a job: communicator (``--distributed``), device (``--device``,
    ``--tf32``), the CPU fast paths (``--fast-cpu``, :func:`minibert.fast.set_fast_paths`)
    and, for a ``job`` ("pretrain", "finetune"), its run directory, rank 0 first. ``args``:
    the job's config (:class:`JobOptions`), changed in place as said below.

    With ``--resume`` the run directory is taken first (:func:`minibert.runs.prepare_run_dir`
    locks it before reading its checkpoint), the checkpoint is loaded and its arguments are
    taken into ``args`` (:func:`minibert.runs.resume_args`; ``resume_fixed`` may not change,
    ``resume_defaults`` stand in for arguments older checkpoints lack). A fresh run's
    ``--output-dir`` may hold none of its inputs (:data:`INPUT_OPTIONS`). Then
    ``check(resumed)`` validates the remaining options and starting points before anything
    is written; its return value comes back as ``Job.checked``. Then ``--export-hf DIR``,
    where the job has it, is taken and checked (:func:`minibert.runs.prepare_export_dir`;
    source: ``--model``, else the run), and last a fresh run's directory is taken and
    prepared (``--overwrite``). The directories stay this process's until the job ends
    (:func:`job_main`).

    Any :class:`ValueError` (RunError, CheckpointError, CorpusError, HFFormatError ...) or
    :class:`OSError` raised on the way ends the job with ``PROG: error: ...``.
    """
    from . import backend, distributed, fast

    stop = partial(fail, prog)
    comm = distributed.start(args, stop)
    note_args(args.to_dict())
    try:
        device = backend.set_device(args.device)
        if args.tf32:
            backend.set_tf32(True)
        if getattr(args, "dtype", None):
            backend.resolve_dtype(args.dtype, device)
        fast.set_fast_paths(args.fast_cpu)
    except backend.BackendError as e:
        stop(str(e))
    out = Job(comm, device, backend.xp_for(device))
    try:
        with leader_first(comm):
            _prologue(out, args, given, job, comm.is_leader, resume_fixed, resume_defaults,
                      check)
    except ValueError as e:
        stop(str(e))
    except OSError as e:
        stop(f"{getattr(e, 'filename', '') or ''}: {e.strerror or e}")
    if job is not None and args.batch_size < comm.world_size:
        stop(f"--batch-size {args.batch_size} is the global batch, split over "
             f"{comm.world_size} ranks: it must be at least {comm.world_size}")
    return out


def _prologue(out: Job, args, given, job, leader, resume_fixed, resume_defaults, check):
    """:func:`start_job`'s run directory, resume, checks and export directory, in order."""
    from .checkpoint import CheckpointError, load_checkpoint
    from .runs import (RunDir, check_inputs, prepare_export_dir, prepare_run_dir, resume_args,
                       unusable_checkpoint)

    resume = job is not None and args.resume is not None
    if resume:
        out.run = (prepare_run_dir(args.output_dir, job, resume=True) if leader
                   else RunDir(Path(args.output_dir), job))
        try:
            out.resumed = load_checkpoint(out.run.checkpoint)
        except CheckpointError as e:
            raise CheckpointError(f"{e}{unusable_checkpoint(out.run.checkpoint)}") from None
        resume_args(args, (resume_defaults or {}) | out.resumed["trainer"].get("args", {}),
                    resume_fixed, given, str(out.run.checkpoint))
    elif job is not None and leader:
        check_inputs(args.output_dir, input_paths(args))
    out.checked = check(out.resumed) if job is not None else None
    if leader and args.to_dict().get("export_hf"):
        source = args.model if job is None else args.output_dir
        prepare_export_dir(args.export_hf, source, overwrite=args.overwrite,
                           inputs={**input_paths(args), flag("output_dir"): source}
                           if job is not None else input_paths(args))
    if job is not None and not resume:
        out.run = (prepare_run_dir(args.output_dir, job, overwrite=args.overwrite)
                   if leader else RunDir(Path(args.output_dir), job))


# ---------------------------------------------------------------------------------------
# The top of every job: faults end in one line, the run directories are let go
# ---------------------------------------------------------------------------------------

# Options that size what a job allocates, named when it runs out of memory.
SIZE_OPTIONS = ("preset", "num_hidden_layers", "hidden_size", "intermediate_size",
                "vocab_size", "max_seq_length", "batch_size", "eval_batch_size",
                "gradient_accumulation_steps", "eval_instances")

_noted: dict[str, Any] = {}  # the running job's arguments, for job_main's messages


def note_args(args: Mapping[str, Any]) -> None:
    """Tell :func:`job_main` the running job's arguments (``vars(args)``), so that an
    out-of-memory message can name the sizes asked for."""
    _noted.clear()
    _noted.update(args)


def job_main(prog: str):
    """Decorator of a job's ``run_*(config)`` (or a script's ``main(argv=None)``): the one
    place where a job's faults are turned into one line on stderr instead of a traceback,
    and where the directories it owns are let go (:func:`minibert.runs.release_run_dirs`)
    when it ends.

    * ``KeyboardInterrupt`` (Ctrl-C): ``PROG: interrupted at step N; ...`` naming the last
      checkpoint (which an atomic write never leaves torn) and the ``--resume`` command;
      exit status 130 (128 + SIGINT, the shell's convention).
    * ``MemoryError`` (NumPy's or CuPy's): ``PROG: error: out of memory ...`` with the
      allocation that failed, the sizes asked for (:data:`SIZE_OPTIONS`) and what to
      lower; exit status 1.
    * ``OSError`` (disk full, read-only file system, permission): ``PROG: error: cannot
      write PATH: REASON ...``, saying that the last good checkpoint is unchanged and how
      to resume; exit status 1.

    Bad input is not handled here: it ends earlier with :func:`fail` (status 2).
    """
    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @wraps(main)
        def run(*args, **kwargs):
            from .runs import release_run_dirs
            _noted.clear()
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt as e:
                _stop(f"{prog}: {_interrupted_message(prog, getattr(e, 'step', None))}", 130)
            except MemoryError as e:
                fail(prog, _memory_message(e, _noted), status=1)
            except OSError as e:
                fail(prog, _write_message(prog, e), status=1)
            finally:
                release_run_dirs()
                _noted.clear()
        return run
    return wrap


def _kept(prog: str) -> tuple[str, str]:
    """(what of the owned run is kept, how to go on), either "" when there is nothing to
    say (a job without a run directory)."""
    from .runs import checkpoint_job, held_runs
    for run in held_runs():
        if run.job == "evaluate":
            return (f"the finished fine-tuning runs in {run.path} are kept",
                    f"the same python {prog} command")
        if run.job in ("pretrain", "finetune"):
            if not run.checkpoint.is_file():
                return "no checkpoint had been written yet", ""
            _, step = checkpoint_job(run.checkpoint)
            return (f"the last checkpoint, {run.checkpoint} (step {step}), is unchanged",
                    f"python {prog} --resume {run.path}")
    return "", ""


def _interrupted_message(prog: str, step: int | None) -> str:
    """The one line of a Ctrl-C: where the run was, what is kept, how to go on."""
    at = f"interrupted at step {step}" if step is not None else "interrupted"
    kept, again = _kept(prog)
    return "; ".join(filter(None, [at, kept, again and f"go on with: {again}"]))


def _write_message(prog: str, e: OSError) -> str:
    """An OSError's message: the path and the reason, and that the last good checkpoint is
    unchanged (files are written atomically, :mod:`minibert.atomic`)."""
    from .atomic import WriteError
    from .runs import CHECKPOINT
    if isinstance(e, WriteError):
        what = str(e)  # the checkpoint's own case is said by _kept
        if Path(e.filename).exists() and Path(e.filename).name != CHECKPOINT:
            what += " (it is left as it was)"
    else:
        what = f"{e.filename}: {e.strerror or e}" if e.filename else str(e.strerror or e)
    kept, again = _kept(prog)
    return "; ".join(filter(None, [what, kept, again and f"once that is fixed, go on with: "
                                                         f"{again}"]))


def _memory_message(e: MemoryError, args: Mapping[str, Any]) -> str:
    """An out-of-memory message: the allocation that failed, the sizes asked for
    (:data:`SIZE_OPTIONS` in ``args``) and what to lower."""
    sizes = [f"{flag(k)} {args[k]}" for k in SIZE_OPTIONS if args.get(k) is not None]
    asked = (f"the sizes asked for: {', '.join(sizes)}; lower them" if sizes else
             "lower the batch size, the sequence length or the model size")
    if "gradient_accumulation_steps" in args:
        asked += " (a smaller --batch-size with a larger --gradient-accumulation-steps keeps "\
                 "the step's batch)"
    return f"out of memory ({e or 'an allocation failed'}); {asked}"
