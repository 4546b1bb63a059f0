"""ALBERT (Lan et al. 2020, "ALBERT: A Lite BERT"): BERT with factorised embeddings and
encoder layers shared across depths, every backward hand-written.

Two changes to BERT (paper section 3.1):

* **Factorised embeddings.** The token, position and segment tables are E wide
  (``embedding_size``, E <= H), and one linear map ``embedding_hidden_mapping_in`` lifts
  their sum to the hidden width H: V*E + E*H parameters instead of V*H. The MLM head
  projects back down to E before the decoder tied to the E-wide word embeddings.
* **Cross-layer sharing.** The encoder owns ``num_hidden_groups`` = G groups of
  ``inner_group_num`` layers each and runs ``num_hidden_layers`` = L group applications;
  depth i applies group ``i * G // L``. With G = 1 (every released ALBERT) one group
  serves every depth.

Back-propagation through a shared layer: the loss depends on a shared weight W through
each depth that applies it, so dL/dW is the sum of the per-depth gradients. Our
accumulation contract gives that sum for free (each application's backward adds into the
same ``grad``); what sharing needs is one forward cache per application, because a
second forward through a module overwrites its cache. The encoder stashes a group's caches
after each application (:meth:`~minibert.nn.Module.stash_caches`) and restores them, last
depth first, before that application's backward. docs/backprop.md derives it.

Module tree and parameter names are Hugging Face ``modeling_albert.py``'s
(``albert.encoder.albert_layer_groups.0.albert_layers.0.attention.query.weight`` ...), so
a state dict lines up with ``transformers.AlbertForPreTraining``'s key for key. Where HF's
``AlbertLayer`` skips the dropout on the feed-forward output we apply it, as
google-research/albert ``modeling.py`` (``attention_ffn_block``) does; released ALBERT
v2 models have dropout 0, where the two agree.

Shape legend: B = batch, T = sequence length, E = embedding size, H = hidden size,
NH = heads, I = intermediate size, V = vocab size, L = depths (num_hidden_layers),
G = layer groups, N = rows through the MLM head.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .heads import (BertForQuestionAnswering, BertForSequenceClassification,
                    BertForTokenClassification)
from .modeling import (BertEmbeddings, BertForPreTraining, BertForPreTrainingOutput, BertModel,
                       BertPredictionHeadTransform, BertSelfAttention, EncoderConfigFields,
                       ModelConfig)
from .nn import Activation, Dropout, LayerNorm, Linear, Module, ModuleList, Parameter
from .nn.activations import tanh_backward, tanh_forward

# name -> (num_hidden_layers, hidden_size, embedding_size): BERT's preset widths and depths
# (minibert.modeling.PRESETS, Turc et al. 2019) with E = min(128, H / 2); ALBERT's own
# models use E = 128 at every width (Lan et al. 2020, table 1). Heads = H / 64, I = 4 H.
ALBERT_PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 64),
    "mini": (4, 256, 128),
    "small": (4, 512, 128),
    "medium": (8, 512, 128),
    "base": (12, 768, 128),
}


@dataclass
class AlbertConfig(ModelConfig, EncoderConfigFields):
    """ALBERT hyper-parameters, with Hugging Face ``AlbertConfig`` field names and defaults
    (ALBERT-xxlarge's sizes, as HF; use :meth:`from_preset` for small models), so that a
    ``config.json`` that leaves out default values reads the same here as in transformers.

    Raises:
        ValueError: a non-positive size; hidden_size not divisible by
            num_attention_heads; embedding_size > hidden_size (the factorisation maps E up
            to H); num_hidden_groups > num_hidden_layers (a group no depth applies); an
            unknown hidden_act / position_embedding_type / classifier_pooling.
    """

    vocab_size: int = 30000               # rows of the word-embedding matrix (tokens)
    embedding_size: int = 128             # E: width of the embedding tables and MLM decoder
    hidden_size: int = 4096               # H: width of every encoder representation
    num_hidden_layers: int = 12           # L: depths (group applications)
    num_hidden_groups: int = 1            # G: groups of layers with their own parameters
    num_attention_heads: int = 64         # NH; must divide hidden_size
    intermediate_size: int = 16384        # I: feed-forward inner width
    inner_group_num: int = 1              # layers in each group, applied in turn
    hidden_act: str = "gelu_new"          # "gelu_new" (tanh, ALBERT's), "gelu", "relu"
    hidden_dropout_prob: float = 0.0      # dropout on embeddings and sub-layer outputs
    attention_probs_dropout_prob: float = 0.0  # dropout on attention probabilities
    classifier_dropout_prob: float | None = 0.1  # dropout before SOP and classifier heads
    position_embedding_type: str = "absolute"  # "absolute" (learned) or "sinusoidal" (fixed)
    pad_token_id: int = 0                 # word-embedding row that gets no gradient
    num_labels: int = 2                   # classes for sequence classification heads
    classifier_pooling: str = "cls"       # sequence classifier input: "cls" or "mean"

    model_type: ClassVar[str] = "albert"

    def __post_init__(self):
        self._check_common(("vocab_size", "embedding_size", "hidden_size",
                            "num_hidden_layers", "num_hidden_groups", "num_attention_heads",
                            "intermediate_size", "inner_group_num", "max_position_embeddings",
                            "type_vocab_size"))
        if self.embedding_size > self.hidden_size:
            raise ValueError(f"AlbertConfig.embedding_size ({self.embedding_size}) must be at "
                             f"most hidden_size ({self.hidden_size})")
        if self.num_hidden_groups > self.num_hidden_layers:
            raise ValueError(f"AlbertConfig.num_hidden_groups ({self.num_hidden_groups}) must "
                             f"be at most num_hidden_layers ({self.num_hidden_layers})")

    @property
    def classifier_dropout(self) -> float | None:
        """The heads' name (:mod:`minibert.heads`) for ``classifier_dropout_prob``."""
        return self.classifier_dropout_prob

    def group_of_depth(self, i: int) -> int:
        """The layer group applied at depth i in [0, L): ``i * G // L`` (Lan et al. 2020
        section 3.1; HF computes ``int(i / (L / G))``, which rounds the other way for a
        few G that do not divide L, e.g. L=18, G=14, i=9)."""
        return i * self.num_hidden_groups // self.num_hidden_layers

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "AlbertConfig":
        """A config for a named size (:data:`ALBERT_PRESETS`: tiny, mini, small, medium,
        base), one group of one layer; fields may be overridden.

        Raises:
            ValueError: an unknown name.
        """
        if name not in ALBERT_PRESETS:
            raise ValueError(f"unknown preset {name!r}: expected one of "
                             f"{', '.join(ALBERT_PRESETS)}")
        layers, hidden, embedding = ALBERT_PRESETS[name]
        base = dict(num_hidden_layers=layers, hidden_size=hidden,
                    embedding_size=embedding, num_attention_heads=hidden // 64,
                    intermediate_size=4 * hidden)
        base.update(overrides)
        return cls(**base)


# ---------------------------------------------------------------------------------------
# Encoder
# ---------------------------------------------------------------------------------------

class AlbertAttention(BertSelfAttention):
    """HF ``AlbertAttention``: BERT's query / key / value and multi-head attention
    (:class:`~minibert.modeling.BertSelfAttention`: ``query``, ``key``, ``value``, and
    ``dropout`` on the probabilities), then at the same level ``dense``, dropout, the
    residual and ``LayerNorm``."""

    def __init__(self, config: AlbertConfig, rng: np.random.Generator, dtype=np.float32):
        super().__init__(config, rng, dtype)
        H = config.hidden_size
        self.dense = Linear(H, H, rng=rng, std=config.initializer_range, dtype=dtype)
        self.output_dropout = Dropout(config.hidden_dropout_prob)
        self.LayerNorm = LayerNorm(H, config.layer_norm_eps, dtype=dtype)

    def forward(self, x, mask_add, output_attentions: bool = False):
        """x: (B, T, H); mask_add: (B, 1, 1, T) additive or None -> (B, T, H)."""
        ctx = super().forward(x, mask_add, output_attentions)            # (B, T, H)
        return self.LayerNorm(self.output_dropout(self.dense(ctx)) + x)  # (B, T, H)

    def backward(self, dout):
        """dout: (B, T, H) -> dx (B, T, H)."""
        # forward: return LayerNorm(output_dropout(dense(ctx)) + x)
        dy = self.LayerNorm.backward(dout)                               # (B, T, H)
        dctx = self.dense.backward(self.output_dropout.backward(dy))     # (B, T, H)
        # forward: ctx = attention(x)  ->  x also feeds the residual: the two add
        return dy + super().backward(dctx)                               # (B, T, H)


class AlbertLayer(Module):
    """HF ``AlbertLayer``: attention sub-layer, then the feed-forward block
    ``ffn`` (H -> I), activation, ``ffn_output`` (I -> H), dropout, residual and
    ``full_layer_layer_norm`` (google-research/albert ``attention_ffn_block``)."""

    def __init__(self, config: AlbertConfig, rng: np.random.Generator, dtype=np.float32):
        H, I, std = config.hidden_size, config.intermediate_size, config.initializer_range
        self.full_layer_layer_norm = LayerNorm(H, config.layer_norm_eps, dtype=dtype)
        self.attention = AlbertAttention(config, rng, dtype)
        self.ffn = Linear(H, I, rng=rng, std=std, dtype=dtype)
        self.ffn_output = Linear(I, H, rng=rng, std=std, dtype=dtype)
        self.activation = Activation(config.hidden_act)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, x, mask_add, output_attentions: bool = False):
        """(B, T, H) -> (B, T, H)."""
        a = self.attention(x, mask_add, output_attentions)               # (B, T, H)
        f = self.dropout(self.ffn_output(self.activation(self.ffn(a))))  # (B, T, H)
        return self.full_layer_layer_norm(f + a)                         # (B, T, H)

    def backward(self, dout):
        """dout: (B, T, H) -> dx (B, T, H)."""
        # forward: return full_layer_layer_norm(f + a)
        dy = self.full_layer_layer_norm.backward(dout)                   # (B, T, H)
        # forward: f = dropout(ffn_output(act(ffn(a))))
        di = self.ffn_output.backward(self.dropout.backward(dy))         # (B, T, I)
        da = self.ffn.backward(self.activation.backward(di))             # (B, T, H)
        # forward: a = attention(x)  ->  a feeds f and the residual: the two add
        return self.attention.backward(da + dy)                          # (B, T, H)


class AlbertLayerGroup(Module):
    """``albert_layers``: inner_group_num layers applied in turn, with their own
    parameters; the unit that the encoder shares across depths."""

    def __init__(self, config: AlbertConfig, rng: np.random.Generator, dtype=np.float32):
        self.albert_layers = ModuleList([AlbertLayer(config, rng, dtype)
                                         for _ in range(config.inner_group_num)])

    def forward(self, x, mask_add, output_attentions: bool = False):
        """(B, T, H) -> (B, T, H)."""
        for layer in self.albert_layers:
            x = layer(x, mask_add, output_attentions)                    # (B, T, H)
        return x

    def backward(self, dout):
        """dout: (B, T, H) -> dx (B, T, H)."""
        # forward: for layer in albert_layers: x = layer(x)  ->  last layer first
        for i in reversed(range(len(self.albert_layers))):
            dout = self.albert_layers[i].backward(dout)                  # (B, T, H)
        return dout


class AlbertTransformer(Module):
    """HF ``AlbertTransformer``: ``embedding_hidden_mapping_in`` (E -> H), then L group
    applications, depth i applying ``albert_layer_groups[i * G // L]``.

    Each application keeps its own caches (a list, one entry per depth, of what
    :meth:`~minibert.nn.Module.stash_caches` took from the group after that depth's
    forward), so the backward can differentiate every depth; each depth's backward adds
    into the shared parameters' ``grad``, which ends up holding the sum over depths.
    """

    cache_attributes = ("_applications", "hidden_states", "attentions")

    def __init__(self, config: AlbertConfig, rng: np.random.Generator, dtype=np.float32):
        E, H = config.embedding_size, config.hidden_size
        self.embedding_hidden_mapping_in = Linear(E, H, rng=rng, std=config.initializer_range,
                                                  dtype=dtype)
        self.albert_layer_groups = ModuleList([AlbertLayerGroup(config, rng, dtype)
                                               for _ in range(config.num_hidden_groups)])
        self.depth_groups = [config.group_of_depth(i) for i in range(config.num_hidden_layers)]
        self._applications = None   # per depth: the group's stashed caches
        self.hidden_states = None   # mapped embeddings and each depth's output, if asked
        self.attentions = None      # every layer application's probabilities, if asked

    def applied_groups(self) -> list[AlbertLayerGroup]:
        """The group applied at each depth, bottom up (L entries, repeats when shared)."""
        return [self.albert_layer_groups[g] for g in self.depth_groups]

    def forward(self, x, mask_add, output_attentions: bool = False,
                output_hidden_states: bool = False):
        """x: (B, T, E) -> (B, T, H). With ``output_hidden_states``, ``hidden_states``
        holds the mapped embeddings and each depth's output, (B, T, H) each (L + 1, as
        HF); with ``output_attentions``, ``attentions`` holds L * inner_group_num
        (B, NH, T, T) arrays, every layer application bottom up."""
        h = self.embedding_hidden_mapping_in(x)                          # (B, T, H)
        states = [h] if output_hidden_states else None
        attentions = [] if output_attentions else None
        applications = []
        for group in self.applied_groups():
            h = group(h, mask_add, output_attentions)                    # (B, T, H)
            if attentions is not None:
                attentions += [layer.attention.attention_probs for layer in group.albert_layers]
            if states is not None:
                states.append(h)
            applications.append(group.stash_caches())    # free the group for the next depth
        self._applications = applications
        self.hidden_states = tuple(states) if states is not None else None
        self.attentions = attentions
        return h

    def backward(self, dout, first_layer: int = 0):
        """dout: (B, T, H) -> dx (B, T, E) for first_layer 0; else the gradient at the
        input of depth ``first_layer`` (B, T, H), and depths below it and the mapping get
        no backward (frozen, see :meth:`BertModel.backward`)."""
        applications = self.take_cache("_applications")
        groups = self.applied_groups()
        # forward: for each depth i: h = groups[i](h)  ->  last depth first; a group used
        # at several depths adds each depth's gradient into the same .grad (the sum rule)
        for i in reversed(range(first_layer, len(groups))):
            groups[i].restore_caches(applications[i])
            dout = groups[i].backward(dout)                              # (B, T, H)
        if first_layer:
            return dout
        # forward: h = embedding_hidden_mapping_in(x)
        return self.embedding_hidden_mapping_in.backward(dout)           # (B, T, E)


class AlbertPooler(Linear):
    """tanh(hidden[:, 0] @ W^T + b): BERT's pooler with the Linear at the top, as HF's
    ``albert.pooler`` (weight (H, H), bias (H,))."""

    cache_attributes = ("_cache", "_tanh_cache")

    def __init__(self, config: AlbertConfig, rng: np.random.Generator, dtype=np.float32):
        H = config.hidden_size
        super().__init__(H, H, rng=rng, std=config.initializer_range, dtype=dtype)
        self._tanh_cache = None

    def forward(self, hidden):
        """(B, T, H) -> (B, H)."""
        out, self._tanh_cache = tanh_forward(super().forward(hidden[:, 0]))  # (B, H)
        return out

    def backward(self, dout):
        """(B, H) -> d(hidden[:, 0]) (B, H); the caller adds it at position 0."""
        # forward: out = tanh(hidden[:, 0] @ W^T + b)
        return super().backward(tanh_backward(dout, self.take_cache("_tanh_cache")))


class AlbertModel(BertModel):
    """The ALBERT encoder: E-wide embeddings (``embeddings``, BERT's with E-wide tables),
    ``encoder`` (:class:`AlbertTransformer`) and optionally ``pooler``. Forward, backward
    and outputs are :class:`~minibert.modeling.BertModel`'s (with H the hidden size);
    ``attentions`` has one entry per layer application.

    Args: as :class:`~minibert.modeling.BertModel`'s; ``add_pooling_layer`` builds
    ``pooler``, needed by SOP and sequence classification.
    """

    base_model_prefix = "albert"

    def __init__(self, config: AlbertConfig, add_pooling_layer: bool = True, *,
                 seed: int = 0, dtype=np.float32, rng: np.random.Generator | None = None):
        self.config = config
        rng = rng if rng is not None else np.random.default_rng(seed)
        self.embeddings = BertEmbeddings(config, rng, dtype, width=config.embedding_size)
        self.encoder = AlbertTransformer(config, rng, dtype)
        if add_pooling_layer:
            self.pooler = AlbertPooler(config, rng, dtype)
        self._hidden_meta = None

    def layer_attentions(self) -> list:
        """Every layer application's attention probabilities of the last forward,
        (B, NH, T, T) each, bottom up (L * inner_group_num; None unless asked for)."""
        return self.encoder.attentions

    def add_last_attention_grad(self, dprobs) -> None:
        """As :meth:`BertModel.add_last_attention_grad`, for the last layer of the last
        depth's group application: that application's caches are restored into the
        (shared) group, given ``dprobs``, and stashed again, so the encoder's backward
        finds them with the gradient when it reaches that depth."""
        encoder = self.encoder
        if encoder._applications is None:
            raise RuntimeError("add_last_attention_grad() needs a preceding forward")
        group = encoder.applied_groups()[-1]
        group.restore_caches(encoder._applications[-1])
        group.albert_layers[len(group.albert_layers) - 1].attention.add_probs_grad(dprobs)
        encoder._applications[-1] = group.stash_caches()

    def backward_stages(self) -> list[Module]:
        """The factorised embeddings (tables and ``embedding_hidden_mapping_in``), then the
        group applied at each depth (see :meth:`BertModel.backward_stages`)."""
        embeddings = ModuleList([self.embeddings, self.encoder.embedding_hidden_mapping_in])
        return [embeddings, *self.encoder.applied_groups()]


# ---------------------------------------------------------------------------------------
# Pretraining heads
# ---------------------------------------------------------------------------------------

class AlbertMLMHead(BertPredictionHeadTransform):
    """HF ``AlbertMLMHead``: ``dense`` (H -> E), activation, ``LayerNorm`` (E), then the
    ``decoder`` whose weight is the E-wide word-embedding matrix, plus the output ``bias``
    (V,) (shared with ``decoder.bias``, as HF)."""

    def __init__(self, config: AlbertConfig, word_embeddings, rng: np.random.Generator,
                 dtype=np.float32):
        self.bias = Parameter(np.zeros(config.vocab_size, dtype=dtype))
        super().__init__(config, rng, dtype, width=config.embedding_size)
        self.decoder = Linear.tied(word_embeddings.weight, self.bias)

    def forward(self, h):
        """(N, H) -> logits (N, V)."""
        return self.decoder(super().forward(h))                          # (N, V)

    def backward(self, dlogits):
        """(N, V) -> (N, H); the decoder's weight gradient lands in the word embeddings."""
        # forward: return decoder(t) = t @ E^T + bias, t = LayerNorm(act(dense(h)))
        return super().backward(self.decoder.backward(dlogits))          # (N, H)


class AlbertSOPHead(Module):
    """HF ``AlbertSOPHead``: dropout (classifier_dropout_prob), then ``classifier``
    (H -> 2), on the pooled output."""

    def __init__(self, config: AlbertConfig, rng: np.random.Generator, dtype=np.float32):
        p = config.classifier_dropout_prob
        self.dropout = Dropout(config.hidden_dropout_prob if p is None else p)
        self.classifier = Linear(config.hidden_size, 2, rng=rng,
                                 std=config.initializer_range, dtype=dtype)

    def forward(self, pooled):
        """(B, H) -> logits (B, 2)."""
        return self.classifier(self.dropout(pooled))

    def backward(self, dlogits):
        """(B, 2) -> d pooled (B, H)."""
        # forward: logits = classifier(dropout(pooled))
        return self.dropout.backward(self.classifier.backward(dlogits))


class AlbertForPreTraining(BertForPreTraining):
    """ALBERT with the masked-LM head ``predictions`` and the sentence-order head
    ``sop_classifier`` (Lan et al. 2020, sections 3.1 and 4.1; label 0 = segments in
    order, 1 = swapped); parameter names as HF ``AlbertForPreTraining``. Without the
    sentence head (``seq_relationship_head=False``) there is no pooler either, and the
    parameters are those of HF ``AlbertForMaskedLM``.

    ``forward(input_ids, token_type_ids=None, attention_mask=None, masked_lm_positions=None,
    masked_lm_ids=None, masked_lm_weights=None, sentence_order_label=None,
    output_attentions=False)`` and ``backward(dloss=1.0, *, d_prediction_logits=None,
    d_hidden_states=None)`` are :class:`~minibert.modeling.BertForPreTraining`'s, with the
    sentence label named ``sentence_order_label``; the output is a
    :class:`~minibert.modeling.BertForPreTrainingOutput` whose ``seq_relationship_*`` fields
    hold the SOP loss and logits. ``load_state_dict`` takes HF's state dict as is, the tied
    ``predictions.decoder.weight`` included.

    Args:
        config: the hyper-parameters.
        seed: seed of the NumPy generator that draws the initial weights.
        dtype: parameter dtype (float32 to train, float64 to check gradients).
        label_smoothing: eps of the MLM cross-entropy (0 = plain cross-entropy).
        seq_relationship_head: build the pooler and ``sop_classifier``.
    """

    base_model_prefix = "albert"
    sentence_label = "sentence_order_label"

    def __init__(self, config: AlbertConfig, *, seed: int = 0, dtype=np.float32,
                 label_smoothing: float = 0.0, seq_relationship_head: bool = True):
        self.config = config
        rng = np.random.default_rng(seed)
        self.albert = AlbertModel(config, add_pooling_layer=seq_relationship_head, rng=rng,
                                  dtype=dtype)
        self.predictions = AlbertMLMHead(config, self.albert.embeddings.word_embeddings, rng,
                                         dtype)
        if seq_relationship_head:
            self.sop_classifier = AlbertSOPHead(config, rng, dtype)
        self.label_smoothing = label_smoothing
        self._cache = None

    @property
    def lm_head(self) -> Module:
        return self.predictions

    @property
    def sentence_head(self) -> Module | None:
        return getattr(self, "sop_classifier", None)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                masked_lm_positions=None, masked_lm_ids=None, masked_lm_weights=None,
                sentence_order_label=None, output_attentions: bool = False
                ) -> BertForPreTrainingOutput:
        """As :meth:`BertForPreTraining.forward`, with ``sentence_order_label`` (B,) int
        0/1 (0 = in order, 1 = swapped) for the SOP head.

        Raises:
            ValueError: as BertForPreTraining.forward, naming sentence_order_label.
        """
        return self._pretraining_forward(
            input_ids, token_type_ids, attention_mask, masked_lm_positions, masked_lm_ids,
            masked_lm_weights, ("sentence_order_label", sentence_order_label),
            output_attentions)


# ---------------------------------------------------------------------------------------
# Fine-tuning heads: BERT's head code (minibert.heads) on the ALBERT encoder
# ---------------------------------------------------------------------------------------

class AlbertForSequenceClassification(BertForSequenceClassification):
    """:class:`~minibert.heads.BertForSequenceClassification` on ``albert``, an
    :class:`AlbertModel` (HF ``AlbertForSequenceClassification``: ``albert.*``,
    ``classifier.*``; dropout ``classifier_dropout_prob``)."""

    base_model_prefix = "albert"
    backbone_class = AlbertModel


class AlbertForTokenClassification(BertForTokenClassification):
    """:class:`~minibert.heads.BertForTokenClassification` on ``albert``, an
    :class:`AlbertModel` without pooler (HF ``AlbertForTokenClassification``)."""

    base_model_prefix = "albert"
    backbone_class = AlbertModel


class AlbertForQuestionAnswering(BertForQuestionAnswering):
    """:class:`~minibert.heads.BertForQuestionAnswering` on ``albert``, an
    :class:`AlbertModel` without pooler (HF ``AlbertForQuestionAnswering``)."""

    base_model_prefix = "albert"
    backbone_class = AlbertModel
