"""Array backend: NumPy on the CPU or CuPy on a CUDA GPU, chosen once per process.

Layers never ask which device they run on: they call :func:`get_array_module` on their
inputs (the CuPy / Chainer convention), so one implementation serves both devices.
Only model construction and the edges of a run (data in, logs and checkpoints out) use
the process-wide choice made by :func:`set_device`.
"""
from __future__ import annotations

import math
import os

import numpy as np

DEVICES = ("cpu", "cuda")
_device = "cpu"
_cupy_checked = None  # the cupy module once it has passed the start-up check (once per process)
_tf32 = False         # what set_tf32 last put in force on the GPU

# What `pip install 'minibert[gpu]'` brings, named in every message about a missing piece.
_INSTALL_HINT = ("install it with pip install 'minibert[gpu]' (cupy-cuda12x[ctk], which brings "
                 "the CUDA toolkit wheels: nvidia-cuda-nvrtc-cu12, nvidia-cublas-cu12, "
                 "nvidia-curand-cu12, nvidia-cuda-runtime-cu12, ...)")

# The pieces the start-up check exercises, and the library names that identify them in an
# error's text (CuPy 14 says e.g. 'Failure finding "libnvrtc.so.13 or libnvrtc.so.12"').
_NVRTC = "CUDA's runtime compiler (NVRTC)"
_CUBLAS = "cuBLAS"
_ERF = "erf from cupyx.scipy.special (compiled by NVRTC against the CUDA headers)"
_CURAND = "cuRAND (cupy.random)"
_LIBRARY_NAMES = (("nvrtc", _NVRTC), ("cublas", _CUBLAS), ("curand", _CURAND))
# CuPy 14: 'Failure finding "libnvrtc.so.13 ..."'; CuPy 13: 'CuPy failed to load libnvrtc.so.12:
# OSError: libnvrtc.so.12: cannot open shared object file'.
_LOAD_FAILURE_WORDS = ("failure finding", "failed to load", "cannot open shared object")

# cublasMath_t values (cublas_api.h); CuPy exports CUBLAS_DEFAULT_MATH but not the TF32 one.
_CUBLAS_DEFAULT_MATH = 0
_CUBLAS_TF32_TENSOR_OP_MATH = 3


class BackendError(RuntimeError):
    """The requested device cannot be used (CuPy missing, no GPU, a CUDA library missing or
    failing the start-up check, unknown name, or an option the device does not have)."""


def _import_cupy():
    """CuPy, after checking once per process that it can compile and run what minibert needs.

    Raises:
        BackendError: CuPy is not installed, sees no usable GPU, or a piece of the CUDA
            toolkit fails the start-up check (see :func:`_self_check`).
    """
    global _cupy_checked
    if _cupy_checked is not None:
        return _cupy_checked
    try:
        import cupy
    except ImportError as e:
        raise BackendError(
            "device 'cuda' needs CuPy, which is not installed: "
            "pip install 'minibert[gpu]' (cupy-cuda12x[ctk])") from e
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise BackendError(
            f"device 'cuda': CuPy is installed but no CUDA GPU is usable ({e})") from e
    if n < 1:
        raise BackendError("device 'cuda': CuPy is installed but it sees no CUDA GPU")
    _self_check(cupy)
    _cupy_checked = cupy
    return cupy


def _piece_error(piece: str, what: str, e: BaseException) -> BackendError:
    """A BackendError naming the missing or failing piece; the library named in the error's
    text wins over the probe that met it (a matmul can fail for want of NVRTC)."""
    text = f"{type(e).__name__}: {e}"
    low = text.lower()
    for lib, name in _LIBRARY_NAMES:
        if lib in low:
            piece = name
            break
    if isinstance(e, ImportError) or any(w in low for w in _LOAD_FAILURE_WORDS):
        return BackendError(f"device 'cuda': {piece} could not be loaded: {text}; {_INSTALL_HINT}")
    return BackendError(f"device 'cuda': {piece} failed the start-up check ({what}): {text}; "
                        f"if a CUDA library is missing, {_INSTALL_HINT}")


def _run_probe(cupy, piece: str, what: str, probe):
    """``probe()``'s result on the host, after a device synchronise.

    Raises:
        BackendError: naming ``piece`` (see :func:`_piece_error`), if the probe raises.
    """
    try:
        out = probe()
        cupy.cuda.runtime.deviceSynchronize()
        return np.asarray(cupy.asnumpy(out))
    except Exception as e:
        raise _piece_error(piece, what, e) from e


def _expect(piece: str, what: str, got: np.ndarray, expected: np.ndarray) -> None:
    """Raise a BackendError naming ``piece`` unless ``got`` is ``expected`` (shape, and
    values to rtol 1e-5, atol 1e-6)."""
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
        raise BackendError(
            f"device 'cuda': {piece} gave a wrong result in the start-up check ({what}): "
            f"got {np.array2string(got, precision=6)}, expected "
            f"{np.array2string(expected, precision=6)}")


def _check_random(cupy) -> None:
    """The random-number probes of :func:`_self_check`: ``cupy.random.default_rng``
    (cuRAND's device API, built into CuPy) and :class:`DropoutRNG`'s generator,
    ``RandomState`` with Philox4x32-10 (the cuRAND host library, libcurand); each must give
    64 distinct draws in [0, 1).

    Raises:
        BackendError: a probe raises or its draws are not so.
    """
    def philox_probe():
        method = cupy.cuda.curand.CURAND_RNG_PSEUDO_PHILOX4_32_10
        return cupy.random.RandomState(0, method=method).random_sample(64, dtype=np.float32)
    for what, probe in (
            ("cupy.random.default_rng(0).random(64)",
             lambda: cupy.random.default_rng(0).random(64, dtype=np.float32)),
            ("cupy.random.RandomState(0, Philox4x32-10).random_sample(64)", philox_probe)):
        r = _run_probe(cupy, _CURAND, what, probe)
        if r.shape != (64,) or not (r.min() >= 0 and r.max() < 1 and r.max() > r.min()):
            raise BackendError(
                f"device 'cuda': {_CURAND} gave a wrong result in the start-up check ({what}): "
                f"expected 64 distinct draws in [0, 1), got shape {r.shape}"
                + (f", min {r.min()}, max {r.max()}" if r.size else ""))


def _self_check(cupy) -> None:
    """Run one tiny instance of each kind of GPU work minibert does, synchronising after each,
    and raise at once, naming the piece, if one cannot run or gives a wrong answer.

    Probes, in order: an ElementwiseKernel (compiled by NVRTC), a 2-D and a batched float32
    matmul (cuBLAS gemm, as the Linear layers' 2-D ``x @ W`` uses, and gemmBatched), erf from
    cupyx.scipy.special (a ufunc compiled by NVRTC), ``cupy.random.default_rng(0).random``
    (cuRAND's device API built into CuPy) and a Philox4x32-10
    ``cupy.random.RandomState`` (the cuRAND host library, which :class:`DropoutRNG` drew from
    before its counter-based kernel; no training path uses cuRAND now). Without the
    CUDA toolkit wheels each of these fails only at its first use, deep in a training step.

    Raises:
        BackendError: the first probe that raises or returns a wrong value.
    """
    def check(piece, what, probe, expected):
        _expect(piece, what, _run_probe(cupy, piece, what, probe), expected)

    x = np.arange(4, dtype=np.float32)

    def kernel_probe():
        kernel = cupy.ElementwiseKernel("float32 x", "float32 y", "y = 2 * x + 1",
                                        "minibert_self_check")
        return kernel(cupy.asarray(x))     # compiled by NVRTC at this first call
    check(_NVRTC, "a tiny elementwise kernel, y = 2x + 1", kernel_probe, 2 * x + 1)

    a = np.arange(6, dtype=np.float32).reshape(2, 3) / 4    # (2, 3)
    b = np.arange(6, dtype=np.float32).reshape(3, 2) - 2    # (3, 2)
    ab = np.stack([a, 2 * a])                                # (2, 2, 3)
    check(_CUBLAS, "a float32 matmul (2, 3) @ (3, 2)",
          lambda: cupy.asarray(a) @ cupy.asarray(b), a @ b)
    check(_CUBLAS, "a batched float32 matmul (2, 2, 3) @ (3, 2)",
          lambda: cupy.asarray(ab) @ cupy.asarray(b), ab @ b)

    def erf_probe():
        from cupyx.scipy.special import erf as _erf
        return _erf(cupy.asarray(np.array([0.0, 0.5, -1.0, 2.0], dtype=np.float32)))
    # erf(0), erf(0.5), erf(-1), erf(2): Abramowitz & Stegun, table 7.1
    check(_ERF, "erf of [0, 0.5, -1, 2]", erf_probe,
          np.array([0.0, 0.5204999, -0.8427008, 0.9953223], dtype=np.float32))
    _check_random(cupy)


def requested_device(device: str | None = None) -> str:
    """The device a job asks for: ``device``, or when it is None (no ``--device``) the
    environment variable MINIBERT_DEVICE, else "cpu". Not checked here (:func:`set_device`
    checks it)."""
    return device or os.environ.get("MINIBERT_DEVICE", "cpu")


def set_device(device: str | None = None) -> str:
    """Choose the array module for the process.

    Selecting "cuda" imports CuPy and, the first time in the process, runs the start-up check
    of :func:`_self_check` (an NVRTC-compiled kernel, cuBLAS matmuls, erf, the RNG), so that a
    missing CUDA library is reported here, by name, rather than in the middle of a step.

    Args:
        device: "cpu" or "cuda"; None reads the environment variable MINIBERT_DEVICE,
            defaulting to "cpu".
    Returns:
        The device name in force.
    Raises:
        BackendError: unknown device name; "cuda" without CuPy or without a GPU; a piece of
            the CUDA toolkit missing or failing the start-up check (the message names it and
            how to install it). The device in force is unchanged when it raises.
    """
    global _device
    device = requested_device(device)
    if device not in DEVICES:
        raise BackendError(f"unknown device {device!r}: expected one of {', '.join(DEVICES)}")
    if device == "cuda":
        _import_cupy()
    _device = device
    return device


def set_tf32(enabled: bool) -> bool:
    """Let float32 matrix products on the GPU use TF32 tensor cores (or stop them).

    TF32 rounds the inputs of a float32 product to a 10-bit mantissa (float32 keeps 23) and
    accumulates in float32: on Ampere and newer GPUs (compute capability >= 8.0) cuBLAS runs
    such GEMMs several times faster, at about 1e-3 relative error per product. Enabling sets
    both of CuPy's switches, because its matmul paths honour different ones:

    - ``cupy._core.set_compute_type(float32, COMPUTE_TYPE_TF32)``: process-wide; used by
      2-D products (``cupy.dot``, ``matmul`` of 2-D arrays: every Linear layer, which
      reshapes its input to (N, I) first), which CuPy runs as cublasGemmEx with
      CUBLAS_COMPUTE_32F_FAST_TF32. (This is the switch CuPy's ``CUPY_TF32=1`` sets; CuPy
      reads that variable at the first float32 product, not at import, and this call
      overrides it.)
    - ``cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH)`` on CuPy's cuBLAS handle for the
      current device and the calling thread: used by batched products (attention's
      ``(B, NH, T, HS) @ (B, NH, HS, T)`` runs as gemmStridedBatchedEx with a legacy compute
      type), which ignore the compute type above. PyTorch's
      ``allow_tf32`` uses the same math mode.

    Limits: only float32 matrix products change (element-wise kernels, reductions, erf and
    float64 work do not); a matmul issued from another thread or on another device keeps the
    default mode; ``NVIDIA_TF32_OVERRIDE=0`` in the environment disables TF32 in cuBLAS
    whatever this says. Call it after ``set_device("cuda")``.

    Args:
        enabled: True to allow TF32, False for full float32 products (CuPy's default).
    Returns:
        The TF32 setting now in force.
    Raises:
        BackendError: ``enabled`` on the CPU ("--tf32 needs --device cuda"; disabling there is a
            no-op, the CPU always computes in float32), or on a GPU older than compute
            capability 8.0, or the device fails the start-up check.
    """
    global _tf32
    enabled = bool(enabled)
    if _device != "cuda":
        if enabled:
            raise BackendError("--tf32 needs --device cuda: TF32 is a tensor-core mode of "
                               "NVIDIA GPUs (compute capability >= 8.0); the CPU path always "
                               "computes in float32")
        return False
    cupy = _import_cupy()
    if enabled:
        cc = str(cupy.cuda.Device().compute_capability)
        if int(cc) < 80:
            raise BackendError(f"--tf32 needs a GPU of compute capability >= 8.0 (Ampere or "
                               f"newer); this one is {_format_cc(cc)}")
    from cupy._core import _routines_linalg as linalg
    cupy._core.set_compute_type(
        np.float32, linalg.COMPUTE_TYPE_TF32 if enabled else linalg.COMPUTE_TYPE_DEFAULT)
    cupy.cuda.cublas.setMathMode(cupy.cuda.get_cublas_handle(),
                                 _CUBLAS_TF32_TENSOR_OP_MATH if enabled else _CUBLAS_DEFAULT_MATH)
    _tf32 = enabled
    return enabled


def get_tf32() -> bool:
    """Whether :func:`set_tf32` has allowed TF32 float32 products (False on the CPU)."""
    return _tf32 and _device == "cuda"


def _format_cc(cc: str) -> str:
    """CuPy's compute capability string ("80", "120") as "8.0", "12.0"."""
    return f"{cc[:-1]}.{cc[-1]}"


def _format_cuda_version(v: int) -> str:
    """A CUDA version integer (12090) as "12.9"."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def device_summary(device: str | None = None) -> dict:
    """What the run computes on, as a JSON-ready dict for logs and run summaries.

    For "cpu": ``{"device": "cpu", "numpy": version}``. For "cuda" (the current CUDA device):
    ``device``, ``index``, ``name``, ``compute_capability`` ("8.0"), ``total_memory_gib``,
    ``cuda_runtime`` (CuPy's CUDA runtime, "12.9"), ``cuda_driver`` (the newest CUDA the
    driver supports), ``nvrtc`` (the runtime compiler's version), ``cupy`` and ``tf32``.

    Args:
        device: "cpu" or "cuda"; default the device chosen by :func:`set_device`.
    Raises:
        BackendError: "cuda" when it cannot be used (see :func:`set_device`).
    """
    device = device or _device
    if device != "cuda":
        return {"device": "cpu", "numpy": np.__version__}
    cupy = _import_cupy()
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    nvrtc_major, nvrtc_minor = cupy.cuda.nvrtc.getVersion()
    return {
        "device": "cuda",
        "index": int(dev.id),
        "name": name,
        "compute_capability": _format_cc(str(dev.compute_capability)),
        "total_memory_gib": round(props["totalGlobalMem"] / 2**30, 2),
        "cuda_runtime": _format_cuda_version(cupy.cuda.runtime.runtimeGetVersion()),
        "cuda_driver": _format_cuda_version(cupy.cuda.runtime.driverGetVersion()),
        "nvrtc": f"{nvrtc_major}.{nvrtc_minor}",
        "cupy": cupy.__version__,
        "tf32": get_tf32(),
    }


def get_device() -> str:
    """The device chosen by :func:`set_device` ("cpu" unless set)."""
    return _device


def xp_for(device: str | None = None):
    """The array module (numpy or cupy) for ``device`` (default: the current device)."""
    device = device or _device
    return _import_cupy() if device == "cuda" else np


def get_array_module(*arrays):
    """numpy or cupy, whichever holds ``arrays`` (numpy for plain Python values)."""
    for a in arrays:
        if type(a).__module__.startswith("cupy"):
            import cupy
            return cupy
    return np


def to_numpy(x) -> np.ndarray:
    """Copy a numpy/cupy array (or scalar) to a host NumPy array. Use only at the edges."""
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)


def erf(x, out=None):
    """Elementwise error function on either backend (scipy.special / cupyx.scipy.special).

    Args:
        x: float array, any shape. out: optional array of x's shape and dtype (may be x).
    Returns:
        erf(x) in x's dtype (float16 is computed in a wider type and rounded), in ``out``
        when given.
    """
    xp = get_array_module(x)
    if xp is not np:  # pragma: no cover - GPU only
        from cupyx.scipy.special import erf as _erf
    else:
        from scipy.special import erf as _erf
    return _erf(x, out=xp.empty_like(x) if out is None else out)


def derive_seed(*keys: int) -> int:
    """A 63-bit seed derived from integer keys (e.g. (seed, step)) by NumPy's SeedSequence.

    Used so that randomness at a given training step depends only on the run seed and the
    step, which makes a resumed run draw the same dropout masks as an uninterrupted one.
    """
    word = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, np.uint64)[0]
    # the shift on a Python int: NumPy 1 refuses uint64 >> int (no safe common type)
    return int(word) >> 1


DTYPES = ("float32", "float64", "float16", "bfloat16")
"""The names ``--dtype`` takes (:func:`resolve_dtype`)."""


def resolve_dtype(name: str, device: str | None = None) -> np.dtype:
    """The NumPy dtype of a ``--dtype`` name.

    bfloat16 (8 exponent bits as float32, 7 mantissa bits; Kalamkar et al. 2019) is
    ``ml_dtypes.bfloat16``, the type CuPy 14 computes bfloat16 with; NumPy has no arithmetic
    of its own for it, so it is a GPU dtype here.

    Args:
        name: one of :data:`DTYPES`.
        device: "cpu" or "cuda" (default: the device in force).
    Raises:
        BackendError: an unknown name; bfloat16 on the CPU, without ml_dtypes, or with a
            NumPy older than 2.1.2 (below it CuPy registers no bfloat16 kernels:
            ``cupy/_util.pyx``).
    """
    if name not in DTYPES:
        raise BackendError(f"unknown dtype {name!r}: expected one of {', '.join(DTYPES)}")
    if name != "bfloat16":
        return np.dtype(name)
    if (device or _device) != "cuda":
        raise BackendError("--dtype bfloat16 needs --device cuda: it runs on the GPU's "
                           "tensor cores through CuPy; on the CPU use float32")
    if np.lib.NumpyVersion(np.__version__) < "2.1.2":
        raise BackendError(f"--dtype bfloat16 needs NumPy >= 2.1.2 (CuPy's bfloat16 kernels "
                           f"need it); this is NumPy {np.__version__}")
    try:
        import ml_dtypes
    except ImportError:
        raise BackendError("--dtype bfloat16 needs the ml_dtypes package: " + _INSTALL_HINT
                           ) from None
    return np.dtype(ml_dtypes.bfloat16)


def is_half(dtype) -> bool:
    """Whether ``dtype`` is a 16-bit float (float16 or bfloat16): mixed precision, with
    float32 master weights and float32 row reductions."""
    dtype = np.dtype(dtype)
    return dtype == np.float16 or dtype.name == "bfloat16"


def compute_dtype(dtype):
    """The dtype in which reductions over a row run for activations of ``dtype``: float32
    for float16 and bfloat16 (LayerNorm statistics, softmax and cross-entropy sums overflow
    or lose their precision in half precision; the float32 list of PyTorch's autocast),
    else ``dtype`` itself."""
    return np.dtype(np.float32) if is_half(dtype) else np.dtype(dtype)


def finfo(dtype):
    """``numpy.finfo`` of a float dtype, bfloat16 included (through ``ml_dtypes.finfo``;
    NumPy's refuses it)."""
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


# SplitMix64 (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number generators";
# the mixing constants of Java's SplittableRandom): the k-th draw of a stream is the
# finalizer of seed + k * golden, so any draw is a function of (seed, k) alone
_SPLITMIX64 = """
U z = seed + (offset + i + 1) * 0x9E3779B97F4A7C15ull;
z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
z = z ^ (z >> 31);
"""
_UNIFORM_BITS = {"float32": "u = (z >> 40) * 5.9604644775390625e-08f",    # 24 bits x 2^-24
                 "float64": "u = (z >> 11) * 1.1102230246251565e-16"}     # 53 bits x 2^-53
_UNIFORM_KERNELS: dict = {}


def _uniform_kernel(dtype):
    """The ElementwiseKernel drawing uniforms in [0, 1) of ``dtype`` (float32 or float64):
    element i of a draw at ``offset`` is SplitMix64's draw offset + i + 1 of ``seed``."""
    name = np.dtype(dtype).name
    if name not in _UNIFORM_KERNELS:
        cupy = _import_cupy()
        _UNIFORM_KERNELS[name] = cupy.ElementwiseKernel(
            "U seed, U offset", f"{name} u", _SPLITMIX64 + _UNIFORM_BITS[name],
            f"minibert_uniform_{name}")
    return _UNIFORM_KERNELS[name]


class DropoutRNG:
    """The one dropout generator of a run, re-keyed for every micro-batch.

    ``load(seeds)`` (one seed per micro-batch of a step, :func:`derive_seed` of the run
    seed, the step and the micro-batch) then ``select(i)`` before micro-batch i makes the
    masks of a step depend only on the run seed and the step, so a resumed run draws what
    an uninterrupted one would. On the CPU a selection is a fresh PCG64
    ``numpy.random.default_rng`` (microseconds). On the GPU the generator is counter-based
    (SplitMix64, in one kernel per draw): the seeds live in a device buffer that ``load``
    fills (one host-to-device copy) and each draw reads its seed from there, at an offset
    counted from the selection on the host. Nothing of it is host state that a kernel bakes
    in, so a step captured as a CUDA graph (:mod:`minibert.graphs`) draws new masks on
    every replay from the seeds loaded before it.

    Args:
        device: "cpu" or "cuda" (default: the current device).
    """

    def __init__(self, device: str | None = None):
        self.device = device or _device
        self._gen = None
        self._seeds = self._seed = None           # GPU: (k,) uint64 buffer, its element i
        self._host_seeds: list[int] = []          # CPU: the loaded seeds
        self._offset = 0

    def load(self, seeds) -> "DropoutRNG":
        """The seeds (ints in [0, 2^64)) of a step's micro-batches; :meth:`select` picks one.
        On the GPU they are copied into a device buffer kept while their number stays."""
        if self.device == "cuda":  # pragma: no cover - GPU only
            cupy = _import_cupy()
            host = np.asarray([int(s) for s in seeds], dtype=np.uint64)
            if self._seeds is None or self._seeds.shape != host.shape:
                self._seeds = cupy.empty(host.shape, np.uint64)
            self._seeds.set(host)
        else:
            self._host_seeds = [int(s) for s in seeds]
        return self

    def select(self, i: int) -> "DropoutRNG":
        """Draw from the i-th loaded seed from its start."""
        if self.device == "cuda":  # pragma: no cover - GPU only
            self._seed, self._offset = self._seeds[i], 0
        else:
            self._gen = np.random.default_rng(self._host_seeds[i])
        return self

    def reseed(self, seed: int) -> "DropoutRNG":
        """Re-key the generator with ``seed`` (an int, e.g. from :func:`derive_seed`):
        ``load([seed]).select(0)``."""
        return self.load([seed]).select(0)

    @property
    def numpy_generator(self):
        """The current ``numpy.random.Generator`` on the CPU (None on the GPU): what
        :func:`keep_mask` draws raw bits from."""
        return self._gen if self.device == "cpu" else None

    def random(self, shape, dtype=np.float64):
        """Uniform [0, 1) samples of ``shape`` and float ``dtype`` (float32 or float64) on
        the device.

        Raises:
            RuntimeError: on the GPU before any :meth:`select` / :meth:`reseed`."""
        if self.device == "cuda":  # pragma: no cover - GPU only
            if self._seed is None:
                raise RuntimeError("DropoutRNG: no seed selected (load() and select(), or "
                                   "reseed(), first)")
            cupy = _import_cupy()
            out = cupy.empty(shape, dtype)
            _uniform_kernel(dtype)(self._seed, np.uint64(self._offset), out)
            self._offset += out.size
            return out
        return self._gen.random(shape, dtype=dtype)


_TWO_32 = 2 ** 32


def keep_threshold(p: float):
    """The uint32 that 32 raw bits must reach to keep an element: round(p 2^32), at most
    2^32 - 1 (:func:`keep_mask`; P(keep) = 1 - threshold / 2^32)."""
    return np.uint32(min(round(p * _TWO_32), _TWO_32 - 1))


def keep_mask(rng, shape, p: float):
    """A boolean array of ``shape``, each element True (kept) with probability 1 - p.

    From a NumPy ``Generator`` (or a CPU :class:`~minibert.backend.DropoutRNG`) the mask
    compares 32 raw bits of the bit generator per element with round(p 2^32): about 3x
    faster than float32 uniforms, which NumPy makes from the same bits one at a time
    (2.1 M elements: 3.0 ms against 9.3 ms on 2 cores). P(keep) is 1 - round(p 2^32) / 2^32,
    within 2^-33 of 1 - p. Any other generator (CuPy, or a test's stand-in) is asked for
    float32 uniforms: ``rng.random(shape, dtype=float32) >= p``.

    Args:
        rng: ``numpy.random.Generator``, :class:`~minibert.backend.DropoutRNG`, or any
            object with ``random(shape, dtype)`` on the arrays' device.
        shape: tuple of ints. p: drop probability in [0, 1).
    """
    gen = getattr(rng, "numpy_generator", rng)
    if not isinstance(gen, np.random.Generator):
        return rng.random(shape, dtype=np.float32) >= p
    n = math.prod(shape)
    bits = gen.bit_generator.random_raw((n + 1) // 2).view(np.uint32)[:n]   # (n,) uint32
    return (bits >= keep_threshold(p)).reshape(shape)
