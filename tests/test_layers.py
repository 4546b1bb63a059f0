"""Gradient checks, float64 central differences, for every layer's hand-written backward.

Shapes and values are drawn by hypothesis; the upstream gradient G is random (an all-ones
upstream gradient would hide, for example, a LayerNorm backward that forgets the mean term).
The scalar checked is L = sum(out * G).
"""
import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import ndtr

from minibert import backend, fast
from minibert.backend import DropoutRNG
from minibert.gradcheck import numerical_gradient
from minibert.nn import (IGNORE_INDEX, Embedding, attention_backward, attention_forward,
                         cross_entropy_backward, cross_entropy_forward,
                         layernorm_backward, layernorm_forward, linear_backward, linear_forward,
                         softmax_backward, softmax_forward)
from minibert.nn.activations import ACTIVATIONS
from minibert.nn.dropout import dropout_backward, dropout_forward, keep_mask
from minibert.nn.pooling import mean_pooling_backward, mean_pooling_forward
from minibert.testing import (assert_gradients_match, attention_inputs, float_arrays,
                              layer_shapes, padding_masks, seeds)

from helpers import cpu_blocking

SETTINGS = settings(max_examples=25, deadline=None)
# the layers with a CPU fast path are checked both ways: the reference formula (what runs
# unless a job switches the fast paths on) and the fast path (what the jobs run)
FORMULAS = pytest.mark.parametrize("formulas", ["fast", "reference"])
dims = st.integers(1, 5)


def formulas_of(name):
    """The context in which the nn/ functions run the named formulas."""
    return fast.fast_paths(name == "fast")


def rand(rng, *shape):
    return rng.standard_normal(shape)


@SETTINGS
@given(lead=st.lists(dims, min_size=1, max_size=2), i=dims, o=dims, bias=st.booleans(),
       seed=seeds)
def test_linear_gradients(lead, i, o, bias, seed):
    rng = np.random.default_rng(seed)
    x, w, b = rand(rng, *lead, i), rand(rng, o, i), (rand(rng, o) if bias else None)
    G = rand(rng, *lead, o)
    out, cache = linear_forward(x, w, b)
    np.testing.assert_allclose(out, x @ w.T + (0 if b is None else b), rtol=1e-12)
    dx, dw, db = linear_backward(G, cache)
    f = lambda: float((linear_forward(x, w, b)[0] * G).sum())
    assert_gradients_match(dx, numerical_gradient(f, x), "dx")
    assert_gradients_match(dw, numerical_gradient(f, w), "dw")
    if bias:
        assert_gradients_match(db, numerical_gradient(f, b), "db")
    else:
        assert db is None


@FORMULAS
@SETTINGS
@given(x=float_arrays(layer_shapes(max_dims=3, last=st.integers(3, 8))), seed=seeds)
def test_layernorm_gradients(x, seed, formulas):
    with formulas_of(formulas):
        # C >= 3: with C = 2 the output is +-1 whatever x, dx is 0 and only noise is compared
        rng = np.random.default_rng(seed)
        c = x.shape[-1]
        w, b, G = rand(rng, c), rand(rng, c), rand(rng, *x.shape)
        _, cache = layernorm_forward(x, w, b)
        dx, dw, db = layernorm_backward(G, cache)
        f = lambda: float((layernorm_forward(x, w, b)[0] * G).sum())
        assert_gradients_match(dx, numerical_gradient(f, x), "dx", tol=1e-5)
        assert_gradients_match(dw, numerical_gradient(f, w), "dw")
        assert_gradients_match(db, numerical_gradient(f, b), "db")


@FORMULAS
@SETTINGS
@given(name=st.sampled_from(sorted(ACTIVATIONS)), x=float_arrays(st.tuples(dims, dims), 2.0),
       seed=seeds)
def test_activation_gradients(name, x, seed, formulas):
    with formulas_of(formulas):
        fwd, bwd = ACTIVATIONS[name]
        if name == "relu":  # keep away from the kink, where the derivative is undefined
            x = np.where(np.abs(x) < 1e-3, 0.5, x)
        G = rand(np.random.default_rng(seed), *x.shape)
        _, cache = fwd(x)
        f = lambda: float((fwd(x)[0] * G).sum())
        assert_gradients_match(bwd(G, cache), numerical_gradient(f, x), name)


def test_gelu_values_match_the_formulas():
    from scipy.stats import norm
    x = np.linspace(-5, 5, 101)
    np.testing.assert_allclose(ACTIVATIONS["gelu"][0](x)[0], x * norm.cdf(x), rtol=1e-12,
                               atol=1e-15)
    tanh_form = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(ACTIVATIONS["gelu_new"][0](x)[0], tanh_form, rtol=1e-12)


@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(1, 70), min_size=1, max_size=3), seed=seeds,
       block=st.sampled_from([None, 1, 7, 4096]), threads=st.sampled_from([1, 2, 3]),
       strided=st.booleans())
def test_float32_gelu_matches_the_exact_gelu_in_any_blocking(shape, seed, block, threads,
                                                             strided):
    """Float32 GELU forward and backward (rational Phi, cache-sized blocks over threads)
    against the float64 exact formulas, for block sizes that split rows anywhere, any thread
    count and strided input; the results do not depend on the blocking at all."""
    fwd, bwd = ACTIVATIONS["gelu"]
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    if strided:
        x, g = x[..., ::-1], g[..., ::-1]
    with cpu_blocking(block, threads):
        out, cache = fwd(x)
        dx = bwd(g, cache)
    with cpu_blocking(None, 1):
        out1, cache1 = fwd(np.ascontiguousarray(x))
        dx1 = bwd(np.ascontiguousarray(g), cache1)
    np.testing.assert_array_equal(out, out1)
    np.testing.assert_array_equal(dx, dx1)
    x64 = x.astype(np.float64)
    phi = ndtr(x64)
    pdf = np.exp(-0.5 * x64 ** 2) / np.sqrt(2 * np.pi)
    assert out.dtype == dx.dtype == np.float32
    np.testing.assert_allclose(out, x64 * phi, rtol=0, atol=2.5e-7 * np.abs(x64).max() + 1e-7)
    np.testing.assert_allclose(dx, g * (phi + x64 * pdf), rtol=1e-5, atol=1e-6)


@FORMULAS
@SETTINGS
@given(x=float_arrays(st.tuples(dims, dims, st.integers(1, 7)), 3.0),
       axis=st.sampled_from([-1, 0, 1]), seed=seeds)
def test_softmax_gradient(x, axis, seed, formulas):
    """The axis travels in the cache: a backward that fell back to the last axis fails
    for axis 0 and 1."""
    with formulas_of(formulas):
        G = rand(np.random.default_rng(seed), *x.shape)
        probs, cache = softmax_forward(x, axis)
        np.testing.assert_allclose(probs.sum(axis), 1, rtol=1e-12)
        f = lambda: float((softmax_forward(x, axis)[0] * G).sum())
        assert_gradients_match(softmax_backward(G, cache), numerical_gradient(f, x), "softmax")


@FORMULAS
@SETTINGS
@given(inp=attention_inputs(), dropout=st.sampled_from([0.0, 0.3]), seed=seeds)
def test_attention_gradients_with_padding_and_fixed_dropout(inp, dropout, seed, formulas):
    with formulas_of(formulas):
        rng = np.random.default_rng(seed)
        qkv, mask_add, heads = inp.qkv, inp.mask_add, inp.num_heads
        G = rand(rng, *inp.q.shape)
        drop_seed = int(rng.integers(1 << 30))

        def run():  # a fresh generator with the same seed replays the same dropout mask
            return attention_forward(qkv, mask_add, heads, dropout,
                                     np.random.default_rng(drop_seed))

        _, cache = run()
        probs = cache.probs                                         # (B, NH, T, T), before dropout
        np.testing.assert_allclose(probs.sum(-1), 1, rtol=1e-12)
        assert np.all(probs[np.broadcast_to(mask_add < 0, probs.shape)] == 0)
        dqkv = attention_backward(G, cache)                         # (B, T, 3C)
        assert dqkv.shape == qkv.shape
        f = lambda: float((run()[0] * G).sum())
        numerical = numerical_gradient(f, qkv)
        C = inp.q.shape[-1]
        for i, name in enumerate(("dq", "dk", "dv")):
            part = np.s_[..., i * C:(i + 1) * C]
            assert_gradients_match(dqkv[part], numerical[part], name)


@FORMULAS
@SETTINGS
@given(n=st.integers(1, 6), k=st.integers(2, 6), smoothing=st.sampled_from([0.0, 0.1]),
       seed=seeds)
def test_cross_entropy_gradient_with_ignored_rows(n, k, smoothing, seed, formulas):
    with formulas_of(formulas):
        rng = np.random.default_rng(seed)
        logits = rand(rng, n, k) * 2
        labels = np.where(rng.random(n) < 0.3, IGNORE_INDEX, rng.integers(0, k, n))
        loss, cache = cross_entropy_forward(logits, labels, smoothing)
        valid = labels != IGNORE_INDEX
        if valid.any():
            logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            target = np.full((n, k), smoothing / k)
            target[np.arange(n), np.where(valid, labels, 0)] += 1 - smoothing
            expected = -(target * logp).sum(-1)[valid].mean()
            assert abs(float(loss) - expected) < 1e-12
        else:
            assert float(loss) == 0.0
        dloss = float(rng.standard_normal())
        f = lambda: float(cross_entropy_forward(logits, labels, smoothing)[0]) * dloss
        assert_gradients_match(cross_entropy_backward(dloss, cache), numerical_gradient(f, logits),
                               "dlogits")


def test_cross_entropy_rejects_out_of_range_labels():
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\)"):
        cross_entropy_forward(np.zeros((2, 3)), np.array([0, 3]))


@SETTINGS
@given(x=float_arrays(st.tuples(dims, dims)), p=st.sampled_from([0.1, 0.5]), seed=seeds)
def test_dropout_gradient_with_fixed_mask(x, p, seed):
    G = rand(np.random.default_rng(seed), *x.shape)
    _, cache = dropout_forward(x, p, np.random.default_rng(seed))
    f = lambda: float((dropout_forward(x, p, np.random.default_rng(seed))[0] * G).sum())
    assert_gradients_match(dropout_backward(G, cache), numerical_gradient(f, x), "dropout")


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 4001), p=st.sampled_from([0.0, 0.1, 0.5, 0.9]), seed=seeds)
def test_dropout_keep_mask_is_bernoulli_and_replays(n, p, seed):
    """Raw-bit masks: the kept share within 5 standard deviations of 1 - p, the same mask
    from the same seed (a CPU DropoutRNG draws what a NumPy Generator does), and any size,
    odd ones too."""
    a = keep_mask(np.random.default_rng(seed), (n,), p)
    b = keep_mask(DropoutRNG("cpu").reseed(seed), (n,), p)
    assert a.shape == (n,) and a.dtype == bool
    np.testing.assert_array_equal(a, b)
    assert abs(a.mean() - (1 - p)) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12
    big = keep_mask(np.random.default_rng(seed), (300, 1001), p)
    assert abs(big.mean() - (1 - p)) <= 5 * np.sqrt(p * (1 - p) / big.size) + 1e-12


@SETTINGS
@given(v=st.integers(2, 6), c=st.integers(1, 4), lead=st.lists(dims, min_size=1, max_size=2),
       padding=st.booleans(), seed=seeds)
def test_embedding_gradient_with_repeated_ids(v, c, lead, padding, seed):
    """Repeated ids must all contribute (fancy-index += would keep one); the padding row
    gets nothing."""
    rng = np.random.default_rng(seed)
    emb = Embedding(v, c, padding_idx=0 if padding else None, rng=rng, dtype=np.float64)
    ids = rng.integers(0, v, size=lead)
    G = rand(rng, *lead, c)
    emb(ids)
    emb.backward(G)
    expected = np.zeros((v, c))
    for i, g in zip(ids.ravel(), G.reshape(-1, c)):
        if not (padding and i == 0):
            expected[i] += g
    np.testing.assert_allclose(emb.weight.grad, expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), B=st.integers(1, 3), T=st.integers(1, 5), C=st.integers(1, 4),
       seed=st.integers(0, 2**32 - 1))
def test_mean_pooling_gradient_and_mask(data, B, T, C, seed):
    """float64 gradient of the masked mean against central differences, with a random
    upstream gradient; padding neither counts nor gets a gradient; None means all real."""
    rng = np.random.default_rng(seed)
    h = data.draw(float_arrays((B, T, C)))
    mask = data.draw(padding_masks(B, T))
    dpooled = rng.standard_normal((B, C))
    pooled, weights = mean_pooling_forward(h, mask)
    dh = mean_pooling_backward(dpooled, weights)
    numeric = numerical_gradient(lambda: float((mean_pooling_forward(h, mask)[0] * dpooled)
                                               .sum()), h)
    np.testing.assert_allclose(dh, numeric, rtol=1e-6, atol=1e-8)
    assert not dh[mask == 0].any()
    real = mask > 0
    for b in range(B):
        np.testing.assert_allclose(pooled[b], h[b][real[b]].mean(axis=0), rtol=1e-12,
                                   atol=1e-12)
    empty = mask.copy()
    empty[0] = 0                                    # a row without a real token pools to 0
    assert not mean_pooling_forward(h, empty)[0][0].any()
    np.testing.assert_allclose(mean_pooling_forward(h, None)[0], h.mean(axis=1), rtol=1e-12,
                               atol=1e-12)
    with pytest.raises(ValueError, match=r"attention_mask must be"):
        mean_pooling_forward(h, np.ones((B, T + 1)))


@SETTINGS
@given(rows=st.integers(1, 6), k=st.integers(1, 9), axis=st.sampled_from([0, -1]),
       scale=st.sampled_from([1.0, 1e3]), seed=st.integers(0, 2**16))
def test_log_softmax_is_the_log_of_a_distribution_and_scipys(rows, k, axis, scale, seed):
    """log_softmax (nn.activations) along either axis: exp sums to 1, equals SciPy's
    log_softmax, and large logits (scale 1e3) neither overflow nor give -inf."""
    from scipy.special import log_softmax as scipy_log_softmax
    from minibert.nn import log_softmax
    x = np.random.default_rng(seed).normal(size=(rows, k)) * scale
    logp = log_softmax(x, axis=axis)
    assert logp.shape == x.shape and logp.dtype == x.dtype and np.isfinite(logp).all()
    np.testing.assert_allclose(np.exp(logp).sum(axis=axis), 1.0, rtol=1e-12)
    np.testing.assert_allclose(logp, scipy_log_softmax(x, axis=axis), rtol=1e-12, atol=1e-9)
    half = log_softmax(x.astype(np.float16), axis=axis)                 # reduced in float32
    assert half.dtype == np.float16


# -- the function pairs the fused GPU kernels sit behind, each checked on its own ---------

def _checked(f, x, analytic, name):
    """check_tensor of ``f`` at ``x`` (entry by entry) must pass."""
    from minibert.gradcheck import check_tensor
    row = check_tensor(f, x, analytic, name, full=True)
    assert row.passed, row


@settings(max_examples=15, deadline=None)
@given(B=st.integers(1, 2), T=st.integers(1, 4), NH=st.integers(1, 2), HS=st.integers(1, 3),
       with_bias=st.booleans(), seed=seeds)
def test_split_heads_backward_is_merge_head_grads(B, T, NH, HS, with_bias, seed):
    """d/dqkv of sum(Gq q + Gk k + Gv v), (q, k, v) = split_heads(qkv [+ bias]), is
    merge_head_grads(Gq, Gk, Gv, scale), float64, random upstream gradients; the bias
    gradient is its sum over (B, T)."""
    from minibert.nn.attention import merge_head_grads, split_heads
    rng = np.random.default_rng(seed)
    C = NH * HS
    qkv, bias = rng.standard_normal((B, T, 3 * C)), rng.standard_normal(3 * C)
    G = [rng.standard_normal((B, NH, T, HS)) for _ in range(3)]

    def f():
        *heads, _ = split_heads(qkv, NH, bias if with_bias else None)
        return float(sum((g * h).sum() for g, h in zip(G, heads)))
    _, _, _, scale = split_heads(qkv, NH)
    dqkv = merge_head_grads(*G, scale)                                  # (B, T, 3C)
    _checked(f, qkv, dqkv, "qkv")
    if with_bias:
        _checked(f, bias, dqkv.reshape(-1, 3 * C).sum(0), "bias")


@settings(max_examples=15, deadline=None)
@given(B=st.integers(1, 2), NH=st.integers(1, 2), T=st.integers(1, 5),
       p=st.sampled_from([0.0, 0.3]),
       seed=seeds)
def test_masked_softmax_backward_with_a_fixed_dropout_mask(B, NH, T, p, seed):
    """d/dscores of sum(G dropout(softmax(scores + mask))) is dropout_softmax_backward,
    float64, random upstream, a padded key, the dropout mask fixed by its seed."""
    from minibert.nn.attention import dropout_softmax_backward, masked_softmax_forward
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((B, NH, T, T))
    mask = np.zeros((B, 1, 1, T))
    mask[..., -1] = -10000.0 if T > 1 else 0.0                          # pad the last key
    G = rng.standard_normal((B, NH, T, T))

    def run():
        probs, cache = masked_softmax_forward(scores.copy(), mask)     # in place: a copy
        if p == 0:
            return probs, cache, None
        dropped, dcache = dropout_forward(probs, p, DropoutRNG("cpu").reseed(seed))
        return dropped, cache, dcache
    out, cache, dcache = run()
    dscores = dropout_softmax_backward(G.copy(), dcache, cache)
    _checked(lambda: float((G * run()[0]).sum()), scores, dscores, "scores")


@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       p=st.sampled_from([0.0, 0.3]),
       seed=seeds)
def test_bias_dropout_add_and_bias_gelu_gradients(shape, p, seed):
    """bias_dropout_add_forward: d/dx is dropout's backward of dout, d/db its column sum,
    d/dresidual dout; bias_gelu_forward: gelu's backward at x + b, and its column sum for
    b. Float64, random upstream, the dropout mask fixed by its seed."""
    from minibert.nn.activations import bias_gelu_forward, gelu_backward
    from minibert.nn.dropout import bias_dropout_add_forward
    rng = np.random.default_rng(seed)
    x, res = rng.standard_normal(shape), rng.standard_normal(shape)
    b, G = rng.standard_normal(shape[-1]), rng.standard_normal(shape)

    def f():
        out, _ = bias_dropout_add_forward(x, b, res, p, DropoutRNG("cpu").reseed(seed))
        return float((G * out).sum())
    _, cache = bias_dropout_add_forward(x, b, res, p, DropoutRNG("cpu").reseed(seed))
    dx = G if cache is None else dropout_backward(G, cache)
    _checked(f, x, dx, "x")
    _checked(f, b, dx.reshape(-1, shape[-1]).sum(0), "b")
    _checked(f, res, G, "residual")

    _, gcache = bias_gelu_forward(x, b)
    dh = gelu_backward(G, gcache)
    _checked(lambda: float((G * bias_gelu_forward(x, b)[0]).sum()), x, dh, "gelu x")
    _checked(lambda: float((G * bias_gelu_forward(x, b)[0]).sum()), b,
             dh.reshape(-1, shape[-1]).sum(0), "gelu b")
