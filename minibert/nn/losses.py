"""Softmax cross-entropy with an ignore index and optional label smoothing.

Semantics of PyTorch ``F.cross_entropy(logits, labels, ignore_index=-100,
label_smoothing=eps, reduction="mean")``: the mean is over rows whose label is not ignored,
and with smoothing the target is (1 - eps) * one_hot + eps / K (Szegedy et al. 2016).

Shape legend: N = rows (e.g. masked positions), K = classes.
"""
from __future__ import annotations

from ..backend import compute_dtype, get_array_module
from ..fast import fast_path

IGNORE_INDEX = -100


def softmax_nll(logits, labels, label_smoothing: float = 0.0):
    """Row softmax and per-row negative log-likelihood, smoothed as in
    :func:`cross_entropy_forward`: nll = -(1 - eps) log p[label] - eps mean_k log p[k].

    Args:
        logits: (N, K) float. labels: (N,) int in [0, K) (an ignored row's label replaced
            by any valid one). label_smoothing: eps in [0, 1).
    Returns:
        probs (N, K), the softmax of each row, and nll (N,), in the logits' dtype. With
        the fast paths on (:func:`minibert.fast.set_fast_paths`), NumPy arrays run
        :func:`minibert.fast_cpu.softmax_nll` instead (row blocks over threads, the
        softmax in place).
    """
    fast = fast_path("softmax_nll", logits)
    if fast is not None:
        return fast(logits, labels, label_smoothing)
    xp = get_array_module(logits)
    # log p = shifted - lse, shifted = logits - max: nn.activations.log_softmax's formula,
    # fused here so that one exp serves both the loss and the softmax the backward needs
    shifted = logits - logits.max(axis=-1, keepdims=True)       # (N, K)
    e = xp.exp(shifted)                                         # (N, K)
    sumexp = e.sum(axis=-1)                                     # (N,)
    lse = xp.log(sumexp)                                        # (N,)
    probs = e / sumexp[:, None]                                 # (N, K) softmax
    nll = lse - shifted[xp.arange(len(labels)), labels]         # (N,) -log p[label]
    if label_smoothing:  # -(1-eps) log p[label] - eps * mean_k log p[k]
        nll = (1.0 - label_smoothing) * nll + label_smoothing * (lse - shifted.mean(axis=-1))
    return probs, nll


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
    probs, nll = softmax_nll(logits, safe, label_smoothing)     # (N, K), (N,)
    denom = xp.maximum(valid.sum(), 1).astype(logits.dtype)
    loss = (nll * valid).sum() / denom
    return loss, (probs, safe, valid, denom, label_smoothing, out_dtype)


def cross_entropy_backward(dloss, cache):
    """d loss / d logits = (softmax - target) * valid / count, times the upstream ``dloss``
    (a float or 0-d array), in the dtype of the forward's logits.

    target = (1 - eps) * one_hot(label) + eps / K. Returns dlogits (N, K). The softmax in
    the cache is overwritten (a forward's cache serves one backward). With the fast paths
    on, NumPy arrays run :func:`minibert.fast_cpu.cross_entropy_backward` instead.
    """
    fast = fast_path("cross_entropy_backward", cache[0])
    if fast is not None:
        return fast(dloss, cache)
    probs, safe, valid, denom, eps, out_dtype = cache
    xp = get_array_module(probs)
    N, K = probs.shape
    dlogits = probs                                             # reuses the cache, (N, K)
    # forward: loss = sum(nll * valid) / denom, nll = -log softmax(logits)[label]
    dlogits[xp.arange(N), safe] -= 1.0 - eps                    # - (1 - eps) one_hot(label)
    if eps:
        dlogits -= eps / K                                      # - eps / K
    dlogits *= (valid / denom * dloss)[:, None].astype(probs.dtype)   # (N, 1) row weights
    return dlogits.astype(out_dtype, copy=False)
