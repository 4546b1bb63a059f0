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

import numpy as np

from ..backend import compute_dtype, erf, get_array_module, parallel_blocks, parallel_rows
from .module import Module

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_C = 0.044715


# Phi(x) - 1/2 = x P(x^2) / Q(x^2) on |x| <= 4 sqrt(2), the float32 CPU form of the normal
# CDF. Our own fit: erf(z) = z p(z^2) / q(z^2) (p of degree 6, q of degree 4, q_0 = 1) on
# z in (0, 4], least squares on the linearised relative error (f q - z p) / (f q_prev),
# re-weighted towards the minimax error (Lawson's iteration), in float64 against SciPy's
# erf; then z = x / sqrt(2), with the 1/2 of Phi folded into P. Relative error of the fit
# 6.9e-8; evaluated in float32, |Phi - exact| <= 2.5e-7 for every float32 x (tests/test_layers.py).
# Beyond |x| = 4 sqrt(2), 1 - Phi(|x|) < 1.6e-8 is below float32's resolution next to 1.
_PHI_P = tuple(np.float32(c) for c in (
    3.9894225492669799e-01, 3.6641473833296953e-02, 4.5560608459247597e-03,
    1.7664241801571389e-04, 3.2577720600479364e-06, -2.1463469473045735e-08,
    1.0553505211691192e-10))
_PHI_Q = tuple(np.float32(c) for c in (
    1.0, 2.5851218582671837e-01, 2.9508445029692330e-02, 1.8714236118387957e-03,
    6.3913727298284324e-05))
_PHI_CLIP = np.float32(4.0 * math.sqrt(2.0))


def _horner(coefficients, s, out):
    """out = sum_k coefficients[k] s^k (Horner's rule, in place; out may not be s)."""
    np.multiply(s, coefficients[-1], out=out)
    for k in range(len(coefficients) - 2, -1, -1):
        out += coefficients[k]
        if k:
            out *= s
    return out


def normal_cdf(x, out):
    """The standard normal CDF, Phi(x) = (1 + erf(x / sqrt(2))) / 2, written into ``out``.

    Args:
        x: float array, any shape. out: array of x's shape and dtype (not x itself).
    Returns:
        ``out``. Float32 NumPy input takes the rational form above (25 ufunc passes,
        |error| <= 2.5e-7, about 5x faster than SciPy's erf, which computes in float64
        one scalar at a time); other dtypes and CuPy use erf from SciPy / CuPy, exact to
        the dtype's rounding.
    """
    xp = get_array_module(x)
    if xp is not np or x.dtype != np.float32:
        xp.multiply(x, _SQRT_HALF, out=out)
        erf(out, out=out)
        out += 1.0
        out *= 0.5
        return out
    np.clip(x, -_PHI_CLIP, _PHI_CLIP, out=out)          # c: x clipped
    s = np.multiply(out, out)                            # c^2
    p = _horner(_PHI_P, s, np.empty_like(s))             # P(c^2)
    p *= out                                             # c P(c^2)
    _horner(_PHI_Q, s, out)                              # Q(c^2)
    np.divide(p, out, out=out)
    out += np.float32(0.5)
    return out


def gelu_forward(x):
    """Exact GELU: x Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))). x: any shape -> same shape.

    Phi comes from :func:`normal_cdf` (in float32 on the CPU its rational form, within
    2.5e-7 of the exact value). The work runs on cache-sized blocks over the CPU's threads
    (:func:`minibert.backend.parallel_blocks`); the cache is (x, Phi(x)).
    """
    xp = get_array_module(x)
    cdf, out = xp.empty_like(x), xp.empty_like(x)

    def block(x, cdf, out):
        normal_cdf(x, cdf)                               # Phi(x)
        xp.multiply(x, cdf, out=out)

    parallel_blocks(block, x, cdf, out)
    return out, (x, cdf)


def gelu_backward(dout, cache):
    """d/dx [x Phi(x)] = Phi(x) + x phi(x), phi the standard normal density."""
    x, cdf = cache
    xp = get_array_module(x)
    dx = xp.empty_like(x)

    def block(x, cdf, dout, d):
        # forward: out = x * Phi(x)
        xp.multiply(x, x, out=d)
        d *= -0.5
        xp.exp(d, out=d)
        d *= _INV_SQRT_2PI                               # phi(x)
        d *= x
        d += cdf                                         # Phi(x) + x phi(x)
        d *= dout

    parallel_blocks(block, x, cdf, dout, dx)
    return dx


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
