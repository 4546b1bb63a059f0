"""What the job scripts share on the command line: range-checked argparse types, the options
several jobs take (defined once here, each with its one range check), the start-of-job
prologue (communicator, device, run directory, resume) and the one way a job stops on bad
input (an ``error:`` line naming the problem, exit status 2, no traceback)."""
from __future__ import annotations

import argparse
import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, NoReturn


def fail(prog: str, message: str) -> NoReturn:
    """Print ``PROG: error: MESSAGE`` to stderr and exit with status 2 (argparse's).

    In a data-parallel run with several ranks the line names the rank, and every rank is
    stopped (``MPI_Abort``), so that none is left waiting in a collective."""
    from .distributed import current
    comm = current()
    where = f" [rank {comm.rank} of {comm.world_size}]" if comm.world_size > 1 else ""
    print(f"{prog}: error: {message}{where}", file=sys.stderr)
    comm.abort(2)
    sys.exit(2)  # abort does not return


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
             "slow)")),
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
    "progress": (("--no-progress",), dict(dest="progress", action="store_false",
                                          help="no progress bars")),
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

    def train_state(self, optimizer, prog: str):
        """The loop's :class:`~minibert.training.TrainState`: fresh, or the resumed
        checkpoint's (the optimizer's moments restored into ``optimizer``), which is then
        let go. Ends the job with ``PROG: error:`` on a checkpoint that does not fit."""
        from . import distributed
        from .training import TrainingError, TrainState, resume_state
        if self.resumed is None:
            return TrainState()
        try:
            state = resume_state(self.resumed, optimizer)
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


def start_job(args, given: set[str], prog: str, job: str | None = None, *,
              resume_fixed=(), resume_defaults=None,
              check: Callable[[dict | None], Any] = lambda resumed: None) -> Job:
    """The prologue of a job: communicator (``--distributed``), device (``--device``,
    ``--tf32``) and, for a ``job`` ("pretrain", "finetune"), its run directory, rank 0 first.

    With ``--resume`` the run's checkpoint is loaded and its arguments are taken into
    ``args`` (:func:`minibert.runs.resume_args`; ``resume_fixed`` may not change,
    ``resume_defaults`` stand in for arguments older checkpoints lack). Then
    ``check(resumed)`` validates the remaining options and starting points before anything
    is written; its return value comes back as ``Job.checked``. Last, a fresh run's
    directory is prepared (:func:`minibert.runs.prepare_run_dir`, ``--overwrite``).

    Any :class:`ValueError` (RunError, CheckpointError, CorpusError, HFFormatError ...) or
    :class:`OSError` raised on the way ends the job with ``PROG: error: ...``.
    """
    from . import backend, distributed
    from .checkpoint import load_checkpoint
    from .runs import RunDir, prepare_run_dir, resume_args

    stop = partial(fail, prog)
    comm = distributed.start(args, stop)
    try:
        device = backend.set_device(args.device)
        if args.tf32:
            backend.set_tf32(True)
    except backend.BackendError as e:
        stop(str(e))
    out = Job(comm, device, backend.xp_for(device))
    if job is None:
        return out
    leader, resume = comm.is_leader, args.resume is not None
    try:
        with leader_first(comm):
            if resume:
                out.run = (prepare_run_dir(args.output_dir, job, resume=True) if leader
                           else RunDir(Path(args.output_dir), job))
                out.resumed = load_checkpoint(out.run.checkpoint)
                resume_args(args, (resume_defaults or {}) | out.resumed["trainer"].get("args", {}),
                            resume_fixed, given, str(out.run.checkpoint))
            out.checked = check(out.resumed)
            if not resume:
                out.run = (prepare_run_dir(args.output_dir, job, overwrite=args.overwrite)
                           if leader else RunDir(Path(args.output_dir), job))
    except ValueError as e:
        stop(str(e))
    except OSError as e:
        stop(f"{getattr(e, 'filename', '') or ''}: {e.strerror or e}")
    if args.batch_size < comm.world_size:
        stop(f"--batch-size {args.batch_size} is the global batch, split over "
             f"{comm.world_size} ranks: it must be at least {comm.world_size}")
    return out
