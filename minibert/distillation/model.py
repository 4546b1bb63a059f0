"""The student of general distillation: a BERT or ALBERT that learns from a frozen teacher
BERT.

:class:`DistillationModel` is a :class:`~minibert.modeling.BertForPreTraining` (same
parameter names, so its checkpoints are pretraining checkpoints that ``finetune.py
--init`` reads; :class:`AlbertDistillationModel` is the same student on
:class:`~minibert.albert.AlbertForPreTraining`, :func:`student_class` picks) that runs a :class:`~.teacher.Teacher` forward on the same batch, in
inference mode, and whose loss is

    alpha_mlm * (student MLM [+ NSP/SOP] loss) + alpha_ce * L_kl + alpha_cos * L_cos
        + alpha_pooled * L_pooled + alpha_att * L_att

with the terms of :mod:`.losses` (DistilBERT's weights, Sanh et al. 2019, section 3:
alpha_ce 5, alpha_mlm 2, alpha_cos 1). Its ``backward(dloss)`` fits
:func:`minibert.training.train`. The teacher is not a sub-module: its parameters are
neither trained, nor saved, nor counted.

Shape legend: B = batch, T = sequence length, P = masked-LM slots per sequence,
V = vocab size, Cs / Ct = student / teacher hidden size, NH = heads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..albert import AlbertConfig, AlbertForPreTraining
from ..distilbert import DistilBertConfig, DistilBertForMaskedLM
from ..backend import get_array_module
from ..modeling import (BertConfig, BertForPreTraining, BertForPreTrainingOutput, ModelConfig,
                        _check_inputs)
from ..nn import Linear
from .losses import (attention_kl_backward, attention_kl_forward, cosine_loss_backward,
                     cosine_loss_forward, pooled_cosine_loss_backward, pooled_cosine_loss_forward,
                     soft_target_kl_backward, soft_target_kl_forward)
from .teacher import Teacher

__all__ = ["AlbertDistillationModel", "DistillationModel", "DistillationOutput",
           "DistillationWeights", "student_class"]


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


def _weighted_sum(terms):
    """The sum of weight * loss over the (weight, loss) pairs ``terms``; None when empty."""
    total = None
    for a, term in terms:
        total = a * term if total is None else total + a * term
    return total


class DistillationModel(BertForPreTraining):
    """A student BertForPreTraining that learns from a :class:`~.teacher.Teacher` (see the
    module docstring for the loss).

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

    cache_attributes = ("_cache", "_distill_cache")
    sentence_label = "next_sentence_label"    # this forward's keyword, whatever the student

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

    @property
    def input_config(self):
        """The config the batch's inputs are checked against (shapes, id ranges): the
        student's; a DistilBERT student's has no token types, so its teacher's."""
        return self.config

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
        token_type_ids, attention_mask = _check_inputs(self.input_config, input_ids,
                                                       token_type_ids, attention_mask)
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
            kl, kl_cache = self._soft_target_kl(out, t, masked_lm_weights, xp)
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
        total = _weighted_sum(terms)
        self._distill_cache = (kl_cache, cos_cache, pooled_cache, att_cache,
                               out.prediction_logits.shape)
        return DistillationOutput(
            total, out.mlm_loss, out.seq_relationship_loss, out.prediction_logits,
            out.seq_relationship_logits, out.hidden_states,
            out.attentions if output_attentions else None,
            student_loss=out.loss, kl_loss=kl, cos_loss=cos, att_loss=att_loss,
            pooled_loss=pooled)

    def _soft_target_kl(self, out, t, masked_lm_weights, xp):
        """(loss, cache) of the soft-target KL between the student's (B, P, V) MLM logits
        and the teacher's at temperature ``weights.temperature``, over the slots of
        ``masked_lm_weights`` > 0 (all when None)."""
        B, P, V = out.prediction_logits.shape
        slots = (masked_lm_weights.reshape(-1) if masked_lm_weights is not None
                 else xp.ones(B * P, dtype=np.float32))                  # (B*P,)
        return soft_target_kl_forward(out.prediction_logits.reshape(B * P, V),
                                      t.prediction_logits.reshape(B * P, V),
                                      slots, self.weights.temperature)

    def backward(self, dloss=1.0) -> None:
        """Add dloss * d(loss)/d(param) into the student's (and the projection's) ``grad``
        for the total loss of the last forward. ``dloss``: a float or 0-d array.

        Raises:
            RuntimeError: no forward came before.
        """
        kl_cache, cos_cache, pooled_cache, att_cache, logits_shape = self.take_cache(
            "_distill_cache")
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
            self.backbone.add_last_attention_grad(
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


class AlbertDistillationModel(DistillationModel, AlbertForPreTraining):
    """:class:`DistillationModel` with an ALBERT student: the parameters, forward and
    backward of :class:`~minibert.albert.AlbertForPreTraining` (``albert.*``,
    ``predictions.*``, ``sop_classifier.*``) under the distillation loss, which reads the
    student's last hidden states, MLM logits and last layer's attention only. Its
    ``forward`` takes the sentence label as ``next_sentence_label``, as DistillationModel's.
    Arguments and errors as DistillationModel."""


class DistilBertDistillationModel(DistillationModel, DistilBertForMaskedLM):
    """:class:`DistillationModel` with a DistilBERT student (Sanh et al. 2019, section 3:
    the student of a BERT teacher under soft-target, MLM and cosine losses): the
    parameters, forward and backward of :class:`~minibert.distilbert.DistilBertForMaskedLM`
    (``distilbert.*``, ``vocab_*``; no sentence head, so no ``next_sentence_label``).
    Token-type ids reach the teacher; the student ignores them. Arguments and errors as
    DistillationModel."""

    @property
    def input_config(self):
        """The teacher's config: the token types the teacher reads are checked against it
        (the student checks its own positions and ids in its forward)."""
        return self.teacher.config


def student_class(config: ModelConfig) -> type[DistillationModel]:
    """The student class of a config's family: :class:`AlbertDistillationModel` for an
    :class:`~minibert.albert.AlbertConfig`, :class:`DistilBertDistillationModel` for a
    :class:`~minibert.distilbert.DistilBertConfig`, else :class:`DistillationModel`."""
    if isinstance(config, DistilBertConfig):
        return DistilBertDistillationModel
    return AlbertDistillationModel if isinstance(config, AlbertConfig) else DistillationModel
