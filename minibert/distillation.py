"""General knowledge distillation: a student BERT learns from a frozen teacher BERT.

The losses, each a ``*_forward`` / ``*_backward`` pair (the gradient is taken with respect
to the student's side only; the teacher's outputs are constants):

* :func:`soft_target_kl_forward`: the soft-target loss of Hinton et al. 2015 ("Distilling
  the Knowledge in a Neural Network", section 2) on the MLM distributions at the masked
  positions, T^2 * KL(softmax(t / T) || softmax(s / T)), DistilBERT's ``L_ce`` (Sanh et al.
  2019, section 3; huggingface/transformers ``examples/research_projects/distillation/
  distiller.py``: ``KLDivLoss(reduction="batchmean")`` times T^2);
* :func:`cosine_loss_forward`: DistilBERT's cosine embedding loss ``L_cos`` between the
  student's and the teacher's last hidden states at the real (attention-mask) tokens,
  torch's ``CosineEmbeddingLoss`` with target 1; when the widths differ the student's
  states first go through a learned projection W_h (TinyBERT, Jiao et al. 2020, eq. 8),
  the ``hidden_projection`` Linear of :class:`DistillationModel`;
* :func:`pooled_cosine_loss_forward`: the same cosine loss between the mean-pooled states
  of each sequence, the student's (projected) sentence embedding against the teacher's,
  as in the sentence-embedding distillation of Reimers & Gurevych 2020 ("Making
  Monolingual Sentence Embeddings Multilingual using Knowledge Distillation", section 2,
  there with MSE; cosine here, since a sentence-transformers teacher such as
  all-MiniLM-L6-v2 compares its mean-pooled embeddings by cosine);
* :func:`attention_kl_forward`: MiniLM's self-attention distribution transfer (Wang et al.
  2020, "MiniLM", section 3.1, eq. 5): the KL between the teacher's and the student's
  last-layer attention probabilities, per head and query position (equal head counts).

:class:`DistillationModel` is the student: a :class:`~minibert.modeling.BertForPreTraining`
(same parameter names, so its checkpoints are pretraining checkpoints that
``finetune.py --init`` reads) that runs a :class:`Teacher` forward on the same batch, in
inference mode, and whose loss is

    alpha_mlm * (student MLM [+ NSP/SOP] loss) + alpha_ce * L_kl + alpha_cos * L_cos
        + alpha_pooled * L_pooled + alpha_att * L_att

(DistilBERT's weights: alpha_ce 5, alpha_mlm 2, alpha_cos 1). Its ``backward(dloss)``
fits :func:`minibert.training.train`. The teacher is not a sub-module: its parameters
are neither trained, nor saved, nor counted; its outputs are computed on the fly for each
batch and its layer caches dropped right after its forward (memory stays that of one
batch).

:func:`every_other_layer_state` builds DistilBERT's student initialisation (Sanh et al.
2019, section 3, "taking one layer out of two"; seed 003 section 3.11, parameter
elimination). :func:`projected_embeddings_state` starts a narrower student from the
teacher's embeddings projected onto their principal directions. :mod:`minibert.pruning`
cuts the teacher itself down to a smaller student (Minitron's structured pruning).

Shape legend: B = batch, T = sequence length, P = prediction slots per sequence,
N = B * P rows of logits, V = vocab size, Cs / Ct = student / teacher hidden size,
NH = heads.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backend import compute_dtype, get_array_module
from .hf import HFFormatError, load_pretrained_weights
from .modeling import (BertConfig, BertForPreTraining, BertForPreTrainingOutput, BertModel,
                       _check_inputs)
from .nn import Linear, mean_pooling_backward, mean_pooling_forward

__all__ = [
    "DistillationModel", "DistillationOutput", "DistillationWeights", "Teacher",
    "TeacherOutput", "attention_kl_backward", "attention_kl_forward", "cosine_loss_backward",
    "cosine_loss_forward", "every_other_layer_config", "every_other_layer_state",
    "has_mlm_head", "load_teacher", "pooled_cosine_loss_backward", "pooled_cosine_loss_forward",
    "projected_embeddings_state", "release_caches",
    "soft_target_kl_backward", "soft_target_kl_forward",
]

COSINE_EPS = 1e-12   # added to each squared norm, as torch's cosine_embedding_loss


def _log_softmax(x):
    """Row-wise log-softmax over the last axis, shifted by the row max (stable)."""
    xp = get_array_module(x)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))


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
    log_ps = _log_softmax(student_logits.astype(dtype) / T)          # (N, V)
    log_pt = _log_softmax(teacher_logits.astype(dtype) / T)          # (N, V)
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
# Teacher
# ---------------------------------------------------------------------------------------

# attributes where layers keep what their backward needs (minibert.nn, minibert.modeling)
_CACHE_ATTRIBUTES = ("_cache", "_mask", "_ids", "_hidden_meta", "_dprobs", "attention_probs")


def release_caches(model) -> None:
    """Drop what every module of ``model`` keeps from its last forward for a backward
    (inputs, masks, softmax outputs ...): a model used for inference only then holds no
    activations between batches. A backward after this raises."""
    for m in model.modules():
        for name in _CACHE_ATTRIBUTES:
            if name in vars(m):
                setattr(m, name, None)


_MLM_HEAD_KEYS = ("cls.predictions.bias", "cls.predictions.transform.dense.weight",
                  "cls.predictions.transform.dense.bias",
                  "cls.predictions.transform.LayerNorm.weight",
                  "cls.predictions.transform.LayerNorm.bias")


def has_mlm_head(state: dict) -> bool:
    """Whether the weights ``state`` (minibert / HF names) hold BERT's MLM head."""
    return all(k in state for k in _MLM_HEAD_KEYS)


@dataclass
class TeacherOutput:
    """What a student learns from, for one batch (device arrays, constants).

    prediction_logits: (B, P, V) MLM logits at the masked positions, or None.
    last_hidden_state: (B, T, Ct).
    last_attention: (B, NH, T, T) last-layer attention probabilities, or None.
    """

    prediction_logits: Any
    last_hidden_state: Any
    last_attention: Any = None


class Teacher:
    """A frozen BERT run forward only, in inference mode (no dropout; caches dropped).

    Not a :class:`~minibert.nn.Module`, so a student that holds one does not count, train
    or save its parameters.

    Args:
        model: a :class:`~minibert.modeling.BertForPreTraining` (with its MLM head) or a
            bare :class:`~minibert.modeling.BertModel` (no head: no soft targets), loaded.
    """

    def __init__(self, model):
        self.model = model.eval()
        self.has_mlm_head = isinstance(model, BertForPreTraining)
        self.config: BertConfig = model.config
        self.bert = model.bert if self.has_mlm_head else model

    def to(self, device: str, dtype=None) -> "Teacher":
        self.model.to(device, dtype)
        return self

    def num_parameters(self) -> int:
        return self.model.num_parameters()

    def __call__(self, input_ids, token_type_ids, attention_mask, masked_lm_positions=None, *,
                 logits: bool = True, attentions: bool = False) -> TeacherOutput:
        """One forward on a batch (inputs as ``BertForPreTraining.forward``).

        Args:
            logits: compute the MLM logits at ``masked_lm_positions`` (needs the head).
            attentions: keep the last layer's attention probabilities.
        Raises:
            ValueError: ``logits`` without an MLM head, or bad inputs.
        """
        if logits and not self.has_mlm_head:
            raise ValueError("the teacher has no MLM head: no soft targets")
        self.model.eval()
        if logits:
            out = self.model(input_ids, token_type_ids, attention_mask,
                             masked_lm_positions=masked_lm_positions,
                             output_attentions=attentions)
            result = TeacherOutput(out.prediction_logits, out.hidden_states)
        else:
            out = self.bert(input_ids, token_type_ids, attention_mask, attentions)
            result = TeacherOutput(None, out.last_hidden_state)
        if attentions:
            result.last_attention = out.attentions[-1]                   # (B, NH, T, T)
        release_caches(self.model)
        return result

    def mlm_loss_sums(self, batches, xp) -> tuple[float, float]:
        """(summed MLM nats, counted positions) of the teacher over ``batches``
        (:class:`minibert.pretraining.Batch`): its held-out MLM loss is their ratio."""
        if not self.has_mlm_head:
            raise ValueError("the teacher has no MLM head")
        self.model.eval()
        total = count = 0.0
        for b in batches:
            kw = {k: xp.asarray(v) for k, v in b.model_inputs().items()
                  if k != "next_sentence_label"}
            out = self.model(**kw)
            n = float((kw["masked_lm_weights"] > 0).sum())
            total += float(out.mlm_loss) * n
            count += n
        release_caches(self.model)
        return total, count


def load_teacher(start, dtype=np.float32) -> Teacher:
    """The :class:`Teacher` of a starting point resolved by :func:`minibert.runs.load_start`
    (a Hugging Face BERT directory or a minibert run): a BertForPreTraining when its weights
    hold the MLM head (``cls.predictions.*``), else a bare BertModel (e.g. a
    sentence-embedding model such as all-MiniLM-L6-v2).

    Raises:
        HFFormatError: the encoder weights do not match the config, or the MLM head is
            there only in part.
    """
    config = start.config
    if has_mlm_head(start.state):
        model = BertForPreTraining(config, dtype=dtype, seq_relationship_head=False)
    else:
        model = BertModel(config, add_pooling_layer=False, dtype=dtype)
    report = load_pretrained_weights(model, start.state, start.source)
    missing = [k for k in report["new"] if k.startswith("cls.predictions.")]
    if missing:
        raise HFFormatError(f"{start.source}: MLM head weights missing or mis-shaped: {missing}")
    return Teacher(model)


# ---------------------------------------------------------------------------------------
# Student initialisation
# ---------------------------------------------------------------------------------------

_LAYER_KEY = re.compile(r"^bert\.encoder\.layer\.(\d+)\.(.*)$")


def every_other_layer_config(teacher: BertConfig, **overrides) -> BertConfig:
    """The teacher's config with ceil(L / 2) layers (layers 0, 2, 4, ... of the teacher);
    ``overrides`` (e.g. dropout) replace fields."""
    d = teacher.to_dict()
    d.update(num_hidden_layers=math.ceil(teacher.num_hidden_layers / 2), **overrides)
    return BertConfig.from_dict(d)


def every_other_layer_state(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A student's initial weights from the teacher's ``state`` (names ``bert.*`` ...):
    encoder layers 0, 2, 4, ... renumbered 0, 1, 2, ..., the odd layers dropped, every
    other tensor (embeddings, pre-LN final norm, pooler, heads) kept as is.

    DistilBERT (Sanh et al. 2019, section 3: "we initialize the student from the teacher
    by taking one layer out of two"; seed 003 section 3.11, parameter elimination). Load
    the result with :func:`minibert.hf.load_pretrained_weights` into a model built with
    :func:`every_other_layer_config`.
    """
    out = {}
    for k, v in state.items():
        m = _LAYER_KEY.match(k)
        if m is None:
            out[k] = v
        elif int(m.group(1)) % 2 == 0:
            out[f"bert.encoder.layer.{int(m.group(1)) // 2}.{m.group(2)}"] = v
    return out


_EMBEDDINGS = ("word_embeddings", "position_embeddings", "token_type_embeddings")


def projected_embeddings_state(state: dict[str, np.ndarray], hidden_size: int
                               ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A narrower student's embedding tables from the teacher's: each table projected onto
    the top ``hidden_size`` principal directions of the teacher's word embeddings.

    With E (V, Ct) the teacher's word embeddings, m their mean row and U (Ct, Cs) the
    right singular vectors of E - m with the Cs largest singular values (principal
    component analysis; computed as the top eigenvectors of (E - m)^T (E - m)), the
    student gets (E - m) @ U as word embeddings and P @ U, S @ U as position and
    token-type embeddings. Projection is linear, so the sum the embedding
    LayerNorm sees is the projected sum of the teacher's, less m @ U. Words the pretraining
    corpus never shows still start where the teacher puts them, which a random table
    cannot give. ``basis`` = U is also the natural start of the cosine loss's W_h
    (``hidden_projection.weight``, (Ct, Cs)): it maps student states back into the span
    they came from. Our choice of initialisation (an SVD truncation, as ALBERT's
    factorised embeddings (Lan et al. 2020) reduce the embedding width); no paper's recipe.

    Args:
        state: the teacher's weights, HF names (``bert.embeddings.*``), any float dtype.
        hidden_size: the student's width Cs, 1 <= Cs <= Ct.
    Returns:
        ({``bert.embeddings.<table>.weight``: float32 array}, basis U (Ct, Cs) float32 with
        orthonormal columns).
    Raises:
        KeyError: the state lacks the word-embedding table.
        ValueError: ``hidden_size`` outside [1, Ct].
    """
    words = np.asarray(state["bert.embeddings.word_embeddings.weight"], np.float64)
    width = words.shape[1]
    if not 1 <= hidden_size <= width:
        raise ValueError(f"a student of width {hidden_size} cannot take projected embeddings "
                         f"of a teacher of width {width} (need 1 <= width <= {width})")
    centred = words - words.mean(0)
    # the right singular vectors of the centred table are the eigenvectors of its (Ct, Ct)
    # scatter matrix; eigh gives all Ct of them (orthonormal) even when V < Ct, where a
    # thin SVD would give only V
    eigenvalues, vectors = np.linalg.eigh(centred.T @ centred)
    basis = vectors[:, np.argsort(eigenvalues)[::-1][:hidden_size]]
    out = {}
    for name in _EMBEDDINGS:
        key = f"bert.embeddings.{name}.weight"
        if key in state:
            table = centred if name == "word_embeddings" else np.asarray(state[key], np.float64)
            out[key] = (table @ basis).astype(np.float32)
    return out, basis.astype(np.float32)


# ---------------------------------------------------------------------------------------
# The student
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DistillationWeights:
    """The temperature and the weight of each loss term (DistilBERT's defaults for the
    first four; MiniLM's attention transfer off by default).

    Raises:
        ValueError: temperature not a finite number > 0, a weight negative or not finite,
            or every weight 0.
    """

    temperature: float = 2.0   # T of the soft targets
    alpha_ce: float = 5.0      # soft-target KL on the MLM distributions
    alpha_mlm: float = 2.0     # the student's own MLM (+ sentence task) loss
    alpha_cos: float = 1.0     # cosine loss on the last hidden states
    alpha_att: float = 0.0     # MiniLM last-layer attention transfer
    alpha_pooled: float = 0.0  # cosine loss on the mean-pooled last hidden states

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature}")
        names = ("alpha_ce", "alpha_mlm", "alpha_cos", "alpha_att", "alpha_pooled")
        for n in names:
            v = getattr(self, n)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{n} must be a finite number >= 0, got {v}")
        if not any(getattr(self, n) > 0 for n in names):
            raise ValueError("every distillation weight is 0: nothing to learn from")


@dataclass
class DistillationOutput(BertForPreTrainingOutput):
    """:class:`~minibert.modeling.BertForPreTrainingOutput` of the student, with ``loss``
    the weighted total, and the terms (0-d arrays, None when their weight is 0):
    ``student_loss`` (the student's own pretraining loss, MLM + sentence task),
    ``kl_loss`` (T^2 * KL per counted masked position), ``cos_loss`` (mean 1 - cos per
    real token), ``att_loss`` (attention KL per head and real query position),
    ``pooled_loss`` (mean 1 - cos of the mean-pooled states per sequence)."""

    student_loss: Any = None
    kl_loss: Any = None
    cos_loss: Any = None
    att_loss: Any = None
    pooled_loss: Any = None


class DistillationModel(BertForPreTraining):
    """A student BertForPreTraining that learns from a :class:`Teacher` (see the module
    docstring for the loss).

    Parameters: the student's (HF names ``bert.*``, ``cls.*``) and, when a cosine loss
    (``alpha_cos`` or ``alpha_pooled``) is on and the hidden sizes differ,
    ``hidden_projection.weight`` (Ct, Cs), TinyBERT's W_h (no bias, initialised
    N(0, initializer_range^2) from ``default_rng([seed, 1])``), shared by both cosine
    losses, trained and saved with the student and unused by anything that loads the
    student.

    Args:
        config: the student's config; ``vocab_size`` must be the teacher's.
        teacher: the frozen :class:`Teacher` (moved with :meth:`to`, never trained).
        weights: :class:`DistillationWeights`.
        seed, dtype, label_smoothing, seq_relationship_head: as BertForPreTraining.
    Raises:
        ValueError: another vocab size than the teacher's; ``alpha_ce`` > 0 with a teacher
            without MLM head; ``alpha_att`` > 0 with other head counts than the teacher's.
    """

    def __init__(self, config: BertConfig, teacher: Teacher,
                 weights: DistillationWeights = DistillationWeights(), *, seed: int = 0,
                 dtype=np.float32, label_smoothing: float = 0.0,
                 seq_relationship_head: bool = True):
        tc = teacher.config
        if config.vocab_size != tc.vocab_size:
            raise ValueError(f"the student's vocab_size {config.vocab_size} differs from the "
                             f"teacher's {tc.vocab_size}: a student shares its teacher's vocab")
        if weights.alpha_ce > 0 and not teacher.has_mlm_head:
            raise ValueError("the teacher has no MLM head (cls.predictions.*), so there are no "
                             "soft targets: set alpha_ce to 0")
        if weights.alpha_att > 0 and config.num_attention_heads != tc.num_attention_heads:
            raise ValueError(f"attention transfer needs the teacher's head count: student "
                             f"{config.num_attention_heads}, teacher {tc.num_attention_heads} "
                             "(set alpha_att to 0 or match num_attention_heads)")
        super().__init__(config, seed=seed, dtype=dtype, label_smoothing=label_smoothing,
                         seq_relationship_head=seq_relationship_head)
        self.weights = weights
        self._teacher = teacher                   # not a Module: not a parameter owner here
        if (weights.alpha_cos > 0 or weights.alpha_pooled > 0) \
                and config.hidden_size != tc.hidden_size:
            self.hidden_projection = Linear(config.hidden_size, tc.hidden_size, bias=False,
                                            rng=np.random.default_rng([seed, 1]),
                                            std=config.initializer_range, dtype=dtype)
        self._distill_cache = None

    @property
    def teacher(self) -> Teacher:
        return self._teacher

    def to(self, device: str, dtype=None) -> "DistillationModel":
        super().to(device, dtype)
        self._teacher.to(device, dtype)
        return self

    def train(self, mode: bool = True) -> "DistillationModel":
        super().train(mode)
        self._teacher.model.eval()                # the teacher never drops out
        return self

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                masked_lm_positions=None, masked_lm_ids=None, masked_lm_weights=None,
                next_sentence_label=None, output_attentions: bool = False
                ) -> DistillationOutput:
        """The teacher's forward, then the student's, then the weighted loss.

        Args: as :meth:`BertForPreTraining.forward`. The soft-target term counts the slots
        of ``masked_lm_weights`` > 0 (all when None); the cosine, pooled and attention
        terms the real tokens of ``attention_mask``.
        Returns:
            :class:`DistillationOutput`; ``loss`` is None only when no term can be
            computed (no labels and only the student's loss weighted).
        Raises:
            ValueError: as BertForPreTraining.forward.
        """
        w = self.weights
        token_type_ids, attention_mask = _check_inputs(self.config, input_ids, token_type_ids,
                                                       attention_mask)
        xp = get_array_module(input_ids)
        att = w.alpha_att > 0
        t = self._teacher(input_ids, token_type_ids, attention_mask, masked_lm_positions,
                          logits=w.alpha_ce > 0, attentions=att)
        out = super().forward(input_ids, token_type_ids, attention_mask, masked_lm_positions,
                              masked_lm_ids, masked_lm_weights, next_sentence_label,
                              output_attentions=output_attentions or att)
        terms = []                               # (weight, loss) of the total
        if out.loss is not None and w.alpha_mlm > 0:
            terms.append((w.alpha_mlm, out.loss))
        kl = cos = att_loss = pooled = None
        kl_cache = cos_cache = att_cache = pooled_cache = None
        if w.alpha_ce > 0:
            B, P, V = out.prediction_logits.shape
            slots = (masked_lm_weights.reshape(-1) if masked_lm_weights is not None
                     else xp.ones(B * P, dtype=np.float32))              # (B*P,)
            kl, kl_cache = soft_target_kl_forward(out.prediction_logits.reshape(B * P, V),
                                                  t.prediction_logits.reshape(B * P, V),
                                                  slots, w.temperature)
            terms.append((w.alpha_ce, kl))
        if w.alpha_cos > 0 or w.alpha_pooled > 0:
            h = out.hidden_states                                        # (B, T, Cs)
            if hasattr(self, "hidden_projection"):
                h = self.hidden_projection(h)                            # (B, T, Ct)
        if w.alpha_cos > 0:
            cos, cos_cache = cosine_loss_forward(h, t.last_hidden_state, attention_mask)
            terms.append((w.alpha_cos, cos))
        if w.alpha_pooled > 0:
            pooled, pooled_cache = pooled_cosine_loss_forward(h, t.last_hidden_state,
                                                              attention_mask)
            terms.append((w.alpha_pooled, pooled))
        if att:
            att_loss, att_cache = attention_kl_forward(out.attentions[-1], t.last_attention,
                                                       attention_mask)
            terms.append((w.alpha_att, att_loss))
        total = None
        for a, term in terms:
            total = a * term if total is None else total + a * term
        self._distill_cache = (kl_cache, cos_cache, pooled_cache, att_cache,
                               out.prediction_logits.shape)
        return DistillationOutput(
            total, out.mlm_loss, out.seq_relationship_loss, out.prediction_logits,
            out.seq_relationship_logits, out.hidden_states,
            out.attentions if output_attentions else None,
            student_loss=out.loss, kl_loss=kl, cos_loss=cos, att_loss=att_loss,
            pooled_loss=pooled)

    def backward(self, dloss=1.0) -> None:
        """Add dloss * d(loss)/d(param) into the student's (and the projection's) ``grad``
        for the total loss of the last forward. ``dloss``: a float or 0-d array.

        Raises:
            RuntimeError: no forward came before.
        """
        if self._distill_cache is None:
            raise RuntimeError("backward() needs a preceding forward")
        kl_cache, cos_cache, pooled_cache, att_cache, logits_shape = self._distill_cache
        self._distill_cache = None
        w = self.weights
        d_logits = dh = None
        if kl_cache is not None:
            # forward: loss += alpha_ce * soft_target_kl(prediction_logits, teacher's)
            d_logits = soft_target_kl_backward(dloss * w.alpha_ce, kl_cache
                                               ).reshape(logits_shape)   # (B, P, V)
        if cos_cache is not None:
            # forward: loss += alpha_cos * cosine_loss(projection(h), teacher's h)
            dh = cosine_loss_backward(dloss * w.alpha_cos, cos_cache)    # (B, T, Ct)
        if pooled_cache is not None:
            # forward: loss += alpha_pooled * pooled_cosine_loss(projection(h), teacher's h)
            dp = pooled_cosine_loss_backward(dloss * w.alpha_pooled, pooled_cache)
            dh = dp if dh is None else dh + dp                           # (B, T, Ct)
        if dh is not None and hasattr(self, "hidden_projection"):
            # forward: h = hidden_projection(hidden_states)
            dh = self.hidden_projection.backward(dh)                     # (B, T, Cs)
        if att_cache is not None:
            # forward: loss += alpha_att * attention_kl(last layer's probs, teacher's)
            last = self.bert.encoder.layer[len(self.bert.encoder.layer) - 1]
            last.attention.self.add_probs_grad(
                attention_kl_backward(dloss * w.alpha_att, att_cache))  # (B, NH, T, T)
            if dh is None and self._cache[3] is None and self._cache[4] is None:
                B, T, C = self._cache[0]                                 # nothing else flows
                dh = get_array_module(self._cache[2]).zeros((B, T, C), dtype=self._cache[1])
        # forward: loss = alpha_mlm * student_loss + ...  (the student's own loss, if any)
        super().backward(dloss * w.alpha_mlm, d_prediction_logits=d_logits, d_hidden_states=dh)

    # -- metrics ------------------------------------------------------------------------
    def stats(self, out: DistillationOutput, inputs: dict) -> dict:
        """Per-batch device sums of the distillation terms (no host read): for each term
        whose weight is > 0, ``<term>_sum`` (its mean times its count) and
        ``<term>_count``: ``kl_loss`` over counted masked slots, ``cos_loss`` and
        ``att_loss`` over real tokens, ``pooled_loss`` over sequences with a real token."""
        xp = get_array_module(inputs["input_ids"])
        sums = {}
        if out.kl_loss is not None:
            n = ((inputs["masked_lm_weights"] > 0).sum() if "masked_lm_weights" in inputs
                 else xp.asarray(out.prediction_logits.shape[0] * out.prediction_logits.shape[1]))
            sums["kl_loss_sum"], sums["kl_count"] = out.kl_loss * n, n
        real = ((inputs["attention_mask"] > 0).sum() if "attention_mask" in inputs
                else xp.asarray(inputs["input_ids"].size))
        for name, v in (("cos_loss", out.cos_loss), ("att_loss", out.att_loss)):
            if v is not None:
                sums[f"{name}_sum"], sums[name.replace("_loss", "_count")] = v * real, real
        if out.pooled_loss is not None:
            seqs = ((inputs["attention_mask"] > 0).any(axis=1).sum() if "attention_mask" in inputs
                    else xp.asarray(inputs["input_ids"].shape[0]))
            sums["pooled_loss_sum"], sums["pooled_count"] = out.pooled_loss * seqs, seqs
        return {k: xp.asarray(v) for k, v in sums.items()}

    @staticmethod
    def summarize(totals: dict) -> dict:
        """Host means of :meth:`stats` sums: ``kl_loss``, ``cos_loss``, ``att_loss``,
        ``pooled_loss`` (those present; nan where the count is 0)."""
        out = {}
        for name, count in (("kl_loss", "kl_count"), ("cos_loss", "cos_count"),
                            ("att_loss", "att_count"), ("pooled_loss", "pooled_count")):
            if count in totals:
                n = totals[count]
                out[name] = totals[f"{name}_sum"] / n if n else math.nan
        return out


from .distill_options_tmp import (OPTIONS, TASK_OPTIONS, add_arguments,  # noqa: E402
                                  add_task_arguments, describe_teacher, init_student,
                                  resolve_teacher, soft_targets, student_config)
