"""The CPU fast paths (minibert/fast_cpu.py) against the formulas of minibert/nn/ and AdamW.

Each fast path gives the same bits as its formula, whatever the shape, dtype, thread count
and BLAS kernel, where both run the same operations in the same order: the row-wise passes,
attention with the batch split over the threads (one product per matrix, as the formula's),
dropout, AdamW. Two do not: the float32 products split in row blocks (fast_cpu.matmul), which
agree with the whole product to the round-off bound of a sum of k terms (on OpenBLAS's
Haswell kernel a 256-row block is not summed as the rows of a 512-row product), and float32
GELU, whose rational normal CDF (|error| <= 2.5e-7) puts it within a stated bound of the
formula. Also here: the thread-pool and memory helpers the fast paths
run on, and that the formulas hand over to their fast path only when the fast paths are
switched on (minibert.fast.set_fast_paths), and only on NumPy arrays.
"""
import contextlib
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import ndtr

from minibert import backend, fast, fast_cpu, nn
from minibert.fast_cpu import normal_cdf
from minibert.nn.activations import gelu_backward, gelu_forward
from minibert.optim import AdamW, adamw_update
from minibert.testing import assert_products_agree, seeds

from helpers import cpu_blocking

SETTINGS = settings(max_examples=20, deadline=None)
DTYPES = [np.float16, np.float32, np.float64]
# shapes up to 120 x 600 = 72,000 elements: above parallel_rows' 65,536, so some draws split
# their rows over the threads
row_shapes = st.tuples(st.integers(1, 4), st.integers(1, 30), st.integers(1, 600))
threads = st.sampled_from([1, 2, 3])


def draw(seed, shape, dtype, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def both(name, *args, **kwargs):
    """(fast path's result, reference formula's result) of the nn/ function ``name``; each
    call gets its own copies of the array arguments (some work in place, or in ``out``)."""
    fn = getattr(nn, name) if hasattr(nn, name) else getattr(nn.activations, name)
    with fast.fast_paths():
        quick = fn(*_copies(args), **_copies(kwargs))
    reference = fn(*_copies(args), **_copies(kwargs))
    return quick, reference


def _copies(args):
    """A copy of every array in the list or dict ``args``."""
    if isinstance(args, dict):
        return dict(zip(args, _copies(list(args.values()))))
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def assert_same_bits(a, b):
    """Equal to the last bit, nested tuples of arrays included (NaNs at the same places)."""
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_bits(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b, strict=True)
    else:
        assert a == b


@SETTINGS
@given(shape=row_shapes, dtype=st.sampled_from(DTYPES), axis=st.sampled_from([-1, 0, 1]),
       in_place=st.booleans(), seed=seeds, n=threads)
def test_softmax_fast_path_gives_the_formulas_bits(shape, dtype, axis, in_place, seed, n):
    x, g = draw(seed, shape, dtype), draw(seed + 1, shape, dtype, 1.0)
    with cpu_blocking(None, n):
        if in_place:   # out=x, as attention does with its scores
            (p, cache), (p_ref, cache_ref) = both("softmax_forward", x, axis, out=x.copy())
        else:
            (p, cache), (p_ref, cache_ref) = both("softmax_forward", x, axis)
        assert_same_bits((p, cache), (p_ref, cache_ref))
        assert_same_bits(*both("softmax_backward", g, cache))
        assert_same_bits(*both("softmax_backward", g, cache, out=g.copy()))


@SETTINGS
@given(shape=row_shapes, dtype=st.sampled_from(DTYPES), seed=seeds, n=threads)
def test_layernorm_fast_path_gives_the_formulas_bits(shape, dtype, seed, n):
    x, g = draw(seed, shape, dtype) + 2, draw(seed + 1, shape, dtype, 1.0)
    w, b = draw(seed + 2, shape[-1:], dtype, 1.0), draw(seed + 3, shape[-1:], dtype, 1.0)
    with cpu_blocking(None, n):
        (out, cache), (out_ref, cache_ref) = both("layernorm_forward", x, w, b)
        assert_same_bits((out, cache), (out_ref, cache_ref))
        assert_same_bits(*both("layernorm_backward", g, cache))


@SETTINGS
@given(n_rows=st.integers(1, 200), k=st.integers(1, 700), smoothing=st.sampled_from([0.0, 0.1]),
       dtype=st.sampled_from(DTYPES), dloss=st.sampled_from([1.0, 0.5, "0-d"]), seed=seeds,
       n=threads)
def test_cross_entropy_fast_paths_give_the_formulas_bits(n_rows, k, smoothing, dtype, dloss,
                                                         seed, n):
    """softmax_nll (the forward's rows) and the backward, with ignored rows."""
    rng = np.random.default_rng(seed)
    logits = draw(seed, (n_rows, k), dtype)
    labels = np.where(rng.random(n_rows) < 0.3, nn.IGNORE_INDEX, rng.integers(0, k, n_rows))
    dloss = np.asarray(0.25, np.float32) if dloss == "0-d" else dloss
    with cpu_blocking(None, n):
        safe = np.where(labels == nn.IGNORE_INDEX, 0, labels)
        logits32 = logits.astype(backend.compute_dtype(dtype))
        assert_same_bits(*both("softmax_nll", logits32, safe, smoothing))
        (loss, cache), (loss_ref, cache_ref) = both("cross_entropy_forward", logits, labels,
                                                    smoothing)
        assert_same_bits((loss, cache), (loss_ref, cache_ref))
        # the backward overwrites the cache's softmax: each run gets its own
        with fast.fast_paths():
            quick = nn.cross_entropy_backward(dloss, (cache[0].copy(),) + cache[1:])
        reference = nn.cross_entropy_backward(dloss, (cache[0].copy(),) + cache[1:])
        assert_same_bits(quick, reference)


@SETTINGS
@given(shape=st.lists(st.integers(1, 70), min_size=1, max_size=3),
       dtype=st.sampled_from([np.float16, np.float64]), seed=seeds, n=threads,
       block=st.sampled_from([None, 7, 4096]))
def test_gelu_fast_path_gives_the_formulas_bits_outside_float32(shape, dtype, seed, n, block):
    """Float16 and float64 GELU take SciPy's erf, as the formula does: the same bits, in
    any blocking."""
    x, g = draw(seed, shape, dtype), draw(seed + 1, shape, dtype, 1.0)
    with cpu_blocking(block, n):
        (out, cache), (out_ref, cache_ref) = both("gelu_forward", x)
        assert_same_bits((out, cache), (out_ref, cache_ref))
        assert_same_bits(*both("gelu_backward", g, cache))


@SETTINGS
@given(lead=st.one_of(st.tuples(st.integers(1, 800)),
                      st.tuples(st.integers(1, 40), st.integers(1, 40))),
       io=st.tuples(st.integers(1, 300), st.integers(1, 300)),
       dtype=st.sampled_from(DTYPES), bias=st.booleans(), seed=seeds, n=threads)
def test_linear_fast_paths_agree_with_the_formulas(lead, io, dtype, bias, seed, n):
    """The Linear layer's forward and backward with their products' rows split over
    the threads (fast_cpu.matmul: float32 products over 16 MFLOP, in blocks of whole 64-row
    units) agree with the formula's, the formula's products on the single BLAS thread that
    the fast paths leave it: in float32 within the round-off bound of each product (the
    bias a term of the forward's sums: [x, 1] @ [w.T; b]), as a BLAS kernel may sum a row
    block in another order than the same rows of the whole product; in float16 and float64,
    never split, bit for bit. The bias gradient, one column sum on both sides: bit for bit."""
    (I, O), shape = io, (*lead, io[0])
    x, w = draw(seed, shape, dtype), draw(seed + 1, (O, I), dtype)
    b = draw(seed + 2, (O,), dtype) if bias else None
    g = draw(seed + 3, (*lead, O), dtype)
    with cpu_blocking(None, n):
        with fast.fast_paths():
            out, cache = nn.linear_forward(x, w, b)
            grads = nn.linear_backward(g, cache)
        fast_cpu.split_products(True)                  # the BLAS on one thread, no split
        try:
            out_ref, cache_ref = nn.linear_forward(x, w, b)
            grads_ref = nn.linear_backward(g, cache_ref)
        finally:
            fast_cpu.split_products(False)
    if dtype != np.float32:
        assert_same_bits(out, out_ref)
        assert_same_bits(grads, grads_ref)
        return
    x2, g2 = x.reshape(-1, I), g.reshape(-1, O)
    ones = np.ones((len(x2), 1), dtype)
    a_fwd, b_fwd = (np.hstack([x2, ones]), np.vstack([w.T, b[None]])) if bias else (x2, w.T)
    assert_products_agree(out.reshape(-1, O), out_ref.reshape(-1, O), a_fwd, b_fwd, "out")
    assert_products_agree(grads[0].reshape(-1, I), grads_ref[0].reshape(-1, I), g2, w, "dx")
    assert_products_agree(grads[1], grads_ref[1], g2.T, x2, "dw")
    assert_same_bits(grads[2], grads_ref[2])


@SETTINGS
@given(dims=st.tuples(st.integers(1, 12), st.integers(1, 3), st.integers(1, 20),
                      st.integers(1, 16)),
       dtype=st.sampled_from(DTYPES), p=st.sampled_from([0.0, 0.3]), masked=st.booleans(),
       bias=st.booleans(), with_dprobs=st.booleans(), seed=seeds, n=threads)
def test_attention_fast_paths_give_the_formulas_bits(dims, dtype, p, masked, bias,
                                                     with_dprobs, seed, n):
    """The attention core with the batch split over the threads (fast_cpu.attention_forward
    and attention_backward) equals the formula, bit for bit: outputs, every array of the
    cache (the dropout mask drawn from the same generator state included) and the
    gradient, with and without dropout, padding mask, packed bias and an upstream
    gradient of the probabilities."""
    B, NH, T, HS = dims
    qkv = draw(seed, (B, T, 3 * NH * HS), dtype)
    pad = np.random.default_rng(seed + 1).integers(0, 2, (B, T))
    pad[:, 0] = 1
    mask_add = nn.attention.extended_attention_mask(pad, dtype) if masked else None
    qkv_bias = draw(seed + 2, (3 * NH * HS,), dtype) if bias else None
    g = draw(seed + 3, (B, T, NH * HS), dtype)
    dprobs = draw(seed + 4, (B, NH, T, T), dtype) if with_dprobs else None

    def run():
        rng = np.random.default_rng(seed + 5)
        ctx, cache = nn.attention_forward(qkv, mask_add, NH, p, rng, qkv_bias)
        cache = cache._replace(q=cache.q.copy())           # nothing is written in place
        dqkv = nn.attention_backward(g.copy(), cache, None if dprobs is None else dprobs.copy())
        return ctx, tuple(cache), dqkv, rng.bit_generator.random_raw()

    with cpu_blocking(None, n):
        with fast.fast_paths():
            quick = run()
        fast_cpu.split_products(True)                  # the BLAS on one thread, as above
        try:
            reference = run()
        finally:
            fast_cpu.split_products(False)
    assert_same_bits(quick[:3], reference[:3])
    assert quick[3] == reference[3]                    # the generator left at one state


@SETTINGS
@given(shape=st.tuples(st.integers(1, 300), st.integers(1, 700)),
       dtype=st.sampled_from(DTYPES), p=st.sampled_from([0.1, 0.5]), seed=seeds, n=threads,
       buffered=st.booleans())
def test_dropout_fast_paths_give_the_formulas_bits(shape, dtype, p, seed, n, buffered):
    """The dropout mask drawn over the threads from advanced copies of the PCG64 stream
    (fast_cpu.keep_mask) is the formula's mask, and the generator is left in the
    formula's state (a buffered 32-bit value kept); dropout, bias + dropout + residual
    and the dropout backward in row blocks equal their formulas bit for bit. Shapes up
    to 210,000 elements: many above the 65,536 at which the draw splits."""
    from minibert.nn import dropout as D
    x, b = draw(seed, shape, dtype), draw(seed + 1, shape[-1:], dtype)
    residual, g = draw(seed + 2, shape, dtype), draw(seed + 3, shape, dtype)

    def run():
        rng = np.random.default_rng(seed + 4)
        if buffered:
            rng.integers(0, 2 ** 32, dtype=np.uint32)      # leaves a 32-bit value buffered
        y, (keep, scale) = D.dropout_forward(x, p, rng)
        z, cache = D.bias_dropout_add_forward(x, b, residual, p, rng)
        dx = D.dropout_backward(g, cache)
        return (y, keep, z, cache[0], dx), rng.bit_generator.state, rng.random()

    with cpu_blocking(None, n):
        with fast.fast_paths():
            quick = run()
        reference = run()
    assert_same_bits(quick[0], reference[0])
    assert quick[1:] == reference[1:]


@pytest.mark.parametrize("n", [2, 3])
def test_a_mask_drawn_while_the_pool_is_busy_is_the_formulas(n):
    """When parallel_rows runs inline (here: another pass holds the pool, as a second
    thread's would), fast_cpu.keep_mask still draws every thread's run of words: the
    formula's whole mask and the formula's generator state, no unwritten elements."""
    shape, p = (300, 701), 0.1

    def run(draw_mask):
        rng = np.random.default_rng(7)
        return draw_mask(rng, shape, p), rng.bit_generator.state

    with cpu_blocking(None, n):
        assert fast_cpu._pass_lock.acquire(blocking=False)
        try:
            quick = run(fast_cpu.keep_mask)
        finally:
            fast_cpu._pass_lock.release()
    reference = run(backend.keep_mask)
    assert_same_bits(quick[0], reference[0])
    assert quick[1] == reference[1]


def test_split_products_take_the_blas_threads_and_give_them_back(monkeypatch):
    """While the fast paths are on, OpenBLAS runs on one thread and matmul splits rows
    over the pool (blocks made on two threads), agreeing with the whole product to its
    round-off bound; off again, the count from before is back and matmul is one call, the
    whole product's bits."""
    controls = fast_cpu._openblas_controls()
    if not controls:
        pytest.skip("no OpenBLAS thread control in this process")
    import threading
    get = controls[0][0]
    before = get()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    names = []
    real = np.matmul

    def spy(a, b, **kw):
        names.append(threading.current_thread().name)
        return real(a, b, **kw)

    monkeypatch.setattr(np, "matmul", spy)
    a, b = draw(0, (512, 128), np.float32), draw(1, (128, 256), np.float32)  # 34 MFLOP
    with fast.fast_paths():
        assert get() == 1
        assert_products_agree(fast_cpu.matmul(a, b), a @ b, a, b)
        assert len(names) == 2 and any(x.startswith("minibert-pool") for x in names)
    assert get() == before and fast_cpu._blas_saved is None
    names.clear()
    assert_same_bits(fast_cpu.matmul(a, b), a @ b)
    assert names == []


_MATMUL = np.matmul                    # the real one, while a test replaces np.matmul


def test_the_log_line_says_how_the_products_run_and_on_which_kernel(monkeypatch):
    """A job's fast-paths line names the split and the OpenBLAS kernel threadpoolctl
    reports (what to look at when a run is slow on another CPU); off, the BLAS's own
    threads."""
    from threadpoolctl import threadpool_info
    from minibert.cli import fast_paths_line
    # every OpenBLAS in the process, named once each: NumPy's and SciPy's wheels may bring
    # two that name one CPU differently (the floor run on an AVX-512 AMD: Cooperlake, Zen)
    kernel = "/".join(sorted({i["architecture"] for i in threadpool_info()
                              if i["internal_api"] == "openblas"}))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert fast_paths_line(True) == "fast CPU paths: on"        # not switched on yet
    with fast.fast_paths():
        line = fast_paths_line(True)
    assert line == f"fast CPU paths: on (products split over 2 threads, OpenBLAS {kernel} " \
                   "kernel on 1 thread)"
    assert fast_cpu.products_line() == f"products on the BLAS's own threads, OpenBLAS {kernel} kernel"


def _last_term_dropped(rows, b, out):
    """A wrong block: the sum without its last term."""
    return _MATMUL(rows[:, :-1], b[:-1], out=out)


def _in_half_precision(rows, b, out):
    """A wrong block: the products of float16 copies."""
    out[...] = (rows.astype(np.float16) @ b.astype(np.float16)).astype(out.dtype)
    return out


def _rows_shifted(rows, b, out):
    """A wrong block: every row but the first gets its predecessor's result."""
    _MATMUL(rows, b, out=out)
    out[1:] = out[:-1].copy()
    return out


@pytest.mark.parametrize("wrong", [_last_term_dropped, _in_half_precision, _rows_shifted])
def test_the_round_off_bound_fails_a_wrong_split_product(monkeypatch, wrong):
    """The bound that replaced equal bits for the split products still catches a split
    product gone wrong in one of its blocks: a dropped term, a block in half precision, a
    block's rows shifted by one."""
    if not fast_cpu._openblas_controls():
        pytest.skip("no OpenBLAS thread control in this process")
    import threading
    monkeypatch.setenv("OMP_NUM_THREADS", "2")

    def broken(a, b, out=None):          # the pool's blocks go wrong, the caller's do not
        if threading.current_thread().name.startswith("minibert-pool"):
            return wrong(a, b, out)
        return _MATMUL(a, b, out=out)

    monkeypatch.setattr(np, "matmul", broken)
    a, b = draw(0, (512, 128), np.float32), draw(1, (128, 256), np.float32)
    with fast.fast_paths():
        got = fast_cpu.matmul(a, b)
    with pytest.raises(AssertionError, match="beyond the round-off bound"):
        assert_products_agree(got, _MATMUL(a, b), a, b)


@SETTINGS
@given(shape=st.lists(st.integers(1, 70), min_size=1, max_size=3),
       dtype=st.sampled_from(DTYPES), seed=seeds, n=threads,
       block=st.sampled_from([None, 7, 4096]))
def test_bias_gelu_fast_path_is_the_gelu_fast_path_of_the_sum(shape, dtype, seed, n, block):
    """The fused bias + GELU (fast_cpu.bias_gelu_forward: the sum made inside the GELU's
    blocks) gives the bits of the GELU fast path on x + b, forward and cache, so its
    backward is that of the GELU too; outside float32 both are the formula's bits
    (nn.activations.bias_gelu_forward, forward and backward)."""
    x, g = draw(seed, shape, dtype), draw(seed + 1, shape, dtype, 1.0)
    b = draw(seed + 2, shape[-1:], dtype)
    with cpu_blocking(block, n):
        fused, reference = both("bias_gelu_forward", x, b)
        with fast.fast_paths():
            assert_same_bits(fused, gelu_forward(x + b))
            dx = gelu_backward(g, fused[1])
        dx_ref = gelu_backward(g, reference[1])
    assert fused[0].shape == x.shape and fused[0].dtype == dtype
    if dtype != np.float32:
        assert_same_bits(fused, reference)
        assert_same_bits(dx, dx_ref)
    else:                                   # the bounds of the float32 GELU test below
        z = x + b
        assert_same_bits(fused[1][0], z)
        assert np.all(np.abs(fused[0] - reference[0]) <= 6e-7 * np.abs(z))
        assert np.all(np.abs(dx - dx_ref) <= 8e-7 * np.abs(g))


def test_bias_gelu_fast_path_takes_other_biases_as_the_formula_does():
    """A bias that is not (I,) of x's dtype (a broadcast shape, a wider dtype) gets
    NumPy's broadcasting and promotion, as ``gelu_forward(x + b)``."""
    x = draw(0, (5, 4), np.float16)
    for b in (draw(1, (4,), np.float64), draw(2, (5, 1), np.float16), np.float16(0.5)):
        fused, reference = both("bias_gelu_forward", x, b)
        assert_same_bits(fused, reference)
        assert fused[0].dtype == (x + b).dtype


@SETTINGS
@given(shape=st.lists(st.integers(1, 70), min_size=1, max_size=3), seed=seeds, n=threads,
       block=st.sampled_from([None, 7, 4096]))
def test_float32_gelu_fast_path_is_within_its_bound_of_the_formula(shape, seed, n, block):
    """Float32 GELU: the fast Phi is within 2.5e-7 of the exact one, the formula's float32
    0.5 (1 + erf(x / sqrt 2)) within 1.5e-7 (three roundings and erf's), so the two Phi
    differ by at most 4e-7; with the rounding of the products, |out - out_ref| <= 6e-7 |x|
    and |dx - dx_ref| <= 8e-7 |dout| (dout (Phi + x phi), phi computed alike in both)."""
    x, g = draw(seed, shape, np.float32), draw(seed + 1, shape, np.float32, 1.0)
    with cpu_blocking(block, n):
        (out, (_, cdf)), (out_ref, (_, cdf_ref)) = both("gelu_forward", x)
        with fast.fast_paths():
            dx = gelu_backward(g, (x, cdf))
        dx_ref = gelu_backward(g, (x, cdf_ref))
    assert out.dtype == out_ref.dtype == dx.dtype == dx_ref.dtype == np.float32
    assert np.all(np.abs(cdf - cdf_ref) <= 4e-7)
    assert np.all(np.abs(out - out_ref) <= 6e-7 * np.abs(x))
    assert np.all(np.abs(dx - dx_ref) <= 8e-7 * np.abs(g))


def test_float32_normal_cdf_is_within_its_bound_everywhere():
    """The rational float32 Phi (the CPU GELU's) against SciPy's in float64, on every
    float32 step of [-12, 12] at 2^-16 and at the extremes; a coefficient off in its 4th
    digit fails."""
    x = np.concatenate([np.arange(-12, 12, 2.0 ** -16), [-np.inf, -1e30, -8, 8, 1e30, np.inf],
                        np.geomspace(1e-30, 1e-3, 50), -np.geomspace(1e-30, 1e-3, 50)])
    x = x.astype(np.float32)
    phi = normal_cdf(x, np.empty_like(x))
    assert phi.dtype == np.float32
    assert np.abs(phi - ndtr(x.astype(np.float64))).max() <= 2.5e-7
    assert np.isnan(normal_cdf(np.float32([np.nan]), np.empty(1, np.float32))).all()


def test_the_formulas_run_unless_the_fast_paths_are_switched_on(monkeypatch):
    """Every FAST_PATHS entry is named after a formula (an nn/ function or AdamW's update),
    which runs it on NumPy arrays only while the fast paths are switched on: never by
    default, never after switching them off, and never on (stand-in) CuPy arrays, whose
    only fused kernel is AdamW's."""
    calls = []
    for name, fn in list(fast_cpu.FAST_PATHS.items()):
        monkeypatch.setitem(fast_cpu.FAST_PATHS, name,
                            lambda *a, _n=name, _f=fn, **k: calls.append(_n) or _f(*a, **k))
    x = draw(0, (3, 5), np.float32)
    labels = np.array([0, 4, nn.IGNORE_INDEX])

    def run_all(xp):
        a = xp.asarray(x)
        _, c = gelu_forward(a)
        gelu_backward(a, c)
        nn.activations.bias_gelu_forward(a, a[0])
        _, c = nn.linear_forward(a, a, a[0, :3])
        nn.linear_backward(a[:, :3], c)
        _, c = nn.softmax_forward(a)
        nn.softmax_backward(a, c)
        _, c = nn.layernorm_forward(a, a[0], a[1])
        nn.layernorm_backward(a, c)
        _, c = nn.cross_entropy_forward(a, xp.asarray(labels))
        nn.cross_entropy_backward(1.0, c)
        ctx, c = nn.attention_forward(xp.asarray(x[:2, :3].reshape(1, 2, 3)), None, 1)
        nn.attention_backward(ctx, c)
        if xp is np:                       # (the CuPy stand-in has no generator)
            rng = np.random.default_rng(0)
            _, c = nn.dropout.dropout_forward(a, 0.5, rng)
            nn.dropout.dropout_backward(a, c)
            nn.dropout.bias_dropout_add_forward(a, a[0], a, 0.5, rng)
        w = nn.Parameter(xp.asarray(x))
        w.grad[...] = a
        AdamW([("w", w)], lr=1e-3).step()

    assert not fast.fast_paths_enabled()
    run_all(np)
    assert calls == []
    with fast.fast_paths():
        assert fast.fast_paths_enabled()
        run_all(np)
    assert sorted(set(calls)) == sorted(fast_cpu.FAST_PATHS)    # (attention calls softmax)
    calls.clear()
    assert fast.set_fast_paths(True) is False
    assert fast.set_fast_paths(False) is True
    run_all(np)
    assert calls == []
    import fakecupy
    with fakecupy.installed(), fast.fast_paths():
        import cupy
        run_all(cupy)
    assert calls == []
    with fast.fast_paths(), pytest.raises(KeyError):
        fast.fast_path("no_such_function", x)


def test_fast_paths_restores_the_setting_after_an_error():
    x = np.zeros((2, 3))
    with contextlib.suppress(RuntimeError), fast.fast_paths():
        assert fast.fast_path("softmax_forward", x) is fast_cpu.softmax_forward
        raise RuntimeError
    assert fast.fast_path("softmax_forward", x) is None
    assert not fast.fast_paths_enabled()


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 3000), n_decay=st.integers(0, 3000), seed=seeds, threads_=threads,
       correct_bias=st.booleans(), weight_decay=st.sampled_from([0.0, 0.01, 0.3]),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_adamw_fast_path_gives_the_formulas_bits(n, n_decay, seed, threads_, correct_bias,
                                                 weight_decay, dtype):
    """fast_cpu.adamw_update, in any blocking, gives the bits of optim.adamw_update over a
    few steps (moments and parameters), with and without bias correction and decay."""
    rng = np.random.default_rng(seed)
    n_decay = min(n_decay, n)
    start = [rng.standard_normal(n).astype(dtype) for _ in range(2)]
    runs = []
    for blocked in (True, False):
        p, m = start[0].copy(), np.zeros(n, dtype)
        v = np.zeros(n, dtype)
        for t in range(1, 4):
            g = (start[1] * t).astype(dtype)
            step_size, v_scale = 1e-2, 1.0
            if correct_bias:
                # Python floats, as AdamW.step passes them
                step_size, v_scale = 1e-2 / (1 - 0.9 ** t), 1 / math.sqrt(1 - 0.999 ** t)
            args = (p, g, m, v, n_decay, dtype(1e-2), step_size, v_scale, 0.9, 0.999, 1e-6,
                    weight_decay)
            if blocked:
                with cpu_blocking(7, threads_):
                    fast_cpu.adamw_update(*args)
            else:
                adamw_update(*args)
        runs.append((p, m, v))
    assert_same_bits(runs[0], runs[1])


def test_row_parallel_passes_give_the_same_bits_as_one_thread(monkeypatch):
    """Softmax, LayerNorm, their backward and the cross-entropy split over threads
    (fast_cpu.parallel_rows)
    equal the single-threaded result exactly, and blocks cover every row once."""
    from minibert.fast_cpu import parallel_rows
    from minibert.nn.activations import softmax_backward, softmax_forward
    from minibert.nn.layernorm import layernorm_backward, layernorm_forward
    from minibert.nn.losses import cross_entropy_backward, cross_entropy_forward
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 3, 1000)).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    logits = rng.standard_normal((301, 517)).astype(np.float32)
    labels = rng.integers(0, 517, 301)
    labels[::7] = -100

    def run(threads):
        monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
        p, cache = softmax_forward(x)
        dx = softmax_backward(g, cache)
        loss, c = cross_entropy_forward(logits, labels, label_smoothing=0.1)
        w, b = g[0, 0], x[0, 0]
        y, ln = layernorm_forward(x, w, b)
        return (p.copy(), dx, loss, cross_entropy_backward(0.5, c), y,
                *layernorm_backward(g, ln))

    for a, b in zip(run(1), run(3)):
        np.testing.assert_array_equal(a, b)
    seen = np.zeros(10, int)

    def mark(block):
        block += 1
        return len(block)

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert parallel_rows(mark, seen, min_size=1) == [3, 4, 3]      # 10 / 3 rows, rounded
    np.testing.assert_array_equal(seen, 1)


@pytest.mark.parametrize("n, threads, align, sizes", [
    (614, 2, 64, [320, 294]),      # 307 rows is nearer 320 than 256: the caller's block
    (650, 2, 64, [320, 330]),
    (128, 2, 64, [64, 64]),
    (100, 3, 1, [33, 34, 33]),
    (130, 3, 64, [64, 0, 66])])
def test_parallel_rows_blocks_start_at_the_nearest_aligned_row(monkeypatch, n, threads,
                                                               align, sizes):
    """Every block but the last starts at the multiple of ``align`` nearest to its even
    share, so an uneven split does not leave the calling thread waiting on a larger block."""
    from minibert.fast_cpu import parallel_rows
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    seen = np.zeros(n, int)

    def mark(block):
        block += 1
        return len(block)

    assert parallel_rows(mark, seen, min_size=0, align=align) == sizes
    np.testing.assert_array_equal(seen, 1)


@pytest.mark.parametrize("threads, block, n", [(1, 4, 10), (3, 4, 10), (2, 1, 7), (2, 100, 7),
                                               (3, 3, 0)])
def test_parallel_blocks_visit_every_element_once(monkeypatch, threads, block, n):
    """Blocks of at most ``block`` elements, every element in exactly one block, in any
    shape; a strided view and an empty array get one call each."""
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    seen = np.zeros((n, 3))
    sizes = []

    def mark(a):
        a += 1
        sizes.append(a.size)

    fast_cpu.parallel_blocks(mark, seen, block=block * 3)
    np.testing.assert_array_equal(seen, 1)
    assert sum(sizes) == seen.size and max(sizes, default=0) <= block * 3
    sizes.clear()
    fast_cpu.parallel_blocks(mark, seen[:, ::2], block=1)       # strided: one call
    assert sizes == [seen[:, ::2].size]


def test_freed_memory_is_kept_for_the_next_allocation():
    """After keep_freed_memory (which set_fast_paths(True) calls), a 64 MiB array allocated
    again after a free reuses pages: almost no new page faults (glibc by default would
    mmap and unmap it every time: about 1,600 faults for the three here with transparent
    huge pages, 49,152 without)."""
    import resource
    if not fast_cpu.keep_freed_memory():
        pytest.skip("not glibc: no mallopt")      # macOS / musl; CI runs on glibc
    np.ones(1 << 24, np.float32)                 # touched once, then freed

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    before = faults()
    for _ in range(3):
        np.ones(1 << 24, np.float32)
    assert faults() - before < 100


def test_parallel_rows_called_from_a_pool_thread_runs_inline(monkeypatch):
    """A row function that itself calls parallel_rows (as the attention fast path's
    blocks call the softmax's) runs the inner call on its own thread: on one of the
    pool's, as pool threads each waiting on the pool would deadlock it, and on the
    calling thread while it runs its own block, as the pool's threads are busy with the
    other blocks (splitting again would only wait for them). Run from a helper thread,
    so a deadlock fails the test at the timeout instead of hanging it."""
    import threading
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    x = np.zeros((8, 4))

    def outer(block):
        return (threading.current_thread().name.startswith("minibert-pool"),
                fast_cpu.parallel_rows(lambda b: len(b), block, min_size=1))

    result = []
    t = threading.Thread(target=lambda: result.append(fast_cpu.parallel_rows(outer, x,
                                                                             min_size=1)))
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "nested parallel_rows deadlocked the pool"
    # outer block 1 on the calling thread, block 2 on the pool's: both inner calls inline
    assert result == [[(False, [4]), (True, [4])]]
    assert fast_cpu.parallel_rows(lambda b: len(b), x, min_size=1) == [4, 4]   # flag cleared


@pytest.mark.parametrize("threads, chunks, n, align", [(2, 4, 1000, 1), (3, 2, 50, 1),
                                                       (2, 3, 4096, 64), (2, 4, 7, 1)])
def test_parallel_rows_in_chunks_cover_every_row_once_in_order(monkeypatch, threads, chunks,
                                                               n, align):
    """With ``chunks`` blocks a thread, taken by whichever thread is free, every row is
    visited once, the results come back in block order, and both the calling thread and
    the pool's take blocks while the other side holds one."""
    import threading
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    seen, names = np.zeros(n, int), set()
    # a block waits (10 s at most) until the other side has taken one too: a sleep in one
    # block instead left the calling thread without a block on a loaded machine
    took = {True: threading.Event(), False: threading.Event()}

    def visit(ids, seen_rows):
        name = threading.current_thread().name
        names.add(name)
        caller = name == "MainThread"
        took[caller].set()
        took[not caller].wait(timeout=10)
        seen_rows += 1
        return int(ids[0]) if len(ids) else None

    starts = fast_cpu.parallel_rows(visit, np.arange(n), seen, min_size=0, align=align,
                                    chunks=chunks)
    np.testing.assert_array_equal(seen, 1)
    assert len(starts) == threads * chunks
    starts = [s for s in starts if s is not None]
    assert starts == sorted(starts) and starts[0] == 0 and len(starts) > threads
    assert all(s % align == 0 for s in starts)
    assert "MainThread" in names and len(names) >= 2       # the pool took blocks meanwhile


def test_parallel_rows_run_the_first_block_on_the_calling_thread(monkeypatch):
    """With t threads, block 0 runs on the caller and blocks 1..t-1 on t - 1 pool
    threads; when a block raises, the call still waits for the others (none is left
    writing) and raises the first block's error (the caller's) before a pool block's."""
    import threading
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    together, done = threading.Barrier(3, timeout=30), []

    def who(block):
        together.wait()                           # all three blocks run at once
        return threading.current_thread().name

    got = fast_cpu.parallel_rows(who, np.zeros(9), min_size=1)
    assert got[0] == threading.current_thread().name
    assert all(n.startswith("minibert-pool") for n in got[1:]) and len(set(got[1:])) == 2

    def fail(block):
        if block[0] == 0:                         # the caller's block
            raise ValueError("first")
        time.sleep(0.05)
        done.append(block[0])
        raise KeyError("later")

    with pytest.raises(ValueError, match="first"):
        fast_cpu.parallel_rows(fail, np.arange(9), min_size=1)
    assert sorted(done) == [3, 6]                 # both pool blocks had finished
