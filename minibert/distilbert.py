"""DistilBERT (Sanh et al. 2019, "DistilBERT, a distilled version of BERT"): BERT's layer
math with half the depth, no token-type embeddings and no pooler, every backward
hand-written.

What differs from BERT (paper section 2; transformers ``modeling_distilbert.py``):

* **Embeddings.** word + position only (no ``token_type_embeddings``: token-type ids are
  accepted and ignored, as transformers' DistilBERT takes none), then LayerNorm and
  dropout. With ``sinusoidal_pos_embds`` the position table starts as the fixed
  encodings of Vaswani et al. 2017 (section 3.5); it is still a parameter under
  ``position_embeddings.weight``, as in transformers 5 (which trains it).
* **Layers.** Post-LN blocks as BERT's, with transformers' names: ``attention.q_lin`` /
  ``k_lin`` / ``v_lin`` / ``out_lin`` (no dropout after ``out_lin``), ``sa_layer_norm``,
  ``ffn.lin1`` / ``ffn.lin2`` (dropout after ``lin2``), ``output_layer_norm``; LayerNorm
  epsilon 1e-12 throughout.
* **Heads.** The MLM head is ``vocab_transform`` (dim -> dim), the activation,
  ``vocab_layer_norm``, then ``vocab_projector`` whose weight is the word-embedding matrix
  (tied) plus its own bias. The sequence classifier reads the first token's state through
  ``pre_classifier`` and a ReLU (there is no pooler); question answering has a dropout
  (``qa_dropout``) before ``qa_outputs``.

Parameter names are transformers' (``distilbert.transformer.layer.0.attention.q_lin.weight``
...), so a state dict lines up with ``transformers.DistilBertForMaskedLM``'s key for key.
Every class subclasses the BERT class of its role (``DistilBertModel`` is a
:class:`~minibert.modeling.BertModel`, ``DistilBertForMaskedLM`` a
:class:`~minibert.modeling.BertForPreTraining` without sentence head ...), so code written
against the BERT classes (fine-tuning, pipelines, PLL scoring) takes it;
:mod:`minibert.auto` picks the class from the config's family. The config answers BERT's
field names (``hidden_size``, ``num_hidden_layers`` ...) as read-only aliases of its own.

Shape legend: B = batch, T = sequence length, C = dim (hidden size), NH = n_heads,
HS = C // NH, I = hidden_dim (feed-forward width), V = vocab size, L = n_layers,
K = num_labels, N = rows through the MLM head.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .backend import get_array_module
from .heads import (BertForQuestionAnswering, BertForSequenceClassification,
                    BertForTokenClassification, SequenceClassifierOutput, _add, _take_cache)
from .modeling import (BertEncoder, BertForPreTraining, BertModel, BertModelOutput,
                       BertSelfAttention, ModelConfig, _check_inputs, init_self_attention,
                       self_attention_backward, sinusoidal_positions, tapped_sum)
from .nn import (Activation, Dropout, Embedding, LayerNorm, Linear, Module, ModuleList,
                 Parameter, attention_forward, cross_entropy_backward,
                 cross_entropy_forward, extended_attention_mask, linear_forward)
from .nn.activations import relu_backward, relu_forward

__all__ = ["DistilBertConfig", "DistilBertModel", "DistilBertForMaskedLM",
           "DistilBertForSequenceClassification", "DistilBertForTokenClassification",
           "DistilBertForQuestionAnswering", "distilbert_config_from_bert",
           "distilbert_state_from_bert"]

LAYER_NORM_EPS = 1e-12   # transformers' DistilBERT hard-codes nn.LayerNorm(dim, eps=1e-12)


@dataclass
class DistilBertConfig(ModelConfig):
    """DistilBERT hyper-parameters, with transformers ``DistilBertConfig`` field names and
    defaults (distilbert-base's sizes), so a ``config.json`` reads the same here as there.

    BERT's names are read-only aliases (``hidden_size`` = dim, ``num_hidden_layers`` =
    n_layers, ``num_attention_heads`` = n_heads, ``intermediate_size`` = hidden_dim,
    ``hidden_act`` = activation, ``hidden_dropout_prob`` = dropout,
    ``attention_probs_dropout_prob`` = attention_dropout), so code written against
    :class:`~minibert.modeling.BertConfig` reads a DistilBERT config.

    Raises:
        ValueError: a non-positive size; dim not divisible by n_heads; an unknown
            activation (naming the field).
    """

    vocab_size: int = 30522               # rows of the word-embedding matrix (tokens)
    max_position_embeddings: int = 512    # longest sequence T, in tokens
    sinusoidal_pos_embds: bool = False    # start the position table at sin/cos encodings
    n_layers: int = 6                     # L: encoder layers
    n_heads: int = 12                     # NH; must divide dim
    dim: int = 768                        # C: width of every token representation
    hidden_dim: int = 3072                # I: feed-forward inner width
    dropout: float = 0.1                  # dropout on embeddings, FFN output, token head
    attention_dropout: float = 0.1        # dropout on attention probabilities
    activation: str = "gelu"              # FFN and MLM-head activation: "gelu", "relu" ...
    initializer_range: float = 0.02       # std of the normal weight initialisation
    qa_dropout: float = 0.1               # dropout before qa_outputs
    seq_classif_dropout: float = 0.2      # dropout before the sequence classifier
    pad_token_id: int = 0                 # word-embedding row that gets no gradient
    num_labels: int = 2                   # classes for sequence classification heads

    model_type: ClassVar[str] = "distilbert"

    # BERT's names for the same sizes (read-only), and the options DistilBERT fixes
    hidden_size = property(lambda self: self.dim)
    num_hidden_layers = property(lambda self: self.n_layers)
    num_attention_heads = property(lambda self: self.n_heads)
    intermediate_size = property(lambda self: self.hidden_dim)
    hidden_act = property(lambda self: self.activation)
    hidden_dropout_prob = property(lambda self: self.dropout)
    attention_probs_dropout_prob = property(lambda self: self.attention_dropout)
    layer_norm_eps = property(lambda self: LAYER_NORM_EPS)
    type_vocab_size = property(lambda self: 1)          # no token types (for size bounds)
    position_embedding_type = property(lambda self: "absolute")   # a table either way
    norm_position = property(lambda self: "post")
    classifier_pooling = property(lambda self: "cls")
    classifier_dropout = property(lambda self: None)    # heads use dropout (token clf.)

    def __post_init__(self):
        self._check_common(("vocab_size", "dim", "n_layers", "n_heads", "hidden_dim",
                            "max_position_embeddings"))


def distilbert_config_from_bert(config) -> DistilBertConfig:
    """The DistilBERT of a post-LN BERT config's sizes, dropout, activation and positions
    (what a student initialised from that BERT's weights needs; num_labels kept).

    Raises:
        ValueError: a pre-LN config (DistilBERT is post-LN).
    """
    if config.norm_position != "post":
        raise ValueError(f"norm_position {config.norm_position!r}: DistilBERT is post-LN")
    return DistilBertConfig(
        vocab_size=config.vocab_size, max_position_embeddings=config.max_position_embeddings,
        sinusoidal_pos_embds=config.position_embedding_type == "sinusoidal",
        n_layers=config.num_hidden_layers, n_heads=config.num_attention_heads,
        dim=config.hidden_size, hidden_dim=config.intermediate_size,
        dropout=config.hidden_dropout_prob, attention_dropout=config.attention_probs_dropout_prob,
        activation=config.hidden_act, initializer_range=config.initializer_range,
        pad_token_id=config.pad_token_id, num_labels=config.num_labels)


# BERT name (after ``bert.encoder.layer.N.`` / ``bert.`` / ``cls.predictions.``) -> DistilBERT's
_BERT_LAYER_NAMES = {
    "attention.self.query": "attention.q_lin", "attention.self.key": "attention.k_lin",
    "attention.self.value": "attention.v_lin", "attention.output.dense": "attention.out_lin",
    "attention.output.LayerNorm": "sa_layer_norm", "intermediate.dense": "ffn.lin1",
    "output.dense": "ffn.lin2", "output.LayerNorm": "output_layer_norm"}
_BERT_OTHER_NAMES = {
    "bert.embeddings.word_embeddings": "distilbert.embeddings.word_embeddings",
    "bert.embeddings.position_embeddings": "distilbert.embeddings.position_embeddings",
    "bert.embeddings.LayerNorm": "distilbert.embeddings.LayerNorm",
    "cls.predictions.transform.dense": "vocab_transform",
    "cls.predictions.transform.LayerNorm": "vocab_layer_norm",
    "cls.predictions.decoder": "vocab_projector"}


def distilbert_state_from_bert(state: dict) -> dict:
    """A post-LN BERT's weights (``bert.*``, ``cls.predictions.*``) under DistilBERT's
    names: the same tensors, layer by layer (``bert.encoder.layer.N.attention.self.query``
    -> ``distilbert.transformer.layer.N.attention.q_lin`` ...), the MLM head's transform
    and bias as ``vocab_transform`` / ``vocab_layer_norm`` / ``vocab_projector.bias``.
    What DistilBERT has no place for is left out: the token-type table (Sanh et al. 2019,
    section 2: "the token-type embeddings and the pooler are removed"), the pooler, the
    NSP head. The token-type row 0 is folded into the position table (BERT adds it at
    every position of a one-segment input), so the DistilBERT computes what the BERT
    computes on token types 0. With :func:`minibert.distillation.every_other_layer_state`
    first, this is the paper's student initialisation (section 3).
    """
    out = {}
    types = state.get("bert.embeddings.token_type_embeddings.weight")
    positions = state.get("bert.embeddings.position_embeddings.weight")
    if types is not None and positions is not None:
        # forward (BERT): x = word + token_type[0] + position  ->  position' = position + tt[0]
        state = {**state, "bert.embeddings.position_embeddings.weight": positions + types[0]}
    for k, v in state.items():
        if k == "cls.predictions.bias":
            out["vocab_projector.bias"] = v
            continue
        if k.startswith("bert.encoder.layer."):
            n, rest = k[len("bert.encoder.layer."):].split(".", 1)
            name, _, leaf = rest.rpartition(".")
            if name in _BERT_LAYER_NAMES:
                out[f"distilbert.transformer.layer.{n}.{_BERT_LAYER_NAMES[name]}.{leaf}"] = v
            continue
        name, _, leaf = k.rpartition(".")
        if name in _BERT_OTHER_NAMES:
            out[f"{_BERT_OTHER_NAMES[name]}.{leaf}"] = v
    return out


# ---------------------------------------------------------------------------------------
# Encoder
# ---------------------------------------------------------------------------------------

class DistilBertEmbeddings(Module):
    """transformers ``Embeddings``: word + position embeddings, LayerNorm, dropout."""

    tap = None   # the attribution seam, as BertEmbeddings.tap

    def __init__(self, config: DistilBertConfig, rng: np.random.Generator, dtype=np.float32):
        C, std = config.dim, config.initializer_range
        self.word_embeddings = Embedding(config.vocab_size, C, config.pad_token_id, rng=rng,
                                         std=std, dtype=dtype)
        self.position_embeddings = Embedding(config.max_position_embeddings, C, rng=rng,
                                             std=std, dtype=dtype)
        if config.sinusoidal_pos_embds:
            self.position_embeddings.weight.data[...] = sinusoidal_positions(
                config.max_position_embeddings, C).astype(dtype)
        self.LayerNorm = LayerNorm(C, LAYER_NORM_EPS, dtype=dtype)
        self.dropout = Dropout(config.dropout)

    def forward(self, input_ids):
        """input_ids: (B, T) int -> (B, T, C)."""
        xp = get_array_module(self.word_embeddings.weight.data)
        T = input_ids.shape[1]
        x = self.word_embeddings(input_ids)                              # (B, T, C)
        x = x + self.position_embeddings(xp.arange(T))                   # (T, C) broadcast
        return self.dropout(self.LayerNorm(tapped_sum(self, x)))         # (B, T, C)

    def backward(self, dout) -> None:
        """dout: (B, T, C); adds into the two tables' grads (or hands the gradient of the
        sum to :attr:`tap`, as :class:`~minibert.modeling.BertEmbeddings`)."""
        # forward: return dropout(LayerNorm(x))
        dx = self.LayerNorm.backward(self.dropout.backward(dout))        # (B, T, C)
        if self.tap is not None:
            self.tap.keep(dx)
            return
        # forward: x = word_embeddings(input_ids) + position_embeddings(arange(T))
        self.word_embeddings.backward(dx)
        self.position_embeddings.backward(dx.sum(axis=0))                # (T, C), sum over B


class DistilBertSelfAttention(Module):
    """transformers ``DistilBertSelfAttention``: ``q_lin`` / ``k_lin`` / ``v_lin``,
    multi-head scaled dot-product attention (dropout on the probabilities), ``out_lin``.
    The three projections run as one fused matmul, as
    :class:`~minibert.modeling.BertSelfAttention`'s."""

    cache_attributes = ("_cache", "_dprobs", "attention_probs")

    def __init__(self, config: DistilBertConfig, rng: np.random.Generator, dtype=np.float32):
        self.n_heads = config.n_heads
        init_self_attention(self, config.dim, config.initializer_range,
                            config.attention_dropout, rng, dtype,
                            names=("q_lin", "k_lin", "v_lin", "out_lin"))

    def forward(self, x, mask_add, output_attentions: bool = False):
        """x: (B, T, C); mask_add: (B, 1, 1, T) additive or None -> (B, T, C)."""
        xp = get_array_module(x)
        projections = (self.q_lin, self.k_lin, self.v_lin)
        w = xp.concatenate([m.weight.data for m in projections])         # (3C, C)
        b = xp.concatenate([m.bias.data for m in projections])           # (3C,)
        qkv, linear_cache = linear_forward(x, w, b)                      # (B, T, 3C)
        p = self.dropout.p if self.dropout.training else 0.0
        ctx, attention_cache = attention_forward(qkv, mask_add, self.n_heads, p,
                                                 self.dropout.rng)       # (B, T, C)
        self._cache = (linear_cache, attention_cache)
        self._dprobs = None
        self.attention_probs = attention_cache.probs if output_attentions else None
        return self.out_lin(ctx)                                         # (B, T, C)

    # an upstream gradient (B, NH, T, T) of the last forward's probabilities, added in by
    # the next backward (see BertSelfAttention.add_probs_grad)
    add_probs_grad = BertSelfAttention.add_probs_grad

    def backward(self, dout):
        """dout: (B, T, C) -> dx (B, T, C); adds into the four Linear layers' grads."""
        # forward: return out_lin(ctx)
        dctx = self.out_lin.backward(dout)                               # (B, T, C)
        # forward: ctx = attention(qkv, mask_add), qkv = x @ [Wq; Wk; Wv]^T + [bq; bk; bv]
        return self_attention_backward(self, dctx, (self.q_lin, self.k_lin, self.v_lin))


class DistilBertFFN(Module):
    """transformers ``FFN``: ``lin1`` (C -> I), activation, ``lin2`` (I -> C), dropout."""

    def __init__(self, config: DistilBertConfig, rng: np.random.Generator, dtype=np.float32):
        C, I, std = config.dim, config.hidden_dim, config.initializer_range
        self.lin1 = Linear(C, I, rng=rng, std=std, dtype=dtype)
        self.lin2 = Linear(I, C, rng=rng, std=std, dtype=dtype)
        self.activation = Activation(config.activation)
        self.dropout = Dropout(config.dropout)

    def forward(self, x):
        """(B, T, C) -> (B, T, C)."""
        return self.dropout(self.lin2(self.activation(self.lin1(x))))

    def backward(self, dout):
        """dout: (B, T, C) -> dx (B, T, C)."""
        # forward: return dropout(lin2(act(lin1(x))))
        di = self.lin2.backward(self.dropout.backward(dout))             # (B, T, I)
        return self.lin1.backward(self.activation.backward(di))          # (B, T, C)


class TransformerBlock(Module):
    """transformers ``TransformerBlock`` (post-LN, as BERT's layer):
    ``a = sa_layer_norm(attention(x) + x)``, ``out = output_layer_norm(ffn(a) + a)``."""

    def __init__(self, config: DistilBertConfig, rng: np.random.Generator, dtype=np.float32):
        self.attention = DistilBertSelfAttention(config, rng, dtype)
        self.sa_layer_norm = LayerNorm(config.dim, LAYER_NORM_EPS, dtype=dtype)
        self.ffn = DistilBertFFN(config, rng, dtype)
        self.output_layer_norm = LayerNorm(config.dim, LAYER_NORM_EPS, dtype=dtype)

    def forward(self, x, mask_add, output_attentions: bool = False):
        """(B, T, C) -> (B, T, C)."""
        a = self.sa_layer_norm(self.attention(x, mask_add, output_attentions) + x)  # (B,T,C)
        return self.output_layer_norm(self.ffn(a) + a)                   # (B, T, C)

    def backward(self, dout):
        """dout: (B, T, C) -> dx (B, T, C)."""
        # forward: return output_layer_norm(ffn(a) + a)
        dy = self.output_layer_norm.backward(dout)                       # (B, T, C)
        # forward: a feeds ffn and the residual: the two add
        da = self.ffn.backward(dy) + dy                                  # (B, T, C)
        # forward: a = sa_layer_norm(attention(x) + x)
        ds = self.sa_layer_norm.backward(da)                             # (B, T, C)
        # forward: x feeds attention and the residual: the two add
        return self.attention.backward(ds) + ds                          # (B, T, C)


class DistilBertTransformer(Module):
    """transformers ``Transformer``: ``layer``, a stack of L :class:`TransformerBlock`."""

    cache_attributes = ("hidden_states",)

    def __init__(self, config: DistilBertConfig, rng: np.random.Generator, dtype=np.float32):
        self.layer = ModuleList([TransformerBlock(config, rng, dtype)
                                 for _ in range(config.n_layers)])
        self.hidden_states = None

    # BertEncoder's loop over ``layer`` (there is no pre-LN ``ln`` here): forward
    # x (B, T, C) -> (B, T, C), keeping ``hidden_states`` when asked; backward
    # dout -> d(input of layer ``first_layer``), layers below it frozen
    forward = BertEncoder.forward
    backward = BertEncoder.backward


class DistilBertModel(BertModel):
    """The DistilBERT encoder: ``embeddings`` and ``transformer``, no pooler (transformers
    ``DistilBertModel``). :meth:`forward` takes BERT's arguments (``token_type_ids`` is
    accepted and ignored) and returns a :class:`~minibert.modeling.BertModelOutput` with
    ``pooler_output`` None; :meth:`backward` is BertModel's (``d_pooler_output`` must be
    None), as are ``freeze``, ``backward_stages`` and ``layer_attentions`` (``encoder`` is
    an alias of ``transformer``).

    Args: as :class:`~minibert.modeling.BertModel`'s; ``add_pooling_layer`` is accepted
    for BERT's signature, and True is ignored (DistilBERT has no pooler).
    """

    base_model_prefix = "distilbert"

    def __init__(self, config: DistilBertConfig, add_pooling_layer: bool = False, *,
                 seed: int = 0, dtype=np.float32, rng: np.random.Generator | None = None):
        self.config = config
        rng = rng if rng is not None else np.random.default_rng(seed)
        self.embeddings = DistilBertEmbeddings(config, rng, dtype)
        self.transformer = DistilBertTransformer(config, rng, dtype)
        self._hidden_meta = None

    @property
    def encoder(self) -> DistilBertTransformer:
        """BERT's name for ``transformer`` (what :class:`BertModel`'s methods use)."""
        return self.transformer

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                output_attentions: bool = False,
                output_hidden_states: bool = False) -> BertModelOutput:
        """Encode a batch.

        Args:
            input_ids: (B, T) int token ids in [0, vocab_size).
            token_type_ids: ignored (DistilBERT has no token types); its shape is checked.
            attention_mask: (B, T) 1 for real tokens, 0 for padding; default all ones.
            output_attentions, output_hidden_states: as :meth:`BertModel.forward`.
        Returns:
            :class:`~minibert.modeling.BertModelOutput` (``pooler_output`` None).
        Raises:
            ValueError: wrong shapes or dtypes, T > max_position_embeddings, ids out of
                range (checked on the CPU only).
        """
        if token_type_ids is not None and tuple(token_type_ids.shape) != tuple(input_ids.shape):
            raise ValueError(f"token_type_ids: expected shape {tuple(input_ids.shape)}, "
                             f"got {tuple(token_type_ids.shape)}")
        _, attention_mask = _check_inputs(self.config, input_ids, None, attention_mask)
        x = self.embeddings(input_ids)                                   # (B, T, C)
        mask_add = extended_attention_mask(attention_mask, x.dtype)      # (B, 1, 1, T)
        h = self.transformer(x, mask_add, output_attentions, output_hidden_states)
        self._hidden_meta = (h.shape, h.dtype)
        attentions = self.layer_attentions() if output_attentions else None
        return BertModelOutput(h, None, attentions, self.transformer.hidden_states)

    def layer_attentions(self) -> list:
        """Each layer's attention probabilities of the last forward, (B, NH, T, T)."""
        return [layer.attention.attention_probs for layer in self.transformer.layer]

    def add_last_attention_grad(self, dprobs) -> None:
        """As :meth:`BertModel.add_last_attention_grad`, for the last block."""
        self.transformer.layer[len(self.transformer.layer) - 1].attention.add_probs_grad(dprobs)

    def backward_stages(self) -> list[Module]:
        """The embeddings, then each block (see :meth:`BertModel.backward_stages`)."""
        return [self.embeddings, *self.transformer.layer]


# ---------------------------------------------------------------------------------------
# Masked LM
# ---------------------------------------------------------------------------------------

class _DistilBertLMHead:
    """The MLM head of a :class:`DistilBertForMaskedLM` seen as one layer (what
    ``BertForPreTraining`` calls ``lm_head``): (N, C) -> (N, V). It owns nothing; the
    modules (and their caches) are the model's, under transformers' top-level names."""

    def __init__(self, model: "DistilBertForMaskedLM"):
        self.m = model

    def __call__(self, h):
        """(N, C) -> logits (N, V)."""
        m = self.m
        t = m.vocab_layer_norm(m.activation(m.vocab_transform(h)))       # (N, C)
        return m.vocab_projector(t)                                      # (N, V)

    def backward(self, dlogits):
        """(N, V) -> (N, C); the projector's weight gradient lands in the word embeddings."""
        m = self.m
        # forward: logits = t @ E^T + b, E the tied word-embedding matrix
        dt = m.vocab_projector.backward(dlogits)                         # (N, C)
        # forward: t = vocab_layer_norm(act(vocab_transform(h)))
        return m.vocab_transform.backward(m.activation.backward(
            m.vocab_layer_norm.backward(dt)))                            # (N, C)


class DistilBertForMaskedLM(BertForPreTraining):
    """DistilBERT with its masked-LM head (transformers ``DistilBertForMaskedLM``):
    ``vocab_transform`` (C -> C), the activation, ``vocab_layer_norm``, ``vocab_projector``
    (weight tied to ``distilbert.embeddings.word_embeddings.weight``, bias (V,)).

    ``forward(input_ids, token_type_ids=None, attention_mask=None, masked_lm_positions=None,
    masked_lm_ids=None, masked_lm_weights=None, next_sentence_label=None,
    output_attentions=False)`` and ``backward(dloss=1.0, *, d_prediction_logits=None,
    d_hidden_states=None)`` are :class:`~minibert.modeling.BertForPreTraining`'s (there is
    no sentence-level head: a ``next_sentence_label`` raises ValueError). transformers'
    ``labels`` (B, T) with -100 at unpredicted positions is ``masked_lm_ids=labels``
    (every position, -100 ignored): the loss is then the mean cross-entropy over the
    labelled positions, as transformers'.

    Args:
        config: the hyper-parameters.
        seed: seed of the NumPy generator that draws the initial weights.
        dtype: parameter dtype (float32 to train, float64 to check gradients).
        label_smoothing: eps of the MLM cross-entropy (0 = plain cross-entropy).
        seq_relationship_head: accepted for BERT's signature; must be False (DistilBERT
            has no sentence-level head).
    Raises:
        ValueError: seq_relationship_head True.
    """

    base_model_prefix = "distilbert"

    def __init__(self, config: DistilBertConfig, *, seed: int = 0, dtype=np.float32,
                 label_smoothing: float = 0.0, seq_relationship_head: bool = False):
        if seq_relationship_head:
            raise ValueError("DistilBertForMaskedLM has no sentence-level head (NSP / SOP): "
                             "train it with a masked-LM objective only")
        self.config = config
        rng = np.random.default_rng(seed)
        C, std = config.dim, config.initializer_range
        self.distilbert = DistilBertModel(config, rng=rng, dtype=dtype)
        self.vocab_transform = Linear(C, C, rng=rng, std=std, dtype=dtype)
        self.activation = Activation(config.activation)
        self.vocab_layer_norm = LayerNorm(C, LAYER_NORM_EPS, dtype=dtype)
        word = self.distilbert.embeddings.word_embeddings.weight
        self.vocab_projector = Linear.tied(word, Parameter(np.zeros(config.vocab_size,
                                                                    dtype=dtype)))  # (V, C)
        self.label_smoothing = label_smoothing
        self._cache = None

    @property
    def lm_head(self) -> _DistilBertLMHead:
        """The MLM head: (N, C) hidden states -> (N, V) logits, with its backward."""
        return _DistilBertLMHead(self)

    @property
    def sentence_head(self) -> None:
        """DistilBERT has no sentence-level head."""
        return None


# ---------------------------------------------------------------------------------------
# Fine-tuning heads
# ---------------------------------------------------------------------------------------

class DistilBertForSequenceClassification(BertForSequenceClassification):
    """transformers ``DistilBertForSequenceClassification``: the first token's last
    hidden state through ``pre_classifier`` (C -> C), ReLU, dropout
    (``seq_classif_dropout``) and ``classifier`` (K, C):

        pooled = relu(h[:, 0] @ Wp^T + bp)                (B, C)
        logits = dropout(pooled) @ W^T + b                (B, K)

    Loss, ``forward`` / ``backward`` signatures and output are
    :class:`~minibert.heads.BertForSequenceClassification`'s (cross-entropy for K >= 2,
    squared error for K == 1); ``pooler_output`` is ``pooled``.

    Args:
        config: the hyper-parameters; num_labels = K >= 1.
        seed: seed of the generator that draws the weights (encoder, pre_classifier,
            classifier in that order).
        dtype: parameter dtype.
    Raises:
        ValueError: num_labels < 1.
    """

    base_model_prefix = "distilbert"
    backbone_class = DistilBertModel
    cache_attributes = ("_cache", "_relu_cache")

    @staticmethod
    def uses_pooler(config) -> bool:
        return False   # no pooler: pre_classifier reads the first token's state

    def __init__(self, config: DistilBertConfig, *, seed: int = 0, dtype=np.float32):
        if int(config.num_labels) < 1:
            raise ValueError(f"DistilBertConfig.num_labels must be >= 1, got {config.num_labels}")
        self.config = config
        rng = np.random.default_rng(seed)
        C, std = config.dim, config.initializer_range
        self._build_backbone(config, False, rng, dtype)
        self.pre_classifier = Linear(C, C, rng=rng, std=std, dtype=dtype)
        self.dropout = Dropout(config.seq_classif_dropout)
        self.classifier = Linear(C, config.num_labels, rng=rng, std=std, dtype=dtype)
        self._relu_cache = None
        self._cache = None

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False) -> SequenceClassifierOutput:
        """As :meth:`BertForSequenceClassification.forward`; labels (B,) int in [0, K)
        (-100 ignored) for K >= 2, (B,) float for K == 1, or None.

        Raises:
            ValueError: bad input shapes or values, labels not (B,).
        """
        out = self.backbone(input_ids, token_type_ids, attention_mask, output_attentions)
        h = out.last_hidden_state                                        # (B, T, C)
        pooled, self._relu_cache = relu_forward(self.pre_classifier(h[:, 0]))   # (B, C)
        logits = self.classifier(self.dropout(pooled))                   # (B, K)
        loss = loss_cache = None
        if labels is not None:
            B = input_ids.shape[0]
            if tuple(labels.shape) != (B,):
                raise ValueError(f"labels: expected shape {(B,)}, got {tuple(labels.shape)}")
            if self.num_labels == 1:
                # forward: loss = mean_i (logits[i, 0] - y_i)^2     (torch MSELoss)
                diff = logits[:, 0] - labels.astype(logits.dtype)        # (B,)
                loss = (diff * diff).mean()
                loss_cache = ("mse", diff)
            else:
                loss, ce = cross_entropy_forward(logits, labels)
                loss_cache = ("ce", ce)
        self._cache = (logits.shape, logits.dtype, loss_cache, h.shape)
        return SequenceClassifierOutput(loss, logits, pooled, out.attentions)

    def backward(self, dloss=1.0, *, d_logits=None) -> None:
        """As :meth:`BertForSequenceClassification.backward`.

        Raises:
            RuntimeError: no forward came before, or it had no labels and d_logits is None.
            ValueError: d_logits not (B, K), dloss not 0-d.
        """
        shape, dtype, loss_cache, h_shape = _take_cache(self, dloss, {"d_logits": d_logits},
                                                        "labels")
        if loss_cache is not None:
            kind, c = loss_cache
            if kind == "ce":
                # forward: loss = mean cross-entropy(logits, labels)
                d_loss = cross_entropy_backward(dloss, c)                # (B, K)
            else:
                # forward: loss = mean (logits[:, 0] - y)^2  ->  d = 2 (logits - y) / B
                d_loss = (dloss * 2.0 / c.shape[0]) * c[:, None]         # (B, 1)
            d_logits = _add(d_loss, d_logits)                            # (B, K)
        # forward: logits = dropout(pooled) @ W^T + b
        d_pooled = self.dropout.backward(self.classifier.backward(d_logits.astype(dtype)))
        # forward: pooled = relu(pre_classifier(h[:, 0]))
        d_first = self.pre_classifier.backward(
            relu_backward(d_pooled, self.take_cache("_relu_cache")))     # (B, C)
        xp = get_array_module(d_first)
        dh = xp.zeros(h_shape, dtype=dtype)                              # (B, T, C)
        # forward: first = h[:, 0]  ->  the gradient lands at position 0 only
        dh[:, 0] = d_first
        self.backbone.backward(dh)


class DistilBertForTokenClassification(BertForTokenClassification):
    """transformers ``DistilBertForTokenClassification``: dropout (``dropout``) then
    ``classifier`` on every token's last hidden state; everything else is
    :class:`~minibert.heads.BertForTokenClassification`'s (labels -100 ignored)."""

    base_model_prefix = "distilbert"
    backbone_class = DistilBertModel


class _DropoutLinear(Linear):
    """``Linear(dropout(x))``: transformers DistilBERT's QA dropout (``qa_dropout``)
    folded into ``qa_outputs`` (the dropout has no parameters, so the names stay
    transformers')."""

    @classmethod
    def around(cls, linear: Linear, p: float) -> "_DropoutLinear":
        """``linear``'s weight and bias (shared, not copied) behind a Dropout(p)."""
        layer = cls.tied(linear.weight, linear.bias)
        layer.dropout = Dropout(p)
        return layer

    def forward(self, x):
        """(..., in) -> (..., out)."""
        return super().forward(self.dropout(x))

    def backward(self, dout):
        """(..., out) -> (..., in)."""
        # forward: out = dropout(x) @ W^T + b
        return self.dropout.backward(super().backward(dout))


class DistilBertForQuestionAnswering(BertForQuestionAnswering):
    """transformers ``DistilBertForQuestionAnswering``: dropout (``qa_dropout``) on the
    last hidden states, then ``qa_outputs`` (2, C); loss, positions and signatures are
    :class:`~minibert.heads.BertForQuestionAnswering`'s.

    Raises:
        ValueError: num_labels != 2.
    """

    base_model_prefix = "distilbert"
    backbone_class = DistilBertModel

    def __init__(self, config: DistilBertConfig, *, seed: int = 0, dtype=np.float32):
        super().__init__(config, seed=seed, dtype=dtype)
        # forward: logits = qa_outputs(dropout(h)), the dropout folded into qa_outputs
        self.qa_outputs = _DropoutLinear.around(self.qa_outputs, config.qa_dropout)
