"""Layer normalisation over the last axis (Ba, Kiros & Hinton 2016), BERT's eps 1e-12.

Shape legend: N = leading dims (B*T), C = normalised size.
"""
from __future__ import annotations

import numpy as np

from ..backend import compute_dtype, get_array_module, parallel_rows
from .module import Module, Parameter


def layernorm_forward(x, w, b, eps: float = 1e-12):
    """out = (x - mean) / sqrt(var + eps) * w + b, statistics over the last axis.

    Args:
        x: (..., C) float; w, b: (C,). Float16 input is normalised in float32 (see
            :func:`minibert.backend.compute_dtype`) and returned as float16.
    Returns:
        out (..., C) and a cache (xhat, rstd, w).
    """
    xp = get_array_module(x)
    dtype = x.dtype
    x = x.astype(compute_dtype(dtype), copy=False)       # float16 -> float32 statistics
    C = x.shape[-1]
    x2 = x.reshape(-1, C)                                # (N, C)
    xhat, out = xp.empty_like(x2), xp.empty_like(x2)
    rstd = xp.empty_like(x2, shape=(len(x2), 1))

    def rows(x, xhat, out, rstd):  # row blocks on the CPU's threads
        xp.subtract(x, x.mean(axis=-1, keepdims=True), out=xhat)      # centred
        xp.multiply(xhat, xhat, out=out)                              # scratch: squares
        rstd[:] = (out.mean(axis=-1, keepdims=True) + eps) ** -0.5    # biased var, as BERT
        xhat *= rstd                                                  # normalised
        xp.multiply(xhat, w, out=out)
        out += b

    parallel_rows(rows, x2, xhat, out, rstd)
    shape = x.shape
    return (out.reshape(shape).astype(dtype, copy=False),
            (xhat.reshape(shape), rstd.reshape(*shape[:-1], 1), w))


def layernorm_backward(dout, cache):
    """Gradients of :func:`layernorm_forward`.

    With g = dout * w, the input gradient is
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), means over the last axis.
    Returns dx (..., C), dw (C,), db (C,).
    """
    xhat, rstd, w = cache
    xp = get_array_module(xhat)
    dtype = dout.dtype
    dout = dout.astype(xhat.dtype, copy=False)
    C = xhat.shape[-1]
    # forward: out = xhat * w + b
    tmp = xp.multiply(dout, xhat)                        # (..., C) scratch
    dw = tmp.reshape(-1, C).sum(axis=0)                  # (C,)
    db = dout.reshape(-1, C).sum(axis=0)                 # (C,)
    dx = xp.empty_like(tmp)

    def rows(dout, xhat, rstd, tmp, dx):  # row blocks on the CPU's threads
        xp.multiply(dout, w, out=dx)                     # g = d out / d xhat
        # forward: xhat = (x - mean(x)) * rstd; rstd depends on x through var
        # dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        xp.multiply(dx, xhat, out=tmp)
        mean_gx = tmp.mean(axis=-1, keepdims=True)       # (n, 1)
        mean_g = dx.mean(axis=-1, keepdims=True)         # (n, 1)
        xp.multiply(xhat, mean_gx, out=tmp)
        dx -= tmp
        dx -= mean_g
        dx *= rstd

    parallel_rows(rows, *(a.reshape(-1, a.shape[-1]) for a in (dout, xhat, rstd, tmp, dx)))
    return dx.astype(dtype, copy=False), dw, db


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
        dx, dw, db = layernorm_backward(dout, self._cache)
        self.weight.add_grad(dw)
        self.bias.add_grad(db)
        self._cache = None
        return dx
