"""Fine-tuning heads on the BERT encoder: sequence classification, token classification
and extractive question answering, with Hugging Face's class and parameter names.

Each head is an encoder plus one small layer. The encoder's class and attribute are
class attributes, so the same head code serves BERT (``bert``, a
:class:`~minibert.modeling.BertModel`) and ALBERT (``albert``, a
:class:`~minibert.albert.AlbertModel`, whose heads are subclasses in
:mod:`minibert.albert` that set ``backbone_class`` and ``base_model_prefix``).
``forward`` returns an output dataclass whose ``loss`` is set when targets are given, and
all three heads share one backward signature::

    backward(dloss=1.0, *, d_logits=None)

``dloss`` scales the gradient of the last forward's loss (used when that forward had
targets); ``d_logits`` is an upstream gradient of the logits from a loss computed outside
the model (soft targets, for one), added to the loss's. For question answering it is the
pair ``(d_start_logits, d_end_logits)``, matching the two logit outputs.

Shape legend: B = batch, T = sequence length, C = hidden size, K = num_labels (classes),
NH = heads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .backend import get_array_module
from .modeling import BertConfig, BertModel, BertPreTrainedModel
from .nn import (Dropout, Linear, cross_entropy_backward, cross_entropy_forward,
                 mean_pooling_backward, mean_pooling_forward)


def _take_cache(model, dloss, upstream: dict, targets: str) -> tuple:
    """Check a head's backward arguments against its last forward and hand over that
    forward's cache ``(upstream shape, logits dtype, loss cache or None, extra)``, clearing
    it (one backward per forward). Nothing is cleared when a check fails.

    Args:
        upstream: {name: upstream gradient or None}, each of the cached shape.
        targets: the forward arguments that give a loss, for the error message.
    Raises:
        RuntimeError: no forward came before, or it had no targets and no upstream
            gradient is given.
        ValueError: ``dloss`` not a float or 0-d array (logit gradients go in
            ``d_logits``), or an upstream gradient of the wrong shape.
    """
    if model._cache is None:
        raise RuntimeError("backward() needs a preceding forward")
    shape, _, loss_cache, _ = model._cache       # checked before the cache is taken
    if loss_cache is None and all(d is None for d in upstream.values()):
        raise RuntimeError(f"backward() without d_logits needs a forward with {targets}")
    if getattr(dloss, "ndim", 0) != 0:
        raise ValueError(f"dloss: expected a float or a 0-d array, got shape "
                         f"{tuple(dloss.shape)} (give logit gradients as d_logits=...)")
    for name, d in upstream.items():
        if d is not None and tuple(d.shape) != tuple(shape):
            raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(d.shape)}")
    return model.take_cache()


def _add(a, b):
    """a + b, where None stands for a gradient of zero."""
    return b if a is None else a if b is None else a + b


def sequence_loss_forward(logits, labels) -> tuple:
    """The sequence classifiers' loss (HF's ``problem_type`` by K): mean cross-entropy
    for K >= 2, mean squared error of ``logits[:, 0]`` for K == 1 (torch ``MSELoss``).

    Args:
        logits: (B, K) float.
        labels: (B,) int class ids in [0, K) (-100 ignored) for K >= 2, float targets
            for K == 1; None for no loss.
    Returns:
        (loss, loss_cache): both None without labels; loss_cache for
        :func:`sequence_loss_backward`.
    Raises:
        ValueError: labels not (B,), or a class id outside [0, K) (CPU only).
    """
    if labels is None:
        return None, None
    B = logits.shape[0]
    if tuple(labels.shape) != (B,):
        raise ValueError(f"labels: expected shape {(B,)}, got {tuple(labels.shape)}")
    if logits.shape[1] == 1:
        # forward: loss = mean_i (logits[i, 0] - y_i)^2     (torch MSELoss)
        diff = logits[:, 0] - labels.astype(logits.dtype)                # (B,)
        return (diff * diff).mean(), ("mse", diff)
    loss, ce = cross_entropy_forward(logits, labels)
    return loss, ("ce", ce)


def sequence_loss_backward(dloss, loss_cache, d_logits):
    """d_logits (B, K) or None plus ``dloss`` times the gradient of the loss of
    :func:`sequence_loss_forward` (``loss_cache`` None: d_logits as given)."""
    if loss_cache is None:
        return d_logits
    kind, c = loss_cache
    if kind == "ce":
        # forward: loss = mean cross-entropy(logits, labels)
        d_loss = cross_entropy_backward(dloss, c)                        # (B, K)
    else:
        # forward: loss = mean (logits[:, 0] - y)^2  ->  d = 2 (logits - y) / B
        d_loss = (dloss * 2.0 / c.shape[0]) * c[:, None]                 # (B, 1)
    return _add(d_loss, d_logits)


class _HeadModel(BertPreTrainedModel):
    """A head on an encoder of class ``backbone_class``, kept as ``self.<base_model_prefix>``
    (``self.bert``: parameter names ``bert.*``, as HF)."""

    backbone_class = BertModel

    def _build_backbone(self, config, add_pooling_layer: bool, rng: np.random.Generator,
                        dtype) -> None:
        setattr(self, self.base_model_prefix,
                self.backbone_class(config, add_pooling_layer=add_pooling_layer, rng=rng,
                                    dtype=dtype))


# ---------------------------------------------------------------------------------------
# Classification: one sequence, every token
# ---------------------------------------------------------------------------------------

@dataclass
class SequenceClassifierOutput:
    """Outputs of :class:`BertForSequenceClassification`.

    loss: 0-d array (mean nats per sequence for classification, mean squared error for
        regression) or None when no labels were given.
    logits: (B, K) scores before the softmax, K = num_labels.
    pooler_output: (B, C) the pooled [CLS] representation the head reads.
    attentions: one (B, NH, T, T) array per layer when asked for, else None.
    """

    loss: Any
    logits: Any
    pooler_output: Any = None
    attentions: list | None = None


@dataclass
class TokenClassifierOutput:
    """Outputs of :class:`BertForTokenClassification`.

    loss: 0-d array, mean nats per labelled token (label != -100), or None when no labels
        were given; 0 when every label of the batch is -100.
    logits: (B, T, K) scores before the softmax, K = num_labels.
    attentions: one (B, NH, T, T) array per layer when asked for, else None.
    """

    loss: Any
    logits: Any
    attentions: list | None = None


class _BertWithClassifier(_HeadModel):
    """The construction shared by the two classification heads: ``bert`` (with a pooler
    when the subclass's ``uses_pooler(config)`` says so), ``dropout`` and ``classifier``
    (K, C). Parameter names are HF's: ``bert.*`` and ``classifier.weight`` /
    ``classifier.bias``."""

    @staticmethod
    def uses_pooler(config: BertConfig) -> bool:
        """Whether the head reads ``bert.pooler``'s output (else the encoder has no pooler)."""
        raise NotImplementedError

    def __init__(self, config: BertConfig, *, seed: int = 0, dtype=np.float32):
        """
        Args:
            config: the hyper-parameters; ``config.num_labels`` = K >= 1. The dropout
                probability is ``config.classifier_dropout``, or ``hidden_dropout_prob``
                when that is None (as HF).
            seed: seed of the NumPy generator that draws the initial weights (the encoder
                first, then the classifier, N(0, initializer_range^2), bias 0).
            dtype: parameter dtype (float32 to train, float64 to check gradients).
        Raises:
            ValueError: num_labels < 1, or a classifier dropout outside [0, 1).
        """
        if int(config.num_labels) < 1:
            raise ValueError(f"{type(config).__name__}.num_labels must be >= 1, "
                             f"got {config.num_labels}")
        self.config = config
        rng = np.random.default_rng(seed)
        self._build_backbone(config, self.uses_pooler(config), rng, dtype)
        p = (config.classifier_dropout if config.classifier_dropout is not None
             else config.hidden_dropout_prob)
        self.dropout = Dropout(p)
        self.classifier = Linear(config.hidden_size, config.num_labels, rng=rng,
                                 std=config.initializer_range, dtype=dtype)
        self._cache = None

    @property
    def num_labels(self) -> int:
        return int(self.config.num_labels)


class BertForSequenceClassification(_BertWithClassifier):
    """BERT with a classification head on the pooled [CLS] vector (Devlin et al. 2019,
    section 4.1; HF ``BertForSequenceClassification``; google-research/bert
    ``run_classifier.py create_model``):

        logits = dropout(pooled) @ W^T + b               W: (K, C), b: (K,)
        pooled = pooler_output                           (classifier_pooling "cls")
               = sum_t m_t h_t / sum_t m_t               (classifier_pooling "mean")
        loss   = mean cross-entropy(logits, labels)      (num_labels >= 2)
               = mean (logits[:, 0] - labels)^2          (num_labels == 1, regression)

    With ``config.classifier_pooling == "mean"`` the head reads the mean of the last hidden
    states h over the real tokens (attention mask m), as sentence-transformers' mean
    pooling (Reimers & Gurevych 2019) and ModernBERT's ``classifier_pooling="mean"``; the
    encoder then has no pooler (a checkpoint's pooler weights are reported unused) and
    transformers' BertForSequenceClassification cannot load the model.

    Construction (``config``, ``seed``, ``dtype``) and parameter names: see
    :class:`_BertWithClassifier`.
    """

    @staticmethod
    def uses_pooler(config: BertConfig) -> bool:
        return config.classifier_pooling == "cls"   # "mean" reads the hidden states

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False) -> SequenceClassifierOutput:
        """Classify a batch.

        Args:
            input_ids, token_type_ids, attention_mask: (B, T) int, as :meth:`BertModel.forward`.
            labels: (B,) int class ids in [0, K) (or -100 to ignore a row) when K >= 2;
                (B,) float targets when K == 1; None for no loss.
            output_attentions: also return per-layer attention probabilities.
        Returns:
            :class:`SequenceClassifierOutput`.
        Raises:
            ValueError: bad input shapes or values (see BertModel.forward), labels not (B,),
                or a class id outside [0, K) (checked on the CPU only).
        """
        out = self.backbone(input_ids, token_type_ids, attention_mask, output_attentions)
        h = out.last_hidden_state                                        # (B, T, C)
        mean_weights = None
        if self.config.classifier_pooling == "mean":
            pooled, mean_weights = mean_pooling_forward(h, attention_mask)   # (B, C)
        else:
            pooled = out.pooler_output                                   # (B, C)
        logits = self.classifier(self.dropout(pooled))                   # (B, K)
        loss, loss_cache = sequence_loss_forward(logits, labels)
        self._cache = (logits.shape, logits.dtype, loss_cache, mean_weights)
        return SequenceClassifierOutput(loss, logits, pooled, out.attentions)

    def backward(self, dloss=1.0, *, d_logits=None) -> None:
        """Gradients of ``dloss * loss + sum(logits * d_logits)`` into every trainable
        parameter's ``grad`` (the shared signature of the module docstring).

        Args:
            dloss: float or 0-d array scaling the last forward's loss (cross-entropy or
                squared error), e.g. 1/k under gradient accumulation; unused without labels.
            d_logits: (B, K) upstream gradient of ``logits``, or None.
        Raises:
            RuntimeError: no forward came before, or it had no labels and d_logits is None.
            ValueError: d_logits not (B, K), dloss not 0-d.
        """
        shape, dtype, loss_cache, mean_weights = _take_cache(self, dloss,
                                                             {"d_logits": d_logits}, "labels")
        d_logits = sequence_loss_backward(dloss, loss_cache, d_logits)  # (B, K)
        # forward: logits = dropout(pooled) @ W^T + b
        d_pooled = self.dropout.backward(self.classifier.backward(d_logits.astype(dtype)))
        if mean_weights is None:
            self.backbone.backward(None, d_pooled)                           # (B, C) upstream
        else:
            # forward: pooled, mean_weights = mean_pooling_forward(h, attention_mask)
            self.backbone.backward(mean_pooling_backward(d_pooled, mean_weights), None)


class BertForTokenClassification(_BertWithClassifier):
    """BERT with a classifier on every token's final hidden state, for tagging tasks such
    as named-entity recognition (Devlin et al. 2019, section 5.3; HF
    ``BertForTokenClassification``):

        logits = dropout(last_hidden_state) @ W^T + b     W: (K, C), b: (K,)   (B, T, K)
        loss   = mean over tokens with label != -100 of cross-entropy(logits, label)

    The encoder has no pooler (as HF's ``add_pooling_layer=False``).

    The loss is torch's ``CrossEntropyLoss()`` over the flattened (B*T, K) logits, as HF's,
    with one difference: a batch whose labels are all -100 gives loss 0 (and zero
    gradients) where torch gives nan (0 / 0), so such a batch cannot poison a training run.
    Padding is not masked by ``attention_mask``: give -100 at padded positions (and at
    word-piece continuations, when only the first piece of a word is labelled).

    Construction (``config``, ``seed``, ``dtype``) and parameter names: see
    :class:`_BertWithClassifier`.
    """

    @staticmethod
    def uses_pooler(config: BertConfig) -> bool:
        return False   # the head reads every token's state, as HF's add_pooling_layer=False

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False) -> TokenClassifierOutput:
        """Tag every token of a batch.

        Args:
            input_ids, token_type_ids, attention_mask: (B, T) int, as :meth:`BertModel.forward`.
            labels: (B, T) int class ids in [0, K), or -100 for a token without a label;
                None for no loss.
            output_attentions: also return per-layer attention probabilities.
        Returns:
            :class:`TokenClassifierOutput`.
        Raises:
            ValueError: bad input shapes or values (see BertModel.forward), labels not
                (B, T), or a label outside [0, K) and not -100 (checked on the CPU only).
        """
        out = self.backbone(input_ids, token_type_ids, attention_mask, output_attentions)
        h = out.last_hidden_state                                        # (B, T, C)
        logits = self.classifier(self.dropout(h))                        # (B, T, K)
        loss = ce = None
        if labels is not None:
            if tuple(labels.shape) != tuple(input_ids.shape):
                raise ValueError(f"labels: expected shape {tuple(input_ids.shape)}, "
                                 f"got {tuple(labels.shape)}")
            # forward: loss = CE(logits viewed as (B*T, K), labels (B*T,), ignore -100)
            loss, ce = cross_entropy_forward(logits.reshape(-1, self.num_labels),
                                             labels.reshape(-1))
        self._cache = (logits.shape, logits.dtype, ce, None)
        return TokenClassifierOutput(loss, logits, out.attentions)

    def backward(self, dloss=1.0, *, d_logits=None) -> None:
        """Gradients of ``dloss * loss + sum(logits * d_logits)`` into every trainable
        parameter's ``grad``; ``dloss`` (float or 0-d array) is unused without labels and
        ``d_logits`` is (B, T, K) or None (the shared signature of the module docstring).

        Raises:
            RuntimeError: no forward came before, or it had no labels and d_logits is None.
            ValueError: d_logits not (B, T, K), dloss not 0-d.
        """
        shape, dtype, ce, _ = _take_cache(self, dloss, {"d_logits": d_logits}, "labels")
        if ce is not None:
            # forward: loss = CE(logits viewed as (B*T, K), labels (B*T,))
            d_logits = _add(cross_entropy_backward(dloss, ce).reshape(shape), d_logits)
        # forward: logits = dropout(h) @ W^T + b
        dh = self.dropout.backward(self.classifier.backward(d_logits.astype(dtype)))
        self.backbone.backward(dh)                                           # (B, T, C)


# ---------------------------------------------------------------------------------------
# Extractive question answering
# ---------------------------------------------------------------------------------------

@dataclass
class QuestionAnsweringModelOutput:
    """Outputs of :class:`BertForQuestionAnswering`.

    loss: 0-d array, (mean start-position nats + mean end-position nats) / 2 over the
        counted examples, or None when no positions were given.
    start_logits, end_logits: (B, T) scores of each token being the first / last token of
        the answer span (a softmax over T gives the distribution).
    attentions: one (B, NH, T, T) array per layer when asked for, else None.
    """

    loss: Any
    start_logits: Any
    end_logits: Any
    attentions: list | None = None


def _span_pair(d_logits) -> tuple:
    """QA's ``d_logits`` (None, or the pair (d_start_logits, d_end_logits)) as a pair.

    Raises:
        ValueError: not a pair, or only one of the two given.
    """
    if d_logits is None:
        return None, None
    if not isinstance(d_logits, (tuple, list)) or len(d_logits) != 2:
        raise ValueError("d_logits: expected the pair (d_start_logits, d_end_logits)")
    if (d_logits[0] is None) != (d_logits[1] is None):
        raise ValueError("d_start_logits and d_end_logits: give both or neither")
    return tuple(d_logits)


class BertForQuestionAnswering(_HeadModel):
    """BERT with a span-extraction head for SQuAD-style question answering (Devlin et al.
    2019, section 4.2; HF ``BertForQuestionAnswering``; google-research/bert
    ``run_squad.py create_model``):

        start_logits, end_logits = split(last_hidden_state @ W^T + b)   W: (2, C)  (B, T) each
        loss = (CE(start_logits, start_positions) + CE(end_logits, end_positions)) / 2

    with HF's handling of positions: each is clamped to [0, T], and T (an answer outside
    the sequence, e.g. truncated away) is ignored; -100 is clamped to 0 ([CLS], the
    "no answer" position), not ignored. Each CE is the mean over the examples it counts;
    one whose positions are all ignored is 0 where torch gives nan. The softmax runs over
    all T positions, padding included, and the head has no dropout (both as HF).
    Parameter names are HF's: ``bert.*`` (no pooler) and ``qa_outputs.weight`` (2, C) /
    ``qa_outputs.bias`` (2,).

    Args:
        config: the hyper-parameters; ``config.num_labels`` must be 2 (start and end, as
            HF's head of ``num_labels`` outputs split in two needs).
        seed: seed of the NumPy generator that draws the initial weights (the encoder
            first, then qa_outputs, N(0, initializer_range^2), bias 0).
        dtype: parameter dtype (float32 to train, float64 to check gradients).
    Raises:
        ValueError: num_labels != 2.
    """

    def __init__(self, config: BertConfig, *, seed: int = 0, dtype=np.float32):
        if int(config.num_labels) != 2:
            raise ValueError(f"{type(self).__name__}: {type(config).__name__}.num_labels must "
                             f"be 2 (start and end logits), got {config.num_labels}")
        self.config = config
        rng = np.random.default_rng(seed)
        self._build_backbone(config, False, rng, dtype)
        self.qa_outputs = Linear(config.hidden_size, 2, rng=rng,
                                 std=config.initializer_range, dtype=dtype)
        self._cache = None

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                start_positions=None, end_positions=None, output_attentions: bool = False
                ) -> QuestionAnsweringModelOutput:
        """Score every token as the start and the end of the answer span.

        Args:
            input_ids, token_type_ids, attention_mask: (B, T) int, as :meth:`BertModel.forward`.
            start_positions, end_positions: (B,) int token indices of the answer's first
                and last token, clamped to [0, T] (T = ignored); both or neither.
            output_attentions: also return per-layer attention probabilities.
        Returns:
            :class:`QuestionAnsweringModelOutput`.
        Raises:
            ValueError: bad input shapes or values (see BertModel.forward), positions not
                (B,), or only one of start_positions / end_positions.
        """
        if (start_positions is None) != (end_positions is None):
            raise ValueError("start_positions and end_positions: give both or neither")
        xp = get_array_module(input_ids)
        out = self.backbone(input_ids, token_type_ids, attention_mask, output_attentions)
        logits = self.qa_outputs(out.last_hidden_state)                  # (B, T, 2)
        start_logits, end_logits = logits[..., 0], logits[..., 1]        # (B, T) each
        loss = caches = None
        if start_positions is not None:
            B, T = input_ids.shape
            for name, pos in (("start_positions", start_positions),
                              ("end_positions", end_positions)):
                if tuple(pos.shape) != (B,):
                    raise ValueError(f"{name}: expected shape {(B,)}, got {tuple(pos.shape)}")
            # HF: positions clamped to [0, T], CrossEntropyLoss(ignore_index=T)
            start_loss, start_ce = cross_entropy_forward(
                start_logits, xp.clip(start_positions, 0, T), ignore_index=T)
            end_loss, end_ce = cross_entropy_forward(
                end_logits, xp.clip(end_positions, 0, T), ignore_index=T)
            loss = (start_loss + end_loss) / 2
            caches = (start_ce, end_ce)
        self._cache = (start_logits.shape, logits.dtype, caches, None)
        return QuestionAnsweringModelOutput(loss, start_logits, end_logits, out.attentions)

    def backward(self, dloss=1.0, *, d_logits=None) -> None:
        """Gradients of ``dloss * loss + sum(start_logits * d_start_logits + end_logits
        * d_end_logits)`` into every trainable parameter's ``grad`` (the shared signature
        of the module docstring, with ``d_logits`` the pair (d_start_logits, d_end_logits),
        (B, T) each, or None). ``dloss``, a float or 0-d array, is unused without positions.

        Raises:
            RuntimeError: no forward came before, or it had no positions and d_logits is
                None.
            ValueError: d_logits not a pair of (B, T) arrays, dloss not 0-d.
        """
        d_start, d_end = _span_pair(d_logits)
        shape, dtype, caches, _ = _take_cache(
            self, dloss, {"d_start_logits": d_start, "d_end_logits": d_end},
            "start_positions and end_positions")
        if caches is not None:
            # forward: loss = (CE(start_logits) + CE(end_logits)) / 2
            s, e = (cross_entropy_backward(dloss * 0.5, c) for c in caches)   # (B, T) each
            d_start, d_end = _add(s, d_start), _add(e, d_end)
        xp = get_array_module(d_start)
        # forward: start_logits, end_logits = logits[..., 0], logits[..., 1]
        d = xp.stack([d_start, d_end], axis=-1).astype(dtype)            # (B, T, 2)
        # forward: logits = h @ W^T + b
        self.backbone.backward(self.qa_outputs.backward(d))                  # (B, T, C)
