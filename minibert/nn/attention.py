"""Multi-head scaled dot-product self-attention core (Vaswani et al. 2017, section 3.2).

Shape legend: B = batch, T = sequence length, C = hidden size, NH = heads, HS = C // NH.
The projections (query/key/value Linear layers) live in ``BertSelfAttention``; this module
is the part between them: split heads, scores, additive padding mask, softmax, dropout on
the probabilities, weighted sum of values, merge heads.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from ..backend import finfo, get_array_module
from ..fast import fast_path
from .activations import softmax_backward, softmax_forward
from .dropout import dropout_backward, dropout_forward


def extended_attention_mask(attention_mask, dtype):
    """The additive mask from a (B, T) 0/1 padding mask, as HF's
    ``get_extended_attention_mask``: 0 where attended, the dtype's most negative finite value
    where padded. Returns (B, 1, 1, T), broadcast over heads and query positions."""
    neg = finfo(dtype).min
    return ((1 - attention_mask[:, None, None, :]).astype(dtype)) * neg


def merge_heads(x):
    """(B, NH, T, HS) -> (B, T, C)."""
    B, NH, T, HS = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, NH * HS)


class AttentionCache(NamedTuple):
    """What :func:`attention_backward` needs from :func:`attention_forward`.

    ``probs`` is also the attention map a caller returns for ``output_attentions``.
    """

    q: Any                # (B, NH, T, HS) queries split into heads, times scale, contiguous
    k: Any                # (B, NH, T, HS) keys, contiguous
    v: Any                # (B, NH, T, HS) values, contiguous
    softmax: tuple        # cache of softmax_forward(scores)
    dropped: Any          # (B, NH, T, T) probabilities after dropout (probs itself if none)
    dropout: Any          # cache of dropout_forward(probs), or None without dropout
    scale: float          # 1 / sqrt(HS)

    @property
    def probs(self):
        """(B, NH, T, T) attention probabilities, before dropout."""
        return self.softmax[0]


def masked_softmax_forward(scores, mask_add):
    """softmax(scores + mask_add) along the last axis, in place in ``scores`` (which
    nothing else reads).

    Args:
        scores: (B, NH, T, T) float; mask_add: (B, 1, 1, T) additive mask or None.
    Returns:
        probs and the cache of :func:`softmax_forward`. With the fast paths on, CuPy
        arrays run :func:`minibert.gpu_kernels.masked_softmax_forward` (the mask added
        inside the row max, the row sum and the normalisation: three launches).
    """
    fast = fast_path("masked_softmax_forward", scores)
    if fast is not None:
        return fast(scores, mask_add)
    if mask_add is not None:
        scores += mask_add
    return softmax_forward(scores, axis=-1, out=scores)


def dropout_softmax_backward(ddropped, dropout_cache, softmax_cache):
    """The gradient of the scores from that of the dropped probabilities: the backward of
    the dropout (if any, ``dropout_cache`` None otherwise), then of the softmax, in place.

    Returns:
        dscores, the shape of ddropped. With the fast paths on, CuPy arrays run
        :func:`minibert.gpu_kernels.dropout_softmax_backward` (two launches).
    """
    fast = fast_path("dropout_softmax_backward", ddropped)
    if fast is not None:
        return fast(ddropped, dropout_cache, softmax_cache)
    d = ddropped if dropout_cache is None else dropout_backward(ddropped, dropout_cache)
    return softmax_backward(d, softmax_cache, out=d)


def split_heads(qkv, num_heads: int, bias=None):
    """The packed projections split into contiguous heads, the scale folded into q.

    Args:
        qkv: (B, T, 3C) float, [q | k | v] along the last axis; num_heads: NH.
        bias: optional (3C,) [bq | bk | bv], added to qkv first (for a caller whose
            projection left its bias out: ``linear_forward(x, w, None)``).
    Returns:
        q * scale, k, v (each (B, NH, T, HS), C-contiguous, qkv's dtype) and
        scale = 1 / sqrt(HS). With the fast paths on
        (:func:`minibert.fast.set_fast_paths`), CuPy arrays run
        :func:`minibert.gpu_kernels.split_heads` instead (one kernel for the three copies).
    """
    B, T, C3 = qkv.shape
    NH, HS = num_heads, C3 // 3 // num_heads
    scale = 1.0 / math.sqrt(HS)
    fast = fast_path("split_heads", qkv)
    if fast is not None:
        return fast(qkv, num_heads, bias)
    xp = get_array_module(qkv)
    if bias is not None:
        qkv = qkv + bias                                        # (B, T, 3C)
    heads = qkv.reshape(B, T, 3, NH, HS).transpose(2, 0, 3, 1, 4)  # (3, B, NH, T, HS) view
    q = heads[0] * scale                                        # (B, NH, T, HS), contiguous
    k = xp.ascontiguousarray(heads[1])                          # (B, NH, T, HS)
    v = xp.ascontiguousarray(heads[2])                          # (B, NH, T, HS)
    return q, k, v, scale


def batched_matmul(a, b, transpose_a: bool = False, transpose_b: bool = False):
    """``op(a) @ op(b)`` over the leading (batch) axes, op swapping the last two axes where
    asked: attention's products (``q k^T``, ``probs v`` and their gradients).

    Args:
        a: (..., M, K), or (..., K, M) with ``transpose_a``; b: (..., K, N), or (..., N, K)
            with ``transpose_b``; one float dtype, the same leading axes.
    Returns:
        (..., M, N) in the operands' dtype. With the fast paths on
        (:func:`minibert.fast.set_fast_paths`), CuPy arrays run
        :func:`minibert.gpu_kernels.batched_matmul` instead: one cuBLAS GemmEx that reads the
        transposed operand in place, float16 on tensor cores with float32 accumulation.
    """
    fast = fast_path("batched_matmul", a)
    if fast is not None:
        return fast(a, b, transpose_a, transpose_b)
    if transpose_a:
        a = a.swapaxes(-1, -2)
    if transpose_b:
        b = b.swapaxes(-1, -2)
    return a @ b


def attention_forward(qkv, mask_add, num_heads: int, dropout_p: float = 0.0, rng=None,
                      qkv_bias=None):
    """softmax(q k^T / sqrt(HS) + mask) v over each head (Vaswani et al. 2017, eq. 1).

    The three projections arrive packed, as one fused matmul makes them; the heads are
    split out once into contiguous (B, NH, T, HS) arrays (the scale folded into q on the
    way), so every batched matmul after it reads unit-stride matrices.

    Args:
        qkv: (B, T, 3C) float, the projected queries, keys and values side by side
            ([q | k | v] along the last axis).
        mask_add: (B, 1, 1, T) additive mask (see :func:`extended_attention_mask`) or None.
        num_heads: NH; C must be divisible by it.
        dropout_p: dropout on the attention probabilities (training only; 0 disables).
        rng: generator for the dropout mask (needed when dropout_p > 0).
        qkv_bias: optional (3C,) bias to add to qkv (see :func:`split_heads`).
    Returns:
        ctx (B, T, C) and an :class:`AttentionCache` (``cache.probs`` (B, NH, T, T) are
        the probabilities before dropout). With the fast paths on, NumPy arrays run
        :func:`minibert.fast_cpu.attention_forward` (the batch split over the threads).
    """
    fast = fast_path("attention_forward", qkv)
    if fast is not None:
        ctx, fields = fast(qkv, mask_add, num_heads, dropout_p, rng, qkv_bias)
        return ctx, AttentionCache(*fields)
    q, k, v, scale = split_heads(qkv, num_heads, qkv_bias)     # (B, NH, T, HS) each
    scores = batched_matmul(q, k, transpose_b=True)             # q @ k^T, (B, NH, T, T)
    probs, softmax_cache = masked_softmax_forward(scores, mask_add)  # (B, NH, T, T)
    dropped, dropout_cache = probs, None
    if dropout_p > 0.0:
        dropped, dropout_cache = dropout_forward(probs, dropout_p, rng)
    ctx = batched_matmul(dropped, v)                            # (B, NH, T, HS)
    cache = AttentionCache(q, k, v, softmax_cache, dropped, dropout_cache, scale)
    return merge_heads(ctx), cache                              # (B, T, C)


def merge_head_grads(dq_scaled, dk, dv, scale: float):
    """The gradient of the packed qkv from the heads' gradients: the backward of
    :func:`split_heads`, ``dq = d(q * scale) * scale``.

    Args:
        dq_scaled, dk, dv: (B, NH, T, HS) each, the gradients of split_heads' outputs.
        scale: split_heads' scale.
    Returns:
        dqkv (B, T, 3C), [dq | dk | dv] along the last axis. With the fast paths on,
        CuPy arrays run :func:`minibert.gpu_kernels.merge_head_grads` (one kernel).
    """
    fast = fast_path("merge_head_grads", dq_scaled)
    if fast is not None:
        return fast(dq_scaled, dk, dv, scale)
    xp = get_array_module(dq_scaled)
    B, NH, T, HS = dq_scaled.shape
    dqkv = xp.empty((B, T, 3, NH, HS), dtype=dq_scaled.dtype)
    dheads = dqkv.transpose(2, 0, 3, 1, 4)                      # (3, B, NH, T, HS) view
    xp.multiply(dq_scaled, scale, out=dheads[0])
    dheads[1] = dk
    dheads[2] = dv
    return dqkv.reshape(B, T, 3 * NH * HS)


def attention_backward(dctx, cache: AttentionCache, dprobs=None):
    """Gradients of :func:`attention_forward` (docs/backprop.md, sections 6 and 7).

    Args:
        dctx: (B, T, C) upstream gradient of ctx.
        cache: the :class:`AttentionCache` of the forward.
        dprobs: optional (B, NH, T, T) upstream gradient of ``cache.probs`` itself (the
            probabilities before dropout), from a loss that reads the attention map, such
            as MiniLM's attention transfer (:mod:`minibert.distillation`); it is added to
            the gradient that reaches the probabilities through ctx, before the softmax
            backward.
    Returns:
        dqkv: (B, T, 3C), packed as the forward's input. The additive mask is constant:
        no gradient. With the fast paths on, NumPy arrays run
        :func:`minibert.fast_cpu.attention_backward` (the batch split over the threads,
        each block through :func:`attention_backward_formula`).
    """
    fast = fast_path("attention_backward", dctx)
    if fast is not None:
        return fast(dctx, cache, dprobs, attention_backward_formula)
    return attention_backward_formula(dctx, cache, dprobs)


def attention_backward_formula(dctx, cache: AttentionCache, dprobs=None):
    """:func:`attention_backward` as written, whatever the fast paths: what its CPU fast
    path runs on each block of the batch."""
    q, k, v, softmax_cache, dropped, dropout_cache, scale = cache
    B, NH, T, HS = q.shape
    # forward: return merge_heads(ctx); made contiguous once for the two products below
    dctx = get_array_module(dctx).ascontiguousarray(
        dctx.reshape(B, T, NH, HS).transpose(0, 2, 1, 3))      # (B, NH, T, HS)
    # forward: ctx = batched_matmul(dropped, v)
    ddropped = batched_matmul(dctx, v, transpose_b=True)        # dctx @ v^T, (B, NH, T, T)
    dv = batched_matmul(dropped, dctx, transpose_a=True)        # dropped^T @ dctx, (B, NH, T, HS)
    if dprobs is None:
        # forward: dropped = dropout(probs), probs = softmax(scores); masked entries have
        # probs 0, hence dscores 0
        dscores = dropout_softmax_backward(ddropped, dropout_cache, softmax_cache)
    else:
        # forward: dropped = dropout(probs)
        d = ddropped if dropout_cache is None else dropout_backward(ddropped, dropout_cache)
        # forward: probs is also an output (the attention map)  ->  its gradients add up
        dprobs = d + dprobs.astype(d.dtype, copy=False)                  # (B, NH, T, T)
        # forward: probs = softmax(scores)
        dscores = softmax_backward(dprobs, softmax_cache, out=dprobs)    # (B, NH, T, T)
    # forward: scores = batched_matmul(q, k, transpose_b=True) (+ mask_add, a constant),
    # where cache.q holds q * scale
    dq_scaled = batched_matmul(dscores, k)                      # d(q * scale), (B, NH, T, HS)
    dk = batched_matmul(dscores, q, transpose_a=True)           # dscores^T @ q, (B, NH, T, HS)
    # forward: q, k, v = split_heads(qkv)
    return merge_head_grads(dq_scaled, dk, dv, scale)           # (B, T, 3C)
