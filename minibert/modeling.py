"""BERT (Devlin et al. 2019) with a hand-written backward for every sub-layer.

The module tree and parameter names are those of Hugging Face ``modeling_bert.py``
(``bert.encoder.layer.0.attention.self.query.weight`` ...), so ``state_dict`` lines up
with ``transformers.BertForPreTraining.state_dict()`` key for key. Pre-LN models
(``norm_position="pre"``, which HF BERT does not have) name each LayerNorm by what it
normalises, as Hugging Face's Megatron-BERT: ``attention.ln`` before self-attention,
``layer.N.ln`` before the feed-forward block, ``encoder.ln`` after the last layer.

The file reads top to bottom: the config, the embeddings, the encoder layers, the
pooler, :class:`BertModel`, then the pretraining heads and :class:`BertForPreTraining`.
The fine-tuning heads (sequence and token classification, question answering) are in
:mod:`minibert.heads`.

Shape legend: B = batch, T = sequence length, C = hidden size, NH = heads,
HS = C // NH, I = intermediate size, V = vocab size, L = layers, P = masked-LM slots
per sequence (the width of ``masked_lm_positions``; T when none are given), N = B * P
rows that go through the MLM head.

Every module caches in ``forward`` what its ``backward`` needs, so a forward must be
followed by at most one backward before the next forward.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .backend import get_array_module
from .fast import frozen_block
from .nn.dropout import bias_dropout_add_forward
from .nn.module import add_grads
from .nn import (IGNORE_INDEX, ACTIVATIONS, Activation, Dropout, Embedding, LayerNorm, Linear,
                 Module, ModuleList, Parameter, attention_backward, attention_forward,
                 cross_entropy_backward, cross_entropy_forward, extended_attention_mask,
                 linear_backward, linear_forward, scatter_add_rows)
from .nn.activations import tanh_backward, tanh_forward

# (num_hidden_layers, hidden_size) of the compact models of Turc et al. 2019
# ("Well-Read Students Learn Better", table of 24 BERT miniatures) and of BERT-Base.
# Heads = hidden / 64 and intermediate = 4 * hidden, as in those releases.
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
}


class ModelConfig:
    """What the model configs (:class:`BertConfig`, :class:`minibert.albert.AlbertConfig`)
    share: the dict / JSON form and the checks of the fields they have in common.

    Class attribute ``model_type``: the family's name in transformers (``"bert"``,
    ``"albert"``); checkpoints and ``config.json`` record it (:mod:`minibert.auto`)."""

    model_type: ClassVar[str]

    def _check_common(self, positive: tuple[str, ...]) -> None:
        """Raise ValueError, naming the field, for a non-positive size among ``positive``,
        hidden_size not divisible by num_attention_heads, or an unknown hidden_act /
        position_embedding_type / classifier_pooling."""
        name = type(self).__name__
        for field in positive:
            if int(getattr(self, field)) <= 0:
                raise ValueError(f"{name}.{field} must be positive, got {getattr(self, field)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{name}: hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"{name}.hidden_act: expected one of {sorted(ACTIVATIONS)}, "
                             f"got {self.hidden_act!r}")
        if self.position_embedding_type not in ("absolute", "sinusoidal"):
            raise ValueError(f"{name}.position_embedding_type: expected 'absolute' or "
                             f"'sinusoidal', got {self.position_embedding_type!r}")
        if self.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"{name}.classifier_pooling: expected 'cls' or 'mean', "
                             f"got {self.classifier_pooling!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        """Build from a dict such as a Hugging Face ``config.json``; keys that are not
        fields here (architectures, model_type, ...) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_record(self) -> dict[str, Any]:
        """The fields and ``model_type`` (as transformers' ``config.json``): what
        ``config.json`` and a checkpoint's meta record hold, and
        :func:`minibert.auto.config_from_dict` reads back."""
        return {"model_type": self.model_type, **self.to_dict()}

    def to_json(self) -> str:
        """:meth:`to_record` as JSON."""
        return json.dumps(self.to_record(), indent=2, sort_keys=True)


@dataclass
class EncoderConfigFields:
    """The fields that BERT's, ALBERT's and ELECTRA's configs share, with transformers'
    names and defaults (ALBERT overrides the two dropout defaults with 0.0). As a dataclass
    base they come first in each config's field order; configs are built by keyword."""

    hidden_dropout_prob: float = 0.1      # dropout on embeddings and sub-layer outputs
    attention_probs_dropout_prob: float = 0.1  # dropout on attention probabilities
    max_position_embeddings: int = 512    # longest sequence T, in tokens
    type_vocab_size: int = 2              # segment ids (sentence A / B)
    initializer_range: float = 0.02       # std of the normal weight initialisation
    layer_norm_eps: float = 1e-12         # LayerNorm epsilon


@dataclass
class BertConfig(ModelConfig, EncoderConfigFields):
    """Model hyper-parameters, with Hugging Face ``BertConfig`` field names.

    Raises:
        ValueError: hidden_size not divisible by num_attention_heads, an unknown
            hidden_act / position_embedding_type / norm_position / classifier_pooling, or
            a non-positive size.
    """

    vocab_size: int = 30522               # rows of the word-embedding matrix (tokens)
    hidden_size: int = 768                # C: width of every token representation
    num_hidden_layers: int = 12           # encoder layers
    num_attention_heads: int = 12         # NH; must divide hidden_size
    intermediate_size: int = 3072         # I: feed-forward inner width
    hidden_act: str = "gelu"              # "gelu" (exact erf), "gelu_new" (tanh), "relu"
    pad_token_id: int = 0                 # word-embedding row that gets no gradient
    position_embedding_type: str = "absolute"  # "absolute" (learned) or "sinusoidal" (fixed)
    norm_position: str = "post"           # "post" (BERT) or "pre" (Xiong et al. 2020)
    num_labels: int = 2                   # classes for sequence classification heads
    classifier_dropout: float | None = None  # None: use hidden_dropout_prob
    classifier_pooling: str = "cls"       # sequence classifier input: "cls" or "mean"

    model_type: ClassVar[str] = "bert"

    def __post_init__(self):
        self._check_common(("vocab_size", "hidden_size", "num_hidden_layers",
                            "num_attention_heads", "intermediate_size",
                            "max_position_embeddings", "type_vocab_size"))
        if self.norm_position not in ("post", "pre"):
            raise ValueError(f"BertConfig.norm_position: expected 'post' or 'pre', "
                             f"got {self.norm_position!r}")

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "BertConfig":
        """A config for a named size (tiny, mini, small, medium, base); fields may be
        overridden. Raises ValueError for an unknown name."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}: expected one of {', '.join(PRESETS)}")
        layers, hidden = PRESETS[name]
        base = dict(num_hidden_layers=layers, hidden_size=hidden,
                    num_attention_heads=hidden // 64, intermediate_size=4 * hidden)
        base.update(overrides)
        return cls(**base)


# ---------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------

def sinusoidal_positions(num_positions: int, dim: int) -> np.ndarray:
    """Fixed position encodings of Vaswani et al. 2017, section 3.5:
    PE[pos, 2i] = sin(pos / 10000^(2i/dim)), PE[pos, 2i+1] = cos(pos / 10000^(2i/dim)).
    Returns (num_positions, dim) float64."""
    pos = np.arange(num_positions)[:, None]
    inv = np.exp(-math.log(10000.0) * np.arange(0, dim, 2) / dim)       # (ceil(dim/2),)
    pe = np.zeros((num_positions, dim))
    pe[:, 0::2] = np.sin(pos * inv)
    pe[:, 1::2] = np.cos(pos * inv[: dim // 2])
    return pe


def tapped_sum(embeddings: Module, x):
    """The sum of the embedding tables ``x`` (B, T, C) as the embeddings' ``tap`` replaces
    it (``x`` itself when no tap is set). With a tap, the embeddings' backward gives the
    tap the gradient of this sum instead of adding into the tables: the gradient at the
    input of the first LayerNorm that gradient x input and integrated gradients read
    (:mod:`minibert.attribution`), with the model's own forward and backward unchanged."""
    tap = embeddings.tap
    return x if tap is None else tap.replace(x)


class BertEmbeddings(Module):
    """word + position + token-type embeddings, then LayerNorm and dropout.

    The tables are ``width`` wide: ``config.hidden_size`` for BERT, ALBERT's
    ``embedding_size`` E for its factorised embeddings (:mod:`minibert.albert`)."""

    def __init__(self, config: BertConfig, rng: np.random.Generator, dtype=np.float32,
                 width: int | None = None):
        C, std = width or config.hidden_size, config.initializer_range
        self.word_embeddings = Embedding(config.vocab_size, C, config.pad_token_id,
                                         rng=rng, std=std, dtype=dtype)
        if config.position_embedding_type == "absolute":
            self.position_embeddings = Embedding(config.max_position_embeddings, C,
                                                 rng=rng, std=std, dtype=dtype)
        else:
            self.position_buffer = sinusoidal_positions(config.max_position_embeddings,
                                                        C).astype(dtype)
        self.token_type_embeddings = Embedding(config.type_vocab_size, C, rng=rng, std=std,
                                               dtype=dtype)
        self.LayerNorm = LayerNorm(C, config.layer_norm_eps, dtype=dtype)
        self.dropout = Dropout(config.hidden_dropout_prob)

    #: The seam attributions use (:mod:`minibert.attribution`): None, or an object with
    #: ``replace(x) -> x'``, given the (B, T, C) sum of the tables in forward and returning
    #: the sum to normalise instead, and ``keep(dx)``, given the gradient (B, T, C) of that
    #: sum in backward, which then adds nothing into the tables. See :func:`tapped_sum`.
    tap = None

    def forward(self, input_ids, token_type_ids):
        """input_ids, token_type_ids: (B, T) int -> (B, T, C)."""
        xp = get_array_module(self.word_embeddings.weight.data)
        T = input_ids.shape[1]
        x = self.word_embeddings(input_ids)                              # (B, T, C)
        x = x + self.token_type_embeddings(token_type_ids)               # (B, T, C)
        if hasattr(self, "position_embeddings"):
            x += self.position_embeddings(xp.arange(T))                  # (T, C) broadcast
        else:
            x += self.position_buffer[:T]
        return self.dropout(self.LayerNorm(tapped_sum(self, x)))

    def backward(self, dout) -> None:
        """dout: (B, T, C); adds into the embedding tables' grads (the integer ids and the
        fixed sinusoidal table have no gradient), or hands the gradient of the sum to
        :attr:`tap` when one is set."""
        # forward: return dropout(LayerNorm(x))
        dx = self.LayerNorm.backward(self.dropout.backward(dout))        # (B, T, C)
        if self.tap is not None:
            self.tap.keep(dx)
            return
        # forward: x = word_embeddings(input_ids) + token_type_embeddings(token_type_ids)
        self.word_embeddings.backward(dx)
        self.token_type_embeddings.backward(dx)
        # forward: x += position_embeddings(arange(T)), broadcast over B  ->  sum over B
        if hasattr(self, "position_embeddings"):
            self.position_embeddings.backward(dx.sum(axis=0))            # (T, C), ids unique


# ---------------------------------------------------------------------------------------
# Encoder
# ---------------------------------------------------------------------------------------

class BertSelfAttention(Module):
    """query / key / value projections and multi-head scaled dot-product attention.

    The three projections keep HF's separate ``query`` / ``key`` / ``value`` parameters but
    run as one fused matmul: their weights are stacked into (3C, C) for the step (a copy
    of 3C^2 values, small against the B*T*3C^2 multiply-adds it saves launching three
    times), and the stacked gradient is split back into the three.
    """

    cache_attributes = ("_cache", "_dprobs", "attention_probs")

    def __init__(self, config: BertConfig, rng: np.random.Generator, dtype=np.float32):
        self.num_attention_heads = config.num_attention_heads
        init_self_attention(self, config.hidden_size, config.initializer_range,
                            config.attention_probs_dropout_prob, rng, dtype)

    def forward(self, x, mask_add, output_attentions: bool = False):
        """x: (B, T, C); mask_add: (B, 1, 1, T) additive or None -> context (B, T, C)."""
        w, b = self._stacked_weights(x)                                  # (3C, C), (3C,)
        # qkv = x [Wq; Wk; Wv]^T + [bq; bk; bv], the bias added where the heads are split
        qkv, (x_, w_, _) = linear_forward(x, w, None)                    # (B, T, 3C)
        linear_cache = (x_, w_, True)            # linear_backward still gives db
        p = self.dropout.p if self.dropout.training else 0.0
        ctx, attention_cache = attention_forward(qkv, mask_add, self.num_attention_heads, p,
                                                 self.dropout.rng, qkv_bias=b)  # (B, T, C)
        self._cache = (linear_cache, attention_cache)
        self._dprobs = None
        self.attention_probs = attention_cache.probs if output_attentions else None
        return ctx

    def _stacked_weights(self, x):
        """[Wq; Wk; Wv] (3C, C) and [bq; bk; bv] (3C,), concatenated from the parameters;
        inside a :func:`minibert.fast.frozen_parameters` block with the fast paths on,
        once per block (the stack is kept with the block's token and the six arrays it
        was made from, and made again when either changes)."""
        arrays = tuple(a for m in (self.query, self.key, self.value)
                       for a in (m.weight.data, m.bias.data))
        block = frozen_block()
        kept = getattr(self, "_stack", None)
        if (block is not None and kept is not None and kept[0] is block
                and all(a is k for a, k in zip(arrays, kept[1]))):
            return kept[2], kept[3]
        xp = get_array_module(x)
        w = xp.concatenate(arrays[0::2])                                 # (3C, C)
        b = xp.concatenate(arrays[1::2])                                 # (3C,)
        self._stack = (block, arrays, w, b) if block is not None else None
        return w, b

    def add_probs_grad(self, dprobs) -> None:
        """Give an upstream gradient of the attention probabilities of the last forward
        (``attention_probs``: (B, NH, T, T), before dropout), from a loss that reads them,
        such as MiniLM's attention transfer (:mod:`minibert.distillation`). The next
        :meth:`backward` adds it to the gradient that flows back through ctx (see
        :func:`minibert.nn.attention_backward`), then forgets it; so does a new forward.
        Gradients given twice add up.

        Raises:
            RuntimeError: no forward came before.
            ValueError: ``dprobs`` not of the probabilities' shape.
        """
        if self._cache is None:
            raise RuntimeError("add_probs_grad() needs a preceding forward")
        shape = tuple(self._cache[1].probs.shape)
        if tuple(dprobs.shape) != shape:
            raise ValueError(f"dprobs: expected shape {shape}, got {tuple(dprobs.shape)}")
        self._dprobs = dprobs if self._dprobs is None else self._dprobs + dprobs

    def backward(self, dctx):
        """dctx: (B, T, C) -> dx (B, T, C); adds into query/key/value weight and bias grads
        (and takes a gradient of the probabilities given by :meth:`add_probs_grad`)."""
        return self_attention_backward(self, dctx, (self.query, self.key, self.value))


def init_self_attention(module: Module, C: int, std: float, p: float,
                        rng: np.random.Generator, dtype=np.float32,
                        names: tuple[str, ...] = ("query", "key", "value")) -> None:
    """Give a self-attention ``module`` (:class:`BertSelfAttention`, DistilBERT's) its
    (C, C) Linear layers, named ``names`` and drawn from ``rng`` in that order, the dropout
    on the attention probabilities (``dropout``, Dropout(p): it holds p and the rng) and
    empty caches: ``attention_probs`` ((B, NH, T, T) of the last forward, if asked for),
    ``_cache`` and ``_dprobs`` (an upstream gradient of the probabilities, if given)."""
    for name in names:
        setattr(module, name, Linear(C, C, rng=rng, std=std, dtype=dtype))
    module.dropout = Dropout(p)
    module.attention_probs = None
    module._cache = None
    module._dprobs = None


def self_attention_backward(module: Module, dctx, projections):
    """The backward of a self-attention ``module``'s fused q/k/v step: dctx (B, T, C) ->
    dx (B, T, C). Takes the module's cache (``(linear_cache, attention_cache)``) and the
    gradient of the probabilities given by ``add_probs_grad``, and adds the stacked
    gradient's slices into the weight and bias grads of ``projections`` (query, key,
    value Linears, in the order they were stacked)."""
    linear_cache, attention_cache = module.take_cache()
    dprobs, module._dprobs = module._dprobs, None
    # forward: ctx = attention(qkv, mask_add), probs = attention_cache.probs
    dqkv = attention_backward(dctx, attention_cache, dprobs)             # (B, T, 3C)
    # forward: qkv = x @ [Wq; Wk; Wv]^T + [bq; bk; bv]
    dx, dw, db = linear_backward(dqkv, linear_cache)                     # (B,T,C), (3C,C), (3C,)
    C = dx.shape[-1]
    add_grads([m.weight for m in projections], [dw[i * C:(i + 1) * C] for i in range(3)])
    add_grads([m.bias for m in projections], [db[i * C:(i + 1) * C] for i in range(3)])
    return dx


class BertOutput(Module):
    """dense -> dropout -> + residual, then LayerNorm when post-LN.

    HF has two classes of this shape, ``BertSelfOutput`` (after attention, in = C) and
    ``BertOutput`` (after the feed-forward, in = I); one class serves both here. Pre-LN has
    no LayerNorm here: the parent normalises the sub-layer's *input* with its own ``ln``
    and the residual sum is returned as is (Megatron-BERT's ``MegatronBertSelfOutput`` /
    ``MegatronBertOutput``).
    """

    def __init__(self, in_features: int, config: BertConfig, rng: np.random.Generator,
                 dtype=np.float32):
        C = config.hidden_size
        self.dense = Linear(in_features, C, rng=rng, std=config.initializer_range, dtype=dtype)
        if config.norm_position == "post":
            self.LayerNorm = LayerNorm(C, config.layer_norm_eps, dtype=dtype)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, h, residual):
        """h: (B, T, in_features); residual: (B, T, C) -> (B, T, C)."""
        d = self.dropout
        p = d.p if d.training else 0.0
        if p > 0.0 and d.rng is None:
            return d(h)          # Dropout's own error: the generator was never set
        # y = dropout(h W^T + b) + residual: the bias, the dropout and the sum in one
        # function (one kernel on the GPU); dense.backward and dropout.backward undo them
        y, d._mask = bias_dropout_add_forward(self.dense.forward_without_bias(h),
                                              self.dense.bias.data, residual, p, d.rng)
        return self.LayerNorm(y) if hasattr(self, "LayerNorm") else y

    def backward(self, dout):
        """dout: (B, T, C) -> (dh (B, T, in_features), dresidual (B, T, C))."""
        # forward: return LayerNorm(y) if post-LN else y
        dy = self.LayerNorm.backward(dout) if hasattr(self, "LayerNorm") else dout  # (B,T,C)
        # forward: y = dropout(dense(h)) + residual
        dh = self.dense.backward(self.dropout.backward(dy))              # (B, T, in_features)
        return dh, dy


class BertAttention(Module):
    """Self-attention sub-layer with its residual connection. Post-LN normalises the sum
    (``output.LayerNorm``); pre-LN normalises the input instead, with ``ln`` (Megatron-BERT's
    ``MegatronBertAttention.ln``)."""

    def __init__(self, config: BertConfig, rng: np.random.Generator, dtype=np.float32):
        self.self = BertSelfAttention(config, rng, dtype)
        self.output = BertOutput(config.hidden_size, config, rng, dtype)
        if config.norm_position == "pre":
            self.ln = LayerNorm(config.hidden_size, config.layer_norm_eps, dtype=dtype)

    def forward(self, x, mask_add, output_attentions: bool = False):
        """x: (B, T, C) -> (B, T, C)."""
        h = self.ln(x) if hasattr(self, "ln") else x                     # (B, T, C)
        ctx = self.self(h, mask_add, output_attentions)                  # (B, T, C)
        return self.output(ctx, x)

    def backward(self, dout):
        """dout: (B, T, C) -> dx (B, T, C)."""
        # forward: return output(ctx, x)
        dctx, dx = self.output.backward(dout)                            # (B, T, C) each
        # forward: ctx = self(h, mask_add)
        dh = self.self.backward(dctx)                                    # (B, T, C)
        # forward: h = ln(x) if pre-LN else x  ->  x fans out: sum with the residual
        return dx + (self.ln.backward(dh) if hasattr(self, "ln") else dh)


class BertIntermediate(Module):
    """Feed-forward expansion: dense (C -> I) then the activation."""

    def __init__(self, config: BertConfig, rng: np.random.Generator, dtype=np.float32):
        self.dense = Linear(config.hidden_size, config.intermediate_size, rng=rng,
                            std=config.initializer_range, dtype=dtype)
        self.intermediate_act_fn = Activation(config.hidden_act)

    def forward(self, x):
        """(B, T, C) -> (B, T, I)."""
        # act(x W^T + b): the bias added with the activation (one kernel for GELU on the GPU)
        return self.intermediate_act_fn.forward_with_bias(self.dense.forward_without_bias(x),
                                                          self.dense.bias.data)

    def backward(self, dout):
        """dout: (B, T, I) -> dx (B, T, C)."""
        # forward: return act(dense(x))
        return self.dense.backward(self.intermediate_act_fn.backward(dout))  # (B, T, C)


class BertLayer(Module):
    """One Transformer encoder block: attention sub-layer, then feed-forward sub-layer.
    Pre-LN normalises the feed-forward input with ``ln`` (Megatron-BERT's
    ``MegatronBertLayer.ln``); post-LN normalises its output sum in ``output.LayerNorm``."""

    def __init__(self, config: BertConfig, rng: np.random.Generator, dtype=np.float32):
        self.attention = BertAttention(config, rng, dtype)
        self.intermediate = BertIntermediate(config, rng, dtype)
        self.output = BertOutput(config.intermediate_size, config, rng, dtype)
        if config.norm_position == "pre":
            self.ln = LayerNorm(config.hidden_size, config.layer_norm_eps, dtype=dtype)

    def forward(self, x, mask_add, output_attentions: bool = False):
        """(B, T, C) -> (B, T, C)."""
        a = self.attention(x, mask_add, output_attentions)               # (B, T, C)
        h = self.ln(a) if hasattr(self, "ln") else a                     # (B, T, C)
        i = self.intermediate(h)                                         # (B, T, I)
        return self.output(i, a)                                         # (B, T, C)

    def backward(self, dout):
        """dout: (B, T, C) -> dx (B, T, C)."""
        # forward: return output(i, a)
        di, da = self.output.backward(dout)                              # (B,T,I), (B,T,C)
        # forward: i = intermediate(h)
        dh = self.intermediate.backward(di)                              # (B, T, C)
        # forward: h = ln(a) if pre-LN else a  ->  a fans out: sum with the residual
        da = da + (self.ln.backward(dh) if hasattr(self, "ln") else dh)
        # forward: a = attention(x, mask_add)
        return self.attention.backward(da)                               # (B, T, C)


class BertEncoder(Module):
    """A stack of BertLayer; with pre-LN, a final LayerNorm ``ln`` on the last layer's
    output (Megatron-BERT's ``MegatronBertEncoder.ln``)."""

    cache_attributes = ("hidden_states",)

    def __init__(self, config: BertConfig, rng: np.random.Generator, dtype=np.float32):
        self.layer = ModuleList([BertLayer(config, rng, dtype)
                                 for _ in range(config.num_hidden_layers)])
        if config.norm_position == "pre":
            self.ln = LayerNorm(config.hidden_size, config.layer_norm_eps, dtype=dtype)
        self.hidden_states = None    # (x, each layer's output) of the last forward, if asked

    def forward(self, x, mask_add, output_attentions: bool = False,
                output_hidden_states: bool = False):
        """x: (B, T, C) -> (B, T, C). With ``output_hidden_states``, ``hidden_states``
        holds x and every layer's output, (B, T, C) each, until the next forward."""
        states = [x] if output_hidden_states else None
        for layer in self.layer:
            x = layer(x, mask_add, output_attentions)                    # (B, T, C)
            if states is not None:
                states.append(x)
        self.hidden_states = tuple(states) if states is not None else None
        return self.ln(x) if hasattr(self, "ln") else x

    def backward(self, dout, first_layer: int = 0):
        """dout: (B, T, C) -> d(input of layer ``first_layer``) (B, T, C), the encoder's dx
        for first_layer 0. Layers below ``first_layer`` get no backward (frozen ones that
        nothing trainable lies under, see :meth:`BertModel.backward`)."""
        # forward: return ln(x) if pre-LN else x
        if hasattr(self, "ln"):
            dout = self.ln.backward(dout)                                # (B, T, C)
        # forward: for layer in self.layer: x = layer(x, mask_add)  ->  last layer first
        for i in reversed(range(first_layer, len(self.layer))):
            dout = self.layer[i].backward(dout)                          # (B, T, C)
        return dout


class BertPooler(Module):
    """tanh(dense(hidden state of the first token, [CLS]))."""

    def __init__(self, config: BertConfig, rng: np.random.Generator, dtype=np.float32):
        C = config.hidden_size
        self.dense = Linear(C, C, rng=rng, std=config.initializer_range, dtype=dtype)
        self._cache = None

    def forward(self, hidden):
        """(B, T, C) -> (B, C)."""
        out, self._cache = tanh_forward(self.dense(hidden[:, 0]))       # (B, C)
        return out

    def backward(self, dout):
        """(B, C) -> d(hidden[:, 0]) (B, C); the caller adds it at position 0."""
        # forward: out = tanh(dense(hidden[:, 0]))
        return self.dense.backward(tanh_backward(dout, self.take_cache()))  # (B, C)


# ---------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------

@dataclass
class BertModelOutput:
    """last_hidden_state (B, T, C); pooler_output (B, C) or None; attentions: one
    (B, NH, T, T) array per layer when asked for, else None; hidden_states: when asked for,
    a tuple of num_hidden_layers + 1 arrays (B, T, C), the embeddings' output and each
    layer's output in order (Hugging Face's ``hidden_states``), else None."""

    last_hidden_state: Any
    pooler_output: Any = None
    attentions: list | None = None
    hidden_states: tuple | None = None


@dataclass
class BertForPreTrainingOutput:
    """Outputs of :class:`BertForPreTraining`.

    loss: the sum of the losses whose labels were given (0-d array, nats), or None.
    mlm_loss: 0-d array, mean nats per counted masked position, or None.
    seq_relationship_loss: 0-d array, mean nats per sequence of the sentence-level task
        (next-sentence or sentence-order prediction), or None.
    prediction_logits: (B, P, V) MLM logits at ``masked_lm_positions`` (P = its width), or
        at every position (P = T, Hugging Face's (B, T, V)) when no positions are given.
        Only the gathered rows go through the head, as the original BERT does
        (``gather_indexes`` in run_pretraining.py).
    seq_relationship_logits: (B, 2) logits of the sentence-level head, None without one.
    hidden_states: (B, T, C) the encoder's last hidden state.
    attentions: one (B, NH, T, T) array per layer when asked for, else None.
    """

    loss: Any
    mlm_loss: Any
    seq_relationship_loss: Any
    prediction_logits: Any
    seq_relationship_logits: Any
    hidden_states: Any = None
    attentions: list | None = None


class BertPreTrainedModel(Module):
    """Shared helpers of the BERT models: construction RNG, dropout generator, devices.

    Attributes:
        base_model_prefix: the attribute (and parameter-name prefix) under which a model
            with a head keeps its encoder: "bert" here, "albert" for ALBERT (as HF's
            ``PreTrainedModel.base_model_prefix``).
    """

    config: BertConfig
    base_model_prefix = "bert"

    @property
    def backbone(self) -> "BertModel":
        """The encoder: ``self.bert`` (``self.albert``) for a model with a head, the model
        itself for a bare encoder."""
        return getattr(self, self.base_model_prefix, self)

    def set_dropout_rng(self, rng) -> None:
        """Give every Dropout in the model the generator ``rng`` (numpy or cupy Generator,
        on the model's device)."""
        for m in self.modules():
            if isinstance(m, Dropout):
                m.rng = rng

    @property
    def dtype(self):
        return self.parameters()[0].data.dtype

    def freeze(self, embeddings: bool = False, layers: int = 0) -> "BertPreTrainedModel":
        """Freeze the embeddings and/or the lowest ``layers`` encoder layers; every other
        parameter becomes trainable (so ``freeze()`` unfreezes all, and a second call
        replaces the first). The usual partial fine-tuning of Howard & Ruder 2018 (ULMFiT)
        and Sun et al. 2019 ("How to Fine-Tune BERT for Text Classification?").

        A frozen parameter has ``requires_grad`` False: backward adds nothing into its
        ``grad`` (which stays zero, also through a tied use such as the MLM decoder), and
        :meth:`BertModel.backward` runs no backward at all below the lowest encoder layer
        that has a trainable parameter or a trainable one under it. Build the optimizer
        over :meth:`~minibert.nn.Module.named_trainable_parameters`. Freezing is not part
        of ``state_dict``: apply it again after loading.

        Args:
            embeddings: freeze ``bert.embeddings.*`` (word, position, token-type tables and
                their LayerNorm; for ALBERT also ``encoder.embedding_hidden_mapping_in``).
            layers: freeze ``bert.encoder.layer.0`` .. ``layer.{layers-1}``, an int in
                [0, num_hidden_layers]: the parameters that the lowest ``layers`` depths
                use (:meth:`BertModel.backward_stages`; with ALBERT's sharing, the whole
                layer group of each of those depths).
        Returns:
            self.
        Raises:
            ValueError: ``layers`` not an int in [0, num_hidden_layers].
        """
        stages = self.backbone.backward_stages()
        L = len(stages) - 1
        if (isinstance(layers, bool) or not isinstance(layers, (int, np.integer))
                or not 0 <= layers <= L):
            raise ValueError(f"freeze: layers must be an int in [0, {L}] "
                             f"(num_hidden_layers), got {layers!r}")
        frozen = stages[1:int(layers) + 1] + ([stages[0]] if embeddings else [])
        frozen_ids = {id(p) for m in frozen for p in m.parameters()}
        for p in self.parameters():
            p.requires_grad = id(p) not in frozen_ids
        return self


def _check_inputs(config: BertConfig, input_ids, token_type_ids, attention_mask):
    """Validate (B, T) integer inputs; fill defaults. Value range checks run on the CPU only
    (on the GPU they would cost a device sync every step)."""
    xp = get_array_module(input_ids)
    if input_ids.ndim != 2 or input_ids.dtype.kind not in "iu":
        raise ValueError(f"input_ids: expected a (B, T) integer array, got shape "
                         f"{tuple(input_ids.shape)} dtype {input_ids.dtype}")
    B, T = input_ids.shape
    if T > config.max_position_embeddings:
        raise ValueError(f"input_ids: sequence length {T} exceeds max_position_embeddings "
                         f"{config.max_position_embeddings}")
    if token_type_ids is None:
        token_type_ids = xp.zeros_like(input_ids)
    if attention_mask is None:
        attention_mask = xp.ones_like(input_ids)
    for name, a in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
        if tuple(a.shape) != (B, T):
            raise ValueError(f"{name}: expected shape {(B, T)}, got {tuple(a.shape)}")
    if xp is np:
        for name, a, hi in (("input_ids", input_ids, config.vocab_size),
                            ("token_type_ids", token_type_ids, config.type_vocab_size)):
            if a.size and (a.min() < 0 or a.max() >= hi):
                raise ValueError(f"{name}: values must be in [0, {hi}), got range "
                                 f"[{a.min()}, {a.max()}]")
    return token_type_ids, attention_mask


class BertModel(BertPreTrainedModel):
    """The BERT encoder: embeddings, encoder stack and (optionally) the pooler.

    Args:
        config: the hyper-parameters.
        add_pooling_layer: build ``pooler`` (needed by NSP and classification heads).
        seed: seed of the NumPy generator that draws the initial weights (unless ``rng``).
        dtype: parameter dtype, float32 for training, float64 for gradient checks.
        rng: the generator to draw from instead (a model with a head passes its own).
    """

    cache_attributes = ("_hidden_meta",)

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True, *, seed: int = 0,
                 dtype=np.float32, rng: np.random.Generator | None = None):
        self.config = config
        rng = rng if rng is not None else np.random.default_rng(seed)
        self.embeddings = BertEmbeddings(config, rng, dtype)
        self.encoder = BertEncoder(config, rng, dtype)
        if add_pooling_layer:
            self.pooler = BertPooler(config, rng, dtype)
        self._hidden_meta = None

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                output_attentions: bool = False,
                output_hidden_states: bool = False) -> BertModelOutput:
        """Encode a batch.

        Args:
            input_ids: (B, T) int token ids in [0, vocab_size).
            token_type_ids: (B, T) int segment ids, default zeros.
            attention_mask: (B, T) 1 for real tokens, 0 for padding; default all ones.
            output_attentions: also return each layer's attention probabilities.
            output_hidden_states: also return the embeddings' output and every layer's
                output (the residual stream between layers). With pre-LN the last of them
                is the last layer's output before ``encoder.ln``: ``last_hidden_state`` is
                ``encoder.ln(hidden_states[-1])`` (Hugging Face's Megatron-BERT puts the
                normalised state last instead); with post-LN it is ``last_hidden_state``.
        Returns:
            :class:`BertModelOutput`.
        Raises:
            ValueError: wrong shapes or dtypes, T > max_position_embeddings, ids out of range.
        """
        token_type_ids, attention_mask = _check_inputs(self.config, input_ids, token_type_ids,
                                                       attention_mask)
        x = self.embeddings(input_ids, token_type_ids)                  # (B, T, C)
        mask_add = extended_attention_mask(attention_mask, x.dtype)     # (B, 1, 1, T)
        h = self.encoder(x, mask_add, output_attentions, output_hidden_states)  # (B, T, C)
        self._hidden_meta = (h.shape, h.dtype)
        pooled = self.pooler(h) if hasattr(self, "pooler") else None    # (B, C)
        attentions = self.layer_attentions() if output_attentions else None
        return BertModelOutput(h, pooled, attentions, self.encoder.hidden_states)

    def layer_attentions(self) -> list:
        """The attention probabilities of the last forward, one (B, NH, T, T) array per
        depth, bottom up (None entries unless that forward asked for them)."""
        return [layer.attention.self.attention_probs for layer in self.encoder.layer]

    def add_last_attention_grad(self, dprobs) -> None:
        """Give an upstream gradient (B, NH, T, T) of the last layer's attention
        probabilities of the last forward (``layer_attentions()[-1]``), from a loss that
        reads them (MiniLM's attention transfer, :mod:`minibert.distillation`); the next
        :meth:`backward` adds it in (:meth:`BertSelfAttention.add_probs_grad`, whose
        errors it raises)."""
        self.encoder.layer[len(self.encoder.layer) - 1].attention.self.add_probs_grad(dprobs)

    def backward_stages(self) -> list[Module]:
        """What :meth:`backward` runs through, bottom up: the embeddings, then the module
        applied at each depth (here ``encoder.layer[i]``). :meth:`freeze` freezes a prefix
        of it, and backward stops below the lowest stage with a trainable parameter."""
        return [self.embeddings, *self.encoder.layer]

    def backward(self, d_last_hidden_state=None, d_pooler_output=None) -> None:
        """Back-propagate upstream gradients of the two outputs (either may be None) into
        every trainable parameter's ``grad``. d_last_hidden_state: (B, T, C);
        d_pooler_output: (B, C). Stops below the lowest encoder layer with a trainable
        parameter at or under it (see :meth:`BertPreTrainedModel.freeze`)."""
        if d_last_hidden_state is None and d_pooler_output is None:
            raise ValueError(f"{type(self).__name__}.backward needs at least one upstream "
                             "gradient")
        if self._hidden_meta is None:
            raise RuntimeError(f"{type(self).__name__}.backward called without a preceding "
                               "forward")
        shape, dtype = self._hidden_meta
        self._hidden_meta = None
        if d_last_hidden_state is None:
            d = get_array_module(d_pooler_output).zeros(shape, dtype=dtype)  # (B, T, C)
        else:
            d = d_last_hidden_state.astype(dtype, copy=True)                 # (B, T, C)
        # forward: pooled = pooler(h), which reads h[:, 0] only
        if d_pooler_output is not None:
            d[:, 0] += self.pooler.backward(d_pooler_output)             # (B, C)
        # backward below a stage is needed only if it or a stage under it has a trainable
        # parameter (see freeze): first = 0 for the embeddings, i + 1 for layer i, L + 1 none
        stages = self.backward_stages()
        first = next((i for i, m in enumerate(stages)
                      if any(p.requires_grad for p in m.parameters())), len(stages))
        # forward: h = encoder(x, mask_add)  (mask_add is a constant)
        dx = self.encoder.backward(d, first_layer=max(first - 1, 0))    # (B, T, C)
        # forward: x = embeddings(input_ids, token_type_ids)
        if first == 0:
            self.embeddings.backward(dx)


class BertPredictionHeadTransform(Module):
    """dense (C -> width) -> activation -> LayerNorm, applied before the MLM decoder; width
    is C for BERT, ALBERT's embedding_size E for its MLM head (:mod:`minibert.albert`).
    The activation is ``act``, by default ``config.hidden_act``."""

    def __init__(self, config: BertConfig, rng: np.random.Generator, dtype=np.float32,
                 width: int | None = None, act: str | None = None):
        C, W = config.hidden_size, width or config.hidden_size
        self.dense = Linear(C, W, rng=rng, std=config.initializer_range, dtype=dtype)
        self.transform_act_fn = Activation(act or config.hidden_act)
        self.LayerNorm = LayerNorm(W, config.layer_norm_eps, dtype=dtype)

    def forward(self, h):
        """(N, C) -> (N, width)."""
        a = self.transform_act_fn.forward_with_bias(self.dense.forward_without_bias(h),
                                                    self.dense.bias.data)
        return self.LayerNorm(a)

    def backward(self, dout):
        """dout: (N, width) -> dh (N, C)."""
        # forward: return LayerNorm(act(dense(h)))
        return self.dense.backward(self.transform_act_fn.backward(self.LayerNorm.backward(dout)))


class BertLMPredictionHead(Module):
    """MLM head: transform, then the decoder whose weight *is* the word-embedding matrix
    (tied, Press & Wolf 2017; google-research/bert ``get_masked_lm_output``) plus an
    output bias ``bias`` (V,), shared with ``decoder.bias`` as in HF."""

    def __init__(self, config: BertConfig, word_embeddings, rng: np.random.Generator,
                 dtype=np.float32):
        self.bias = Parameter(np.zeros(config.vocab_size, dtype=dtype))
        self.transform = BertPredictionHeadTransform(config, rng, dtype)
        self.decoder = Linear.tied(word_embeddings.weight, self.bias)

    def forward(self, h):
        """(N, C) -> logits (N, V)."""
        t = self.transform(h)                                            # (N, C)
        return self.decoder(t)                                           # (N, V)

    def backward(self, dlogits):
        """(N, V) -> (N, C); the decoder's weight gradient lands in the word embeddings."""
        # forward: return decoder(t) = t @ E^T + bias, E the tied word-embedding matrix
        dt = self.decoder.backward(dlogits)                              # (N, C)
        # forward: t = transform(h)
        return self.transform.backward(dt)                               # (N, C)


class BertPreTrainingHeads(Module):
    """``cls``: the MLM head ``predictions`` and, when asked for, the two-way sentence-level
    head ``seq_relationship`` (NSP or SOP)."""

    def __init__(self, config: BertConfig, word_embeddings, rng: np.random.Generator,
                 dtype=np.float32, seq_relationship_head: bool = True):
        self.predictions = BertLMPredictionHead(config, word_embeddings, rng, dtype)
        if seq_relationship_head:
            self.seq_relationship = Linear(config.hidden_size, 2, rng=rng,
                                           std=config.initializer_range, dtype=dtype)


def masked_lm_from_labels(labels: np.ndarray, width: int | None = None):
    """Dense MLM labels to google-research/bert's fixed-shape form (host NumPy).

    Args:
        labels: (B, T) int, the original id at predicted positions, -100 elsewhere.
        width: P, the number of slots per row (default: the most predictions in a row).
    Returns:
        masked_lm_positions (B, P) int64, masked_lm_ids (B, P) int64 and
        masked_lm_weights (B, P) float32 (1 at a real slot, 0 at padding, whose position
        and id are 0), positions increasing within a row.
    Raises:
        ValueError: a row holds more than ``width`` predictions.
    """
    labels = np.asarray(labels)
    B, T = labels.shape
    real = labels != IGNORE_INDEX                                        # (B, T)
    counts = real.sum(axis=1)
    P = int(counts.max(initial=0)) if width is None else int(width)
    if counts.size and counts.max() > P:
        raise ValueError(f"labels: a row has {int(counts.max())} predictions, over width {P}")
    positions = np.zeros((B, P), dtype=np.int64)
    ids = np.zeros((B, P), dtype=np.int64)
    weights = np.zeros((B, P), dtype=np.float32)
    rows, cols = np.nonzero(real)
    slots = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    positions[rows, slots] = cols
    ids[rows, slots] = labels[rows, cols]
    weights[rows, slots] = 1.0
    return positions, ids, weights


def labels_from_masked_lm(positions, ids, weights, seq_len: int) -> np.ndarray:
    """The inverse of :func:`masked_lm_from_labels`: (B, T) int64 dense labels, -100 where
    no slot of weight > 0 points (host NumPy; for Hugging Face's ``labels`` argument)."""
    positions, ids, weights = (np.asarray(a) for a in (positions, ids, weights))
    labels = np.full((positions.shape[0], seq_len), IGNORE_INDEX, dtype=np.int64)
    rows, slots = np.nonzero(weights > 0)
    labels[rows, positions[rows, slots]] = ids[rows, slots]
    return labels


class BertForPreTraining(BertPreTrainedModel):
    """BERT with the masked-LM head and, optionally, a two-way sentence-level head
    (Devlin et al. 2019, section 3.1); parameter names as HF ``BertForPreTraining``.

    The sentence-level head ``cls.seq_relationship`` serves next-sentence prediction
    (label 0 = B follows A, 1 = B is random) and ALBERT's sentence-order prediction (Lan
    et al. 2020; 0 = segments in order, 1 = swapped). Without it
    (``seq_relationship_head=False``, RoBERTa-style MLM only, Liu et al. 2019) the model has
    no pooler either, and its parameters are those of HF ``BertForMaskedLM``.

    Args:
        config: the hyper-parameters.
        seed: seed of the NumPy generator that draws the initial weights.
        dtype: parameter dtype (float32 to train, float64 to check gradients).
        label_smoothing: eps of the MLM cross-entropy (0 = plain cross-entropy).
        seq_relationship_head: build the pooler and the sentence-level head.

    Attributes:
        sentence_label: the keyword under which :meth:`forward` takes the sentence label
            (``"next_sentence_label"``; ALBERT's is ``"sentence_order_label"``), for
            callers that hold it as
            :meth:`minibert.pretraining.PretrainingBatch.model_inputs` names it.
    """

    sentence_label = "next_sentence_label"

    def __init__(self, config: BertConfig, *, seed: int = 0, dtype=np.float32,
                 label_smoothing: float = 0.0, seq_relationship_head: bool = True):
        self.config = config
        rng = np.random.default_rng(seed)
        self.bert = BertModel(config, add_pooling_layer=seq_relationship_head, rng=rng,
                              dtype=dtype)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings, rng, dtype,
                                        seq_relationship_head)
        self.label_smoothing = label_smoothing
        self._cache = None

    @property
    def lm_head(self) -> Module:
        """The MLM head: (N, C) hidden states -> (N, V) logits, with its backward."""
        return self.cls.predictions

    @property
    def sentence_head(self) -> Module | None:
        """The sentence-level head, (B, C) pooled -> (B, 2) logits, or None without one."""
        return getattr(self.cls, "seq_relationship", None)

    @property
    def has_seq_relationship_head(self) -> bool:
        return self.sentence_head is not None

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                masked_lm_positions=None, masked_lm_ids=None, masked_lm_weights=None,
                next_sentence_label=None, output_attentions: bool = False
                ) -> BertForPreTrainingOutput:
        """Run the model and, with labels, the losses. No host read of a device value.

        Args:
            input_ids, token_type_ids, attention_mask: (B, T) int, as :meth:`BertModel.forward`.
            masked_lm_positions: (B, P) int positions in [0, T) to predict (google-research/
                bert's ``masked_lm_positions``); None = every position (P = T).
            masked_lm_ids: (B, P) int original ids at those positions; None = no MLM loss.
            masked_lm_weights: (B, P) 1 for a real slot, 0 for padding; None = all 1. The
                MLM loss is the mean cross-entropy over slots of weight 1.
            next_sentence_label: (B,) int 0/1 for the sentence-level head.
            output_attentions: also return per-layer attention probabilities.
        Returns:
            :class:`BertForPreTrainingOutput`.
        Raises:
            ValueError: bad input shapes or values (see BertModel.forward), masked_lm_*
                arrays not (B, P), positions out of [0, T) (checked on the CPU only),
                next_sentence_label not (B,), or a label for a missing head.
        """
        return self._pretraining_forward(
            input_ids, token_type_ids, attention_mask, masked_lm_positions, masked_lm_ids,
            masked_lm_weights, ("next_sentence_label", next_sentence_label), output_attentions)

    def _pretraining_forward(self, input_ids, token_type_ids, attention_mask,
                             masked_lm_positions, masked_lm_ids, masked_lm_weights,
                             sentence_label: tuple, output_attentions: bool
                             ) -> BertForPreTrainingOutput:
        """The body of :meth:`forward`, shared with ALBERT's (which names its sentence
        label ``sentence_order_label``); ``sentence_label`` is the pair (argument name,
        (B,) labels or None)."""
        label_name, next_sentence_label = sentence_label
        xp = get_array_module(input_ids)
        out = self.backbone(input_ids, token_type_ids, attention_mask, output_attentions)
        h = out.last_hidden_state                                        # (B, T, C)
        B, T, C = h.shape
        if masked_lm_positions is None:
            masked_lm_positions = xp.broadcast_to(xp.arange(T), (B, T))
        P = masked_lm_positions.shape[-1]
        for name, a in (("masked_lm_positions", masked_lm_positions),
                        ("masked_lm_ids", masked_lm_ids), ("masked_lm_weights", masked_lm_weights)):
            if a is not None and tuple(a.shape) != (B, P):
                raise ValueError(f"{name}: expected shape {(B, P)}, got {tuple(a.shape)}")
        if xp is np and P and (masked_lm_positions.min() < 0 or masked_lm_positions.max() >= T):
            raise ValueError(f"masked_lm_positions: values must be in [0, {T})")
        # flat row of each slot in h viewed as (B*T, C), the gather_indexes of the reference
        flat = (masked_lm_positions + (xp.arange(B) * T)[:, None]).reshape(-1)   # (B*P,)
        logits = self.lm_head(h.reshape(B * T, C)[flat])                 # (B*P, V)

        mlm_loss = seq_loss = mlm_cache = seq_cache = seq_logits = None
        if masked_lm_ids is not None:
            labels = masked_lm_ids.reshape(-1)                           # (B*P,)
            if masked_lm_weights is not None:
                labels = xp.where(masked_lm_weights.reshape(-1) > 0, labels, IGNORE_INDEX)
            mlm_loss, mlm_cache = cross_entropy_forward(logits, labels, self.label_smoothing)
        if self.has_seq_relationship_head:
            seq_logits = self.sentence_head(out.pooler_output)           # (B, 2)
        if next_sentence_label is not None:
            if seq_logits is None:
                raise ValueError(f"{label_name} given to a model built without "
                                 "seq_relationship_head")
            if tuple(next_sentence_label.shape) != (B,):
                raise ValueError(f"{label_name}: expected shape {(B,)}, "
                                 f"got {tuple(next_sentence_label.shape)}")
            seq_loss, seq_cache = cross_entropy_forward(seq_logits, next_sentence_label)
        losses = [x for x in (mlm_loss, seq_loss) if x is not None]
        loss = sum(losses[1:], losses[0]) if losses else None
        self._cache = (h.shape, h.dtype, flat, mlm_cache, seq_cache)
        V = logits.shape[-1]
        return BertForPreTrainingOutput(loss, mlm_loss, seq_loss, logits.reshape(B, P, V),
                                        seq_logits, h, out.attentions)

    def backward(self, dloss=1.0, *, d_prediction_logits=None, d_hidden_states=None) -> None:
        """Add dloss * d(loss)/d(param) into every parameter's ``grad`` for the loss of the
        last forward, plus the back-propagation of upstream gradients of its outputs when
        given (a loss computed outside the model from them, e.g. knowledge distillation,
        :mod:`minibert.distillation`).

        Args:
            dloss: a float or 0-d array (e.g. 1/k under gradient accumulation).
            d_prediction_logits: (B, P, V) upstream gradient of ``prediction_logits``,
                added to the MLM loss's.
            d_hidden_states: (B, T, C) upstream gradient of ``hidden_states`` (the last
                hidden state), added to what flows back from the heads.
        Raises:
            RuntimeError: no forward came before, or it had no labels and no upstream
                gradient is given.
            ValueError: an upstream gradient of the wrong shape.
        """
        extra = d_prediction_logits is not None or d_hidden_states is not None
        if self._cache is None or (self._cache[3] is None and self._cache[4] is None
                                   and not extra):
            raise RuntimeError("backward() needs a preceding forward with masked_lm_ids "
                               "and/or a sentence label, or an upstream gradient")
        (B, T, C), _, flat, _, _ = self._cache            # checked before the cache is taken
        N = flat.shape[0]                                                # B * P
        for name, d, shape in (("d_prediction_logits", d_prediction_logits,
                                (B, N // max(B, 1), self.config.vocab_size)),
                               ("d_hidden_states", d_hidden_states, (B, T, C))):
            if d is not None and tuple(d.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {tuple(d.shape)}")
        _, dtype, flat, mlm_cache, seq_cache = self.take_cache()
        xp = get_array_module(flat)
        dh = xp.zeros((B * T, C), dtype=dtype)                           # (B*T, C)
        dlogits = None
        if mlm_cache is not None:
            # forward: mlm_loss = cross_entropy(predictions(h[flat]), labels)
            dlogits = cross_entropy_backward(dloss, mlm_cache)           # (B*P, V)
        if d_prediction_logits is not None:
            # forward: prediction_logits = logits.reshape(B, P, V), also an output
            d = d_prediction_logits.reshape(N, -1).astype(dtype, copy=False)   # (B*P, V)
            dlogits = d if dlogits is None else dlogits + d
        if dlogits is not None:
            # forward: rows = h[flat]  ->  scatter-add, correct when a position repeats
            scatter_add_rows(dh, flat, self.lm_head.backward(dlogits))
        if d_hidden_states is not None:
            # forward: hidden_states = h, also an output  ->  its gradient adds in
            dh += d_hidden_states.reshape(B * T, C).astype(dtype, copy=False)
        d_pooled = None
        if seq_cache is not None:
            # forward: seq_loss = cross_entropy(sentence_head(pooler_output), label)
            d_pooled = self.sentence_head.backward(cross_entropy_backward(dloss, seq_cache))
        self.backbone.backward(dh.reshape(B, T, C), d_pooled)
