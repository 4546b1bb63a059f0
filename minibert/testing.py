"""Hypothesis strategies and assertions for testing layers and models (needs ``hypothesis``).

Our own tests use these, and they are public so that users can test their own layers the
same way:

    from hypothesis import given
    from minibert.testing import bert_configs, token_batches, assert_gradients_match

Shapes are drawn by hypothesis (so failures shrink to small shapes); the float values of
large arrays come from a NumPy generator seeded by a drawn integer, which is much faster
than drawing every element and still reproducible from the failing example.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from .gradcheck import rel_error
from .modeling import BertConfig

seeds = st.integers(min_value=0, max_value=2**32 - 1)


@st.composite
def float_arrays(draw, shape, scale: float = 1.0, dtype=np.float64):
    """A float array of the given shape (tuple or strategy of tuples), N(0, scale^2)."""
    if not isinstance(shape, tuple):
        shape = draw(shape)
    rng = np.random.default_rng(draw(seeds))
    return (rng.standard_normal(shape) * scale).astype(dtype)


@st.composite
def bert_configs(draw, max_hidden: int = 16, max_layers: int = 2, max_vocab: int = 40,
                 max_positions: int = 12, dropout: float = 0.0) -> BertConfig:
    """Small valid :class:`BertConfig` objects: heads dividing hidden size, every
    activation, both norm positions and both position-embedding types."""
    heads = draw(st.sampled_from([h for h in (1, 2, 4) if h <= max_hidden]))
    head_size = draw(st.integers(1, max(1, max_hidden // heads)))
    return BertConfig(
        vocab_size=draw(st.integers(8, max_vocab)),
        hidden_size=heads * head_size,
        num_hidden_layers=draw(st.integers(1, max_layers)),
        num_attention_heads=heads,
        intermediate_size=draw(st.integers(2, 2 * max_hidden)),
        hidden_act=draw(st.sampled_from(["gelu", "gelu_new", "relu"])),
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        max_position_embeddings=max_positions,
        position_embedding_type=draw(st.sampled_from(["absolute", "sinusoidal"])),
        norm_position=draw(st.sampled_from(["post", "pre"])),
        # a larger init than BERT's 0.02 keeps small-model gradients well away from zero
        initializer_range=0.5,
    )


@dataclass
class TokenBatch:
    """Inputs for BertForPreTraining, all NumPy int64: input_ids, token_type_ids,
    attention_mask, labels (B, T) and next_sentence_label (B,)."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    labels: np.ndarray
    next_sentence_label: np.ndarray

    def as_kwargs(self) -> dict:
        return dict(vars(self))


@st.composite
def token_batches(draw, config: BertConfig, max_batch: int = 3, max_len: int | None = None,
                  min_len: int = 1) -> TokenBatch:
    """A batch for ``config``: padding at the end of rows (at least one real token per
    row; id 0, the pad token, only at padded positions), segment ids 0 then 1, at least one masked label over the batch, labels only at
    real positions (-100 elsewhere), NSP labels 0/1."""
    max_len = min(max_len or config.max_position_embeddings, config.max_position_embeddings)
    B = draw(st.integers(1, max_batch))
    T = draw(st.integers(max(1, min_len), max(max_len, min_len)))
    rng = np.random.default_rng(draw(seeds))
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0] = T if draw(st.booleans()) else lengths[0]
    positions = np.arange(T)[None, :]
    attention_mask = (positions < lengths[:, None]).astype(np.int64)
    input_ids = rng.integers(1, config.vocab_size, size=(B, T)) * attention_mask  # 0 = [PAD]
    split = rng.integers(0, T + 1, size=B)
    token_type_ids = ((positions >= split[:, None]) & (attention_mask == 1)).astype(np.int64)
    token_type_ids %= config.type_vocab_size
    masked = (rng.random((B, T)) < 0.3) & (attention_mask == 1)
    masked[0, 0] = True
    labels = np.where(masked, rng.integers(0, config.vocab_size, size=(B, T)), -100)
    return TokenBatch(input_ids, token_type_ids, attention_mask, labels.astype(np.int64),
                      rng.integers(0, 2, size=B))


def assert_gradients_match(analytic, numerical, name: str = "gradient",
                           tol: float = 1e-6, atol: float = 1e-8) -> None:
    """Raise AssertionError naming ``name`` unless the :func:`rel_error` of the two is at
    most ``tol`` or they differ nowhere by more than ``atol`` (central differences carry
    an absolute noise of about 1e-10 |L| / h, which dominates where the true gradient is
    close to zero)."""
    a, b = np.asarray(analytic, dtype=np.float64), np.asarray(numerical, dtype=np.float64)
    err = rel_error(a, b)
    if not (err <= tol or np.abs(a - b).max(initial=0.0) <= atol):
        raise AssertionError(f"{name}: relative error {err:.3e} > {tol:.1e}\n"
                             f"analytic:  {a.ravel()[:6]}\n"
                             f"numerical: {b.ravel()[:6]}")
