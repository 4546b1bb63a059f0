"""The layer checks of the command line: every layer of minibert on small shapes.

Shape legend: B = batch, T = sequence length, C = hidden size, NH = heads,
I = intermediate size, V = vocab, N = rows (B * T).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .. import modeling as M
from ..nn import (IGNORE_INDEX, Activation, Dropout, Embedding, LayerNorm, Linear, Module,
                  extended_attention_mask)
# functions are looked up on their modules at call time, so that --perturb reaches them
from ..nn import activations as A, attention as Att, losses as Lo
from .core import GradcheckReport, check_module
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


def layer_checks(s: Shapes, seed: int = 0) -> dict[str, Callable[..., list[GradcheckReport]]]:
    """name -> function(**check_module keywords) returning the reports of that layer's
    checks (one per configuration, e.g. post- and pre-LN)."""
    B, T, C, NH, I, V = s.batch, s.seq_len, s.hidden, s.heads, s.intermediate, s.vocab
    dims = f"B={B} T={T} C={C}"

    def rng(k=0):
        return np.random.default_rng([seed, k])

    def x(*shape, k=1):
        return rng(k).standard_normal(shape)

    def linear(**kw):
        m = _set(Linear(C, I, rng=rng(), dtype=np.float64), rng(2))
        return [check_module(m, [x(B, T, C)], input_names=["x"], title=f"linear C={C} -> I={I}, "
                             f"{dims}", prefix="linear.", **kw)]

    def embedding(**kw):
        m = Embedding(V, C, rng=rng(), std=0.5, dtype=np.float64)
        ids = rng(3).integers(0, max(1, min(V, (B * T) // 2)), size=(B, T))  # repeated ids
        return [check_module(m, [ids], title=f"embedding V={V} C={C}, ids (B={B}, T={T}) "
                             "with repeats", prefix="embedding.", **kw)]

    def layernorm(**kw):
        m = _set(LayerNorm(C, dtype=np.float64), rng(2))
        return [check_module(m, [x(B, T, C) * 3 + 1], input_names=["x"],
                             title=f"layernorm {dims}", prefix="layernorm.", **kw)]

    def gelu(**kw):
        return [check_module(Activation(name), [x(B, T, I) * 2], input_names=["x"],
                             title=f"{name} ({'exact erf' if name == 'gelu' else 'tanh'}) "
                             f"B={B} T={T} I={I}", prefix=f"{name}.", **kw)
                for name in ("gelu", "gelu_new")]

    def softmax(**kw):
        def fwd(self, scores):
            probs, self.cache = A.softmax_forward(scores)       # (B, NH, T, T)
            return probs
        m = _module(fwd, lambda self, d: A.softmax_backward(d, self.cache))
        return [check_module(m, [x(B, NH, T, T) * 2], input_names=["scores"],
                             title=f"softmax over the last axis (B={B}, NH={NH}, T={T}, T={T})",
                             prefix="softmax.", **kw)]

    def attention(**kw):
        mask_add = _mask_add(rng(4), B, T)

        def fwd(self, q, k, v):  # a fresh generator per forward: the same dropout mask
            qkv = np.concatenate([q, k, v], axis=-1)             # (B, T, 3C), packed
            ctx, self.cache = Att.attention_forward(qkv, mask_add, NH, s.dropout,
                                                    np.random.default_rng(seed))
            return ctx                                           # (B, T, C)

        def bwd(self, d):  # the packed gradient, reported per projection
            return tuple(np.split(Att.attention_backward(d, self.cache), 3, axis=-1))
        m = _module(fwd, bwd)
        return [check_module(m, [x(B, T, C, k=5), x(B, T, C, k=6), x(B, T, C, k=7)],
                             input_names=["q", "k", "v"],
                             title=f"attention core {dims} NH={NH}, padding mask, dropout "
                             f"{s.dropout} (fixed mask)", prefix="attention.", **kw)]

    def ffn(**kw):
        config = _config(s)
        inter = _set(M.BertIntermediate(config, rng(), np.float64), rng(2))
        out = _set(M.BertOutput(I, config, rng(), np.float64), rng(3))

        def fwd(self, h):
            return self.output(self.intermediate(h), h)

        def bwd(self, d):
            di, dres = self.output.backward(d)
            return self.intermediate.backward(di) + dres
        m = _module(fwd, bwd, intermediate=inter, output=out)
        return [check_module(m, [x(B, T, C)], input_names=["x"],
                             title=f"feed-forward sub-layer (dense, GELU, dense, residual, "
                             f"post-LN) {dims} I={I}", prefix="ffn.", **kw)]

    def encoder_layer(**kw):
        reports = []
        for norm in ("post", "pre"):
            m = _set(M.BertLayer(_config(s, norm, s.dropout), rng(), np.float64), rng(2))

            def reset(m=m):  # the same generator state before every forward: same masks
                for d in m.modules():
                    if isinstance(d, Dropout):
                        d.rng = np.random.default_rng(seed)
            m_add = _mask_add(rng(4), B, T)
            wrapped = _module(lambda self, h, m=m: m(h, m_add), lambda self, d, m=m: m.backward(d),
                              layer=m)
            reports.append(check_module(
                wrapped, [x(B, T, C)], input_names=["x"], before_forward=reset,
                title=f"encoder layer, {norm}-LN, {dims} NH={NH} I={I}, padding mask, dropout "
                f"{s.dropout} (fixed masks)", prefix=f"{norm}.", **kw))
        return reports

    def mlm_head(**kw):
        config = _config(s)
        emb = Embedding(V, C, rng=rng(), std=0.5, dtype=np.float64)
        head = _set(M.BertLMPredictionHead(config, emb, rng(), np.float64), rng(2))
        N = B * T
        return [check_module(head, [x(N, C)], input_names=["h"],
                             title=f"MLM head (transform + tied decoder) N={N} C={C} V={V}",
                             prefix="predictions.", **kw)]

    def nsp_head(**kw):
        config = _config(s)
        pooler = _set(M.BertPooler(config, rng(), np.float64), rng(2))
        seq = _set(Linear(C, 2, rng=rng(), dtype=np.float64), rng(3))
        # the pooler reads position 0 only, so the checked input is h[:, 0] (B, C)
        m = _module(lambda self, h0: self.seq_relationship(self.pooler(h0[:, None, :])),
                    lambda self, d: self.pooler.backward(self.seq_relationship.backward(d)),
                    pooler=pooler, seq_relationship=seq)
        return [check_module(m, [x(B, C)], input_names=["h[:, 0]"],
                             title=f"NSP head (pooler tanh(dense(h[:, 0])), then dense C -> 2) "
                             f"B={B} C={C}", prefix="nsp.", **kw)]

    def cross_entropy(**kw):
        reports = []
        N = B * T
        labels = rng(8).integers(0, V, size=N)
        labels[rng(9).random(N) < 0.3] = IGNORE_INDEX
        labels[0] = 1
        for eps in (0.0, s.label_smoothing):
            def fwd(self, logits, eps=eps):
                loss, self.cache = Lo.cross_entropy_forward(logits, labels, eps)
                return loss
            m = _module(fwd, lambda self, d: Lo.cross_entropy_backward(d, self.cache))
            reports.append(check_module(
                m, [x(N, V) * 2], input_names=["logits"],
                loss=lambda out: (out * 1.7, np.float64(1.7)),
                title=f"softmax cross-entropy N={N} K={V}, "
                f"{int((labels == IGNORE_INDEX).sum())} ignored rows, label smoothing {eps}",
                prefix=f"cross_entropy(eps={eps}).", **kw))
        return reports

    def distillation(**kw):
        from .. import distillation as D
        N, Ct = B * T, C + 2
        weights = (rng(11).random(N) < 0.7).astype(np.float64)
        weights[0] = 1.0
        teacher_logits = x(N, V, k=12) * 2
        mask = (_mask_add(rng(13), B, T)[:, 0, 0, :] == 0).astype(np.int64)      # (B, T)
        teacher_h = x(B, T, Ct, k=14)
        scores = x(B, NH, T, T, k=15) + _mask_add(rng(13), B, T)
        teacher_probs = A.softmax_forward(x(B, NH, T, T, k=16) + _mask_add(rng(13), B, T))[0]

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

        proj = _set(Linear(C, Ct, bias=False, rng=rng(), dtype=np.float64), rng(2))
        scalar = dict(loss=lambda out: (out * 1.3, np.float64(1.3)))
        return [
            check_module(_module(kl_fwd, lambda self, d: D.soft_target_kl_backward(d, self.cache)),
                         [x(N, V) * 2], input_names=["logits"], **scalar,
                         title=f"soft-target KL at T=2 (Hinton et al.) N={N} V={V}, "
                         f"{int((weights == 0).sum())} uncounted rows", prefix="kl.", **kw),
            check_module(_module(cos_fwd, lambda self, d: self.hidden_projection.backward(
                D.cosine_loss_backward(d, self.cache)), hidden_projection=proj),
                [x(B, T, C)], input_names=["h"], **scalar,
                title=f"cosine loss through W_h (C={C} -> {Ct}) {dims}, padding",
                prefix="cos.", **kw),
            check_module(_module(att_fwd, lambda self, d: A.softmax_backward(
                D.attention_kl_backward(d, self.cache), self.softmax_cache)),
                [scores], input_names=["scores"], **scalar,
                title=f"attention KL (MiniLM) after the softmax, B={B} NH={NH} T={T}, padding",
                prefix="att.", **kw),
        ]

    def model(**kw):
        reports = []
        for norm in ("post", "pre"):
            config = _config(s, norm, s.dropout)
            net = M.BertForPreTraining(config, seed=seed, dtype=np.float64,
                                       label_smoothing=s.label_smoothing)
            batch = random_token_batch(config, rng(10), B, T, first_row_full=True)
            reports.append(check_module(
                net, list(batch.values()), loss=lambda out: (out.loss, None),
                before_forward=lambda net=net: net.set_dropout_rng(np.random.default_rng(seed)),
                title=f"BertForPreTraining {norm}-LN, L={s.layers} {dims} NH={NH} I={I} V={V}: "
                f"MLM + NSP loss, padding, dropout {s.dropout} (fixed masks), label smoothing "
                f"{s.label_smoothing}", prefix=f"{norm}:", **kw))
        return reports

    return dict(linear=linear, embedding=embedding, layernorm=layernorm, gelu=gelu,
                softmax=softmax, attention=attention, ffn=ffn, encoder_layer=encoder_layer,
                mlm_head=mlm_head, nsp_head=nsp_head, cross_entropy=cross_entropy,
                distillation=distillation, model=model)


LAYERS = ("linear", "embedding", "layernorm", "gelu", "softmax", "attention", "ffn",
          "encoder_layer", "mlm_head", "nsp_head", "cross_entropy", "distillation", "model")


def run_checks(layers: Sequence[str], shapes: Shapes, seed: int = 0,
               perturbation: str | None = None, **check_kw) -> list[GradcheckReport]:
    """Run the named layer checks (see :data:`LAYERS`), optionally under a perturbation
    (see :data:`~minibert.gradcheck.PERTURBATIONS`); ``check_kw`` go to
    :func:`~minibert.gradcheck.check_module` (tol, atol, full_max_size ...).

    Returns one report per checked configuration.
    Raises:
        ValueError: an unknown layer or perturbation name.
    """
    unknown = [name for name in layers if name not in LAYERS]
    if unknown:
        raise ValueError(f"unknown layer(s) {unknown}: expected {', '.join(LAYERS)} or all")
    checks = layer_checks(shapes, seed)
    reports = []
    with perturbed(perturbation):
        for name in layers:
            reports.extend(checks[name](seed=seed, **check_kw))
    return reports
