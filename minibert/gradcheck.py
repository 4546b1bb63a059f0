"""Numerical gradient checking (central differences, float64), shared by tests and users.

The checks follow cs231n's ``gradient_check.py``: perturb one entry by +-h, evaluate a
scalar loss, and compare (L(x + h) - L(x - h)) / 2h with the analytic gradient. For tensors
too large to perturb entry by entry, :func:`directional_derivative` checks the gradient
along a random unit direction u instead: (L(x + h u) - L(x - h u)) / 2h = <grad, u>.
Run in float64: with float32 the rounding error of the differences is ~1e-3.
"""
from __future__ import annotations

from typing import Callable

import numpy as np


def rel_error(a, b, floor: float = 1e-8) -> float:
    """max |a - b| / max(max |a|, max |b|, floor): a scale-aware relative error.

    Args:
        a, b: arrays of the same shape (or scalars).
        floor: smallest denominator, so that two all-but-zero gradients (e.g. a key bias,
            whose true gradient is 0) compare as equal.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(np.abs(a).max(initial=0.0), np.abs(b).max(initial=0.0), floor)
    return float(np.abs(a - b).max(initial=0.0) / scale)


def numerical_gradient(f: Callable[[], float], x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """d f / d x by central differences, perturbing ``x`` in place entry by entry.

    Args:
        f: evaluates the scalar loss from the current contents of ``x``.
        x: float64 array, restored exactly after each perturbation.
        h: step.
    Returns:
        Array of the shape of ``x``.
    """
    grad = np.zeros_like(x, dtype=np.float64)
    it = np.nditer(x, flags=["multi_index"], op_flags=["readwrite"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + h
        fp = f()
        x[i] = old - h
        fm = f()
        x[i] = old
        grad[i] = (fp - fm) / (2 * h)
    return grad


def directional_derivative(f: Callable[[], float], x: np.ndarray, direction: np.ndarray,
                           h: float = 1e-6) -> float:
    """(f(x + h u) - f(x - h u)) / 2h along ``direction`` u, restoring ``x`` afterwards."""
    old = x.copy()
    x += h * direction
    fp = f()
    x[...] = old - h * direction
    fm = f()
    x[...] = old
    return (fp - fm) / (2 * h)
