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

from ..backend import compute_dtype, erf, get_array_module
from ..fast import fast_path
from .module import Module

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_C = 0.044715


def gelu_forward(x):
    """Exact GELU: x Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))). x: any shape -> same shape;
    the cache is (x, Phi(x)).

    With the fast paths on (:func:`minibert.fast.set_fast_paths`), NumPy arrays run
    :func:`minibert.fast_cpu.gelu_forward` instead (blocks over threads; in float32 a
    rational Phi within 2.5e-7 of the exact value).
    """
    fast = fast_path("gelu_forward", x)
    if fast is not None:
        return fast(x)
    cdf = 0.5 * (1.0 + erf(x * _SQRT_HALF))             # Phi(x), shape of x
    return x * cdf, (x, cdf)


def bias_gelu_forward(x, b):
    """:func:`gelu_forward` of ``x + b``: a Linear layer's bias and the GELU after it (BERT's
    feed-forward expansion and MLM transform), as one function so that the GPU runs it as
    one kernel. x: (..., I) float; b: (I,). Returns out (shape of x) and the cache of
    :func:`gelu_forward` (x + b, Phi(x + b)). With the fast paths on, CuPy arrays run
    :func:`minibert.gpu_kernels.bias_gelu_forward`."""
    fast = fast_path("bias_gelu_forward", x)
    if fast is not None:
        return fast(x, b)
    return gelu_forward(x + b)


def gelu_backward(dout, cache):
    """d/dx [x Phi(x)] = Phi(x) + x phi(x), phi the standard normal density. dout: shape of
    x -> dx, same shape. With the fast paths on, NumPy arrays run
    :func:`minibert.fast_cpu.gelu_backward` instead."""
    fast = fast_path("gelu_backward", dout)
    if fast is not None:
        return fast(dout, cache)
    x, cdf = cache
    xp = get_array_module(x)
    # forward: out = x * Phi(x)
    pdf = xp.exp(x * x * -0.5) * _INV_SQRT_2PI          # phi(x), shape of x
    return dout * (cdf + x * pdf)


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

    def forward_with_bias(self, x, b):
        """The activation of ``x + b`` (b: the bias a Linear layer left out,
        :meth:`minibert.nn.Linear.forward_without_bias`); for GELU one kernel on the GPU
        (:func:`bias_gelu_forward`)."""
        if self.name == "gelu":
            out, self._cache = bias_gelu_forward(x, b)
        else:
            out, self._cache = self._fwd(x + b)
        return out

    def backward(self, dout):
        return self._bwd(dout, self.take_cache())


def softmax_forward(x, axis: int = -1, out=None):
    """Numerically stable softmax along ``axis`` (the max is subtracted first, which
    changes nothing: softmax ignores a constant added to a row).

    Args:
        x: any shape, float. Float16 is normalised in float32 (see
            :func:`minibert.backend.compute_dtype`) and returned as float16.
        axis: the axis normalised over.
        out: optional array of x's shape and dtype for the result (not used for float16);
            ``out=x`` works in place (attention does this with its scores, which nothing
            else reads).
    Returns:
        probs (same shape as x, each slice along ``axis`` sums to 1) and a cache
        ``(probs, axis)`` for :func:`softmax_backward`. With the fast paths on
        (:func:`minibert.fast.set_fast_paths`), NumPy arrays run
        :func:`minibert.fast_cpu.softmax_forward` instead (in place, row blocks over
        threads).
    """
    fast = fast_path("softmax_forward", x)
    if fast is not None:
        return fast(x, axis, out)
    xp = get_array_module(x)
    dtype = x.dtype
    if compute_dtype(dtype) != dtype:                    # float16: normalise in float32
        x, out = x.astype(compute_dtype(dtype)), None
    # one buffer (out, else a new array) holds x - max, then its exp, then the probabilities:
    # on the GPU the attention scores are normalised in place, without (B, NH, T, T) copies
    e = xp.subtract(x, x.max(axis=axis, keepdims=True), out=out)   # shape of x, largest 0
    xp.exp(e, out=e)                                                # largest entry 1
    probs = xp.divide(e, e.sum(axis=axis, keepdims=True), out=e)
    probs = probs.astype(dtype, copy=False)
    return probs, (probs, axis)


def log_softmax(x, axis: int = -1):
    """Numerically stable log-softmax along ``axis``: log p = (x - max) - log sum exp(x - max),
    so no exp overflows and no probability underflows to log(0). Distillation's soft
    targets and the fine-tuning scores take their log-probabilities from here; the
    cross-entropy (:func:`minibert.nn.losses.softmax_nll`) runs the same formula fused with
    the softmax its backward keeps.

    Its gradient is ``dx = dlogp - softmax(x) * sum(dlogp)`` along ``axis``; each loss folds
    that into its own backward (e.g. ``softmax - target`` for cross-entropy), so there is
    no separate ``log_softmax_backward``.

    Args:
        x: any shape, float. Float16 is reduced in float32 (see
            :func:`minibert.backend.compute_dtype`) and returned as float16.
        axis: the axis normalised over.
    Returns:
        log p, the shape and dtype of x; ``exp`` of each slice along ``axis`` sums to 1.
    """
    xp = get_array_module(x)
    dtype = x.dtype
    x = x.astype(compute_dtype(dtype), copy=False)
    shifted = x - x.max(axis=axis, keepdims=True)                      # shape of x, largest 0
    logp = shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))
    return logp.astype(dtype, copy=False)


def softmax_backward(dprobs, cache, out=None):
    """Jacobian-vector product of softmax along the forward's axis:
    dx = p * (dp - sum(dp * p)), from dp_i/dx_j = p_i (delta_ij - p_j)
    (J = diag(p) - p p^T, never materialised; docs/backprop.md section 5).

    Args:
        dprobs: upstream gradient, the shape of probs.
        cache: from :func:`softmax_forward`.
        out: optional array for the result; ``out=dprobs`` works in place.
    Returns:
        dx, the shape of x. With the fast paths on, NumPy arrays run
        :func:`minibert.fast_cpu.softmax_backward` instead (row blocks over threads).
    """
    fast = fast_path("softmax_backward", dprobs)
    if fast is not None:
        return fast(dprobs, cache, out)
    probs, axis = cache
    xp = get_array_module(probs)
    # forward: probs = exp(x - max) / sum(exp(x - max))
    row = (dprobs * probs).sum(axis=axis, keepdims=True,
                               dtype=compute_dtype(probs.dtype)).astype(probs.dtype)
    return xp.multiply(dprobs - row, probs, out=out)    # shape of x
