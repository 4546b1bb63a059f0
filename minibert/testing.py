"""Hypothesis strategies and assertions for testing layers and models (needs ``hypothesis``).

Our own tests use these, and they are public so that users can test their own layers the
same way:

    from hypothesis import given
    from minibert.testing import bert_configs, token_batches, assert_gradients_match

    @given(config=bert_configs(max_hidden=8), data=st.data())
    def test_my_layer(config, data):
        x = data.draw(hidden_states(config))                 # (B, T, C) float64
        assert_module_gradients(MyLayer(config), [x])        # raises with the table

What is here: ``seeds``; ``float_arrays(shape)`` and ``layer_shapes()`` for layer inputs;
``bert_configs(max_hidden=...)`` and ``albert_configs(...)``; ``padding_masks(B, T)`` (at
least one real token per row); ``token_batches(config)`` (model inputs); ``hidden_states(config)`` and
``attention_inputs()`` (inputs of one sub-layer); ``assert_gradients_match`` (two arrays)
and ``assert_module_gradients`` (a whole Module, via :func:`minibert.gradcheck.check_module`);
``product_round_off`` and ``assert_products_agree`` (two computations of one matrix product,
e.g. a fast path against the formula, compared within the round-off that any BLAS kernel
may show).

Shapes are drawn by hypothesis (so failures shrink to small shapes); the float values of
large arrays come from a NumPy generator seeded by a drawn integer, which is much faster
than drawing every element and still reproducible from the failing example.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from hypothesis import strategies as st

from . import backend
from .albert import AlbertConfig
from .gradcheck import (GradcheckReport, check_module, check_tensor, random_token_batch,
                        rel_error)
from .modeling import BertConfig
from .nn import extended_attention_mask

seeds = st.integers(min_value=0, max_value=2**32 - 1)


@st.composite
def float_arrays(draw, shape, scale: float = 1.0, dtype=np.float64):
    """A float array of the given shape (tuple or strategy of tuples), N(0, scale^2).

    Values come from a NumPy generator seeded by a drawn integer (fast, reproducible from
    the failing example); ``dtype`` float64 by default, as gradient checks need."""
    if not isinstance(shape, tuple):
        shape = draw(shape)
    rng = np.random.default_rng(draw(seeds))
    return (rng.standard_normal(shape) * scale).astype(dtype)


def layer_shapes(min_dims: int = 1, max_dims: int = 3, min_side: int = 1, max_side: int = 5,
                 last: int | st.SearchStrategy | None = None) -> st.SearchStrategy:
    """Shapes of layer inputs (..., C): ``min_dims`` to ``max_dims`` axes of
    ``min_side``..``max_side`` entries; ``last`` fixes (int) or draws (strategy) the
    feature axis C. For ``float_arrays(layer_shapes(last=8))``."""
    lead = st.lists(st.integers(min_side, max_side), min_size=max(0, min_dims - 1),
                    max_size=max(0, max_dims - 1))
    if last is None:
        last = st.integers(min_side, max_side)
    elif isinstance(last, int):
        last = st.just(last)
    return st.tuples(lead, last).map(lambda t: (*t[0], t[1]))


@st.composite
def bert_configs(draw, max_hidden: int = 16, max_layers: int = 2, max_vocab: int = 40,
                 max_positions: int = 12, dropout: float = 0.0,
                 min_hidden: int = 3) -> BertConfig:
    """Small valid :class:`BertConfig` objects: heads dividing hidden size, every
    activation, both norm positions and both position-embedding types.

    The hidden size is at least 3: a LayerNorm over 2 features outputs +-1 whatever its
    input, so every gradient below it is ~0 and a gradient check compares only rounding
    noise. Gradient checks with dropout ask for ``min_hidden=8``: at hidden size 4 dropout
    0.3 zeroes a whole row about once in 120, a LayerNorm then sees a constant row, and at
    variance 0 its eps of 1e-12 bends the function on the scale of a central-difference
    step. Raises ValueError when ``max_hidden`` < max(3, min_hidden)."""
    low = max(3, min_hidden)
    if max_hidden < low:
        raise ValueError(f"bert_configs: max_hidden must be at least {low}, got {max_hidden}")
    heads = draw(st.sampled_from([h for h in (1, 2, 4) if h * -(-low // h) <= max_hidden]))
    head_size = draw(st.integers(-(-low // heads), max_hidden // heads))  # C = NH * HS >= low
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


@st.composite
def albert_configs(draw, max_hidden: int = 16, max_layers: int = 3, max_groups: int = 3,
                   max_inner: int = 2, max_vocab: int = 40, max_positions: int = 12,
                   dropout: float = 0.0, min_hidden: int = 3) -> AlbertConfig:
    """Small valid :class:`~minibert.albert.AlbertConfig` objects: heads dividing the
    hidden size H, an embedding size E in [3, H] (E = H about half the time), 1 to
    ``max_layers`` depths applying 1 to ``max_groups`` groups (at most one per depth) of 1
    to ``max_inner`` layers, every activation, both position-embedding types. Sizes of at
    least 3 for the reason given in :func:`bert_configs`. Raises ValueError when
    ``max_hidden`` < max(3, min_hidden)."""
    bert = draw(bert_configs(max_hidden=max_hidden, max_layers=max_layers, max_vocab=max_vocab,
                             max_positions=max_positions, dropout=dropout,
                             min_hidden=min_hidden))
    H, L = bert.hidden_size, bert.num_hidden_layers
    E = draw(st.one_of(st.just(H), st.integers(3, H)))
    return AlbertConfig(
        vocab_size=bert.vocab_size, embedding_size=E, hidden_size=H, num_hidden_layers=L,
        num_hidden_groups=draw(st.integers(1, min(L, max_groups))),
        num_attention_heads=bert.num_attention_heads,
        intermediate_size=bert.intermediate_size,
        inner_group_num=draw(st.integers(1, max_inner)), hidden_act=bert.hidden_act,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
        classifier_dropout_prob=dropout, max_position_embeddings=max_positions,
        position_embedding_type=bert.position_embedding_type,
        initializer_range=bert.initializer_range)


@st.composite
def token_batches(draw, config: BertConfig, max_batch: int = 3, max_len: int | None = None,
                  min_len: int = 1) -> PretrainingBatch:
    """A batch for ``config``: padding at the end of rows (at least one real token per
    row; id 0, the pad token, only at padded positions), segment ids 0 then 1, at least
    one masked position over the batch, masked positions only at real tokens, NSP
    labels 0/1. B <= max_batch, T <= min(max_len, max_position_embeddings). A
    :class:`minibert.pretraining.PretrainingBatch` (masked_lm_weights int64 0/1) built by
    :func:`minibert.gradcheck.random_token_batch` from drawn (B, T, seed)."""
    max_len = min(max_len or config.max_position_embeddings, config.max_position_embeddings)
    B = draw(st.integers(1, max_batch))
    T = draw(st.integers(max(1, min_len), max(max_len, min_len)))
    rng = np.random.default_rng(draw(seeds))
    full = draw(st.booleans())
    from .pretraining import PretrainingBatch   # here: the core loads no job module
    return PretrainingBatch(**random_token_batch(config, rng, B, T, first_row_full=full))


@st.composite
def padding_masks(draw, batch: int | st.SearchStrategy, seq_len: int | st.SearchStrategy
                  ) -> np.ndarray:
    """A (B, T) int64 0/1 attention mask, padding at the end of each row and at least one
    real token (1) per row (a row of padding only has no defined softmax). ``batch`` and
    ``seq_len`` are ints or strategies of ints (>= 1)."""
    B = batch if isinstance(batch, int) else draw(batch)
    T = seq_len if isinstance(seq_len, int) else draw(seq_len)
    lengths = np.array(draw(st.lists(st.integers(1, T), min_size=B, max_size=B)))
    return (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)


@st.composite
def hidden_states(draw, config: BertConfig, max_batch: int = 3, max_len: int | None = None,
                  scale: float = 1.0) -> np.ndarray:
    """A (B, T, C) float64 input of an encoder sub-layer for ``config`` (C = hidden_size,
    T <= max_position_embeddings), N(0, scale^2)."""
    max_len = min(max_len or config.max_position_embeddings, config.max_position_embeddings)
    B, T = draw(st.integers(1, max_batch)), draw(st.integers(1, max_len))
    return draw(float_arrays((B, T, config.hidden_size), scale))


@dataclass
class AttentionInputs:
    """Inputs of :func:`minibert.nn.attention_forward`: q, k, v (B, T, C) float64 (packed
    as ``qkv`` (B, T, 3C), the forward's argument), the additive mask ``mask_add``
    (B, 1, 1, T) built from ``attention_mask`` (B, T) int64 (at least one real token per
    row), and ``num_heads`` (divides C)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    attention_mask: np.ndarray
    mask_add: np.ndarray
    num_heads: int

    @property
    def qkv(self) -> np.ndarray:
        """(B, T, 3C): [q | k | v] along the last axis."""
        return np.concatenate([self.q, self.k, self.v], axis=-1)


@st.composite
def attention_inputs(draw, max_batch: int = 3, max_len: int = 5, max_heads: int = 3,
                     max_head_size: int = 3, scale: float = 1.0) -> AttentionInputs:
    """Multi-head attention inputs with a padding mask (see :class:`AttentionInputs`)."""
    B, T = draw(st.integers(1, max_batch)), draw(st.integers(1, max_len))
    NH, HS = draw(st.integers(1, max_heads)), draw(st.integers(1, max_head_size))
    q, k, v = (draw(float_arrays((B, T, NH * HS), scale)) for _ in range(3))
    mask = draw(padding_masks(B, T))
    return AttentionInputs(q, k, v, mask, extended_attention_mask(mask, np.float64), NH)


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


def product_round_off(a, b) -> np.ndarray:
    """The bound on how far two float computations of the product ``a @ b`` may differ.

    A sum of k products computed in floating point, in any order and any blocking, is
    within gamma_k = k u / (1 - k u) of the exact one, relative to the sum of the terms'
    magnitudes (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. 3.11:
    ``|fl(a @ b) - a @ b| <= gamma_k |a| @ |b|``, u the unit round-off, half of
    ``np.finfo(dtype).eps``); two such computations then differ by at most twice that.
    BLAS kernels (AVX2, AVX-512, NEON), thread counts and row blocks change the order of
    the sums, so this, not equal bits, is what two of them can promise to each other.

    Args:
        a: (M, K) float array; b: (K, N) float array, same dtype (float16, float32 or
            float64).
    Returns:
        (M, N) float64 array: ``2 gamma_K (|a| @ |b|)``, computed in float64.
    Raises:
        ValueError: when the shapes do not chain, or K u >= 1 (no bound).
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"product_round_off: shapes {a.shape} and {b.shape} do not chain")
    u = np.finfo(np.result_type(a, b)).eps / 2
    k = a.shape[1]
    if k * u >= 1:
        raise ValueError(f"product_round_off: {k} terms leave no bound at unit round-off {u}")
    gamma = k * u / (1 - k * u)
    return 2 * gamma * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))


def assert_products_agree(got, want, a, b, name: str = "product") -> None:
    """Raise AssertionError naming ``name`` unless ``got`` and ``want``, two computations
    of ``a @ b`` (any shapes that :func:`product_round_off` takes), differ nowhere by more
    than :func:`product_round_off` ``(a, b)`` (plus the smallest normal number, for the
    terms that underflow). A product with a dropped or doubled term, a wrong row or a
    block summed in half precision is far outside it (tests/test_fast_cpu.py)."""
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shapes {got.shape} and {want.shape}")
    bound = product_round_off(a, b) + np.finfo(np.result_type(a, b)).tiny
    excess = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)) - bound
    if not (excess <= 0).all():                       # NaN counts as beyond
        at = np.unravel_index(np.nanargmax(np.where(np.isnan(excess), np.inf, excess)),
                              excess.shape)
        raise AssertionError(f"{name}: {got[at]!r} against {want[at]!r} at {at}, beyond "
                             f"the round-off bound {bound[at]:.3e}")


def assert_module_gradients(module, inputs=(), **check_kw) -> GradcheckReport:
    """Run :func:`minibert.gradcheck.check_module` (same arguments) and raise
    AssertionError with the whole table if any tensor fails; return the report otherwise.
    The module's parameters and float inputs must be float64."""
    report = check_module(module, inputs, **check_kw)
    if not report.passed:
        names = ", ".join(r.name for r in report.failures)
        raise AssertionError(f"gradient check failed for {names}\n{report}")
    return report


def assert_parameter_gradients(model, loss_fn, rng: np.random.Generator, label: str = "",
                               full_max_size: int = 48, full: Callable[[str], bool] = None,
                               tol: float = 1e-5) -> None:
    """Compare every parameter's ``.grad`` with central differences of ``loss_fn``
    (:func:`minibert.gradcheck.check_tensor`).

    Tensors of at most ``full_max_size`` entries (or whose name ``full(name)`` accepts)
    are checked entry by entry, larger ones along one random unit direction u drawn from
    ``rng`` (``<grad, u>`` against the directional derivative). Call after
    ``model.backward``; ``loss_fn()`` must recompute the scalar loss (float64) from the
    current parameters.

    Raises:
        AssertionError naming ``label`` and the failing parameters, with the table.
    """
    report = GradcheckReport(label, [
        check_tensor(loss_fn, p.data, p.grad, name, rng=rng, directions=1, tol=tol,
                     full=p.data.size <= full_max_size or (full is not None and full(name)))
        for name, p in model.named_parameters()])
    if not report.passed:
        names = ", ".join(r.name for r in report.failures)
        raise AssertionError(f"{label}: gradient check failed for {names}\n{report}")


def gpu_available() -> bool:
    """Whether ``backend.set_device("cuda")`` succeeds here (CuPy, a GPU, and the CUDA
    start-up check); the device in force is "cpu" again afterwards. For ``skipif`` marks."""
    try:
        backend.set_device("cuda")
        return True
    except backend.BackendError:
        return False
    finally:
        backend.set_device("cpu")
