"""Token / position / segment embedding lookup and its scatter-add backward.

Shape legend: B = batch, T = sequence length, V = rows (vocab), C = embedding size.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module
from .module import Module, Parameter


def scatter_add_rows(dst, ids, src) -> None:
    """dst[ids[i]] += src[i] for every i, correct when ``ids`` repeats.

    ``dst[ids] += src`` is wrong with repeated ids: NumPy keeps only one of the updates
    and CuPy leaves the result undefined. On NumPy we sort the ids and sum each run
    (faster than ``np.add.at``); on CuPy ``cupyx.scatter_add`` is an atomic scatter-add
    (bfloat16, which CuPy 14's atomic add refuses, is summed into a float32 (V, C) buffer
    first and added once).

    Args:
        dst: (V, C) array, updated in place.
        ids: (N,) integer row indices into ``dst``.
        src: (N, C) rows to add.
    """
    xp = get_array_module(dst)
    if xp is not np:  # pragma: no cover - GPU only
        import cupyx
        if dst.dtype.name == "bfloat16":
            acc = xp.zeros(dst.shape, np.float32)                # (V, C)
            cupyx.scatter_add(acc, ids, src.astype(np.float32))
            dst += acc.astype(dst.dtype)
        else:
            cupyx.scatter_add(dst, ids, src)
        return
    if ids.size == 0:  # e.g. every position was padding
        return
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])  # run starts
    rows = sorted_ids[starts]
    dst[rows] += np.add.reduceat(src[order], starts, axis=0)  # rows are unique here


def accumulate_embedding_grad(dw, dout, ids, padding_idx: int | None = None) -> None:
    """dw += d(out)/d(w) . dout for out = w[ids], in place. dout: (..., C); ids: (...)."""
    flat_ids = ids.reshape(-1)
    flat = dout.reshape(-1, dout.shape[-1])              # (B*T, C)
    if padding_idx is not None:
        # the padding row gets no gradient: its positions add zeros (not dropped rows,
        # whose count CuPy would read back to the host to size the result: a sync)
        keep = flat_ids != padding_idx
        flat = get_array_module(flat).where(keep[:, None], flat, 0)
    scatter_add_rows(dw, flat_ids, flat)


class Embedding(Module):
    """``nn.Embedding(num_embeddings, embedding_dim, padding_idx)``.

    Weight (V, C) initialised N(0, std^2); the ``padding_idx`` row starts at zero and gets
    no gradient from lookups, as in PyTorch (HF ``BertEmbeddings.word_embeddings``).
    """

    cache_attributes = ("_ids",)

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 *, rng: np.random.Generator, std: float = 0.02, dtype=np.float32):
        w = rng.normal(0.0, std, size=(num_embeddings, embedding_dim)).astype(dtype)
        if padding_idx is not None:
            w[padding_idx] = 0
        self.weight = Parameter(w)
        self.padding_idx = padding_idx
        self._ids = None

    def forward(self, ids):
        """ids: (...) integer array in [0, V) -> (..., C)."""
        self._ids = ids
        return self.weight.data[ids]

    def backward(self, dout) -> None:
        """dout: (..., C); adds into weight.grad (nothing if the weight is frozen). Integer
        inputs have no gradient."""
        if self.weight.requires_grad:
            accumulate_embedding_grad(self.weight.grad, dout, self._ids, self.padding_idx)
        self._ids = None
