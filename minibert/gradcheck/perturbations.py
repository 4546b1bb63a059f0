"""Wrong backward passes, swapped in for the duration of a check (``--perturb NAME``).

Each entry of :data:`PERTURBATIONS` corrupts one term of one derivation in
docs/backprop.md, so that ``python -m minibert.gradcheck --perturb NAME`` shows what a
wrong gradient looks like and which tensors it reaches.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

from ..modeling import BertLMPredictionHead, BertOutput
from ..nn import activations, attention, embedding, layernorm, losses


@contextlib.contextmanager
def _swap_function(original, replacement) -> Iterator[None]:
    """Replace ``original`` by ``replacement`` wherever a minibert module refers to it: as a
    module-level name (``from .activations import softmax_backward`` copies the reference
    into the importing module) or inside a module-level dict of tuples (``ACTIVATIONS``).
    Everything is restored on exit."""
    undo = []
    for mod in [m for n, m in list(sys.modules.items()) if n.startswith("minibert") and m]:
        for attr, value in list(vars(mod).items()):
            if value is original:
                undo.append((setattr, mod, attr, value))
                setattr(mod, attr, replacement)
            elif isinstance(value, dict):
                for key, entry in list(value.items()):
                    if isinstance(entry, tuple) and original in entry:
                        undo.append((dict.__setitem__, value, key, entry))
                        value[key] = tuple(replacement if e is original else e for e in entry)
    try:
        yield
    finally:
        for setter, obj, key, value in reversed(undo):
            setter(obj, key, value)


@contextlib.contextmanager
def _swap_method(cls, name: str, make: Callable) -> Iterator[None]:
    """Replace ``cls.name`` by ``make(original)`` for the duration of the block."""
    original = getattr(cls, name)
    setattr(cls, name, make(original))
    try:
        yield
    finally:
        setattr(cls, name, original)


def _softmax_no_diagonal():
    def softmax_backward(dprobs, cache, out=None):
        probs, axis = cache
        # correct: p * dp - p * sum(dp * p); the diag(p) term p * dp is dropped
        return -probs * (dprobs * probs).sum(axis=axis, keepdims=True)
    return _swap_function(activations.softmax_backward, softmax_backward)


def _layernorm_no_mean():
    def layernorm_backward(dout, cache):
        xhat, rstd, w = cache
        C = xhat.shape[-1]
        g = dout * w
        dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))  # no - mean(g)
        return dx, (dout * xhat).reshape(-1, C).sum(0), dout.reshape(-1, C).sum(0)
    return _swap_function(layernorm.layernorm_backward, layernorm_backward)


def _gelu_no_pdf():
    def gelu_backward(dout, cache):
        x, cdf = cache
        return dout * cdf  # correct: dout * (cdf + x * pdf)
    return _swap_function(activations.gelu_backward, gelu_backward)


def _attention_no_scale():
    original = attention.attention_backward

    def attention_backward(dctx, cache, dprobs=None):
        # cache.q holds q * scale: undo it, so dq and dk both miss 1/sqrt(HS)
        return original(dctx, cache._replace(q=cache.q / cache.scale, scale=1.0), dprobs)
    return _swap_function(original, attention_backward)


def _tied_decoder_dropped():
    def make(original):
        def backward(self, dlogits):
            w = self.decoder.weight           # the word-embedding Parameter
            saved = w.grad.copy()
            dx = original(self, dlogits)
            w.grad[...] = saved               # forget the decoder's dW = dlogits^T @ h
            return dx
        return backward
    return _swap_method(BertLMPredictionHead, "backward", make)


def _embedding_fancy_index():
    def scatter_add_rows(dst, ids, src):
        dst[ids] += src  # the bug: with repeated ids only one update per row survives
    return _swap_function(embedding.scatter_add_rows, scatter_add_rows)


def _cross_entropy_counts_ignored():
    original = losses.cross_entropy_backward

    def cross_entropy_backward(dloss, cache):
        probs, safe, valid, denom, eps, out_dtype = cache
        n = probs.dtype.type(probs.shape[0])  # divides by N, not by the counted rows
        return original(dloss, (probs, safe, valid, n, eps, out_dtype))
    return _swap_function(original, cross_entropy_backward)


def _residual_dropped():
    def make(original):
        def backward(self, dout):
            dh, dres = original(self, dout)
            return dh, 0 * dres  # the skip connection's identity path forgotten
        return backward
    return _swap_method(BertOutput, "backward", make)


PERTURBATIONS: dict[str, tuple[str, Callable]] = {
    "softmax-diagonal": ("softmax JVP without the diag(p) term of J = diag(p) - p p^T",
                         _softmax_no_diagonal),
    "layernorm-mean": ("LayerNorm dx without the -mean(g) term (the gradient through the mean)",
                       _layernorm_no_mean),
    "gelu-pdf": ("exact GELU derivative Phi(x) + x phi(x) without x phi(x)", _gelu_no_pdf),
    "attention-scale": ("dq, dk without the 1/sqrt(HS) factor", _attention_no_scale),
    "tied-decoder": ("the MLM decoder's contribution to the tied word-embedding grad dropped",
                     _tied_decoder_dropped),
    "embedding-fancy-index": ("embedding scatter-add done as dW[ids] += g (repeated ids lost)",
                              _embedding_fancy_index),
    "cross-entropy-ignored": ("cross-entropy grad divided by all rows, ignored ones included",
                              _cross_entropy_counts_ignored),
    "residual": ("the residual (identity) path's gradient dropped in BertOutput.backward",
                 _residual_dropped),
}
"""name -> (what is wrong, a factory of the context manager that swaps it in)."""


@contextlib.contextmanager
def perturbed(name: str | None) -> Iterator[None]:
    """Context manager: run the body with one backward term corrupted (see
    :data:`PERTURBATIONS`), restoring the real functions on exit. ``None`` does nothing.

    Raises:
        ValueError: unknown name (the known ones are listed).
    """
    if name is None:
        yield
        return
    if name not in PERTURBATIONS:
        raise ValueError(f"unknown perturbation {name!r}: expected one of "
                         f"{', '.join(PERTURBATIONS)}")
    with PERTURBATIONS[name][1]():
        yield
