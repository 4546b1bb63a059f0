"""ELECTRA (Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators
Rather Than Generators") with Hugging Face ``modeling_electra.py``'s module tree and
parameter names, every backward hand-written.

ELECTRA's encoder is BERT's (:class:`~minibert.modeling.BertEncoder`, the same layer math
and names ``electra.encoder.layer.N...``) with two differences:

* **Embeddings of width E** (``embedding_size``): word, position and token-type tables,
  LayerNorm and dropout are E wide, and one linear map ``embeddings_project`` lifts them
  to the hidden width H when E != H (section 3.1's embedding sharing between a small
  generator and the discriminator; ALBERT's factorisation, :mod:`minibert.albert`, in
  the same place). With E == H there is no projection.
* **No pooler.** The heads read the last hidden states.

Heads (transformers' names):

* :class:`ElectraForPreTraining`, the discriminator: ``discriminator_predictions.dense``
  (H -> H), ``hidden_act``, ``dense_prediction`` (H -> 1); one logit per token, > 0 for
  "replaced". Loss: binary cross-entropy with logits, mean over the real tokens
  (``attention_mask == 1``), as transformers' ``ElectraForPreTraining``.
* :class:`ElectraForMaskedLM`, the generator: ``generator_predictions.dense`` (H -> E),
  GELU (always the exact ``"gelu"``, as transformers), ``LayerNorm`` (E), then
  ``generator_lm_head`` (E -> V) whose weight is the word-embedding matrix (tied) and
  whose bias is its own. It plays the masked-LM role of
  :class:`~minibert.modeling.BertForPreTraining` (``forward`` with ``masked_lm_*``), so
  the pipelines and PLL scoring take it.
* :class:`ElectraForSequenceClassification`: ``classifier.dense`` (H -> H) on the [CLS]
  state, dropout before and after, GELU, ``classifier.out_proj`` (H -> K);
  :class:`ElectraForTokenClassification` and :class:`ElectraForQuestionAnswering` are
  BERT's heads (:mod:`minibert.heads`) on the ELECTRA encoder.

Shape legend: B = batch, T = sequence length, E = embedding size, H = hidden size,
K = num_labels, V = vocab size, N = rows through the MLM head, P = masked-LM slots.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .backend import compute_dtype, get_array_module
from .heads import (BertForQuestionAnswering, BertForSequenceClassification,
                    BertForTokenClassification, SequenceClassifierOutput, _add, _take_cache,
                    sequence_loss_backward, sequence_loss_forward)
from .modeling import (BertEmbeddings, BertEncoder, BertForPreTraining, BertModel,
                       BertModelOutput, BertPredictionHeadTransform, BertPreTrainedModel,
                       EncoderConfigFields, ModelConfig, _check_inputs)
from .nn import (Activation, Dropout, Linear, Module, ModuleList, Parameter,
                 extended_attention_mask)

__all__ = ["ElectraConfig", "ElectraModel", "ElectraForPreTraining", "ElectraForMaskedLM",
           "ElectraForPreTrainingOutput", "ElectraForSequenceClassification",
           "ElectraForTokenClassification", "ElectraForQuestionAnswering",
           "ElectraDiscriminatorPredictions", "ElectraGeneratorPredictions",
           "ElectraClassificationHead", "bce_with_logits_forward", "bce_with_logits_backward"]


@dataclass
class ElectraConfig(ModelConfig, EncoderConfigFields):
    """ELECTRA hyper-parameters, with transformers ``ElectraConfig`` field names and
    defaults (ELECTRA-small's discriminator: E = 128, H = 256, 12 layers, 4 heads), so a
    ``config.json`` that leaves out default values reads the same here as in transformers.

    ``position_embedding_type``, ``norm_position`` and ``classifier_pooling`` exist for the
    shared BERT layers; ELECTRA checkpoints use "absolute", "post" and "cls" only.

    Raises:
        ValueError: a non-positive size; hidden_size not divisible by
            num_attention_heads; an unknown hidden_act; norm_position other than "post",
            or classifier_pooling other than "cls" (transformers' ELECTRA has neither).
    """

    vocab_size: int = 30522               # rows of the word-embedding matrix (tokens)
    embedding_size: int = 128             # E: width of the embedding tables, generator head
    hidden_size: int = 256                # H: width of every encoder representation
    num_hidden_layers: int = 12           # encoder layers
    num_attention_heads: int = 4          # NH; must divide hidden_size
    intermediate_size: int = 1024         # I: feed-forward inner width
    hidden_act: str = "gelu"              # encoder and discriminator head activation
    summary_type: str = "first"           # transformers' multiple-choice summary (unused)
    summary_use_proj: bool = True         # idem
    summary_activation: str = "gelu"      # idem
    summary_last_dropout: float = 0.1     # idem
    pad_token_id: int = 0                 # word-embedding row that gets no gradient
    classifier_dropout: float | None = None  # None: use hidden_dropout_prob
    num_labels: int = 2                   # classes for sequence classification heads
    position_embedding_type: str = "absolute"  # learned absolute positions
    norm_position: str = "post"           # post-LN, as BERT; "pre" is refused
    classifier_pooling: str = "cls"       # the classifier reads [CLS]

    model_type: ClassVar[str] = "electra"

    def __post_init__(self):
        self._check_common(("vocab_size", "embedding_size", "hidden_size",
                            "num_hidden_layers", "num_attention_heads", "intermediate_size",
                            "max_position_embeddings", "type_vocab_size"))
        if self.norm_position != "post":
            raise ValueError(f"ElectraConfig.norm_position: only 'post' (ELECTRA is post-LN), "
                             f"got {self.norm_position!r}")
        if self.classifier_pooling != "cls":
            raise ValueError(f"ElectraConfig.classifier_pooling: only 'cls' (ELECTRA's "
                             f"classifier reads [CLS]), got {self.classifier_pooling!r}")


# ---------------------------------------------------------------------------------------
# Encoder
# ---------------------------------------------------------------------------------------

class ElectraModel(BertModel):
    """The ELECTRA encoder (HF ``ElectraModel``): ``embeddings`` (BERT's, E wide),
    ``embeddings_project`` (E -> H, only when E != H), ``encoder``
    (:class:`~minibert.modeling.BertEncoder`); no pooler, so ``pooler_output`` is None.

    ``forward`` / ``backward`` are :class:`~minibert.modeling.BertModel`'s with the
    projection between the embeddings and the encoder.

    Args:
        config: the hyper-parameters.
        add_pooling_layer: must be False (ELECTRA has no pooler); accepted so the heads
            of :mod:`minibert.heads` can build it.
        seed: seed of the NumPy generator that draws the initial weights (unless ``rng``).
        dtype: parameter dtype, float32 to train, float64 to check gradients.
        rng: the generator to draw from instead.
    Raises:
        ValueError: add_pooling_layer True.
    """

    base_model_prefix = "electra"

    def __init__(self, config: ElectraConfig, add_pooling_layer: bool = False, *,
                 seed: int = 0, dtype=np.float32, rng: np.random.Generator | None = None):
        if add_pooling_layer:
            raise ValueError("ElectraModel has no pooler (add_pooling_layer must be False)")
        self.config = config
        rng = rng if rng is not None else np.random.default_rng(seed)
        E, H = config.embedding_size, config.hidden_size
        self.embeddings = BertEmbeddings(config, rng, dtype, width=E)
        if E != H:
            self.embeddings_project = Linear(E, H, rng=rng, std=config.initializer_range,
                                             dtype=dtype)
        self.encoder = BertEncoder(config, rng, dtype)
        self._hidden_meta = None

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                output_attentions: bool = False,
                output_hidden_states: bool = False) -> BertModelOutput:
        """Encode a batch: input_ids, token_type_ids, attention_mask (B, T) int, as
        :meth:`BertModel.forward` (whose errors it raises). ``hidden_states``, when asked
        for, starts with the projected embeddings (B, T, H), as transformers'."""
        token_type_ids, attention_mask = _check_inputs(self.config, input_ids, token_type_ids,
                                                       attention_mask)
        x = self.embeddings(input_ids, token_type_ids)                  # (B, T, E)
        if hasattr(self, "embeddings_project"):
            x = self.embeddings_project(x)                              # (B, T, H)
        mask_add = extended_attention_mask(attention_mask, x.dtype)     # (B, 1, 1, T)
        h = self.encoder(x, mask_add, output_attentions, output_hidden_states)  # (B, T, H)
        self._hidden_meta = (h.shape, h.dtype)
        attentions = self.layer_attentions() if output_attentions else None
        return BertModelOutput(h, None, attentions, self.encoder.hidden_states)

    def backward_stages(self) -> list[Module]:
        """The embeddings with ``embeddings_project``, then ``encoder.layer[i]``
        (see :meth:`BertModel.backward_stages`)."""
        first = ([self.embeddings, self.embeddings_project]
                 if hasattr(self, "embeddings_project") else [self.embeddings])
        return [ModuleList(first), *self.encoder.layer]

    def backward(self, d_last_hidden_state=None, d_pooler_output=None) -> None:
        """Back-propagate d_last_hidden_state (B, T, H) into every trainable parameter's
        ``grad``, stopping below the lowest stage with a trainable parameter.

        Raises:
            ValueError: no upstream gradient, or a d_pooler_output (there is no pooler).
            RuntimeError: no forward came before.
        """
        if d_pooler_output is not None:
            raise ValueError("ElectraModel has no pooler: d_pooler_output must be None")
        if d_last_hidden_state is None:
            raise ValueError("ElectraModel.backward needs d_last_hidden_state")
        if self._hidden_meta is None:
            raise RuntimeError("ElectraModel.backward called without a preceding forward")
        _, dtype = self._hidden_meta
        self._hidden_meta = None
        d = d_last_hidden_state.astype(dtype, copy=False)                # (B, T, H)
        stages = self.backward_stages()
        first = next((i for i, m in enumerate(stages)
                      if any(p.requires_grad for p in m.parameters())), len(stages))
        # forward: h = encoder(x, mask_add)  (mask_add is a constant)
        dx = self.encoder.backward(d, first_layer=max(first - 1, 0))    # (B, T, H)
        if first != 0:
            return
        # forward: x = embeddings_project(x)   (E -> H)
        if hasattr(self, "embeddings_project"):
            dx = self.embeddings_project.backward(dx)                    # (B, T, E)
        # forward: x = embeddings(input_ids, token_type_ids)
        self.embeddings.backward(dx)


def _build_electra(model: Module, config: ElectraConfig, seed: int,
                   dtype) -> np.random.Generator:
    """The construction the ELECTRA models share: set ``model.config``, ``model.electra``
    (an :class:`ElectraModel` drawn from a NumPy generator seeded ``seed``) and an empty
    ``model._cache``; return the generator, which draws the head's weights next."""
    model.config = config
    rng = np.random.default_rng(seed)
    model.electra = ElectraModel(config, rng=rng, dtype=dtype)
    model._cache = None
    return rng


# ---------------------------------------------------------------------------------------
# Discriminator
# ---------------------------------------------------------------------------------------

def bce_with_logits_forward(z, y, mask):
    """Mean binary cross-entropy with logits over the positions where ``mask`` is 1
    (torch ``BCEWithLogitsLoss()`` on the selected logits, as transformers'
    ``ElectraForPreTraining`` computes it), in the numerically stable form
    ``max(z, 0) - z y + log(1 + exp(-|z|))``.

    Args:
        z: (B, T) float logits; y: (B, T) labels in {0, 1} (int or float);
        mask: (B, T) 1 where the loss counts, 0 elsewhere.
    Returns:
        (loss, cache): loss a 0-d array in the compute dtype (nats per counted position;
        0 when none counts), cache for :func:`bce_with_logits_backward`.
    """
    xp = get_array_module(z)
    zc = z.astype(compute_dtype(z.dtype))
    yc = y.astype(zc.dtype)
    m = mask.astype(zc.dtype)
    n = xp.maximum(m.sum(), 1.0)
    bce = xp.maximum(zc, 0) - zc * yc + xp.log1p(xp.exp(-xp.abs(zc)))   # (B, T)
    return (bce * m).sum() / n, (zc, yc, m, n, z.dtype)


def bce_with_logits_backward(dloss, cache):
    """d loss / d z (B, T), in the logits' dtype, for the cache of
    :func:`bce_with_logits_forward`."""
    zc, yc, m, n, dtype = cache
    xp = get_array_module(zc)
    # forward: loss = sum(bce(z, y) * m) / n;  d bce / dz = sigmoid(z) - y
    sig = 1.0 / (1.0 + xp.exp(-zc))
    return ((sig - yc) * m * (dloss / n)).astype(dtype)                 # (B, T)


class ElectraDiscriminatorPredictions(Module):
    """HF ``ElectraDiscriminatorPredictions``: logit = dense_prediction(act(dense(h))),
    ``dense`` (H, H), activation ``hidden_act``, ``dense_prediction`` (1, H)."""

    def __init__(self, config: ElectraConfig, rng: np.random.Generator, dtype=np.float32):
        H, std = config.hidden_size, config.initializer_range
        self.dense = Linear(H, H, rng=rng, std=std, dtype=dtype)
        self.activation = Activation(config.hidden_act)
        self.dense_prediction = Linear(H, 1, rng=rng, std=std, dtype=dtype)

    def forward(self, h):
        """h: (B, T, H) -> (B, T) logits."""
        return self.dense_prediction(self.activation(self.dense(h)))[..., 0]

    def backward(self, dlogits):
        """dlogits: (B, T) -> dh (B, T, H)."""
        # forward: logit = dense_prediction(activation(dense(h)))[..., 0]
        da = self.dense_prediction.backward(dlogits[..., None])          # (B, T, H)
        return self.dense.backward(self.activation.backward(da))         # (B, T, H)


@dataclass
class ElectraForPreTrainingOutput:
    """Outputs of :class:`ElectraForPreTraining`: loss (0-d, nats per real token) or None
    without labels; logits (B, T), > 0 for "replaced"; hidden_states (B, T, H) the last
    hidden state; attentions when asked for."""

    loss: Any
    logits: Any
    hidden_states: Any = None
    attentions: list | None = None


class ElectraForPreTraining(BertPreTrainedModel):
    """The ELECTRA discriminator (Clark et al. 2020, section 2; HF
    ``ElectraForPreTraining``): ``electra`` (:class:`ElectraModel`) and
    ``discriminator_predictions``; a logit per token for "this token was replaced".

    Args:
        config: the hyper-parameters.
        seed: seed of the NumPy generator that draws the initial weights.
        dtype: parameter dtype (float32 to train, float64 to check gradients).
    """

    base_model_prefix = "electra"

    def __init__(self, config: ElectraConfig, *, seed: int = 0, dtype=np.float32):
        rng = _build_electra(self, config, seed, dtype)
        self.discriminator_predictions = ElectraDiscriminatorPredictions(config, rng, dtype)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False) -> ElectraForPreTrainingOutput:
        """Score every token as replaced (> 0) or original.

        Args:
            input_ids, token_type_ids, attention_mask: (B, T) int, as
                :meth:`BertModel.forward`.
            labels: (B, T) int, 1 = replaced, 0 = original; None for no loss. The loss is
                the mean binary cross-entropy over positions with attention_mask == 1
                (every position when attention_mask is None), as transformers.
            output_attentions: also return per-layer attention probabilities.
        Returns:
            :class:`ElectraForPreTrainingOutput`.
        Raises:
            ValueError: bad inputs (see BertModel.forward), labels not (B, T).
        """
        xp = get_array_module(input_ids)
        out = self.electra(input_ids, token_type_ids, attention_mask, output_attentions)
        h = out.last_hidden_state                                        # (B, T, H)
        logits = self.discriminator_predictions(h)                       # (B, T)
        loss = cache = None
        if labels is not None:
            if tuple(labels.shape) != tuple(input_ids.shape):
                raise ValueError(f"labels: expected shape {tuple(input_ids.shape)}, "
                                 f"got {tuple(labels.shape)}")
            mask = (xp.ones(input_ids.shape, dtype=np.int8) if attention_mask is None
                    else (attention_mask == 1))
            loss, cache = bce_with_logits_forward(logits, labels, mask)
        self._cache = (logits.shape, logits.dtype, cache, None)
        return ElectraForPreTrainingOutput(loss, logits, h, out.attentions)

    def backward(self, dloss=1.0, *, d_logits=None) -> None:
        """Gradients of ``dloss * loss + sum(logits * d_logits)`` into every trainable
        parameter's ``grad``; d_logits (B, T) or None.

        Raises:
            RuntimeError: no forward came before, or it had no labels and d_logits is None.
            ValueError: d_logits not (B, T), dloss not 0-d.
        """
        _, dtype, cache, _ = _take_cache(self, dloss, {"d_logits": d_logits}, "labels")
        if cache is not None:
            # forward: loss = mean over real tokens of bce(logits, labels)
            d_logits = _add(bce_with_logits_backward(dloss, cache), d_logits)
        # forward: logits = discriminator_predictions(h)
        self.electra.backward(self.discriminator_predictions.backward(d_logits.astype(dtype)))


# ---------------------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------------------

class ElectraGeneratorPredictions(BertPredictionHeadTransform):
    """HF ``ElectraGeneratorPredictions``: LayerNorm(gelu(dense(h))), ``dense`` (E, H),
    the exact GELU whatever ``hidden_act`` says (as transformers), ``LayerNorm`` (E):
    BERT's :class:`~minibert.modeling.BertPredictionHeadTransform` of width E; (N, H) ->
    (N, E)."""

    def __init__(self, config: ElectraConfig, rng: np.random.Generator, dtype=np.float32):
        super().__init__(config, rng, dtype, width=config.embedding_size, act="gelu")


class _GeneratorHead(Module):
    """The generator's MLM head as one module (N, H) -> (N, V): ``generator_predictions``
    then ``generator_lm_head``. Built on demand by :attr:`ElectraForMaskedLM.lm_head`
    over the model's own modules (which keep the caches), so it adds no parameter names."""

    def __init__(self, predictions: ElectraGeneratorPredictions, lm_head: Linear):
        self._parts = (predictions, lm_head)    # a tuple: not a registered child

    def named_children(self):
        yield "generator_predictions", self._parts[0]
        yield "generator_lm_head", self._parts[1]

    def forward(self, h):
        """(N, H) -> logits (N, V)."""
        return self._parts[1](self._parts[0](h))                          # (N, V)

    def backward(self, dlogits):
        """(N, V) -> (N, H); the weight gradient lands in the word embeddings (tied)."""
        # forward: logits = generator_lm_head(generator_predictions(h))
        return self._parts[0].backward(self._parts[1].backward(dlogits))  # (N, H)


class ElectraForMaskedLM(BertForPreTraining):
    """The ELECTRA generator (Clark et al. 2020, section 2; HF ``ElectraForMaskedLM``):
    ``electra``, ``generator_predictions`` and ``generator_lm_head`` (weight tied to
    ``electra.embeddings.word_embeddings.weight``, its own bias (V,)).

    ``forward(input_ids, token_type_ids=None, attention_mask=None, masked_lm_positions=None,
    masked_lm_ids=None, masked_lm_weights=None, output_attentions=False)`` and
    ``backward(dloss=1.0, *, d_prediction_logits=None, d_hidden_states=None)`` are
    :class:`~minibert.modeling.BertForPreTraining`'s without a sentence head (the loss is
    the mean cross-entropy over the real masked slots; HF's dense ``labels`` convert with
    :func:`~minibert.modeling.masked_lm_from_labels`).

    Args:
        config: the hyper-parameters.
        seed: seed of the NumPy generator that draws the initial weights.
        dtype: parameter dtype.
        label_smoothing: eps of the MLM cross-entropy (0 = plain cross-entropy).
        seq_relationship_head: must be False (accepted for the shared constructor call).
    Raises:
        ValueError: seq_relationship_head True (ELECTRA has no sentence task).
    """

    base_model_prefix = "electra"

    def __init__(self, config: ElectraConfig, *, seed: int = 0, dtype=np.float32,
                 label_smoothing: float = 0.0, seq_relationship_head: bool = False):
        if seq_relationship_head:
            raise ValueError("ElectraForMaskedLM has no sentence-level head")
        rng = _build_electra(self, config, seed, dtype)
        self.generator_predictions = ElectraGeneratorPredictions(config, rng, dtype)
        bias = Parameter(np.zeros(config.vocab_size, dtype=dtype))
        self.generator_lm_head = Linear.tied(self.electra.embeddings.word_embeddings.weight,
                                             bias)
        self.label_smoothing = label_smoothing

    @property
    def lm_head(self) -> Module:
        """(N, H) -> (N, V): generator_predictions then generator_lm_head."""
        return _GeneratorHead(self.generator_predictions, self.generator_lm_head)

    @property
    def sentence_head(self) -> Module | None:
        return None

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                masked_lm_positions=None, masked_lm_ids=None, masked_lm_weights=None,
                next_sentence_label=None, output_attentions: bool = False):
        """As :meth:`BertForPreTraining.forward` (no sentence label: giving one raises
        ValueError)."""
        return self._pretraining_forward(
            input_ids, token_type_ids, attention_mask, masked_lm_positions, masked_lm_ids,
            masked_lm_weights, ("next_sentence_label", next_sentence_label), output_attentions)


# ---------------------------------------------------------------------------------------
# Fine-tuning heads
# ---------------------------------------------------------------------------------------

class ElectraClassificationHead(Module):
    """HF ``ElectraClassificationHead``: on the [CLS] state x (B, H),
    out_proj(dropout(gelu(dense(dropout(x))))); ``dense`` (H, H), ``out_proj`` (K, H),
    the exact GELU (as transformers), one dropout module applied twice (two masks)."""

    cache_attributes = ("_masks",)

    def __init__(self, config: ElectraConfig, rng: np.random.Generator, dtype=np.float32):
        H, std = config.hidden_size, config.initializer_range
        p = (config.classifier_dropout if config.classifier_dropout is not None
             else config.hidden_dropout_prob)
        self.dense = Linear(H, H, rng=rng, std=std, dtype=dtype)
        self.activation = Activation("gelu")
        self.dropout = Dropout(p)
        self.out_proj = Linear(H, config.num_labels, rng=rng, std=std, dtype=dtype)
        self._masks = None

    def forward(self, x):
        """x: (B, H) the [CLS] states -> logits (B, K)."""
        a = self.dropout(x)                                              # (B, H)
        first = self.dropout.stash_caches()
        a = self.dropout(self.activation(self.dense(a)))                 # (B, H)
        self._masks = (first, self.dropout.stash_caches())
        return self.out_proj(a)                                          # (B, K)

    def backward(self, dlogits):
        """dlogits: (B, K) -> dx (B, H)."""
        first, second = self.take_cache("_masks")
        # forward: logits = out_proj(dropout(gelu(dense(a))))
        self.dropout.restore_caches(second)
        da = self.dropout.backward(self.out_proj.backward(dlogits))      # (B, H)
        da = self.dense.backward(self.activation.backward(da))           # (B, H)
        # forward: a = dropout(x)
        self.dropout.restore_caches(first)
        return self.dropout.backward(da)                                 # (B, H)


class ElectraForSequenceClassification(BertForSequenceClassification):
    """ELECTRA with HF ``ElectraForSequenceClassification``'s head ``classifier``
    (:class:`ElectraClassificationHead`) on the [CLS] state: parameters ``electra.*``,
    ``classifier.dense.*``, ``classifier.out_proj.*``. Loss as
    :class:`~minibert.heads.BertForSequenceClassification` (cross-entropy for K >= 2,
    squared error for K == 1); forward / backward signatures the same, with
    ``pooler_output`` the [CLS] state (B, H).

    Raises:
        ValueError: num_labels < 1.
    """

    base_model_prefix = "electra"
    backbone_class = ElectraModel

    @staticmethod
    def uses_pooler(config) -> bool:
        return False

    def __init__(self, config: ElectraConfig, *, seed: int = 0, dtype=np.float32):
        if int(config.num_labels) < 1:
            raise ValueError(f"ElectraConfig.num_labels must be >= 1, got {config.num_labels}")
        rng = _build_electra(self, config, seed, dtype)
        self.classifier = ElectraClassificationHead(config, rng, dtype)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False) -> SequenceClassifierOutput:
        """As :meth:`BertForSequenceClassification.forward` (its errors too)."""
        out = self.electra(input_ids, token_type_ids, attention_mask, output_attentions)
        h = out.last_hidden_state                                        # (B, T, H)
        cls = h[:, 0]                                                    # (B, H)
        logits = self.classifier(cls)                                    # (B, K)
        loss, loss_cache = sequence_loss_forward(logits, labels)
        self._cache = (logits.shape, logits.dtype, loss_cache, h.shape)
        return SequenceClassifierOutput(loss, logits, cls, out.attentions)

    def backward(self, dloss=1.0, *, d_logits=None) -> None:
        """As :meth:`BertForSequenceClassification.backward` (its errors too)."""
        _, dtype, loss_cache, h_shape = _take_cache(self, dloss, {"d_logits": d_logits},
                                                    "labels")
        d_logits = sequence_loss_backward(dloss, loss_cache, d_logits)  # (B, K)
        # forward: logits = classifier(h[:, 0])
        dcls = self.classifier.backward(d_logits.astype(dtype))          # (B, H)
        xp = get_array_module(dcls)
        dh = xp.zeros(h_shape, dtype=dtype)                              # (B, T, H)
        dh[:, 0] = dcls
        self.electra.backward(dh)


class ElectraForTokenClassification(BertForTokenClassification):
    """:class:`~minibert.heads.BertForTokenClassification` on ``electra``, an
    :class:`ElectraModel` (HF ``ElectraForTokenClassification``: ``electra.*``,
    ``classifier.*``; dropout ``classifier_dropout`` or ``hidden_dropout_prob``)."""

    base_model_prefix = "electra"
    backbone_class = ElectraModel


class ElectraForQuestionAnswering(BertForQuestionAnswering):
    """:class:`~minibert.heads.BertForQuestionAnswering` on ``electra``, an
    :class:`ElectraModel` (HF ``ElectraForQuestionAnswering``: ``electra.*``,
    ``qa_outputs.*``)."""

    base_model_prefix = "electra"
    backbone_class = ElectraModel
