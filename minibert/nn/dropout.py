"""Inverted dropout (Srivastava et al. 2014) with randomness from an explicit generator."""
from __future__ import annotations

from ..backend import keep_mask  # the mask's draw: beside the generators it draws from
from ..fast import fast_path
from .module import Module


def dropout_forward(x, p: float, rng):
    """Zero each element with probability ``p`` and scale the rest by 1 / (1 - p).

    Args:
        x: any shape, float.
        p: drop probability in [0, 1).
        rng: the generator of :func:`keep_mask`, on the same device as ``x``.
    Returns:
        out (same shape) and the cache of :func:`dropout_backward`: (keep, scale), the
        boolean mask of kept elements (shape of x, one byte each) and 1 / (1 - p). With
        the fast paths on (:func:`minibert.fast.set_fast_paths`), CuPy arrays run
        :func:`minibert.gpu_kernels.dropout_forward` instead (the draw and one kernel).
    """
    fast = fast_path("dropout_forward", x)
    if fast is not None:
        return fast(x, p, rng)
    keep = keep_mask(rng, x.shape, p)
    scale = 1.0 / (1.0 - p)
    out = x * keep
    out *= scale
    return out, (keep, scale)


def bias_dropout_add_forward(x, b, residual, p: float, rng):
    """``dropout(x + b) + residual``: a Linear layer's bias, the dropout of its output and
    the residual sum of a BERT sub-layer (``BertOutput``), as one function so that the GPU
    can run it as one kernel.

    Args:
        x: (..., C) float, the product x W^T without its bias; b: (C,) the bias;
            residual: x's shape; p: drop probability in [0, 1) (0 in evaluation: no
            dropout); rng: the generator of :func:`keep_mask` (used when p > 0).
    Returns:
        out (x's shape) and the cache of :func:`dropout_forward`, or None when p == 0
        (the backward of the sum is the identity for x and for the residual; the bias
        gradient is the column sum of the gradient reaching x + b). With the fast paths
        on, CuPy arrays run :func:`minibert.gpu_kernels.bias_dropout_add_forward`.
    """
    fast = fast_path("bias_dropout_add_forward", x)
    if fast is not None:
        return fast(x, b, residual, p, rng)
    y = x + b
    cache = None
    if p > 0.0:
        y, cache = dropout_forward(y, p, rng)
    return y + residual, cache


def dropout_backward(dout, cache):
    """dx (shape of dout) from dout and the cache of :func:`dropout_forward`. With the fast
    paths on, CuPy arrays run :func:`minibert.gpu_kernels.dropout_backward` (one kernel)."""
    fast = fast_path("dropout_backward", dout)
    if fast is not None:
        return fast(dout, cache)
    keep, scale = cache
    # forward: out = x * keep * scale
    dx = dout * keep
    dx *= scale
    return dx


class Dropout(Module):
    """Dropout with probability ``p``, active only in training mode.

    The generator is set from outside (``set_rng``, usually for the whole model by
    ``BertPreTrainedModel.set_dropout_rng``), so a run is reproducible from its seed and a
    gradient check can replay the same mask by resetting the generator.

    Raises:
        ValueError: p outside [0, 1).
        RuntimeError: forward in training mode with p > 0 before a generator was set.
    """

    cache_attributes = ("_mask",)

    def __init__(self, p: float):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.rng = None
        self._mask = None

    def forward(self, x):
        if not self.training or self.p == 0.0:
            self._mask = None
            return x
        if self.rng is None:
            raise RuntimeError("Dropout in training mode needs a generator: call set_dropout_rng")
        out, self._mask = dropout_forward(x, self.p, self.rng)
        return out

    def backward(self, dout):
        if self._mask is None:
            return dout
        dx = dropout_backward(dout, self._mask)
        self._mask = None
        return dx
