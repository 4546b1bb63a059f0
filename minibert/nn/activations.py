"""Elementwise activations and the row softmax, each with its backward.

The GELU names follow Hugging Face ``ACT2FN``: ``"gelu"`` is the exact form
x * Phi(x) (Hendrycks & Gimpel 2016, used by google-research/bert's released models
through HF), ``"gelu_new"`` the tanh approximation of the same paper (GPT-2, original
BERT TF code).

Every pair follows one contract: ``*_forward(x) -> (out, cache)`` and
``*_backward(dout, cache) -> dx``, with dout and dx of the shape of out and x. The
derivations are in docs/backprop.md, sections 4 and 5.
"""
from __future__ import annotations

import math

from ..backend import compute_dtype, erf, get_array_module, parallel_rows
from .module import Module

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_C = 0.044715


def gelu_forward(x):
    """Exact GELU: 0.5 * x * (1 + erf(x / sqrt(2))). x: any shape -> same shape."""
    cdf = x * _SQRT_HALF
    erf(cdf, out=cdf)
    cdf += 1.0
    cdf *= 0.5                                           # Phi(x)
    return x * cdf, (x, cdf)


def gelu_backward(dout, cache):
    """d/dx [x Phi(x)] = Phi(x) + x phi(x), phi the standard normal density."""
    x, cdf = cache
    xp = get_array_module(x)
    # forward: out = x * Phi(x)
    d = x * x
    d *= -0.5
    xp.exp(d, out=d)
    d *= _INV_SQRT_2PI                                   # phi(x)
    d *= x
    d += cdf                                             # Phi(x) + x phi(x)
    d *= dout
    return d


def gelu_new_forward(x):
    """Tanh GELU: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""
    xp = get_array_module(x)
    t = xp.tanh(_SQRT_2_OVER_PI * (x + _GELU_TANH_C * x * x * x))
    return 0.5 * x * (1.0 + t), (x, t)


def gelu_new_backward(dout, cache):
    """With u = sqrt(2/pi)(x + c x^3): d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x)."""
    x, t = cache
    du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_C * x * x)
    return dout * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


def relu_forward(x):
    """max(x, 0)."""
    xp = get_array_module(x)
    return xp.maximum(x, 0), (x,)


def relu_backward(dout, cache):
    """d/dx max(x, 0) = 1 where x > 0, else 0 (0 at the kink, as PyTorch)."""
    (x,) = cache
    return dout * (x > 0)


def tanh_forward(x):
    """tanh(x); cache keeps the output, since d tanh = 1 - tanh^2."""
    out = get_array_module(x).tanh(x)
    return out, (out,)


def tanh_backward(dout, cache):
    """d tanh(x) / dx = 1 - tanh(x)^2, from the cached output."""
    (out,) = cache
    return dout * (1.0 - out * out)


ACTIVATIONS = {
    "gelu": (gelu_forward, gelu_backward),
    "gelu_new": (gelu_new_forward, gelu_new_backward),
    "relu": (relu_forward, relu_backward),
    "tanh": (tanh_forward, tanh_backward),
}


class Activation(Module):
    """An elementwise activation chosen by its HF name (``gelu``, ``gelu_new``, ``relu``,
    ``tanh``).

    Raises:
        ValueError: unknown name (the known ones are listed).
    """

    def __init__(self, name: str):
        if name not in ACTIVATIONS:
            raise ValueError(f"unknown activation {name!r}: expected one of {sorted(ACTIVATIONS)}")
        self.name = name
        self._fwd, self._bwd = ACTIVATIONS[name]
        self._cache = None

    def forward(self, x):
        out, self._cache = self._fwd(x)
        return out

    def backward(self, dout):
        dx = self._bwd(dout, self._cache)
        self._cache = None
        return dx


def softmax_forward(x, axis: int = -1, out=None):
    """Numerically stable softmax along ``axis`` (the max is subtracted first, which
    changes nothing: softmax ignores a constant added to a row).

    Args:
        x: any shape, float.
        axis: the axis normalised over.
        out: optional array of x's shape and dtype for the result; ``out=x`` works in
            place (attention does this with its scores, which nothing else reads).
    Returns:
        probs (same shape as x, each slice along ``axis`` sums to 1) and a cache
        ``(probs, axis)`` for :func:`softmax_backward`.
    """
    xp = get_array_module(x)
    dtype = x.dtype
    if compute_dtype(dtype) != dtype:                    # float16: normalise in float32
        x, out = x.astype(compute_dtype(dtype)), None
    probs = xp.empty_like(x) if out is None else out

    def rows(x, probs):  # row blocks of the leading axis on the CPU's threads
        xp.subtract(x, x.max(axis=axis, keepdims=True), out=probs)
        xp.exp(probs, out=probs)
        probs /= probs.sum(axis=axis, keepdims=True)

    if axis in (-1, x.ndim - 1) and x.ndim > 1:
        parallel_rows(rows, x, probs)
    else:
        rows(x, probs)
    probs = probs.astype(dtype, copy=False)
    return probs, (probs, axis)


def softmax_backward(dprobs, cache, out=None):
    """Jacobian-vector product of softmax along the forward's axis:
    dx = p * (dp - sum(dp * p)), from dp_i/dx_j = p_i (delta_ij - p_j)
    (J = diag(p) - p p^T, never materialised; docs/backprop.md section 5).

    Args:
        dprobs: upstream gradient, the shape of probs.
        cache: from :func:`softmax_forward`.
        out: optional array for the result; ``out=dprobs`` works in place.
    Returns:
        dx, the shape of x.
    """
    probs, axis = cache
    xp = get_array_module(probs)
    dx = xp.empty_like(dprobs) if out is None else out

    def rows(dprobs, probs, dx):
        # forward: probs = exp(x - max) / sum(exp(x - max))
        row = (dprobs * probs).sum(axis=axis, keepdims=True,
                                   dtype=compute_dtype(probs.dtype)).astype(probs.dtype)
        xp.subtract(dprobs, row, out=dx)
        dx *= probs

    if axis in (-1, probs.ndim - 1) and probs.ndim > 1:
        parallel_rows(rows, dprobs, probs, dx)
    else:
        rows(dprobs, probs, dx)
    return dx
