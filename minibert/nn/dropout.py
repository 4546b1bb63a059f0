"""Inverted dropout (Srivastava et al. 2014) with randomness from an explicit generator."""
from __future__ import annotations

from ..backend import compute_dtype
from .module import Module


def dropout_forward(x, p: float, rng):
    """Zero each element with probability ``p`` and scale the rest by 1 / (1 - p).

    Args:
        x: any shape, float.
        p: drop probability in [0, 1).
        rng: numpy / cupy ``Generator`` on the same device as ``x``.
    Returns:
        out (same shape) and the cache of :func:`dropout_backward`: (keep, scale), the
        boolean mask of kept elements (shape of x, one byte each) and 1 / (1 - p).
    """
    keep = rng.random(x.shape, dtype=compute_dtype(x.dtype)) >= p   # no float16 draws
    scale = 1.0 / (1.0 - p)
    out = x * keep
    out *= scale
    return out, (keep, scale)


def dropout_backward(dout, cache):
    """dx (shape of dout) from dout and the cache of :func:`dropout_forward`."""
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
