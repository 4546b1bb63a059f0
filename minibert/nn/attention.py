"""Multi-head scaled dot-product self-attention core (Vaswani et al. 2017, section 3.2).

Shape legend: B = batch, T = sequence length, C = hidden size, NH = heads, HS = C // NH.
The projections (query/key/value Linear layers) live in ``BertSelfAttention``; this module
is the part between them: split heads, scores, additive padding mask, softmax, dropout on
the probabilities, weighted sum of values, merge heads.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from ..backend import get_array_module
from .activations import softmax_backward, softmax_forward
from .dropout import dropout_backward, dropout_forward


def extended_attention_mask(attention_mask, dtype):
    """The additive mask from a (B, T) 0/1 padding mask, as HF's
    ``get_extended_attention_mask``: 0 where attended, the dtype's most negative finite value
    where padded. Returns (B, 1, 1, T), broadcast over heads and query positions."""
    xp = get_array_module(attention_mask)
    neg = xp.finfo(dtype).min
    return ((1 - attention_mask[:, None, None, :]).astype(dtype)) * neg


def split_heads(x, num_heads: int):
    """(B, T, C) -> (B, NH, T, HS)."""
    B, T, C = x.shape
    return x.reshape(B, T, num_heads, C // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, NH, T, HS) -> (B, T, C)."""
    B, NH, T, HS = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, NH * HS)


class AttentionCache(NamedTuple):
    """What :func:`attention_backward` needs from :func:`attention_forward`.

    ``probs`` is also the attention map a caller returns for ``output_attentions``.
    """

    q: Any                # (B, NH, T, HS) queries, split into heads
    k: Any                # (B, NH, T, HS) keys
    v: Any                # (B, NH, T, HS) values
    softmax: tuple        # cache of softmax_forward(scores)
    dropped: Any          # (B, NH, T, T) probabilities after dropout (probs itself if none)
    dropout: Any          # cache of dropout_forward(probs), or None without dropout
    scale: float          # 1 / sqrt(HS)

    @property
    def probs(self):
        """(B, NH, T, T) attention probabilities, before dropout."""
        return self.softmax[0]


def attention_forward(q, k, v, mask_add, num_heads: int, dropout_p: float = 0.0, rng=None):
    """softmax(q k^T / sqrt(HS) + mask) v over each head (Vaswani et al. 2017, eq. 1).

    Args:
        q, k, v: (B, T, C) float, projected queries, keys, values.
        mask_add: (B, 1, 1, T) additive mask (see :func:`extended_attention_mask`) or None.
        num_heads: NH; C must be divisible by it.
        dropout_p: dropout on the attention probabilities (training only; 0 disables).
        rng: generator for the dropout mask (needed when dropout_p > 0).
    Returns:
        ctx (B, T, C) and an :class:`AttentionCache` (``cache.probs`` (B, NH, T, T) are
        the probabilities before dropout).
    """
    q, k, v = (split_heads(t, num_heads) for t in (q, k, v))  # (B, NH, T, HS) each
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(0, 1, 3, 2)) * scale            # (B, NH, T, T)
    if mask_add is not None:
        scores += mask_add
    probs, softmax_cache = softmax_forward(scores, axis=-1)     # (B, NH, T, T)
    dropped, dropout_cache = probs, None
    if dropout_p > 0.0:
        dropped, dropout_cache = dropout_forward(probs, dropout_p, rng)
    ctx = dropped @ v                                           # (B, NH, T, HS)
    cache = AttentionCache(q, k, v, softmax_cache, dropped, dropout_cache, scale)
    return merge_heads(ctx), cache                              # (B, T, C)


def attention_backward(dctx, cache: AttentionCache):
    """Gradients of :func:`attention_forward` (docs/backprop.md, sections 6 and 7).

    Args:
        dctx: (B, T, C) upstream gradient of ctx.
        cache: the :class:`AttentionCache` of the forward.
    Returns:
        dq, dk, dv: (B, T, C) each. The additive mask is constant: no gradient.
    """
    q, k, v, softmax_cache, dropped, dropout_cache, scale = cache
    # forward: return merge_heads(ctx)
    dctx = split_heads(dctx, q.shape[1])                        # (B, NH, T, HS)
    # forward: ctx = dropped @ v
    ddropped = dctx @ v.transpose(0, 1, 3, 2)                   # (B, NH, T, T)
    dv = dropped.transpose(0, 1, 3, 2) @ dctx                   # (B, NH, T, HS)
    # forward: dropped = dropout(probs)
    dprobs = ddropped if dropout_cache is None else dropout_backward(ddropped, dropout_cache)
    # forward: probs = softmax(scores); masked entries have probs 0, hence dscores 0
    dscores = softmax_backward(dprobs, softmax_cache)           # (B, NH, T, T)
    # forward: scores = q @ k^T * scale (+ mask_add, a constant)
    dq = (dscores @ k) * scale                                  # (B, NH, T, HS)
    dk = (dscores.transpose(0, 1, 3, 2) @ q) * scale            # (B, NH, T, HS)
    # forward: q, k, v = split_heads(q), split_heads(k), split_heads(v)
    return merge_heads(dq), merge_heads(dk), merge_heads(dv)    # (B, T, C) each
