"""The layer checks of the command line: every layer of minibert on small shapes.

Shape legend: B = batch, T = sequence length, C = hidden size, NH = heads,
I = intermediate size, V = vocab, N = rows (B * T).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from .. import modeling as M
from ..nn import (IGNORE_INDEX, Activation, Dropout, Embedding, LayerNorm, Linear, Module,
                  extended_attention_mask)
# functions are looked up on their modules at call time, so that --perturb reaches them
from ..nn import activations as A, attention as Att, losses as Lo
from .core import GradcheckReport, check_module, check_tolerances
from .perturbations import perturbed


@dataclass
class Shapes:
    """Sizes of the command-line checks: batch B, sequence T, hidden C, heads NH,
    intermediate I, vocab V, encoder layers L (all positive; NH divides C), the dropout
    probability (masks fixed during a check) and the label smoothing of the losses."""

    batch: int = 2
    seq_len: int = 5
    hidden: int = 8
    heads: int = 2
    intermediate: int = 16
    vocab: int = 12
    layers: int = 2
    dropout: float = 0.1
    label_smoothing: float = 0.1

    def float64_terms(self) -> dict[tuple[str, str], int]:
        """The float64 values the largest arrays of the checks hold, keyed by (the options
        they grow with, what they are): attention probabilities and their cache (B NH T^2
        per layer, ~4 live), feed-forward activations (B T I per layer), the other
        activations (B T C, ~16 per layer), the MLM logits and their gradient (B T V, ~4),
        the embedding table and the weights (V C, L (4 C^2 + 2 C I), ~4 each: data,
        gradient and the finite-difference copies)."""
        B, T, C, NH, I, V, L = (self.batch, self.seq_len, self.hidden, self.heads,
                                self.intermediate, self.vocab, self.layers)
        return {("--batch x --heads x --seq-len^2", "attention"): 4 * B * NH * T * T * L,
                ("--batch x --seq-len x --intermediate", "feed-forward"): 4 * B * T * I * L,
                ("--batch x --seq-len x --hidden", "activations"): 16 * B * T * C * L,
                ("--batch x --seq-len x --vocab", "MLM logits"): 4 * B * T * V,
                ("--vocab x --hidden", "embeddings"): 4 * V * C,
                ("--layers x --hidden x --intermediate", "weights"):
                    4 * L * (4 * C * C + 2 * C * I)}

    def check_fits(self) -> None:
        """Refuse sizes whose float64 arrays (:meth:`float64_terms`) cannot fit in the
        memory available (:func:`minibert.untrusted.available_memory`), before any is
        allocated; nothing is refused where that memory is not known.

        Raises:
            ValueError: naming the options of the largest term and the bytes.
        """
        from ..untrusted import available_memory
        terms = self.float64_terms()
        need, avail = 8 * sum(terms.values()), available_memory()
        if avail is not None and need > avail:
            options, what = max(terms, key=terms.get)
            raise ValueError(
                f"{options} too large: the checks need ~{need / 1e9:.3g} GB of float64 "
                f"arrays ({what} the largest), more than the {avail / 1e9:.3g} GB of memory "
                f"available (batch {self.batch}, seq-len {self.seq_len}, hidden "
                f"{self.hidden}, heads {self.heads}, intermediate {self.intermediate}, "
                f"vocab {self.vocab}, layers {self.layers})")


def random_token_batch(config, rng: np.random.Generator, batch: int, seq_len: int,
                       first_row_full: bool = False) -> dict:
    """Random BertForPreTraining inputs for ``config`` as a dict of int64 NumPy arrays.

    Rows are padded at the end, with at least one real token each (``attention_mask``
    (B, T) 0/1); id 0 ([PAD]) only at padded positions; segment ids 0 then 1 on real
    positions; MLM targets at ~30% of real positions (always at [0, 0]) in the fixed-shape
    form ``masked_lm_positions`` / ``masked_lm_ids`` (B, P) int64 and ``masked_lm_weights``
    (B, P) int64 0/1 (integers, so gradient checks do not take them for inputs; see
    :func:`minibert.modeling.masked_lm_from_labels`); ``next_sentence_label`` (B,) 0/1.
    Keys in the positional order of ``BertForPreTraining.forward``.
    :func:`minibert.testing.token_batches` draws its batches through this function.
    """
    B, T = batch, seq_len
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0] = T if first_row_full else lengths[0]
    positions = np.arange(T)[None, :]
    attention_mask = (positions < lengths[:, None]).astype(np.int64)
    input_ids = rng.integers(1, config.vocab_size, size=(B, T)) * attention_mask  # 0 = [PAD]
    split = rng.integers(0, T + 1, size=B)
    token_type_ids = ((positions >= split[:, None]) & (attention_mask == 1)).astype(np.int64)
    token_type_ids %= config.type_vocab_size
    masked = (rng.random((B, T)) < 0.3) & (attention_mask == 1)
    masked[0, 0] = True
    labels = np.where(masked, rng.integers(0, config.vocab_size, size=(B, T)), IGNORE_INDEX)
    positions, ids, weights = M.masked_lm_from_labels(labels)
    return dict(input_ids=input_ids, token_type_ids=token_type_ids,
                attention_mask=attention_mask, masked_lm_positions=positions,
                masked_lm_ids=ids, masked_lm_weights=weights.astype(np.int64),
                next_sentence_label=rng.integers(0, 2, size=B))


def _config(s: Shapes, norm_position: str = "post", dropout: float = 0.0) -> M.BertConfig:
    return M.BertConfig(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                        num_attention_heads=s.heads, intermediate_size=s.intermediate,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        max_position_embeddings=s.seq_len, norm_position=norm_position,
                        initializer_range=0.5)


def _module(forward, backward, **children) -> Module:
    """A throw-away Module from two functions of (self, ...); ``children`` become its
    attributes (and so give it its parameters)."""

    class _Wrapped(Module):
        def forward(self, *a):
            return forward(self, *a)

        def backward(self, *d):
            return backward(self, *d)
    m = _Wrapped()
    for k, v in children.items():
        setattr(m, k, v)
    return m


def _set(module, rng):
    """Random N(0, 0.25) parameter values (so LayerNorm weights are not all ones, biases
    not zero)."""
    for _, p in module.named_parameters():
        p.data[...] = rng.standard_normal(p.data.shape) * 0.5
    return module


def _mask_add(rng, B, T):
    """A (B, 1, 1, T) float64 additive padding mask; row 0 has no padding."""
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0] = T
    return extended_attention_mask((np.arange(T)[None] < lengths[:, None]).astype(np.int64),
                                   np.float64)


@dataclass
class _Case:
    """One checked configuration: :func:`~minibert.gradcheck.check_module`'s arguments."""

    module: Module
    inputs: list
    title: str
    prefix: str
    input_names: list[str] | None = None
    loss: Callable | None = None
    before_forward: Callable[[], None] | None = None


def _scaled(c: float):
    """The loss of a scalar output: L = c * out, upstream c (c != 1 exposes a backward that
    ignores its upstream gradient)."""
    return lambda out: (out * c, np.float64(c))


class _Draws:
    """The sizes of one catalogue run and its random draws: ``rng(k)`` a fresh generator
    for key k (so that no check depends on another's draws), ``x(*shape, k=k)`` N(0, 1)
    values from it; ``dims`` the "B=.. T=.. C=.." of the titles."""

    def __init__(self, s: Shapes, seed: int):
        self.s, self.seed = s, seed
        self.B, self.T, self.C, self.NH = s.batch, s.seq_len, s.hidden, s.heads
        self.I, self.V, self.N = s.intermediate, s.vocab, s.batch * s.seq_len
        self.dims = f"B={self.B} T={self.T} C={self.C}"

    def rng(self, k: int = 0) -> np.random.Generator:
        return np.random.default_rng([self.seed, k])

    def x(self, *shape: int, k: int = 1) -> np.ndarray:
        return self.rng(k).standard_normal(shape)


# The entries: each yields its cases one at a time, built only when its check runs (inside
# a --perturb swap, so that a module picks up the swapped functions).

def _linear(d: _Draws):
    m = _set(Linear(d.C, d.I, rng=d.rng(), dtype=np.float64), d.rng(2))
    yield _Case(m, [d.x(d.B, d.T, d.C)], f"linear C={d.C} -> I={d.I}, {d.dims}", "linear.",
                ["x"])


def _embedding(d: _Draws):
    m = Embedding(d.V, d.C, rng=d.rng(), std=0.5, dtype=np.float64)
    ids = d.rng(3).integers(0, max(1, min(d.V, d.N // 2)), size=(d.B, d.T))  # repeated ids
    yield _Case(m, [ids], f"embedding V={d.V} C={d.C}, ids (B={d.B}, T={d.T}) with repeats",
                "embedding.")


def _layernorm(d: _Draws):
    m = _set(LayerNorm(d.C, dtype=np.float64), d.rng(2))
    yield _Case(m, [d.x(d.B, d.T, d.C) * 3 + 1], f"layernorm {d.dims}", "layernorm.", ["x"])


def _gelu(d: _Draws):
    for name in ("gelu", "gelu_new"):
        yield _Case(Activation(name), [d.x(d.B, d.T, d.I) * 2],
                    f"{name} ({'exact erf' if name == 'gelu' else 'tanh'}) B={d.B} T={d.T} "
                    f"I={d.I}", f"{name}.", ["x"])


def _softmax(d: _Draws):
    def fwd(self, scores):
        probs, self.cache = A.softmax_forward(scores)           # (B, NH, T, T)
        return probs
    m = _module(fwd, lambda self, g: A.softmax_backward(g, self.cache))
    yield _Case(m, [d.x(d.B, d.NH, d.T, d.T) * 2],
                f"softmax over the last axis (B={d.B}, NH={d.NH}, T={d.T}, T={d.T})",
                "softmax.", ["scores"])


def _attention(d: _Draws):
    mask_add = _mask_add(d.rng(4), d.B, d.T)

    def fwd(self, q, k, v):  # a fresh generator per forward: the same dropout mask
        qkv = np.concatenate([q, k, v], axis=-1)                 # (B, T, 3C), packed
        ctx, self.cache = Att.attention_forward(qkv, mask_add, d.NH, d.s.dropout,
                                                np.random.default_rng(d.seed))
        return ctx                                               # (B, T, C)

    def bwd(self, g):  # the packed gradient, reported per projection
        return tuple(np.split(Att.attention_backward(g, self.cache), 3, axis=-1))
    yield _Case(_module(fwd, bwd), [d.x(d.B, d.T, d.C, k=k) for k in (5, 6, 7)],
                f"attention core {d.dims} NH={d.NH}, padding mask, dropout {d.s.dropout} "
                "(fixed mask)", "attention.", ["q", "k", "v"])


def _ffn(d: _Draws):
    config = _config(d.s)
    inter = _set(M.BertIntermediate(config, d.rng(), np.float64), d.rng(2))
    out = _set(M.BertOutput(d.I, config, d.rng(), np.float64), d.rng(3))

    def bwd(self, g):
        di, dres = self.output.backward(g)
        return self.intermediate.backward(di) + dres
    m = _module(lambda self, h: self.output(self.intermediate(h), h), bwd,
                intermediate=inter, output=out)
    yield _Case(m, [d.x(d.B, d.T, d.C)], "feed-forward sub-layer (dense, GELU, dense, "
                f"residual, post-LN) {d.dims} I={d.I}", "ffn.", ["x"])


def _encoder_layer(d: _Draws):
    for norm in ("post", "pre"):
        m = _set(M.BertLayer(_config(d.s, norm, d.s.dropout), d.rng(), np.float64), d.rng(2))

        def reset(m=m):  # the same generator state before every forward: same masks
            for layer in m.modules():
                if isinstance(layer, Dropout):
                    layer.rng = np.random.default_rng(d.seed)
        m_add = _mask_add(d.rng(4), d.B, d.T)
        wrapped = _module(lambda self, h, m=m, m_add=m_add: m(h, m_add),
                          lambda self, g, m=m: m.backward(g), layer=m)
        yield _Case(wrapped, [d.x(d.B, d.T, d.C)],
                    f"encoder layer, {norm}-LN, {d.dims} NH={d.NH} I={d.I}, padding mask, "
                    f"dropout {d.s.dropout} (fixed masks)", f"{norm}.", ["x"],
                    before_forward=reset)


def _mlm_head(d: _Draws):
    emb = Embedding(d.V, d.C, rng=d.rng(), std=0.5, dtype=np.float64)
    head = _set(M.BertLMPredictionHead(_config(d.s), emb, d.rng(), np.float64), d.rng(2))
    yield _Case(head, [d.x(d.N, d.C)], f"MLM head (transform + tied decoder) N={d.N} "
                f"C={d.C} V={d.V}", "predictions.", ["h"])


def _nsp_head(d: _Draws):
    pooler = _set(M.BertPooler(_config(d.s), d.rng(), np.float64), d.rng(2))
    seq = _set(Linear(d.C, 2, rng=d.rng(), dtype=np.float64), d.rng(3))
    # the pooler reads position 0 only, so the checked input is h[:, 0] (B, C)
    m = _module(lambda self, h0: self.seq_relationship(self.pooler(h0[:, None, :])),
                lambda self, g: self.pooler.backward(self.seq_relationship.backward(g)),
                pooler=pooler, seq_relationship=seq)
    yield _Case(m, [d.x(d.B, d.C)], "NSP head (pooler tanh(dense(h[:, 0])), then dense "
                f"C -> 2) B={d.B} C={d.C}", "nsp.", ["h[:, 0]"])


def _cross_entropy(d: _Draws):
    labels = d.rng(8).integers(0, d.V, size=d.N)
    labels[d.rng(9).random(d.N) < 0.3] = IGNORE_INDEX
    labels[0] = 1
    for eps in (0.0, d.s.label_smoothing):
        def fwd(self, logits, eps=eps):
            loss, self.cache = Lo.cross_entropy_forward(logits, labels, eps)
            return loss
        m = _module(fwd, lambda self, g: Lo.cross_entropy_backward(g, self.cache))
        yield _Case(m, [d.x(d.N, d.V) * 2], f"softmax cross-entropy N={d.N} K={d.V}, "
                    f"{int((labels == IGNORE_INDEX).sum())} ignored rows, label smoothing {eps}",
                    f"cross_entropy(eps={eps}).", ["logits"], _scaled(1.7))


def _distillation(d: _Draws):
    from .. import distillation as D
    B, T, C, NH, N, Ct = d.B, d.T, d.C, d.NH, d.N, d.C + 2
    weights = (d.rng(11).random(N) < 0.7).astype(np.float64)
    weights[0] = 1.0
    teacher_logits = d.x(N, d.V, k=12) * 2
    mask = (_mask_add(d.rng(13), B, T)[:, 0, 0, :] == 0).astype(np.int64)     # (B, T)
    teacher_h = d.x(B, T, Ct, k=14)
    scores = d.x(B, NH, T, T, k=15) + _mask_add(d.rng(13), B, T)
    teacher_probs = A.softmax_forward(d.x(B, NH, T, T, k=16) + _mask_add(d.rng(13), B, T))[0]

    def kl_fwd(self, logits):
        loss, self.cache = D.soft_target_kl_forward(logits, teacher_logits, weights, 2.0)
        return loss

    def cos_fwd(self, h):  # through the learned projection W_h (C -> Ct)
        loss, self.cache = D.cosine_loss_forward(self.hidden_projection(h), teacher_h, mask)
        return loss

    def att_fwd(self, scores):  # the student's probabilities from its scores
        probs, self.softmax_cache = A.softmax_forward(scores)
        loss, self.cache = D.attention_kl_forward(probs, teacher_probs, mask)
        return loss

    proj = _set(Linear(C, Ct, bias=False, rng=d.rng(), dtype=np.float64), d.rng(2))
    yield _Case(_module(kl_fwd, lambda self, g: D.soft_target_kl_backward(g, self.cache)),
                [d.x(N, d.V) * 2], f"soft-target KL at T=2 (Hinton et al.) N={N} V={d.V}, "
                f"{int((weights == 0).sum())} uncounted rows", "kl.", ["logits"], _scaled(1.3))
    yield _Case(_module(cos_fwd, lambda self, g: self.hidden_projection.backward(
        D.cosine_loss_backward(g, self.cache)), hidden_projection=proj),
        [d.x(B, T, C)], f"cosine loss through W_h (C={C} -> {Ct}) {d.dims}, padding", "cos.",
        ["h"], _scaled(1.3))
    yield _Case(_module(att_fwd, lambda self, g: A.softmax_backward(
        D.attention_kl_backward(g, self.cache), self.softmax_cache)),
        [scores], f"attention KL (MiniLM) after the softmax, B={B} NH={NH} T={T}, padding",
        "att.", ["scores"], _scaled(1.3))


def _pretraining_case(d: _Draws, model_class, config, title: str, prefix: str) -> _Case:
    """A whole pretraining model of ``config`` in float64 on a random padded batch, its
    loss the model's own (MLM + the sentence-level objective), the same dropout masks at
    every evaluation."""
    net = model_class(config, seed=d.seed, dtype=np.float64, label_smoothing=d.s.label_smoothing)
    batch = random_token_batch(config, d.rng(10), d.B, d.T, first_row_full=True)
    batch[net.sentence_label] = batch.pop("next_sentence_label")
    return _Case(net, list(batch.values()), title, prefix, loss=lambda out: (out.loss, None),
                 before_forward=lambda: net.set_dropout_rng(np.random.default_rng(d.seed)))


def _model(d: _Draws):
    s = d.s
    for norm in ("post", "pre"):
        yield _pretraining_case(
            d, M.BertForPreTraining, _config(s, norm, s.dropout),
            f"BertForPreTraining {norm}-LN, L={s.layers} {d.dims} NH={d.NH} I={d.I} "
            f"V={d.V}: MLM + NSP loss, padding, dropout {s.dropout} (fixed masks), "
            f"label smoothing {s.label_smoothing}", f"{norm}:")


def _albert(d: _Draws):
    """AlbertForPreTraining twice: one group of two layers shared by every depth, E < H
    (the shared gradients sum over depths), and one group per depth with E = H."""
    from ..albert import AlbertConfig, AlbertForPreTraining
    s = d.s
    for groups, inner, E in ((1, 2, max(3, s.hidden // 2)), (s.layers, 1, s.hidden)):
        config = AlbertConfig(
            vocab_size=s.vocab, embedding_size=E, hidden_size=s.hidden,
            num_hidden_layers=s.layers, num_hidden_groups=groups, num_attention_heads=s.heads,
            intermediate_size=s.intermediate, inner_group_num=inner,
            hidden_dropout_prob=s.dropout, attention_probs_dropout_prob=s.dropout,
            classifier_dropout_prob=s.dropout, max_position_embeddings=s.seq_len,
            initializer_range=0.5)
        yield _pretraining_case(
            d, AlbertForPreTraining, config,
            f"AlbertForPreTraining, {groups} group(s) of {inner} layer(s) over "
            f"L={s.layers} depths, E={E} {d.dims} NH={d.NH} I={d.I} V={d.V}: MLM + "
            f"SOP loss, padding, dropout {s.dropout} (fixed masks)", f"G={groups}:")


def _electra(d: _Draws):
    """ELECTRA (minibert.electra): the discriminator (replaced-token BCE over real tokens)
    with E < H through ``embeddings_project``, and the generator (MLM, decoder tied to the
    E-wide word embeddings) with E = H, no projection."""
    from ..electra import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining
    s = d.s
    for cls, E in ((ElectraForPreTraining, max(3, s.hidden // 2)),
                   (ElectraForMaskedLM, s.hidden)):
        config = ElectraConfig(
            vocab_size=s.vocab, embedding_size=E, hidden_size=s.hidden,
            num_hidden_layers=s.layers, num_attention_heads=s.heads,
            intermediate_size=s.intermediate, hidden_dropout_prob=s.dropout,
            attention_probs_dropout_prob=s.dropout, max_position_embeddings=s.seq_len,
            initializer_range=0.5)
        net = cls(config, seed=d.seed, dtype=np.float64)
        batch = random_token_batch(config, d.rng(11), d.B, d.T, first_row_full=True)
        batch.pop("next_sentence_label")
        if cls is ElectraForPreTraining:
            inputs = [batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                      d.rng(12).integers(0, 2, batch["input_ids"].shape)]
            what = "replaced-token BCE over real tokens"
        else:
            inputs = list(batch.values())
            what = "MLM loss, tied decoder"
        yield _Case(net, inputs, f"{cls.__name__}, E={E} {d.dims} L={s.layers} NH={d.NH} "
                    f"I={d.I} V={d.V}: {what}, padding, dropout {s.dropout} (fixed masks)",
                    f"{'disc' if cls is ElectraForPreTraining else 'gen'}:",
                    loss=lambda out: (out.loss, None),
                    before_forward=lambda net=net: net.set_dropout_rng(
                        np.random.default_rng(d.seed)))


# the catalogue: name -> entry, in the order of --layer all
_ENTRIES: dict[str, Callable[[_Draws], Iterator[_Case]]] = {
    "linear": _linear, "embedding": _embedding, "layernorm": _layernorm, "gelu": _gelu,
    "softmax": _softmax, "attention": _attention, "ffn": _ffn,
    "encoder_layer": _encoder_layer, "mlm_head": _mlm_head, "nsp_head": _nsp_head,
    "cross_entropy": _cross_entropy, "distillation": _distillation, "model": _model,
    "albert": _albert, "electra": _electra,
}
LAYERS = tuple(_ENTRIES)


def layer_checks(s: Shapes, seed: int = 0) -> dict[str, Callable[..., list[GradcheckReport]]]:
    """name -> function(**check_module keywords) returning the reports of that layer's
    checks (one per configuration, e.g. post- and pre-LN), for every name of
    :data:`LAYERS`. A layer's modules and inputs are built when its function is called."""
    draws = _Draws(s, seed)

    def checks(entry):
        return lambda **kw: [
            check_module(case.module, case.inputs, case.loss, input_names=case.input_names,
                         before_forward=case.before_forward, title=case.title,
                         prefix=case.prefix, **kw)
            for case in entry(draws)]
    return {name: checks(entry) for name, entry in _ENTRIES.items()}


def run_checks(layers: Sequence[str], shapes: Shapes, seed: int = 0,
               perturbation: str | None = None, **check_kw) -> list[GradcheckReport]:
    """Run the named layer checks (see :data:`LAYERS`), optionally under a perturbation
    (see :data:`~minibert.gradcheck.PERTURBATIONS`); ``check_kw`` go to
    :func:`~minibert.gradcheck.check_module` (tol, atol, full_max_size ...).

    Returns one report per checked configuration.
    Raises:
        ValueError: an unknown layer or perturbation name; sizes that do not fit in memory
            (:meth:`Shapes.check_fits`); a tolerance that is not a finite number > 0.
    """
    unknown = [name for name in layers if name not in LAYERS]
    if unknown:
        raise ValueError(f"unknown layer(s) {unknown}: expected {', '.join(LAYERS)} or all")
    shapes.check_fits()
    check_tolerances(**{k: v for k, v in check_kw.items() if k in ("tol", "atol", "h")})
    checks = layer_checks(shapes, seed)
    reports = []
    with perturbed(perturbation):
        for name in layers:
            reports.extend(checks[name](seed=seed, **check_kw))
    return reports
