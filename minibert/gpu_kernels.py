"""Fused CuPy kernels for the GPU path: each one pass over memory instead of a chain of
element-wise launches. Imported only when arrays live on the GPU (CuPy compiles a kernel
with NVRTC on its first call and caches it).

Every kernel computes the formula it replaces (named in its docstring) and runs only when a
job switches the fast paths on (:func:`minibert.fast.set_fast_paths`); tests compare
the two through the NumPy stand-in of CuPy (tests/fakecupy.py).
"""
from __future__ import annotations

import functools

import cupy


@functools.lru_cache(maxsize=None)
def _adamw_kernel():
    # one thread per scalar of the flat buffer; i is the element index, so the decayed
    # matrices (the first n_decay scalars) get the decoupled weight decay. c1 = 1 - b1 and
    # c2 = 1 - b2 come from the host: computed here in float32, 1 - 0.999f is 1.00005e-3,
    # not 1e-3 (b2 rounded to float32 first), which the NumPy passes do not do.
    return cupy.ElementwiseKernel(
        "T g, T lr, T step_size, T v_scale, T b1, T b2, T c1, T c2, T eps, T wd, "
        "int64 n_decay",
        "T p, T m, T v",
        """
        T m_new = b1 * m + c1 * g;
        T v_new = b2 * v + g * g * c2;
        m = m_new;
        v = v_new;
        T p_new = p;
        if (i < n_decay) p_new = p_new * (1 - lr * wd);
        p = p_new - step_size * m_new / (sqrt(v_new) * v_scale + eps);
        """,
        "minibert_adamw")


def adamw_update(p, g, m, v, n_decay: int, lr, step_size, v_scale: float, b1: float,
                 b2: float, eps: float, weight_decay: float, scratch=None) -> None:
    """One fused AdamW update over flat (S,) buffers, in place on p, m, v: the formula of
    :func:`minibert.optim.adamw_update` (Loshchilov & Hutter 2019, BERT's eps placement).

    Args:
        p, g, m, v: (S,) float32 CuPy arrays (parameters, gradient, moments).
        n_decay: the first n_decay scalars are weight-decayed.
        lr, step_size: floats or 0-d device arrays (a skipped step passes lr 0 with no
            host read); v_scale, b1, b2, eps, weight_decay: floats, passed to the kernel
            as scalar arguments (no host-to-device copy).
        scratch: unused (the kernel keeps its intermediates in registers).
    """
    _adamw_kernel()(g, lr, step_size, v_scale, b1, b2, 1.0 - b1, 1.0 - b2, eps, weight_decay,
                    int(n_decay), p, m, v)


FAST_PATHS = {"adamw_update": adamw_update}
"""The name of a formula -> its fused GPU kernel, where the GPU has one (see
:func:`minibert.fast.fast_path`); the other formulas run as written on the GPU."""
