"""Layer normalisation over the last axis (Ba, Kiros & Hinton 2016), BERT's eps 1e-12.

Shape legend: N = leading dims (B*T), C = normalised size.
"""
from __future__ import annotations

import numpy as np

from ..backend import compute_dtype
from ..fast import fast_path
from .module import Module, Parameter, backward_into


def layernorm_forward(x, w, b, eps: float = 1e-12):
    """out = (x - mean) / sqrt(var + eps) * w + b, statistics over the last axis.

    Args:
        x: (..., C) float; w, b: (C,). Float16 input is normalised in float32 (see
            :func:`minibert.backend.compute_dtype`) and returned as float16.
    Returns:
        out (..., C) and a cache (xhat (..., C), rstd (..., 1), w). With the fast paths
        on (:func:`minibert.fast.set_fast_paths`), NumPy arrays run
        :func:`minibert.fast_cpu.layernorm_forward` instead (row blocks over threads).
    """
    fast = fast_path("layernorm_forward", x)
    if fast is not None:
        return fast(x, w, b, eps)
    dtype = x.dtype
    x = x.astype(compute_dtype(dtype), copy=False)       # float16 -> float32 statistics
    xc = x - x.mean(axis=-1, keepdims=True)              # (..., C) centred
    var = (xc * xc).mean(axis=-1, keepdims=True)         # (..., 1) biased, as BERT
    rstd = (var + eps) ** -0.5                           # (..., 1)
    xhat = xc * rstd                                     # (..., C) normalised
    out = xhat * w + b                                   # (..., C)
    return out.astype(dtype, copy=False), (xhat, rstd, w)


def layernorm_backward(dout, cache):
    """Gradients of :func:`layernorm_forward`.

    With g = dout * w, the input gradient is
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), means over the last axis
    (docs/backprop.md section 3). Returns dx (..., C), dw (C,), db (C,). With the fast paths
    on, NumPy arrays run :func:`minibert.fast_cpu.layernorm_backward` instead.
    """
    fast = fast_path("layernorm_backward", dout)
    if fast is not None:
        return fast(dout, cache)
    xhat, rstd, w = cache
    dtype = dout.dtype
    dout = dout.astype(xhat.dtype, copy=False)
    C = xhat.shape[-1]
    # forward: out = xhat * w + b
    dw = (dout * xhat).reshape(-1, C).sum(axis=0)        # (C,)
    db = dout.reshape(-1, C).sum(axis=0)                 # (C,)
    g = dout * w                                         # (..., C) d out / d xhat
    # forward: xhat = (x - mean(x)) * rstd, rstd = (var(x) + eps)^-1/2
    mean_gx = (g * xhat).mean(axis=-1, keepdims=True)    # (..., 1)
    mean_g = g.mean(axis=-1, keepdims=True)              # (..., 1)
    dx = (g - xhat * mean_gx - mean_g) * rstd            # (..., C)
    return dx.astype(dtype, copy=False), dw, db


def layernorm_backward_into(dout, cache, dw_acc=None, db_acc=None):
    """:func:`layernorm_backward` with dw and db added into accumulators (the parameters'
    ``grad``), which is what :meth:`LayerNorm.backward` does with them.

    Args:
        dout: (..., C); cache: from :func:`layernorm_forward`; dw_acc, db_acc: (C,) arrays
            to add into, or None (a frozen parameter).
    Returns:
        dx (..., C). With the fast paths on, CuPy arrays run
        :func:`minibert.gpu_kernels.layernorm_backward_into` (the column sums inside
        cuBLAS products that accumulate, ``beta = 1``).
    """
    return backward_into("layernorm_backward_into", layernorm_backward, dout, cache, dw_acc,
                         db_acc)


class LayerNorm(Module):
    """``nn.LayerNorm(C, eps)``: weight ones, bias zeros (HF names ``LayerNorm.weight/bias``)."""

    def __init__(self, size: int, eps: float = 1e-12, *, dtype=np.float32):
        self.weight = Parameter(np.ones(size, dtype=dtype))
        self.bias = Parameter(np.zeros(size, dtype=dtype))
        self.eps = eps
        self._cache = None

    def forward(self, x):
        """x: (..., C) -> (..., C)."""
        out, self._cache = layernorm_forward(x, self.weight.data, self.bias.data, self.eps)
        return out

    def backward(self, dout):
        """dout: (..., C) -> dx (..., C); accumulates weight/bias grads."""
        w, b = self.weight, self.bias
        return layernorm_backward_into(dout, self.take_cache(),
                                       w.grad if w.requires_grad else None,
                                       b.grad if b.requires_grad else None)
