"""Softmax cross-entropy with an ignore index and optional label smoothing.

Semantics of PyTorch ``F.cross_entropy(logits, labels, ignore_index=-100,
label_smoothing=eps, reduction="mean")``: the mean is over rows whose label is not ignored,
and with smoothing the target is (1 - eps) * one_hot + eps / K (Szegedy et al. 2016).

Shape legend: N = rows (e.g. masked positions), K = classes.
"""
from __future__ import annotations

from ..backend import compute_dtype, get_array_module, parallel_rows

IGNORE_INDEX = -100


def cross_entropy_forward(logits, labels, label_smoothing: float = 0.0,
                          ignore_index: int = IGNORE_INDEX):
    """Mean softmax cross-entropy over the rows whose label is not ``ignore_index``.

    Args:
        logits: (N, K) float; float16 logits are reduced in float32 and the loss is
            float32 (:func:`minibert.backend.compute_dtype`).
        labels: (N,) int in [0, K) or ``ignore_index``.
        label_smoothing: eps in [0, 1).
    Returns:
        loss: 0-d array (nats per counted row; 0 if every row is ignored) and a cache.
    Raises:
        ValueError: a label outside [0, K) that is not ``ignore_index`` (only checked on
            the CPU, to avoid a device sync on the GPU).
    """
    xp = get_array_module(logits)
    out_dtype = logits.dtype
    logits = logits.astype(compute_dtype(out_dtype), copy=False)   # float16 -> float32
    N, K = logits.shape
    valid = labels != ignore_index                              # (N,)
    if xp.__name__ == "numpy" and ((labels[valid] < 0) | (labels[valid] >= K)).any():
        raise ValueError(f"cross_entropy: labels must be in [0, {K}) or {ignore_index}, "
                         f"got values {sorted(set(labels[valid].tolist()))[:10]}")
    safe = xp.where(valid, labels, 0)                           # (N,)
    probs = xp.empty_like(logits)                               # (N, K)
    nll = xp.empty_like(logits, shape=(N,))                     # (N,)

    def rows(logits, safe, probs, nll):  # row blocks on the CPU's threads
        # log p = shifted - log(sum exp(shifted)), shifted = logits - max: stable
        shifted = xp.subtract(logits, logits.max(axis=-1, keepdims=True), out=probs)
        picked = shifted[xp.arange(len(safe)), safe]            # (n,)
        mean_shifted = shifted.mean(axis=-1) if label_smoothing else None
        xp.exp(shifted, out=probs)                              # in place
        sumexp = probs.sum(axis=-1)                             # (n,)
        lse = xp.log(sumexp)
        probs /= sumexp[:, None]                                # softmax, kept for backward
        nll[:] = lse - picked                                   # -log p[label]
        if label_smoothing:  # -(1-eps) log p[label] - eps * mean_k log p[k]
            nll[:] = (1.0 - label_smoothing) * nll + label_smoothing * (lse - mean_shifted)

    parallel_rows(rows, logits, safe, probs, nll)
    denom = xp.maximum(valid.sum(), 1).astype(logits.dtype)
    loss = (nll * valid).sum() / denom
    return loss, (probs, safe, valid, denom, label_smoothing, out_dtype)


def cross_entropy_backward(dloss, cache):
    """d loss / d logits = (softmax - target) * valid / count, times the upstream ``dloss``
    (a float or 0-d array), in the dtype of the forward's logits.

    target = (1 - eps) * one_hot(label) + eps / K. Returns dlogits (N, K). The softmax in
    the cache is overwritten (a forward's cache serves one backward).
    """
    probs, safe, valid, denom, eps, out_dtype = cache
    xp = get_array_module(probs)
    N, K = probs.shape
    dlogits = probs                                             # reuses the cache, (N, K)
    # forward: loss = sum(nll * valid) / denom, nll = -log softmax(logits)[label]
    dlogits[xp.arange(N), safe] -= 1.0 - eps
    scale = (valid / denom * dloss)[:, None].astype(probs.dtype)   # (N, 1)

    def rows(d, scale):
        if eps:
            d -= eps / K
        d *= scale

    parallel_rows(rows, dlogits, scale)
    return dlogits.astype(out_dtype, copy=False)
