"""Array backend: NumPy on the CPU or CuPy on a CUDA GPU, chosen once per process.

Layers never ask which device they run on: they call :func:`get_array_module` on their
inputs (the CuPy / Chainer convention), so one implementation serves both devices.
Only model construction and the edges of a run (data in, logs and checkpoints out) use
the process-wide choice made by :func:`set_device`.
"""
from __future__ import annotations

import os

import numpy as np

DEVICES = ("cpu", "cuda")
_device = "cpu"


class BackendError(RuntimeError):
    """The requested device cannot be used (CuPy missing, no GPU, unknown name)."""


def _import_cupy():
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise BackendError(
            "device 'cuda' needs CuPy, which is not installed: "
            "pip install 'minibert[gpu]' (cupy-cuda12x)") from e
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # pragma: no cover - depends on the machine
        raise BackendError(
            f"device 'cuda': CuPy is installed but no CUDA GPU is usable ({e})") from e
    if n < 1:  # pragma: no cover
        raise BackendError("device 'cuda': CuPy is installed but it sees no CUDA GPU")
    return cupy


def set_device(device: str | None = None) -> str:
    """Choose the array module for the process.

    Args:
        device: "cpu" or "cuda"; None reads the environment variable MINIBERT_DEVICE,
            defaulting to "cpu".
    Returns:
        The device name in force.
    Raises:
        BackendError: unknown device name, or "cuda" without CuPy or without a GPU.
    """
    global _device
    device = device or os.environ.get("MINIBERT_DEVICE", "cpu")
    if device not in DEVICES:
        raise BackendError(f"unknown device {device!r}: expected one of {', '.join(DEVICES)}")
    if device == "cuda":
        _import_cupy()
    _device = device
    return device


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


def erf(x):
    """Elementwise error function on either backend (scipy.special / cupyx.scipy.special)."""
    if get_array_module(x) is np:
        from scipy.special import erf as _erf
    else:  # pragma: no cover - GPU only
        from cupyx.scipy.special import erf as _erf
    return _erf(x)


def derive_seed(*keys: int) -> int:
    """A 63-bit seed derived from integer keys (e.g. (seed, step)) by NumPy's SeedSequence.

    Used so that randomness at a given training step depends only on the run seed and the
    step, which makes a resumed run draw the same dropout masks as an uninterrupted one.
    """
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(2, np.uint64)[0] >> 1)


def make_rng(seed: int, device: str | None = None):
    """A seeded random Generator on ``device`` (numpy.random.Generator or cupy's)."""
    return xp_for(device).random.default_rng(seed)
