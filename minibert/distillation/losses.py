"""The distillation losses, each a ``*_forward`` / ``*_backward`` pair. The gradient is
taken with respect to the student's side only: the teacher's outputs are constants.

General distillation (a student BERT learns from a teacher BERT, :mod:`.model`):

* :func:`soft_target_kl_forward`: the soft-target loss of Hinton et al. 2015 ("Distilling
  the Knowledge in a Neural Network", section 2) on the MLM distributions at the masked
  positions, T^2 * KL(softmax(t / T) || softmax(s / T)), DistilBERT's ``L_ce`` (Sanh et al.
  2019, section 3; huggingface/transformers ``examples/research_projects/distillation/
  distiller.py``: ``KLDivLoss(reduction="batchmean")`` times T^2);
* :func:`cosine_loss_forward`: DistilBERT's cosine embedding loss ``L_cos`` between the
  student's and the teacher's last hidden states at the real (attention-mask) tokens,
  torch's ``CosineEmbeddingLoss`` with target 1; when the widths differ the student's
  states first go through a learned projection W_h (TinyBERT, Jiao et al. 2020, eq. 8),
  the ``hidden_projection`` Linear of :class:`~minibert.distillation.DistillationModel`;
* :func:`pooled_cosine_loss_forward`: the same cosine loss between the mean-pooled states
  of each sequence, the student's (projected) sentence embedding against the teacher's,
  as in the sentence-embedding distillation of Reimers & Gurevych 2020 ("Making
  Monolingual Sentence Embeddings Multilingual using Knowledge Distillation", section 2,
  there with MSE; cosine here, since a sentence-transformers teacher such as
  all-MiniLM-L6-v2 compares its mean-pooled embeddings by cosine);
* :func:`attention_kl_forward`: MiniLM's self-attention distribution transfer (Wang et al.
  2020, "MiniLM", section 3.1, eq. 5): the KL between the teacher's and the student's
  last-layer attention probabilities, per head and query position (equal head counts).

Task distillation (a sequence classifier learns from a fine-tuned teacher, :mod:`.task`):

* :func:`soft_label_loss_forward`: (1 - alpha) * CE with the gold labels + alpha * the
  soft-target loss on the classifier's logits.

Shape legend: B = batch, T = sequence length, N = rows of logits (masked-LM slots),
V = vocab size, K = classes, C = hidden size, NH = heads.
"""
from __future__ import annotations

import numpy as np

from ..backend import compute_dtype, get_array_module
from ..nn import mean_pooling_backward, mean_pooling_forward
from ..nn.activations import log_softmax
from ..nn.losses import cross_entropy_backward, cross_entropy_forward

__all__ = ["COSINE_EPS", "attention_kl_backward", "attention_kl_forward",
           "cosine_loss_backward", "cosine_loss_forward", "pooled_cosine_loss_backward",
           "pooled_cosine_loss_forward", "soft_label_loss_backward", "soft_label_loss_forward",
           "soft_target_kl_backward", "soft_target_kl_forward"]

COSINE_EPS = 1e-12   # added to each squared norm, as torch's cosine_embedding_loss


# ---------------------------------------------------------------------------------------
# Soft-target loss on the MLM distributions (Hinton et al. 2015; DistilBERT's L_ce)
# ---------------------------------------------------------------------------------------

def soft_target_kl_forward(student_logits, teacher_logits, weights, temperature: float):
    """T^2 * KL(softmax(t / T) || softmax(s / T)), the mean over the counted rows.

        p_t = softmax(t / T), log p_s = log_softmax(s / T)         per row, over V
        kl_n = sum_v p_t[n, v] (log p_t[n, v] - log p_s[n, v])      (N,)
        loss = T^2 * sum_n w_n kl_n / max(sum_n w_n, 1),  w_n = 1 if weights[n] > 0 else 0

    Hinton et al. 2015, section 2: the soft targets' gradients scale as 1/T^2, hence the
    T^2; DistilBERT (distiller.py) takes KLDivLoss(reduction="batchmean") over the masked
    positions, i.e. this mean over counted rows.

    Args:
        student_logits: (N, V) float, the student's MLM logits (float16 is reduced in
            float32, :func:`minibert.backend.compute_dtype`).
        teacher_logits: (N, V) float, the teacher's logits at the same rows (a constant).
        weights: (N,) the rows that count (> 0), e.g. ``masked_lm_weights`` flattened.
        temperature: T > 0.
    Returns:
        loss: 0-d array (nats * T^2 per counted row; 0 when no row counts) and a cache.
    Raises:
        ValueError: shapes that differ or are not (N, V) / (N,), or T <= 0.
    """
    if student_logits.ndim != 2 or tuple(teacher_logits.shape) != tuple(student_logits.shape):
        raise ValueError(f"soft_target_kl: student and teacher logits must be the same "
                         f"(N, V), got {tuple(student_logits.shape)} and "
                         f"{tuple(teacher_logits.shape)}")
    if tuple(weights.shape) != tuple(student_logits.shape[:1]):
        raise ValueError(f"soft_target_kl: weights must be {tuple(student_logits.shape[:1])}, "
                         f"got {tuple(weights.shape)}")
    if not temperature > 0:
        raise ValueError(f"soft_target_kl: temperature must be > 0, got {temperature}")
    xp = get_array_module(student_logits)
    out_dtype = student_logits.dtype
    dtype = compute_dtype(out_dtype)
    T = float(temperature)
    log_ps = log_softmax(student_logits.astype(dtype) / T)          # (N, V)
    log_pt = log_softmax(teacher_logits.astype(dtype) / T)          # (N, V)
    pt = xp.exp(log_pt)                                              # (N, V)
    kl = (pt * (log_pt - log_ps)).sum(axis=-1)                       # (N,)
    w = (weights > 0).astype(dtype)                                  # (N,)
    denom = xp.maximum(w.sum(), 1)
    loss = T * T * (w * kl).sum() / denom
    return loss, (xp.exp(log_ps), pt, w, denom, T, out_dtype)


def soft_target_kl_backward(dloss, cache):
    """d loss / d student_logits of :func:`soft_target_kl_forward`, times ``dloss`` (a
    float or 0-d array): (N, V) in the dtype of the forward's student logits."""
    ps, pt, w, denom, T, out_dtype = cache
    # forward: loss = T^2 * sum_n w_n kl_n / denom  ->  d kl_n = dloss * T^2 * w_n / denom
    dkl = (dloss * T * T) * w / denom                                # (N,)
    # forward: kl_n = sum_v p_t (log p_t - log_softmax(s / T))  ->  (p_s - p_t) / T per row
    ds = (dkl / T)[:, None] * (ps - pt)                              # (N, V)
    return ds.astype(out_dtype, copy=False)


# ---------------------------------------------------------------------------------------
# Cosine loss on the last hidden states (DistilBERT's L_cos)
# ---------------------------------------------------------------------------------------

def _check_states(name: str, student_hidden, teacher_hidden, attention_mask) -> None:
    """Raise ValueError unless both states are the same (B, T, C) and the mask is (B, T)."""
    if student_hidden.ndim != 3 or tuple(teacher_hidden.shape) != tuple(student_hidden.shape):
        raise ValueError(f"{name}: student and teacher states must be the same (B, T, C), "
                         f"got {tuple(student_hidden.shape)} and {tuple(teacher_hidden.shape)}")
    if tuple(attention_mask.shape) != tuple(student_hidden.shape[:2]):
        raise ValueError(f"{name}: attention_mask must be {tuple(student_hidden.shape[:2])}, "
                         f"got {tuple(attention_mask.shape)}")


def cosine_loss_forward(student_hidden, teacher_hidden, attention_mask, eps: float = COSINE_EPS):
    """Mean over real tokens of 1 - cos(student_hidden, teacher_hidden).

        na2 = |a|^2 + eps, nb2 = |b|^2 + eps, cos = <a, b> / sqrt(na2 nb2)     (B, T)
        loss = sum_{b,t} m[b, t] (1 - cos[b, t]) / max(sum m, 1),  m = attention_mask > 0

    torch's ``CosineEmbeddingLoss`` with target 1 and its EPSILON (aten
    ``cosine_embedding_loss``), over the tokens DistilBERT selects with the attention mask
    (distiller.py, ``loss_cos``).

    Args:
        student_hidden: (B, T, C) float, the student's last hidden state, projected to the
            teacher's width C when the widths differ.
        teacher_hidden: (B, T, C) float, the teacher's (a constant).
        attention_mask: (B, T) 1 for real tokens, 0 for padding.
        eps: added to each squared norm (a zero vector then has cos 0, not nan).
    Returns:
        loss: 0-d array (mean 1 - cos, in [0, 2]) and a cache.
    Raises:
        ValueError: shapes that differ, or a mask that is not (B, T).
    """
    _check_states("cosine_loss", student_hidden, teacher_hidden, attention_mask)
    xp = get_array_module(student_hidden)
    out_dtype = student_hidden.dtype
    dtype = compute_dtype(out_dtype)
    a = student_hidden.astype(dtype)                                 # (B, T, C)
    b = teacher_hidden.astype(dtype)                                 # (B, T, C)
    dot = (a * b).sum(axis=-1)                                       # (B, T)
    na2 = (a * a).sum(axis=-1) + eps                                 # (B, T)
    nb2 = (b * b).sum(axis=-1) + eps                                 # (B, T)
    inv = 1.0 / xp.sqrt(na2 * nb2)                                   # (B, T)
    cos = dot * inv                                                  # (B, T)
    m = (attention_mask > 0).astype(dtype)                           # (B, T)
    denom = xp.maximum(m.sum(), 1)
    loss = (m * (1.0 - cos)).sum() / denom
    return loss, (a, b, cos, inv, na2, m, denom, out_dtype)


def cosine_loss_backward(dloss, cache):
    """d loss / d student_hidden of :func:`cosine_loss_forward`, times ``dloss``:
    (B, T, C) in the dtype of the forward's student states."""
    a, b, cos, inv, na2, m, denom, out_dtype = cache
    # forward: loss = sum m (1 - cos) / denom
    dcos = -dloss * m / denom                                        # (B, T)
    # forward: cos = <a, b> / sqrt(na2 nb2), na2 = |a|^2 + eps
    #   d cos / d a = b / sqrt(na2 nb2) - cos * a / na2
    da = dcos[..., None] * (b * inv[..., None] - (cos / na2)[..., None] * a)   # (B, T, C)
    return da.astype(out_dtype, copy=False)


def pooled_cosine_loss_forward(student_hidden, teacher_hidden, attention_mask,
                               eps: float = COSINE_EPS):
    """Mean over sequences of 1 - cos(mean-pooled student, mean-pooled teacher states).

        m = attention_mask > 0, n_b = max(sum_t m[b, t], 1)                   (B,)
        s_b = sum_t m[b, t] a[b, t] / n_b,  u_b = sum_t m[b, t] b[b, t] / n_b    (B, C)
        loss = cosine_loss(s[:, None], u[:, None], mask = [n_real_b > 0])

    i.e. :func:`cosine_loss_forward` on the pooled vectors, over the sequences that have a
    real token. Mean pooling over the attention mask is the pooling of sentence-transformers
    models (all-MiniLM-L6-v2's ``1_Pooling``: ``pooling_mode_mean_tokens``); Reimers &
    Gurevych 2020, section 2, distil such sentence embeddings into a student (with MSE).

    Args:
        student_hidden: (B, T, C) float, the student's last hidden state (projected to the
            teacher's width C when the widths differ).
        teacher_hidden: (B, T, C) float, the teacher's (a constant).
        attention_mask: (B, T) 1 for real tokens, 0 for padding.
        eps: added to each squared norm, as :func:`cosine_loss_forward`.
    Returns:
        loss: 0-d array (mean 1 - cos over sequences, in [0, 2]) and a cache.
    Raises:
        ValueError: shapes that differ, or a mask that is not (B, T).
    """
    _check_states("pooled_cosine_loss", student_hidden, teacher_hidden, attention_mask)
    out_dtype = student_hidden.dtype
    dtype = compute_dtype(out_dtype)
    s, w = mean_pooling_forward(student_hidden.astype(dtype), attention_mask)   # (B, C)
    u, _ = mean_pooling_forward(teacher_hidden.astype(dtype), attention_mask)   # (B, C)
    real = (attention_mask > 0).any(axis=1)                          # (B,)
    loss, cos_cache = cosine_loss_forward(s[:, None], u[:, None], real[:, None], eps)
    return loss, (cos_cache, w, out_dtype)


def pooled_cosine_loss_backward(dloss, cache):
    """d loss / d student_hidden of :func:`pooled_cosine_loss_forward`, times ``dloss``:
    (B, T, C) in the dtype of the forward's student states."""
    cos_cache, w, out_dtype = cache
    # forward: loss = cosine_loss(s[:, None], u[:, None], ...)
    ds = cosine_loss_backward(dloss, cos_cache)[:, 0]                # (B, C)
    # forward: s, w = mean_pooling_forward(a, attention_mask)
    return mean_pooling_backward(ds, w).astype(out_dtype, copy=False)   # (B, T, C)


# ---------------------------------------------------------------------------------------
# Self-attention distribution transfer (MiniLM)
# ---------------------------------------------------------------------------------------

def attention_kl_forward(student_probs, teacher_probs, attention_mask):
    """MiniLM's attention transfer: KL(A_teacher || A_student) per head and query position.

        kl[b, h, i] = sum_j pt[b, h, i, j] (log pt[b, h, i, j] - log ps[b, h, i, j])
        loss = sum_{b, h, i} m[b, i] kl[b, h, i] / max(NH * sum m, 1)

    Wang et al. 2020, eq. 5 (1 / (A_h |x|) sum over heads and positions), with the mean
    taken over the real query positions (m = attention_mask > 0) of the batch. Keys where
    the teacher's probability is 0 (padding) add nothing; the student's probability is
    floored at the dtype's smallest normal number inside the log.

    Args:
        student_probs: (B, NH, T, T) float, the student's last-layer attention
            probabilities (before dropout), rows summing to 1.
        teacher_probs: (B, NH, T, T) float, the teacher's (a constant).
        attention_mask: (B, T) 1 for real tokens, 0 for padding.
    Returns:
        loss: 0-d array (nats per head and real query position) and a cache.
    Raises:
        ValueError: shapes that differ (e.g. other head counts), or a mask not (B, T).
    """
    if student_probs.ndim != 4 or tuple(teacher_probs.shape) != tuple(student_probs.shape):
        raise ValueError(f"attention_kl: student and teacher attention maps must be the same "
                         f"(B, NH, T, T), got {tuple(student_probs.shape)} and "
                         f"{tuple(teacher_probs.shape)}")
    B, NH, T, _ = student_probs.shape
    if tuple(attention_mask.shape) != (B, T):
        raise ValueError(f"attention_kl: attention_mask must be {(B, T)}, "
                         f"got {tuple(attention_mask.shape)}")
    xp = get_array_module(student_probs)
    out_dtype = student_probs.dtype
    dtype = compute_dtype(out_dtype)
    ps = xp.maximum(student_probs.astype(dtype), np.finfo(dtype).tiny)    # (B, NH, T, T)
    pt = teacher_probs.astype(dtype)                                      # (B, NH, T, T)
    on = pt > 0
    log_pt = xp.log(xp.where(on, pt, 1))                                  # 0 where pt = 0
    kl = (xp.where(on, pt * (log_pt - xp.log(ps)), 0)).sum(axis=-1)        # (B, NH, T)
    m = (attention_mask > 0).astype(dtype)[:, None, :]                    # (B, 1, T)
    denom = xp.maximum(NH * m.sum(), 1)
    loss = (m * kl).sum() / denom
    return loss, (ps, pt, m, denom, out_dtype)


def attention_kl_backward(dloss, cache):
    """d loss / d student_probs of :func:`attention_kl_forward`, times ``dloss``:
    (B, NH, T, T) in the dtype of the forward's student probabilities (hand it to
    ``BertSelfAttention.add_probs_grad``)."""
    ps, pt, m, denom, out_dtype = cache
    # forward: loss = sum m kl / denom  ->  d kl[b, h, i] = dloss * m[b, i] / denom
    dkl = dloss * m / denom                                               # (B, 1, T)
    # forward: kl = sum_j pt (log pt - log ps)  ->  d ps = -pt / ps
    dps = -dkl[..., None] * pt / ps                                       # (B, NH, T, T)
    return dps.astype(out_dtype, copy=False)


# ---------------------------------------------------------------------------------------
# Soft labels of a fine-tuned teacher (task distillation)
# ---------------------------------------------------------------------------------------

def soft_label_loss_forward(logits, labels, teacher, alpha: float, temperature: float):
    """(1 - alpha) * CE(logits, labels) + alpha * T^2 * KL(softmax(teacher / T) ||
    softmax(logits / T)).

    The soft-target objective of Hinton et al. 2015 (section 2: the T^2 keeps the soft
    term's gradient scale independent of T), as DistilBERT's task-specific distillation
    and Turc et al. 2019 ("Well-Read Students Learn Better", section 3) use it. The CE
    mean runs over the rows with a gold label, the soft term's (:func:`soft_target_kl_forward`
    with every row counted) over every row: a transfer-set row (label -100) counts only in
    the soft term.

    Args:
        logits: (B, K) float, the student's logits.
        labels: (B,) int in [0, K), or -100 for a row without a gold label.
        teacher: (B, K) float, the teacher's logits for the same rows (a constant).
        alpha: weight of the soft term in [0, 1].
        temperature: T > 0.
    Returns:
        (loss, cache): loss a 0-d array (nats; the CE is 0 when no row has a gold label).
    Raises:
        ValueError: alpha outside [0, 1], T <= 0, shapes that differ, or (on the CPU) a
            label outside [0, K) that is not -100.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"soft_label_loss: alpha must be in [0, 1], got {alpha}")
    every_row = get_array_module(logits).ones(logits.shape[:1])      # (B,) all rows count
    ce, ce_cache = cross_entropy_forward(logits, labels)
    kl, kl_cache = soft_target_kl_forward(logits, teacher, every_row, temperature)
    return (1.0 - alpha) * ce + alpha * kl, (ce_cache, kl_cache, alpha)


def soft_label_loss_backward(dloss, cache):
    """d loss / d logits (B, K) of :func:`soft_label_loss_forward`, times ``dloss``."""
    ce_cache, kl_cache, alpha = cache
    # forward: loss = (1 - alpha) * ce + alpha * kl
    return (cross_entropy_backward(dloss * (1.0 - alpha), ce_cache)
            + soft_target_kl_backward(dloss * alpha, kl_cache))
