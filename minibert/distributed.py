"""Data parallelism across processes: a small communicator and the row sharding of a batch.

One process per rank, each holding a full copy of the model (data parallelism, as llm.c's
``mpirun -np N``, Horovod and PyTorch DDP do). Every rank generates the same global batch
stream and trains on its own contiguous slice of rows of each batch (:func:`shard_rows`);
after the backward passes the loop sums the flat gradient buffer across ranks with one
all-reduce, so clipping sees the global norm and every rank takes the same optimizer step.
``--batch-size`` stays the *global* batch: a run gives the same result (to round-off,
dropout aside) on any number of ranks, and a checkpoint resumes on another world size.

Backends (``--distributed``):

    none  one process (the default outside a launcher); every collective is a no-op
    mpi   mpi4py over the system MPI (Open MPI, MPICH): buffer-based ``Allreduce`` /
          ``Bcast`` on NumPy arrays; CuPy arrays go through the host, or straight from the
          device with ``--cuda-aware-mpi`` (an MPI built with CUDA support)
    nccl  NCCL through ``cupy.cuda.nccl``, one GPU per rank; MPI starts the ranks and
          carries the NCCL unique id and the host-side reductions of metric sums
    auto  ``mpi`` (CPU) or ``nccl`` (CUDA) when the process was started by ``mpirun`` /
          ``mpiexec`` with more than one rank, else ``none``

A rank that fails must not leave the others blocked in a collective: with more than one
rank, :func:`minibert.cli.fail` and any uncaught exception call ``MPI_Abort``, which makes
the launcher stop every rank (as ``python -m mpi4py`` does for uncaught exceptions). A rank
killed outright (``kill -9``) is noticed by ``mpirun``, which stops the rest.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import traceback
from typing import Any

import numpy as np

from .backend import get_array_module, requested_device

BACKENDS = ("auto", "none", "mpi", "nccl")

OPEN_MPI_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
"""The environment that lets Open MPI's ``mpirun`` start as root (it refuses without both;
GPU machines, containers and CI often run as root); other MPIs ignore it."""

# environment variables through which MPI launchers tell a process the world size
_LAUNCHER_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS",
                       "MV2_COMM_WORLD_SIZE")
_LAUNCHER_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                             "MV2_COMM_WORLD_LOCAL_RANK")


class DistributedError(RuntimeError):
    """A backend that cannot start (mpi4py or NCCL missing, a device/backend mismatch)."""


class Communicator:
    """The single-process communicator: rank 0 of 1, every collective a no-op.

    All communicators share this interface. Buffers are contiguous NumPy or CuPy arrays,
    changed in place.

    Attributes:
        name: "none", "mpi" or "nccl".
        rank: this process's rank in [0, world_size). world_size: number of ranks (>= 1).
        local_rank: rank among the processes of this machine (picks the GPU).
    """

    name = "none"
    rank = 0
    world_size = 1
    local_rank = 0

    @property
    def is_leader(self) -> bool:
        """Rank 0: the one that logs, evaluates and writes the run directory."""
        return self.rank == 0

    def allreduce_(self, buf):
        """Sum ``buf`` (any shape, float or int, host or device) over ranks, in place;
        returns ``buf``."""
        return buf

    def broadcast_(self, buf, root: int = 0):
        """Overwrite ``buf`` on every rank with rank ``root``'s values; returns ``buf``."""
        return buf

    def allreduce_host(self, values: np.ndarray) -> np.ndarray:
        """The sum over ranks of a small host float64 array (metric sums at log steps)."""
        return np.asarray(values, dtype=np.float64)

    def barrier(self) -> None:
        """Wait until every rank has reached this call."""

    def abort(self, code: int = 1) -> None:
        """Stop this process (and, with several ranks, every rank) with exit status ``code``."""
        sys.exit(code)


class MPICommunicator(Communicator):
    """mpi4py's ``COMM_WORLD`` (Dalcin et al., mpi4py): buffer-based collectives, no pickling.

    Args:
        cuda_aware: pass CuPy arrays to MPI directly (the MPI library must be built with
            CUDA support); otherwise they are copied to the host and back (one device sync
            per collective).
    Raises:
        DistributedError: mpi4py is not installed or MPI cannot start.
    """

    name = "mpi"

    def __init__(self, cuda_aware: bool = False):
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise DistributedError(
                f"--distributed mpi needs mpi4py and an MPI library ({e}); install them with "
                "`apt-get install openmpi-bin libopenmpi-dev` and "
                "`pip install -e \".[distributed]\"`") from None
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        self.local_rank = self.comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
        self.cuda_aware = cuda_aware

    def _through_host(self, buf, collective):
        """Run ``collective`` on ``buf``: NumPy directly; CuPy via a host copy, or directly
        from the device with ``cuda_aware`` (after the stream's pending work is done)."""
        xp = get_array_module(buf)
        if xp is np:
            collective(buf)
        elif self.cuda_aware:                                  # pragma: no cover - GPU only
            xp.cuda.get_current_stream().synchronize()
            collective(buf)
        else:                                                  # pragma: no cover - GPU only
            host = buf.get()
            collective(host)
            buf.set(host)
        return buf

    def allreduce_(self, buf):
        return self._through_host(
            buf, lambda b: self.comm.Allreduce(self.MPI.IN_PLACE, b, op=self.MPI.SUM))

    def broadcast_(self, buf, root: int = 0):
        return self._through_host(buf, lambda b: self.comm.Bcast(b, root=root))

    def allreduce_host(self, values: np.ndarray) -> np.ndarray:
        out = np.array(values, dtype=np.float64)
        self.comm.Allreduce(self.MPI.IN_PLACE, out, op=self.MPI.SUM)
        return out

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.comm.Abort(code)


class NCCLCommunicator(MPICommunicator):  # pragma: no cover - needs GPUs and NCCL
    """NCCL collectives on CuPy arrays (``cupy.cuda.nccl.NcclCommunicator``), one GPU per
    rank; started by MPI, which carries the NCCL unique id from rank 0 and keeps doing the
    host-side work (barriers, metric sums, abort). Collectives are queued on the current
    CUDA stream: no host sync.

    Raises:
        DistributedError: mpi4py, CuPy or NCCL is missing.
    """

    name = "nccl"

    def __init__(self):
        super().__init__()
        try:
            from cupy.cuda import nccl
        except ImportError as e:
            raise DistributedError(f"--distributed nccl needs CuPy with NCCL ({e}); "
                                   "pip install -e \".[nccl]\" (CuPy, mpi4py and "
                                   "nvidia-nccl-cu12)") from None
        if not nccl.available:
            raise DistributedError("--distributed nccl: this CuPy finds no NCCL library "
                                   "(CuPy's wheels do not bundle it): pip install -e "
                                   "\".[nccl]\", which brings nvidia-nccl-cu12")
        self.nccl = nccl
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = self.comm.bcast(uid, root=0)      # a small tuple, once at start-up
        self.nccl_comm = nccl.NcclCommunicator(self.world_size, uid, self.rank)
        self._dtypes = {np.dtype(np.float16): nccl.NCCL_FLOAT16, "bfloat16": nccl.NCCL_BFLOAT16,
                        np.dtype(np.float32): nccl.NCCL_FLOAT32,
                        np.dtype(np.float64): nccl.NCCL_FLOAT64,
                        np.dtype(np.int64): nccl.NCCL_INT64}

    def _args(self, buf):
        import cupy
        if get_array_module(buf) is np:
            raise DistributedError("--distributed nccl works on GPU arrays; got a NumPy array")
        dtype = np.dtype(buf.dtype)
        kind = self._dtypes["bfloat16" if dtype.name == "bfloat16" else dtype]
        return buf.data.ptr, buf.size, kind, \
            cupy.cuda.get_current_stream().ptr

    def allreduce_(self, buf):
        ptr, n, dtype, stream = self._args(buf)
        self.nccl_comm.allReduce(ptr, ptr, n, dtype, self.nccl.NCCL_SUM, stream)
        return buf

    def broadcast_(self, buf, root: int = 0):
        ptr, n, dtype, stream = self._args(buf)
        self.nccl_comm.bcast(ptr, n, dtype, root, stream)
        return buf


def _launcher_value(names, default: int) -> int:
    """The first of the environment variables ``names`` an MPI launcher set to a number."""
    for var in names:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return default


def launched_world_size() -> int:
    """The world size an MPI launcher announced in the environment (1 when none did)."""
    return _launcher_value(_LAUNCHER_SIZE_VARS, 1)


_current: Communicator = Communicator()


def current() -> Communicator:
    """The communicator :func:`init_distributed` made (single process before that)."""
    return _current


def init_distributed(kind: str = "auto", device: str = "cpu", *,
                     cuda_aware: bool = False) -> Communicator:
    """Start the communicator for ``--distributed kind`` and make it :func:`current`.

    Call before :func:`minibert.backend.set_device`: with ``device="cuda"`` it selects the
    GPU ``local_rank % device_count`` first. With more than one rank it also installs an
    exception hook that prints the traceback and aborts every rank.

    Args:
        kind: one of :data:`BACKENDS`.
        device: "cpu" or "cuda" (None: "cpu").
        cuda_aware: see :class:`MPICommunicator`.
    Raises:
        DistributedError: an unknown kind, ``nccl`` on the CPU, or a backend whose library
            is missing.
    """
    global _current
    device = device or "cpu"
    if kind not in BACKENDS:
        raise DistributedError(f"--distributed {kind!r}: expected one of {', '.join(BACKENDS)}")
    if kind == "auto":
        kind = "none" if launched_world_size() <= 1 else ("nccl" if device == "cuda" else "mpi")
    if kind == "nccl" and device != "cuda":
        raise DistributedError("--distributed nccl needs --device cuda (use mpi on the CPU)")
    if device == "cuda" and kind != "none":  # pragma: no cover - GPU only
        import cupy
        local_rank = _launcher_value(_LAUNCHER_LOCAL_RANK_VARS, 0)
        cupy.cuda.Device(local_rank % cupy.cuda.runtime.getDeviceCount()).use()
    if kind == "none":
        _current = Communicator()
    elif kind == "mpi":
        _current = MPICommunicator(cuda_aware=cuda_aware)
    else:  # pragma: no cover - GPU only
        _current = NCCLCommunicator()
    if _current.world_size > 1:
        sys.excepthook = _abort_on_exception
    return _current


def _abort_on_exception(kind, value, tb) -> None:
    """sys.excepthook with several ranks: print the traceback, then abort every rank."""
    traceback.print_exception(kind, value, tb)
    print(f"rank {_current.rank}: aborting all {_current.world_size} ranks", file=sys.stderr)
    _current.abort(1)


def shard_rows(batch: Any, rank: int, world_size: int) -> tuple[Any, float]:
    """This rank's contiguous slice of a batch's rows, and its share of the batch.

    Rank r of W takes rows [r*B//W, (r+1)*B//W) of every array field whose first axis is
    the batch axis (B, the length of ``batch.attention_mask``); other fields are kept. A
    rank whose slice would be empty (a batch of fewer than W rows, e.g. the last of an
    epoch) gets the batch's last row with weight 0, so that it still runs the same steps
    and collectives while contributing nothing.

    Args:
        batch: a dataclass of host arrays with an ``attention_mask`` of shape (B, T).
        rank, world_size: 0 <= rank < world_size.
    Returns:
        (shard, weight): the shard (a new dataclass of the same type; the batch itself when
        world_size == 1) and weight = rows of the shard / B (0.0 for the stand-in row). The
        weights of all ranks sum to 1: a mean loss over the batch's rows is the weighted sum
        of the shards' mean losses.
    """
    if world_size == 1:
        return batch, 1.0
    B = len(batch.attention_mask)
    lo, hi = rank * B // world_size, (rank + 1) * B // world_size
    weight = (hi - lo) / B
    if hi == lo:
        lo, hi = B - 1, B
    changes = {f.name: v[lo:hi] for f in dataclasses.fields(batch)
               if isinstance(v := getattr(batch, f.name), np.ndarray) and v.ndim >= 1
               and len(v) == B}
    return dataclasses.replace(batch, **changes), weight


def describe(comm: Communicator, batch_size: int) -> str:
    """One log line: the backend, the world size and the rows per rank of a global batch."""
    lo, hi = batch_size // comm.world_size, -(-batch_size // comm.world_size)
    rows = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return (f"data parallel: {comm.world_size} ranks over {comm.name}, global batch "
            f"{batch_size} = {rows} rows per rank")


def resume_notice(saved_world_size: int, comm: Communicator) -> str | None:
    """What resuming a checkpoint written by ``saved_world_size`` ranks on ``comm``'s
    world size means (None when the two agree)."""
    if saved_world_size == comm.world_size:
        return None
    return (f"note: the checkpoint was written by a run on {saved_world_size} rank(s); this "
            f"run has {comm.world_size}. The data stream and the global batch continue "
            "unchanged (--batch-size is split over the ranks), but dropout masks are drawn "
            "per rank, so the loss curve continues statistically, not bit for bit")


def add_arguments(group) -> None:
    """The ``--distributed`` and ``--cuda-aware-mpi`` options of both jobs."""
    group.add_argument("--distributed", choices=BACKENDS, default="auto",
                       help="data parallelism across processes: auto = mpi (CPU) or nccl "
                            "(GPU) when started by mpirun/mpiexec with several ranks, else none; "
                            "--batch-size stays the global batch, split over the ranks")
    group.add_argument("--cuda-aware-mpi", action="store_true",
                       help="with --distributed mpi on the GPU: hand device buffers to MPI "
                            "directly (needs an MPI built with CUDA support)")


def start(options, fail) -> Communicator:
    """A job's start-up: the communicator from the job's config ``options``
    (``--distributed``, ``--device``, ``--cuda-aware-mpi``); ``fail(message)`` on error. Ranks other than 0 print nothing to
    stdout from here on (warnings and errors still go to stderr)."""
    try:
        comm = init_distributed(options.distributed, requested_device(options.device),
                                cuda_aware=options.cuda_aware_mpi)
    except DistributedError as e:
        fail(str(e))
    if not comm.is_leader:
        sys.stdout = open(os.devnull, "w")
    return comm
