"""Fully connected layer, y = x W^T + b, with W stored (out, in) as in PyTorch / HF.

Shape legend: N = any leading dims flattened (B*T), I = in features, O = out features.
"""
from __future__ import annotations

import numpy as np

from ..fast import fast_path
from .module import Module, Parameter, backward_into


def linear_forward(x, w, b=None):
    """y = x @ w.T + b.

    Args:
        x: (..., I) float array.
        w: (O, I) weight.
        b: (O,) bias or None.
    Returns:
        out: (..., O); cache: what :func:`linear_backward` needs. With the fast paths on
        (:func:`minibert.fast.set_fast_paths`), NumPy arrays run
        :func:`minibert.fast_cpu.linear_forward` (the product's rows over the threads).
    """
    fast = fast_path("linear_forward", x)
    if fast is not None:
        return fast(x, w, b)
    x2 = x.reshape(-1, x.shape[-1])                      # (N, I)
    out = x2 @ w.T                                       # (N, O)
    if b is not None:
        out += b
    return out.reshape(*x.shape[:-1], w.shape[0]), (x, w, b is not None)


def linear_backward(dout, cache):
    """Gradients of :func:`linear_forward`.

    Args:
        dout: (..., O) upstream gradient.
    Returns:
        dx (..., I), dw (O, I), db (O,) or None. With the fast paths on, NumPy arrays run
        :func:`minibert.fast_cpu.linear_backward` (each product's rows over the threads).
    """
    fast = fast_path("linear_backward", dout)
    if fast is not None:
        return fast(dout, cache)
    x, w, has_bias = cache
    d2 = dout.reshape(-1, dout.shape[-1])                # (N, O)
    x2 = x.reshape(-1, x.shape[-1])                      # (N, I)
    # forward: out = x @ w.T + b
    dx = (d2 @ w).reshape(x.shape)                       # (..., I)
    dw = d2.T @ x2                                       # (O, I)
    db = d2.sum(axis=0) if has_bias else None            # (O,)
    return dx, dw, db


def linear_backward_into(dout, cache, dw_acc=None, db_acc=None):
    """:func:`linear_backward` with the weight and bias gradients added into accumulators
    (the parameters' ``grad``), which is what :meth:`Linear.backward` does with them.

    Args:
        dout: (..., O) upstream gradient; cache: from :func:`linear_forward`.
        dw_acc: (O, I) array to add dw into, or None (a frozen weight: dw is not needed).
        db_acc: (O,) array to add db into, or None (no bias, or a frozen one).
    Returns:
        dx (..., I). With the fast paths on (:func:`minibert.fast.set_fast_paths`), CuPy
        arrays run :func:`minibert.gpu_kernels.linear_backward_into` (each accumulation in
        its cuBLAS product, ``beta = 1``: one launch instead of two).
    """
    return backward_into("linear_backward_into", linear_backward, dout, cache, dw_acc, db_acc)


class Linear(Module):
    """``nn.Linear``: weight (out_features, in_features), bias (out_features,).

    Initialised N(0, std^2) for the weight and zeros for the bias, as BERT's
    ``initializer_range`` (google-research/bert modeling.py, HF ``_init_weights``).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 rng: np.random.Generator, std: float = 0.02, dtype=np.float32):
        w = rng.normal(0.0, std, size=(out_features, in_features))
        self.weight = Parameter(w.astype(dtype))
        self.bias = Parameter(np.zeros(out_features, dtype=dtype)) if bias else None
        self._cache = None

    @classmethod
    def tied(cls, weight: Parameter, bias: Parameter | None = None) -> "Linear":
        """A Linear that shares existing Parameters (weight (O, I), bias (O,)) instead of
        owning new ones: how the MLM decoder reuses the word-embedding matrix."""
        layer = cls.__new__(cls)
        layer.weight, layer.bias, layer._cache = weight, bias, None
        return layer

    def forward(self, x):
        """x: (..., in_features) -> (..., out_features)."""
        b = self.bias.data if self.bias is not None else None
        out, self._cache = linear_forward(x, self.weight.data, b)
        return out

    def forward_without_bias(self, x):
        """x @ W^T, (..., in_features) -> (..., out_features), for a caller that adds the
        bias itself (in a fused kernel: :func:`minibert.nn.dropout.bias_dropout_add_forward`);
        :meth:`backward` still accumulates the bias gradient (the sum of dout over the
        leading dims), as after :meth:`forward`."""
        out, (x, w, _) = linear_forward(x, self.weight.data, None)
        self._cache = (x, w, self.bias is not None)
        return out

    def backward(self, dout):
        """dout: (..., out_features) -> dx (..., in_features); accumulates weight/bias grads."""
        w, b = self.weight, self.bias
        return linear_backward_into(dout, self.take_cache(),
                                    w.grad if w.requires_grad else None,
                                    b.grad if b is not None and b.requires_grad else None)
