"""Mean pooling over the real tokens of each sequence (the attention mask).

The sentence embedding of sentence-transformers models (``pooling_mode_mean_tokens``,
Reimers & Gurevych 2019, "Sentence-BERT", section 3), read by the mean-pooling classifier
head, the frozen probe and the pooled distillation loss.
"""
from __future__ import annotations

from ..backend import get_array_module


def mean_pooling_forward(hidden, attention_mask):
    """pooled[b] = sum_t m[b, t] hidden[b, t] / max(sum_t m[b, t], 1), m the mask.

    Args:
        hidden: (B, T, C) float.
        attention_mask: (B, T), 1 for real tokens and 0 for padding, or None (all real).
    Returns:
        pooled (B, C) and the cache of :func:`mean_pooling_backward`, the pooling weights
        (B, T), both in ``hidden``'s dtype. A row without a real token pools to 0.
    Raises:
        ValueError: ``hidden`` not 3-d, or a mask that is not (B, T).
    """
    if hidden.ndim != 3:
        raise ValueError(f"mean_pooling: hidden must be (B, T, C), got {tuple(hidden.shape)}")
    xp = get_array_module(hidden)
    if attention_mask is None:
        m = xp.ones(hidden.shape[:2], dtype=hidden.dtype)
    elif tuple(attention_mask.shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"mean_pooling: attention_mask must be {tuple(hidden.shape[:2])}, "
                         f"got {tuple(attention_mask.shape)}")
    else:
        m = (attention_mask > 0).astype(hidden.dtype)                 # (B, T)
    weights = m / m.sum(axis=1, keepdims=True).clip(1, None)          # (B, T)
    return (weights[:, :, None] * hidden).sum(axis=1), weights        # (B, C)


def mean_pooling_backward(dpooled, weights):
    """d/d hidden of :func:`mean_pooling_forward`: (B, T, C) from ``dpooled`` (B, C) and
    the forward's cache ``weights`` (B, T); in their common dtype."""
    # forward: pooled[b] = sum_t weights[b, t] hidden[b, t]
    return weights[:, :, None] * dpooled[:, None, :]
