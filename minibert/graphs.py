"""The training step replayed from CUDA graphs (``--cuda-graphs``; issue 52, item 3).

A GPU step of the mini preset is some 380 kernel launches, each a Python call into CuPy:
the host's time per launch, not the GPU's, bounds a small model's step. A CUDA graph
(NVIDIA's CUDA C++ Programming Guide, "CUDA Graphs") records the launches of one step once
and replays them with one call. What a replay cannot see is any value the host computed
while the graph was recorded, so the step keeps none (:func:`minibert.training.device_step`):

- the learning rate and Adam's bias corrections are read from a device buffer that the host
  fills before each step (:meth:`minibert.optim.AdamW.stage`);
- dropout masks come from a counter-based generator whose seeds the host loads into a
  device buffer before each step (:class:`minibert.backend.DropoutRNG`), so every replay
  draws the masks an uncaptured step would, and ``--resume`` stays exact;
- the loss scaler and the optimizer update their device state in place;
- the batch is copied into static device buffers before each replay;
- every buffer allocated while the graph was captured is kept for the graph's life (CuPy's
  memory pool would otherwise hand it to the next allocation while a replay writes it);
- cuBLAS is called on a handle of nvmath-python's bindings whose stream and workspace were
  set before the capture (:func:`minibert.gpu_kernels.prepare_capture`); CuPy refuses
  cuBLAS calls while a stream captures.

One graph is captured per shape of a step's micro-batches (``--line-by-line`` buckets
give one each), on the second step of that shape: the first runs uncaptured, so the kernels
are compiled and the caches made before the capture. A capture that fails falls back to
uncaptured steps for the rest of the run, with the reason (:attr:`GraphedStep.fallback`).
The capture rules are modelled by the CuPy stand-in (tests/fakecupy.py), which replays the
recorded launches on the same buffers, so the CPU tests catch a step that breaks them.
"""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from .training import plain_step, device_step, prepare_step

__all__ = ["GraphedStep", "status_line", "step_function", "unsupported"]


def status_line(enabled: bool, device: str | None, world_size: int) -> str:
    """The job's log line for ``--cuda-graphs`` (``enabled``) on ``device`` (None: as
    ``--device``) with ``world_size`` ranks: on, off, or off with the reason."""
    from .backend import requested_device
    from .fast import fast_paths_enabled
    if not enabled:
        return "cuda graphs: off"
    why = unsupported(requested_device(device), world_size, fast_paths_enabled())
    return (f"cuda graphs: off ({why})" if why else
            "cuda graphs: on (a step replayed from a graph per batch shape, captured at its "
            "second step)")


def step_function(model, optimizer, workload, cfg, comm, device: str | None, rng):
    """The step the training loop calls, ``f(micro, step, lr)`` -> train_step's result: a
    :class:`GraphedStep` with ``cfg.cuda_graphs`` where :func:`unsupported` finds nothing
    against it, else :func:`minibert.training.train_step` itself."""
    from .backend import requested_device
    from .fast import fast_paths_enabled
    if cfg.cuda_graphs and unsupported(requested_device(device), comm.world_size,
                                       fast_paths_enabled()) is None:
        return GraphedStep(model, optimizer, workload, cfg, comm, rng)
    return plain_step(model, optimizer, workload, cfg, comm, device, rng)


def unsupported(device: str, world_size: int, fast_paths: bool) -> str | None:
    """Why a run cannot replay its steps from CUDA graphs, or None when it can.

    Args:
        device: the run's device. world_size: data-parallel ranks. fast_paths: whether
            :func:`minibert.fast.set_fast_paths` is on (the formulas' products go through
            CuPy's cuBLAS calls, which a capture refuses)."""
    if device != "cuda":
        return "CUDA graphs need --device cuda"
    if world_size > 1:
        return "data-parallel steps all-reduce through NCCL between the ranks' captures; not captured"
    if not fast_paths:
        return "the fast paths are off (the formulas' products cannot be captured)"
    try:
        import nvmath.bindings.cublas  # noqa: F401
    except ImportError:
        return "nvmath-python is not installed (pip install -e '.[gpu]')"
    return None


def _array_fields(batch) -> dict:
    """The NumPy array fields of a batch dataclass, by name."""
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)
            if isinstance(getattr(batch, f.name), np.ndarray)}


def batch_key(micro: list) -> tuple:
    """What a graph is captured for: each micro-batch's type and its arrays' names,
    shapes and dtypes."""
    return tuple((type(b).__name__, tuple((n, a.shape, a.dtype.str)
                                          for n, a in _array_fields(b).items()))
                 for b in micro)


@dataclasses.dataclass
class _Captured:
    graph: object                   # cupy.cuda.Graph
    static: list                    # the micro-batches with device arrays the graph reads
    outputs: tuple                  # train_step's result: buffers each replay rewrites
    kept: list                      # the memory allocated during the capture

    def load(self, micro: list) -> None:
        """Copy the host micro-batches into the static buffers (before a replay)."""
        for host, dev in zip(micro, self.static):
            for name, a in _array_fields(host).items():
                getattr(dev, name).set(np.ascontiguousarray(a))


class GraphedStep:
    """:func:`minibert.training.train_step` with its device half replayed from CUDA graphs.

    Call it as ``step(micro, step, lr)``; it returns train_step's (loss, grad_norm, finite,
    sums). The outputs of a replayed step are the graph's buffers, rewritten by the next
    replay: read them (or compute from them) before the next step.

    Args:
        model, optimizer, workload, cfg, comm, rng: as :func:`train_step` takes them (one
            process: ``comm.world_size == 1``).
    Attributes:
        fallback: None while steps are captured; the reason once a capture failed (the
            steps from then on run uncaptured).
        captured: the number of graphs captured so far.
    """

    def __init__(self, model, optimizer, workload, cfg, comm, rng):
        import cupy
        from .gpu_kernels import prepare_capture
        self._cupy = cupy
        self._args = (model, optimizer, workload)
        self._cfg, self._comm, self._rng = cfg, comm, rng
        self._stream = cupy.cuda.Stream(non_blocking=True)
        prepare_capture(self._stream)
        self._graphs: dict[tuple, _Captured] = {}
        self._seen: set[tuple] = set()
        self.fallback: str | None = None

    @property
    def captured(self) -> int:
        return len(self._graphs)

    def __call__(self, micro: list, step: int, lr: float):
        staged = prepare_step(self._args[1], len(micro), step, lr, self._cfg, self._comm,
                              self._rng)
        key = batch_key(micro)
        entry = self._graphs.get(key)
        if entry is None and (self.fallback is not None or key not in self._seen):
            self._seen.add(key)
            return self._eager(micro, staged)
        if entry is None:
            try:
                entry = self._graphs[key] = self._capture(micro, staged)
            except Exception as e:            # a step that breaks a capture rule
                self.fallback = f"{type(e).__name__}: {e}"
                if self._comm.is_leader:
                    print(f"cuda graphs: off from step {step + 1} (the capture failed: "
                          f"{self.fallback})", flush=True)
                return self._eager(micro, staged)
        entry.load(micro)
        entry.graph.launch(stream=self._cupy.cuda.get_current_stream())
        return entry.outputs

    def _eager(self, micro, staged):
        return device_step(*self._args, micro, self._cfg, self._comm, self._rng, staged)

    def _capture(self, micro: list, staged) -> _Captured:
        """Capture the device half of a step on the host batch ``micro``'s shapes (the
        capture runs nothing: the caller launches the graph)."""
        cupy = self._cupy
        static = [dataclasses.replace(b, **{n: cupy.asarray(a) for n, a in
                                            _array_fields(b).items()}) for b in micro]
        kept, pool = [], cupy.get_default_memory_pool()

        def keep(size):
            memory = pool.malloc(size)
            kept.append(memory)
            return memory
        cupy.cuda.Device().synchronize()   # the capture stream does not wait for the null one
        stream = self._stream
        with stream:
            stream.begin_capture()
            try:
                with cupy.cuda.using_allocator(keep):
                    outputs = device_step(*self._args, static, self._cfg, self._comm,
                                          self._rng, staged)
            except BaseException:
                with contextlib.suppress(Exception):    # an invalidated capture's own error
                    stream.end_capture()
                raise
            graph = stream.end_capture()
        return _Captured(graph, static, outputs, kept)
