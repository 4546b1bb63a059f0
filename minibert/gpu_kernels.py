"""Fused CuPy kernels for the GPU path: each one pass over memory instead of a chain of
element-wise launches. Imported only when arrays live on the GPU (CuPy compiles a kernel
with NVRTC on its first call and caches it).

Every kernel computes the formula it replaces (named in its docstring) and runs only when a
job switches the fast paths on (:func:`minibert.fast.set_fast_paths`); tests compare
the two through the NumPy stand-in of CuPy (tests/fakecupy.py).
"""
from __future__ import annotations

import functools
import math

import numpy

import cupy


@functools.lru_cache(maxsize=None)
def _adamw_kernel():
    # one thread per scalar of the flat buffer; i is the element index, so the decayed
    # matrices (the first n_decay scalars) get the decoupled weight decay. c1 = 1 - b1 and
    # c2 = 1 - b2 come from the host: computed here in float32, 1 - 0.999f is 1.00005e-3,
    # not 1e-3 (b2 rounded to float32 first), which the NumPy passes do not do.
    return cupy.ElementwiseKernel(
        "T g, T lr, T step_size, T v_scale, T b1, T b2, T c1, T c2, T eps, T wd, "
        "int64 n_decay",
        "T p, T m, T v",
        """
        T m_new = b1 * m + c1 * g;
        T v_new = b2 * v + g * g * c2;
        m = m_new;
        v = v_new;
        T p_new = p;
        if (i < n_decay) p_new = p_new * (1 - lr * wd);
        p = p_new - step_size * m_new / (sqrt(v_new) * v_scale + eps);
        """,
        "minibert_adamw")


def adamw_update(p, g, m, v, n_decay: int, lr, step_size, v_scale: float, b1: float,
                 b2: float, eps: float, weight_decay: float, scratch=None) -> None:
    """One fused AdamW update over flat (S,) buffers, in place on p, m, v: the formula of
    :func:`minibert.optim.adamw_update` (Loshchilov & Hutter 2019, BERT's eps placement).

    Args:
        p, g, m, v: (S,) float32 CuPy arrays (parameters, gradient, moments).
        n_decay: the first n_decay scalars are weight-decayed.
        lr, step_size: floats or 0-d device arrays (a skipped step passes lr 0 with no
            host read); v_scale, b1, b2, eps, weight_decay: floats, passed to the kernel
            as scalar arguments (no host-to-device copy).
        scratch: unused (the kernel keeps its intermediates in registers).
    """
    _adamw_kernel()(g, lr, step_size, v_scale, b1, b2, 1.0 - b1, 1.0 - b2, eps, weight_decay,
                    int(n_decay), p, m, v)


FAST_PATHS = {"adamw_update": adamw_update}
"""The name of a formula -> its fused GPU kernel, where the GPU has one (see
:func:`minibert.fast.fast_path`); the other formulas run as written on the GPU."""


# ------------------------------------------------------------------ the layers' kernels
#
# Each kernel below is one launch for a chain of element-wise operations of a formula of
# minibert/nn/. A kernel is built once per compute type: "float" (float32 arrays, and
# float16 arrays, which the formulas reduce or evaluate in float32 where they say so) or
# "double" (float64: gradient checks). Constants are literals of that type, so a float32
# kernel rounds them as NumPy rounds a Python float against a float32 array. The reductions
# (row max, row sums and means, column sums for dw / db) stay CuPy reductions: one launch
# each.

_SQRT_HALF = 0.7071067811865476          # 1 / sqrt(2), as nn/activations.py
_INV_SQRT_2PI = 0.3989422804014327       # 1 / sqrt(2 pi)


def _ctype(dtype) -> tuple[str, str, str]:
    """(C type, literal suffix, NumPy dtype name) of the arithmetic for arrays of dtype."""
    if numpy.dtype(dtype) == numpy.float64:
        return "double", "", "float64"
    return "float", "f", "float32"


def _compute(dtype):
    """The dtype of the row statistics for activations of ``dtype`` (float16 and bfloat16
    -> float32: :func:`minibert.backend.compute_dtype`)."""
    from .backend import compute_dtype
    return compute_dtype(dtype)


_IND = "            "     # the indentation of a kernel body's lines

_GELU_BODY = """{c} cdf_v = 0.5{s} * (1.0{s} + erf(xv * {sqrt_half}{s}));
cdf = cdf_v;
{c} cdf_r = cdf;
y = xv * cdf_r;
"""
"""GELU of the local ``xv`` (C type ``{c}``): writes ``cdf`` and ``y = xv cdf`` (cdf read
back rounded to its array type), as gelu_forward and bias_gelu_forward both compute it."""


def _body(*lines: str) -> str:
    """A kernel body of the C ``lines`` (each one statement, or several joined by
    newlines), indented as the kernels' bodies are."""
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return "\n" + "".join(_IND + line + "\n" for line in text.splitlines()) + _IND


def _gelu(c: str, s: str) -> str:
    """:data:`_GELU_BODY` in the C type ``c`` (literal suffix ``s``)."""
    return _GELU_BODY.format(c=c, s=s, sqrt_half=_SQRT_HALF)


def _sum(c: str, out: str, a: tuple[str, str], b: tuple[str, str], decl: str = "") -> str:
    """C lines ``out = a + b``, each operand ``(local, source)`` read into a local of type
    ``c`` first (``decl``: a type declaring ``out``, or "" for an output)."""
    (an, av), (bn, bv) = a, b
    return f"{c} {an} = {av};\n{c} {bn} = {bv};\n{decl}{out} = {an} + {bn};\n"


def _scaled_copy(c: str, src: tuple[str, str, str], dst: tuple[str, str, str]) -> str:
    """A body copying three arrays ``src`` into ``dst``, the first times ``scale``."""
    return _body(f"{c} a = {src[0]};", f"{c} sv = scale;", f"{dst[0]} = a * sv;",
                 f"{dst[1]} = {src[1]};", f"{dst[2]} = {src[2]};")


def _activation_kernels(c: str, s: str, np_name: str) -> dict[str, tuple[str, str, str]]:
    """ElementwiseKernel specs (inputs, outputs, body) of GELU (exact, and with the feed-forward's bias) and inverted dropout, in the C type ``c``
    (literal suffix ``s``; ``np_name`` its NumPy name): see :func:`_kernel`."""
    return {
        # x Phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2))
        "gelu_forward": ("T x", "T y, T cdf", _body(f"{c} xv = x;", _gelu(c, s))),
        # h = x + b, then GELU of h (the feed-forward's bias and activation)
        "bias_gelu_forward": ("T x, T b", "T h, T y, T cdf", _body(
            _sum(c, "h", ("xv0", "x"), ("bv", "b")), f"{c} xv = h;", _gelu(c, s))),
        # dout (Phi(x) + x phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
        "gelu_backward": ("T dout, T x, T cdf", "T dx", f"""
            {c} xv = x;
            {c} d = dout;
            {c} cv = cdf;
            {c} pdf = exp(xv * xv * -0.5{s}) * {_INV_SQRT_2PI}{s};
            dx = d * (cv + xv * pdf);
            """),
        # keep = u >= p, out = x keep scale (inverted dropout)
        "dropout_forward": (f"T x, float32 u, float32 p, {np_name} scale", "bool keep, T out", f"""
            keep = u >= p;
            {c} xv = x;
            {c} kv = keep;
            out = xv * kv * scale;
            """),
        "dropout_backward": (f"T dout, bool keep, {np_name} scale", "T dx", f"""
            {c} d = dout;
            {c} kv = keep;
            dx = d * kv * scale;
            """),
    }


def _layernorm_kernels(c: str, s: str, np_name: str) -> dict[str, tuple[str, str, str]]:
    """ElementwiseKernel specs (inputs, outputs, body) of LayerNorm's forward and backward passes, in the C type ``c``
    (literal suffix ``s``; ``np_name`` its NumPy name): see :func:`_kernel`."""
    return {
        # centred x and its square (LayerNorm's variance is the row mean of sq)
        "layernorm_centre": ("T x, C mean", "C xc, C sq", f"""
            {c} xv = x;
            xc = xv - mean;
            sq = (xv - mean) * (xv - mean);
            """),
        # rstd = (var + eps)^-1/2
        "layernorm_rstd": (f"C var, {np_name} eps", "C rstd", f"""
            rstd = pow(var + eps, -0.5{s});
            """),
        # xhat = xc rstd, out = xhat w + b
        "layernorm_affine": ("C xc, C rstd, W w, W b", "C xhat, T out", f"""
            {c} h = xc * rstd;
            xhat = h;
            {c} wv = w;
            {c} bv = b;
            out = h * wv + bv;
            """),
        # g = dout w (d out / d xhat), dout in the compute dtype, and the products whose
        # sums give dw and mean(g xhat)
        "layernorm_grads": ("T dout, C xhat, W w", "C dxh, C dc, C g, C gx", f"""
            {c} d = dout;
            {c} wv = w;
            dxh = d * xhat;
            dc = d;
            g = d * wv;
            gx = (d * wv) * xhat;
            """),
        # dx = (g - xhat mean(g xhat) - mean(g)) rstd
        "layernorm_dx": ("C g, C xhat, C mean_gx, C mean_g, C rstd", "T dx", f"""
            {c} v = (g - xhat * mean_gx - mean_g) * rstd;
            dx = v;
            """),
        # xhat = (x - mean) rstd, out = xhat w + b (x in the compute dtype)
        "layernorm_normalise": ("T x, T mean, T rstd, T w, T b", "T xhat, T out", """
            T h = (x - mean) * rstd;
            xhat = h;
            out = h * w + b;
            """),
    }


def _softmax_kernels(c: str, s: str, np_name: str) -> dict[str, tuple[str, str, str]]:
    """ElementwiseKernel specs (inputs, outputs, body) of the softmax (plain, masked, with dropout's backward) and the cross-entropy, in the C type ``c``
    (literal suffix ``s``; ``np_name`` its NumPy name): see :func:`_kernel`."""
    return {
        # p = exp(x - max) / sum
        "softmax_normalise": ("T x, T m, T s", "T p", """
            p = exp(x - m) / s;
            """),
        # p = exp(x + mask - max) / sum
        "masked_softmax_normalise": ("T x, T mask, T m, T s", "T p", """
            T xm = x + mask;
            p = exp(xm - m) / s;
            """),
        # dx = (dd keep scale - row) p
        "dropout_softmax_dx": ("T dd, bool keep, T scale, T row, T p", "T dx", """
            T d = dd * keep * scale;
            dx = (d - row) * p;
            """),
        # e = exp(x - max)
        "softmax_exp": ("T x, T m", "C e", f"""
            {c} xv = x;
            {c} mv = m;
            e = exp(xv - mv);
            """),
        # the cross-entropy: nll = lse - (x[label] - max), lse = log(sum exp(x - max)),
        # with label smoothing (1 - eps) nll + eps (lse - (mean(x) - max))
        "softmax_nll": ("T xl, T m, T s, T xmean, T eps", "T nll", f"""
            T lse = log(s);
            T picked = xl - m;
            T plain = lse - picked;
            nll = plain;
            if (eps != 0) nll = (1 - eps) * plain + eps * (lse - (xmean - m));
            """),
        # its backward: (p - (1 - eps) onehot(label) - eps / K) * valid / denom * dloss
        "cross_entropy_backward": ("T p, L lab, int64 col, bool valid, T denom, "
                                   "float64 dloss, T c1, T epsk", "T d", f"""
            T one = col == lab;
            T v = p - one * c1;
            v = v - epsk;
            {c} vv = valid;
            {c} w32 = vv / denom;
            double wd = w32 * dloss;
            T w = wd;
            d = v * w;
            """),
        # dx = (dp - row) p
        "softmax_dx": ("T dp, T row, T p", "T dx", f"""
            {c} d = dp;
            {c} r = row;
            T t = d - r;
            {c} tv = t;
            {c} pv = p;
            dx = tv * pv;
            """),
    }


def _attention_kernels(c: str, s: str, np_name: str) -> dict[str, tuple[str, str, str]]:
    """ElementwiseKernel specs (inputs, outputs, body) of attention's head split and merge and the three QKV gradients, in the C type ``c``
    (literal suffix ``s``; ``np_name`` its NumPy name): see :func:`_kernel`."""
    return {
        # q = q_in * scale, k = k_in, v = v_in: three strided head views made contiguous
        "split_heads": ("T qi, T ki, T vi, T scale", "T q, T k, T v",
                        _scaled_copy(c, ("qi", "ki", "vi"), ("q", "k", "v"))),
        # the same with the projections' bias added first
        "split_heads_bias": ("T qi, T ki, T vi, T bq, T bk, T bv, T scale", "T q, T k, T v",
                             _body(_sum(c, "hq", ("a", "qi"), ("ba", "bq"), "T "),
                                   f"{c} hqv = hq;", f"{c} sv = scale;", "q = hqv * sv;",
                                   _sum(c, "k", ("kv0", "ki"), ("bkv", "bk")),
                                   _sum(c, "v", ("vv0", "vi"), ("bvv", "bv")))),
        # the inverse: dq = dq_scaled * scale, dk, dv written into strided views of dqkv
        "merge_head_grads": ("T dqs, T dki, T dvi, T scale", "T dq, T dk, T dv",
                             _scaled_copy(c, ("dqs", "dki", "dvi"), ("dq", "dk", "dv"))),
        # three gradients added into three accumulators
        "add_grads": ("T a, T b, T c", "T ga, T gb, T gc", _body(
            *(_sum(c, f"g{x}", (f"{x}0", f"g{x}"), (f"{x}1", x)) for x in "abc"))),
    }


def _residual_kernels(c: str, s: str, np_name: str) -> dict[str, tuple[str, str, str]]:
    """ElementwiseKernel specs (inputs, outputs, body) of bias + dropout + residual, and the clipping coefficient, in the C type ``c``
    (literal suffix ``s``; ``np_name`` its NumPy name): see :func:`_kernel`."""
    return {
        # out = dropout(x + b) + residual, each step rounded to T as the formula rounds it
        "bias_dropout_add": (f"T x, T b, float32 u, T residual, float32 p, {np_name} scale",
                             "bool keep, T out", _body(
            _sum(c, "y", ("xv", "x"), ("bv", "b"), "T "), "keep = u >= p;", f"{c} yv = y;",
            f"{c} kv = keep;", "T d = yv * kv * scale;",
            _sum(c, "out", ("dv", "d"), ("rv", "residual")))),
        # out = (x + b) + residual (no dropout: evaluation, or p = 0)
        "bias_add_add": ("T x, T b, T residual", "T out", _body(
            _sum(c, "y", ("xv", "x"), ("bv", "b"), "T "),
            _sum(c, "out", ("yv", "y"), ("rv", "residual")))),
        # the global norm and the clipping coefficient min(max_norm / (norm + 1e-6), 1)
        "clip_coef": ("T sq, float64 max_norm", "T total, T coef", """
            total = sqrt(sq);
            double t = total;
            double c = fmin(max_norm / (t + 1e-6), 1.0);
            coef = c;
            """),
    }


@functools.lru_cache(maxsize=None)
def _kernel(kind: str, ctype: str):
    """The ElementwiseKernel ``kind`` computing in ``ctype`` ("float" or "double")."""
    s = "f" if ctype == "float" else ""
    np_name = "float32" if ctype == "float" else "float64"
    c = ctype
    specs = {}
    for group in (_activation_kernels, _layernorm_kernels, _softmax_kernels,
                  _attention_kernels, _residual_kernels):
        specs.update(group(c, s, np_name))
    ins, outs, body = specs[kind]
    return cupy.ElementwiseKernel(ins, outs, body, f"minibert_{kind}_{ctype}")


@functools.lru_cache(maxsize=None)
def _reduction(kind: str, ctype: str):
    """The ReductionKernel ``kind`` computing in ``ctype`` ("float" or "double"): a map,
    a sum along the axis of the call, a post-map of the sum ``a`` and scalar inputs."""
    s = "f" if ctype == "float" else ""
    specs = {
        # rstd = (mean((x - mean)^2) + eps)^-1/2, n the row length
        "layernorm_rstd": ("T x, T mean, T n, T eps", "T rstd", "(x - mean) * (x - mean)",
                           f"rstd = pow(a / n + eps, -0.5{s})"),
        # s = sum(exp(x - max))
        "softmax_sum": ("T x, T m", "T s", "exp(x - m)", "s = a"),
        # row = sum(dp p)
        "softmax_row": ("T dp, T p", "T row", "dp * p", "row = a"),
        # the masked row max and sum of exp(x + mask - max)
        "masked_max": ("T x, T mask", "T m", "x + mask", "m = a"),
        "masked_sum": ("T x, T mask, T m", "T s", "exp(x + mask - m)", "s = a"),
        # row = sum(dd keep scale p): the dropout's backward inside the softmax's
        "dropout_softmax_row": ("T dd, bool keep, T scale, T p", "T row",
                                "dd * keep * scale * p", "row = a"),
        # sq = sum(g^2): a reduction, not cuBLAS's dot (which a captured graph cannot hold)
        "sum_squares": ("T g", "T sq", "g * g", "sq = a"),
    }
    ins, out, map_expr, post = specs[kind]
    if kind == "masked_max":
        lowest = "-3.4028234663852886e+38" if ctype == "float" else "-1.7976931348623157e+308"
        return cupy.ReductionKernel(ins, out, map_expr, "max(a, b)", post, lowest,
                                    f"minibert_{kind}_{ctype}")
    return cupy.ReductionKernel(ins, out, map_expr, "a + b", post, "0",
                                f"minibert_{kind}_{ctype}")


def gelu_forward(x):
    """Exact GELU in one kernel: the formula of :func:`minibert.nn.activations.gelu_forward`,
    ``cdf = 0.5 (1 + erf(x / sqrt 2))``, ``out = x cdf``, computed in float (float16 and
    float32 x) or double (float64 x) and rounded to x's dtype.

    Args:
        x: CuPy array, any shape, float16 / float32 / float64.
    Returns:
        out (shape and dtype of x) and the cache ``(x, cdf)`` of the formula.
    """
    out, cdf = _kernel("gelu_forward", _ctype(x.dtype)[0])(x)
    return out, (x, cdf)


def bias_gelu_forward(x, b):
    """:func:`minibert.nn.activations.bias_gelu_forward` in one kernel: ``h = x + b``
    (rounded to x's dtype), ``cdf = 0.5 (1 + erf(h / sqrt 2))``, ``out = h cdf``.

    Args:
        x: (..., I) CuPy float array; b: (I,) of x's dtype.
    Returns:
        out (shape and dtype of x) and the GELU cache ``(h, cdf)``.
    """
    h, out, cdf = _kernel("bias_gelu_forward", _ctype(x.dtype)[0])(x, b)
    return out, (h, cdf)


def gelu_backward(dout, cache):
    """d/dx [x Phi(x)] in one kernel: ``dx = dout (Phi(x) + x phi(x))``, ``phi(x) =
    exp(-x^2 / 2) / sqrt(2 pi)`` (:func:`minibert.nn.activations.gelu_backward`).

    Args:
        dout: the shape and dtype of x; cache: from :func:`gelu_forward` (or the formula).
    Returns:
        dx, the shape and dtype of dout.
    """
    x, cdf = cache
    return _kernel("gelu_backward", _ctype(x.dtype)[0])(dout, x, cdf)


def dropout_forward(x, p: float, rng):
    """Inverted dropout: one draw of float32 uniforms ``u`` (the counter-based generator of
    :class:`minibert.backend.DropoutRNG`, one kernel) and one kernel,
    ``keep = u >= p``, ``out = x keep / (1 - p)`` (the formula of
    :func:`minibert.nn.dropout.dropout_forward` with the mask of
    :func:`minibert.backend.keep_mask` for a device generator).

    Args:
        x: CuPy array, float; p: drop probability in [0, 1); rng: a device generator
            (``random(shape, dtype)``, e.g. :class:`minibert.backend.DropoutRNG`).
    Returns:
        out (shape and dtype of x) and the cache ``(keep, scale)`` (keep: bool, shape of x).
    """
    u = rng.random(x.shape, dtype=numpy.float32)
    scale = 1.0 / (1.0 - p)
    keep, out = _kernel("dropout_forward", _ctype(x.dtype)[0])(x, u, p, scale)
    return out, (keep, scale)


def dropout_backward(dout, cache):
    """``dx = dout keep scale`` in one kernel (:func:`minibert.nn.dropout.dropout_backward`).
    dout: any shape, float; cache: ``(keep, scale)`` of the forward. Returns dx."""
    keep, scale = cache
    return _kernel("dropout_backward", _ctype(dout.dtype)[0])(dout, keep, scale)


def layernorm_forward(x, w, b, eps: float = 1e-12):
    """LayerNorm over the last axis in five launches instead of nine: the row mean, one
    kernel for ``xc = x - mean`` and ``xc^2``, the row mean of that (the biased variance),
    one for ``rstd = (var + eps)^-1/2``, one for ``xhat = xc rstd`` and ``out = xhat w + b``
    (:func:`minibert.nn.layernorm.layernorm_forward`; float16 x is normalised in float32).

    Args:
        x: (..., C) CuPy float array; w, b: (C,).
    Returns:
        out (..., C) in x's dtype and the cache ``(xhat, rstd, w)`` of the formula (xhat
        (..., C) and rstd (..., 1) in the compute dtype).
    """
    cdt = _compute(x.dtype)
    ctype, _, _ = _ctype(cdt)
    if x.dtype == cdt and w.dtype == cdt and b.dtype == cdt:   # three launches
        mean = x.mean(axis=-1, keepdims=True)                             # (..., 1)
        rstd = _reduction("layernorm_rstd", ctype)(x, mean, x.shape[-1], eps, axis=-1,
                                                   keepdims=True)          # (..., 1)
        xhat, out = _kernel("layernorm_normalise", ctype)(x, mean, rstd, w, b)
        return out, (xhat, rstd, w)
    mean = x.mean(axis=-1, keepdims=True, dtype=cdt)                 # (..., 1)
    xc, sq = _kernel("layernorm_centre", ctype)(x, mean)             # (..., C)
    var = sq.mean(axis=-1, keepdims=True)                            # (..., 1)
    rstd = _kernel("layernorm_rstd", ctype)(var, eps)                # (..., 1)
    xhat = cupy.empty(x.shape, cdt)
    out = cupy.empty(x.shape, x.dtype)
    _kernel("layernorm_affine", ctype)(xc, rstd, w, b, xhat, out)
    return out, (xhat, rstd, w)


def _layernorm_grads(dout, cache):
    """The kernels of LayerNorm's backward: (dx, cols) with cols (2, N, C) holding
    ``dout xhat`` and ``dout`` (compute dtype), whose column sums are dw and db."""
    xhat, rstd, w = cache
    ctype, _, _ = _ctype(xhat.dtype)
    C = xhat.shape[-1]
    cols = cupy.empty((2,) + xhat.shape, xhat.dtype)        # [dout xhat, dout]
    rows = cupy.empty((2,) + xhat.shape, xhat.dtype)        # [g, g xhat]
    _kernel("layernorm_grads", ctype)(dout, xhat, w, cols[0], cols[1], rows[0], rows[1])
    means = rows.mean(axis=-1, keepdims=True)                          # (2, ..., 1)
    dx = cupy.empty(dout.shape, dout.dtype)
    _kernel("layernorm_dx", ctype)(rows[0], xhat, means[1], means[0], rstd, dx)
    return dx, cols.reshape(2, -1, C)


def layernorm_backward(dout, cache):
    """Gradients of LayerNorm in four launches instead of eleven: one kernel writing
    ``dout xhat`` and ``dout`` (in the compute dtype) into one (2, ..., C) buffer and
    ``g = dout w`` and ``g xhat`` into another; one column sum of the first (dw and db
    together), one row mean of the second (mean(g) and mean(g xhat) together); one kernel
    for ``dx = (g - xhat mean(g xhat) - mean(g)) rstd``
    (:func:`minibert.nn.layernorm.layernorm_backward`).

    Args:
        dout: (..., C); cache: ``(xhat, rstd, w)`` of the forward.
    Returns:
        dx (..., C) in dout's dtype, dw (C,) and db (C,) in the compute dtype.
    """
    dx, cols = _layernorm_grads(dout, cache)
    sums = cols.sum(axis=1)                                            # (2, C): dw, db
    return dx, sums[0], sums[1]


def layernorm_backward_into(dout, cache, dw_acc=None, db_acc=None):
    """:func:`minibert.nn.layernorm.layernorm_backward_into`: the kernels of
    :func:`layernorm_backward`, then ``dw_acc += 1^T (dout xhat)`` and ``db_acc += 1^T
    dout``, each one cuBLAS gemm with ``beta = 1`` (two launches where the formula's route
    takes a sum and two additions). Accumulators of another dtype than the compute dtype
    (float16 parameters) or not contiguous take the sums and additions.

    Args:
        dout: (..., C); cache: ``(xhat, rstd, w)``; dw_acc, db_acc: (C,) or None.
    Returns:
        dx (..., C) in dout's dtype.
    """
    dx, cols = _layernorm_grads(dout, cache)
    N, C = cols.shape[1], cols.shape[2]
    for i, acc in enumerate((dw_acc, db_acc)):
        if acc is None:
            continue
        if cols.dtype.char in "fd" and acc.dtype == cols.dtype and acc.flags.c_contiguous:
            gemm_ex(_ones_row(N, cols.dtype), cols[i], acc.reshape(1, C), beta=1.0)
        else:
            acc += cols[i].sum(axis=0)
    return dx


def softmax_forward(x, axis: int = -1, out=None):
    """Softmax along ``axis`` in four launches instead of five: the row max, one kernel
    for ``e = exp(x - max)`` (into ``out``, in place when ``out is x``), the row sum, the
    division in place (:func:`minibert.nn.activations.softmax_forward`; float16 is
    normalised in float32 and returned as float16).

    Args:
        x: any shape, float CuPy array; axis: the axis normalised over; out: optional
            array of x's shape and dtype for the result (ignored for float16).
    Returns:
        probs (shape of x, x's dtype) and the cache ``(probs, axis)``.
    """
    dtype, cdt = x.dtype, _compute(x.dtype)
    if cdt != dtype or out is None:
        out = cupy.empty(x.shape, cdt)
    m = x.max(axis=axis, keepdims=True)
    if cdt == dtype:                                           # three launches
        s = _reduction("softmax_sum", _ctype(cdt)[0])(x, m, axis=axis, keepdims=True)
        _kernel("softmax_normalise", _ctype(cdt)[0])(x, m, s, out)
        return out, (out, axis)
    _kernel("softmax_exp", _ctype(cdt)[0])(x, m, out)
    probs = cupy.divide(out, out.sum(axis=axis, keepdims=True), out=out)
    probs = probs.astype(dtype, copy=False)
    return probs, (probs, axis)


def softmax_backward(dprobs, cache, out=None):
    """``dx = p (dp - sum(dp p))`` along the forward's axis in three launches instead of
    four: the product, its row sum (in the compute dtype), one kernel for ``(dp - row) p``
    (:func:`minibert.nn.activations.softmax_backward`).

    Args:
        dprobs: the shape of probs; cache: from :func:`softmax_forward`; out: optional
            array for the result (``out=dprobs`` works in place).
    Returns:
        dx, the shape and dtype of probs.
    """
    probs, axis = cache
    if out is None:
        out = cupy.empty(probs.shape, probs.dtype)
    if _compute(probs.dtype) == probs.dtype and dprobs.dtype == probs.dtype:   # two launches
        row = _reduction("softmax_row", _ctype(probs.dtype)[0])(dprobs, probs, axis=axis,
                                                                keepdims=True)
        _kernel("softmax_dx", _ctype(probs.dtype)[0])(dprobs, row, probs, out)
        return out
    row = cupy.multiply(dprobs, probs).sum(axis=axis, keepdims=True,
                                           dtype=_compute(probs.dtype)).astype(probs.dtype,
                                                                               copy=False)
    if out is None:
        out = cupy.empty(probs.shape, probs.dtype)
    _kernel("softmax_dx", _ctype(probs.dtype)[0])(dprobs, row, probs, out)
    return out


def split_heads(qkv, num_heads: int, bias=None):
    """:func:`minibert.nn.attention.split_heads` in one kernel: the three strided head
    views of qkv copied into contiguous arrays (plus their part of ``bias``, rounded to
    qkv's dtype as the formula's ``qkv + bias``), q times ``1 / sqrt(HS)`` on the way.

    Args:
        qkv: (B, T, 3C) CuPy float array; num_heads: NH; bias: (3C,) or None.
    Returns:
        q * scale, k, v ((B, NH, T, HS) each, C-contiguous, qkv's dtype) and scale.
    """
    B, T, C3 = qkv.shape
    NH, HS = num_heads, C3 // 3 // num_heads
    scale = 1.0 / math.sqrt(HS)
    heads = qkv.reshape(B, T, 3, NH, HS).transpose(2, 0, 3, 1, 4)  # (3, B, NH, T, HS) view
    q, k, v = (cupy.empty((B, NH, T, HS), qkv.dtype) for _ in range(3))
    ctype = _ctype(qkv.dtype)[0]
    if bias is None:
        _kernel("split_heads", ctype)(heads[0], heads[1], heads[2], scale, q, k, v)
    else:
        b = bias.reshape(3, NH, 1, HS)                             # broadcast over B, T
        _kernel("split_heads_bias", ctype)(heads[0], heads[1], heads[2], b[0], b[1], b[2],
                                           scale, q, k, v)
    return q, k, v, scale


def merge_head_grads(dq_scaled, dk, dv, scale: float):
    """:func:`minibert.nn.attention.merge_head_grads` in one kernel: the heads' gradients
    written into the strided views of one (B, T, 3C) array, dq times ``scale`` on the way.

    Args:
        dq_scaled, dk, dv: (B, NH, T, HS) CuPy float arrays of one dtype; scale: float.
    Returns:
        dqkv (B, T, 3C), [dq | dk | dv] along the last axis.
    """
    B, NH, T, HS = dq_scaled.shape
    dqkv = cupy.empty((B, T, 3, NH, HS), dq_scaled.dtype)
    dheads = dqkv.transpose(2, 0, 3, 1, 4)                      # (3, B, NH, T, HS) view
    _kernel("merge_head_grads", _ctype(dq_scaled.dtype)[0])(dq_scaled, dk, dv, scale,
                                                             dheads[0], dheads[1], dheads[2])
    return dqkv.reshape(B, T, 3 * NH * HS)


def bias_dropout_add_forward(x, b, residual, p: float, rng):
    """``dropout(x + b) + residual`` in one kernel after the draw
    (:func:`minibert.nn.dropout.bias_dropout_add_forward`): the bias of a Linear layer, the
    dropout of its output and the residual sum of a BERT sub-layer.

    Args:
        x: (..., C) CuPy float array (the product x W^T); b: (C,); residual: x's shape;
            p: drop probability in [0, 1) (0: no dropout, no draw); rng: the device
            generator (used when p > 0).
    Returns:
        out (x's shape and dtype) and the dropout cache ``(keep, scale)``, or None when
        p == 0.
    """
    ctype = _ctype(x.dtype)[0]
    if p == 0.0:
        return _kernel("bias_add_add", ctype)(x, b, residual), None
    u = rng.random(x.shape, dtype=numpy.float32)
    scale = 1.0 / (1.0 - p)
    keep, out = _kernel("bias_dropout_add", ctype)(x, b, u, residual, p, scale)
    return out, (keep, scale)


_ONES = {}      # (device, n, dtype) -> a (1, n) row of ones on that device, made once


def _ones_row(n: int, dtype):
    """A (1, n) row of ones of ``dtype`` on the current device, made once (the left
    operand of a column-sum product ``1^T X``)."""
    key = (cupy.cuda.runtime.getDevice(), n, numpy.dtype(dtype).name)
    if key not in _ONES:
        _ONES[key] = cupy.ones((1, n), dtype)
    return _ONES[key]


# ------------------------------------------------------------------ matrix products
#
# cuBLAS enums (cublas_api.h, library_types.h), the values CuPy's cupy.cuda.cublas takes.
_CUBLAS_OP = (0, 1)                                # CUBLAS_OP_N, CUBLAS_OP_T
_CUDA_TYPE = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}   # CUDA_R_*
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 77, 70           # CUBLAS_COMPUTE_*
_GEMM_DEFAULT, _GEMM_DEFAULT_TENSOR_OP = -1, 99                           # cublasGemmAlgo_t
_SCALARS = {(v, t): numpy.array(v, t) for v in (0.0, 1.0) for t in (numpy.float32,
                                                                      numpy.float64)}
"""alpha and beta as host scalars of the compute type (cuBLAS's default host pointer
mode reads them during the call); kept alive here for the process."""


def _gemm_layout(x, what: str):
    """``(array, ld, batch_stride)`` for a row-major operand of shape (..., R, C): the
    array cuBLAS reads (``x`` itself when its rows are unit-stride and its leading axes
    collapse to one stride, else a C-contiguous copy: one launch), its row stride in
    elements and the stride between matrices (0 for a 2-D operand, repeated over the
    batch)."""
    size = x.itemsize
    if x.ndim >= 2 and x.shape[-1] > 0 and (x.strides[-1] == size or x.shape[-1] == 1) and \
            x.strides[-2] % size == 0 and x.strides[-2] // size >= x.shape[-1]:
        lead = [(n, st) for n, st in zip(x.shape[:-2], x.strides[:-2]) if n != 1]
        ok = all(st % size == 0 and st == n2 * st2 for (n, st), (n2, st2) in
                 zip(lead, lead[1:]))
        batch_stride = lead[-1][1] // size if lead else 0
        if ok and (not lead or batch_stride >= x.shape[-2] * x.strides[-2] // size):
            return x, max(x.strides[-2] // size, 1), batch_stride
    x = cupy.ascontiguousarray(x)
    if x.ndim < 2:
        raise ValueError(f"{what}: a matrix product needs >= 2 axes, got shape {x.shape}")
    R, C = x.shape[-2:]
    return x, max(C, 1), R * C if x.ndim > 2 else 0


def gemm_ex(a, b, out=None, transpose_a: bool = False, transpose_b: bool = False,
            beta: float = 0.0):
    """``out = op(a) @ op(b) + beta out`` as one cuBLAS GemmEx call
    (``cublasGemmStridedBatchedEx`` over a batch, ``cublasGemmEx`` for one matrix), op
    transposing the last two axes where asked, read in place: no copy of a transposed
    operand, no cast. Float16 and bfloat16 operands keep 16-bit inputs and outputs with
    float32 accumulation on tensor cores (CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP;
    NVIDIA's cuBLAS guide, "cublasGemmEx"); float32 uses TF32 tensor cores when
    :func:`minibert.backend.set_tf32` allows them; float64 stays float64.

    cuBLAS is column-major: the row-major ``C = op(A) op(B)`` is run as the column-major
    ``C^T = op(B)^T op(A)^T`` (a row-major (R, C) matrix is its column-major transpose with
    leading dimension C), as CuPy's ``matmul`` does.

    Args:
        a: (..., M, K), or (..., K, M) with ``transpose_a``; b: (..., K, N), or (..., N, K)
            with ``transpose_b``; CuPy arrays of one float dtype, their leading axes equal to
            ``out``'s or absent (a 2-D operand is repeated over the batch).
        out: (..., M, N) of the operands' dtype, rows unit-stride (C-contiguous), or None
            for a new array (``beta`` must then be 0).
        beta: 0 (``out`` is overwritten, not read) or 1 (the product is added into ``out``:
            a gradient accumulation).
    Returns:
        out.
    Raises:
        ValueError: shapes or dtypes that do not fit, or another beta.
    """
    from .backend import get_tf32
    if beta not in (0.0, 1.0):
        raise ValueError(f"gemm_ex: beta must be 0 or 1, got {beta}")
    dtype = numpy.dtype(a.dtype)
    if b.dtype != dtype or dtype.name not in _CUDA_TYPE:
        raise ValueError(f"gemm_ex: operands {a.dtype} and {b.dtype}; expected one of "
                         f"{', '.join(_CUDA_TYPE)}")
    M, K = a.shape[-1:-3:-1] if transpose_a else a.shape[-2:]
    K2, N = b.shape[-1:-3:-1] if transpose_b else b.shape[-2:]
    lead = a.shape[:-2] if a.ndim >= b.ndim else b.shape[:-2]
    if K != K2 or (a.ndim > 2 and a.shape[:-2] != lead) or (b.ndim > 2 and b.shape[:-2] != lead):
        raise ValueError(f"gemm_ex: shapes {a.shape}{'^T' * transpose_a} and "
                         f"{b.shape}{'^T' * transpose_b} do not multiply")
    if out is None:
        if beta != 0.0:
            raise ValueError("gemm_ex: beta != 0 needs out")
        out = cupy.empty((*lead, M, N), dtype)
    if out.shape != (*lead, M, N) or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"gemm_ex: out {out.shape} {out.dtype} (C-contiguous: "
                         f"{out.flags.c_contiguous}); expected {(*lead, M, N)} {dtype}")
    if out.size == 0:
        return out
    a, lda, stride_a = _gemm_layout(a, "a")
    b, ldb, stride_b = _gemm_layout(b, "b")
    batch = math.prod(lead)
    if dtype == numpy.float64:
        compute, algo, scalar = _COMPUTE_64F, _GEMM_DEFAULT, numpy.float64
    else:
        compute = _COMPUTE_32F_FAST_TF32 if dtype == numpy.float32 and get_tf32() \
            else _COMPUTE_32F
        algo, scalar = _GEMM_DEFAULT_TENSOR_OP, numpy.float32
    one, beta_ = _SCALARS[(1.0, scalar)], _SCALARS[(float(beta), scalar)]
    kind = _CUDA_TYPE[dtype.name]
    op_b, op_a = _CUBLAS_OP[transpose_b], _CUBLAS_OP[transpose_a]
    handle, gemm, batched = _cublas()
    # column-major: C^T (N x M, ld N) = op(B)^T (N x K) op(A)^T (K x M)
    if batch == 1:
        gemm(handle, op_b, op_a, N, M, K, one.ctypes.data, b.data.ptr, kind, ldb,
             a.data.ptr, kind, lda, beta_.ctypes.data, out.data.ptr, kind, N, compute, algo)
    else:
        batched(handle, op_b, op_a, N, M, K, one.ctypes.data, b.data.ptr, kind, ldb, stride_b,
                a.data.ptr, kind, lda, stride_a, beta_.ctypes.data, out.data.ptr, kind, N,
                M * N, batch, compute, algo)
    return out


_CAPTURE_HANDLES: dict = {}   # stream pointer -> (nvmath cuBLAS handle, its workspace)
_CUBLAS_WORKSPACE = 32 << 20  # bytes: what NVIDIA's cuBLAS guide asks of a graph on Hopper


def prepare_capture(stream) -> None:
    """Make the cuBLAS handle :func:`gemm_ex` uses while ``stream`` captures a CUDA graph
    (call it before ``stream.begin_capture()``): a handle of nvmath-python's cuBLAS
    bindings with its stream and a workspace of its own set beforehand, as NVIDIA's cuBLAS
    guide asks of a captured call ("CUDA Graphs Support"). CuPy's own handle cannot be
    used: CuPy refuses every cuBLAS call while the current stream captures
    (``cupy_backends/cuda/libs/cublas.pyx``).

    Raises:
        ImportError: nvmath-python is not installed (it comes with the ``gpu`` extra)."""
    from nvmath.bindings import cublas
    if stream.ptr not in _CAPTURE_HANDLES:
        handle = cublas.create()
        cublas.set_stream(handle, stream.ptr)
        workspace = cupy.empty(_CUBLAS_WORKSPACE, numpy.uint8)
        cublas.set_workspace(handle, workspace.data.ptr, _CUBLAS_WORKSPACE)
        _CAPTURE_HANDLES[stream.ptr] = (handle, workspace)


def _cublas():
    """(handle, GemmEx, GemmStridedBatchedEx) for the current stream: CuPy's bindings, or
    while the stream captures, nvmath's on the handle :func:`prepare_capture` made."""
    stream = cupy.cuda.get_current_stream()
    if not stream.is_capturing():
        blas = cupy.cuda.cublas
        return cupy.cuda.get_cublas_handle(), blas.gemmEx, blas.gemmStridedBatchedEx
    if stream.ptr not in _CAPTURE_HANDLES:
        raise RuntimeError("gemm_ex: the stream captures a CUDA graph but has no cuBLAS "
                           "handle of its own: call prepare_capture(stream) first")
    from nvmath.bindings import cublas
    return _CAPTURE_HANDLES[stream.ptr][0], cublas.gemm_ex, cublas.gemm_strided_batched_ex


def batched_matmul(a, b, transpose_a: bool = False, transpose_b: bool = False):
    """:func:`minibert.nn.attention.batched_matmul` as one :func:`gemm_ex`: the transposed
    operand read in place, and float16 / bfloat16 on tensor cores with float32
    accumulation. CuPy's ``matmul`` of more than two axes casts float16 to float32, runs
    the product there and casts back (``cupy/_core/_routines_linalg.pyx``: three more
    launches, and no tensor cores), and copies a transposed operand first."""
    return gemm_ex(a, b, None, transpose_a, transpose_b)


def linear_forward(x, w, b=None):
    """:func:`minibert.nn.linear.linear_forward` with the product as one :func:`gemm_ex`
    (``x2 w^T``, the weight read transposed in place) and the bias added in place: the
    launches of the formula, and a product a captured CUDA graph can hold."""
    x2 = x.reshape(-1, x.shape[-1])                      # (N, I)
    out = gemm_ex(x2, w, None, transpose_b=True)         # (N, O)
    if b is not None:
        out += b
    return out.reshape(*x.shape[:-1], w.shape[0]), (x, w, b is not None)


def linear_backward(dout, cache):
    """:func:`minibert.nn.linear.linear_backward` with both products as :func:`gemm_ex`
    calls (the transposed operand read in place): the launches of the formula, and
    products a captured CUDA graph can hold. Returns dx (..., I), dw (O, I), db (O,) or
    None."""
    x, w, has_bias = cache
    d2 = dout.reshape(-1, dout.shape[-1])                # (N, O)
    x2 = x.reshape(-1, x.shape[-1])                      # (N, I)
    # forward: out = x @ w.T + b
    dx = gemm_ex(d2, w).reshape(x.shape)                 # (..., I)
    dw = gemm_ex(d2, x2, transpose_a=True)               # (O, I)
    db = d2.sum(axis=0) if has_bias else None            # (O,)
    return dx, dw, db


def linear_backward_into(dout, cache, dw_acc=None, db_acc=None):
    """:func:`minibert.nn.linear.linear_backward_into` with the accumulations inside the
    products: ``dw_acc += dout2^T x2`` and ``db_acc += 1^T dout2`` each one cuBLAS GemmEx
    with ``beta = 1`` (:func:`gemm_ex`; float16 with float32 accumulation), instead of a
    product or a sum and an addition.

    An accumulator of another dtype than ``dout`` or not contiguous runs the formula's
    operations.

    Args:
        dout: (..., O) CuPy float array; cache: from :func:`minibert.nn.linear_forward`;
            dw_acc: (O, I) or None; db_acc: (O,) or None.
    Returns:
        dx (..., I).
    """
    x, w, has_bias = cache
    O = dout.shape[-1]
    d2 = dout.reshape(-1, O)                             # (N, O)
    x2 = x.reshape(-1, x.shape[-1])                      # (N, I)
    dx = gemm_ex(d2, w).reshape(x.shape)                 # forward: out = x @ w.T + b
    gemm = x.dtype == dout.dtype
    if dw_acc is not None:
        if gemm and dw_acc.dtype == dout.dtype and dw_acc.flags.c_contiguous:
            gemm_ex(d2, x2, dw_acc, transpose_a=True, beta=1.0)
        else:
            dw_acc += d2.T @ x2
    if has_bias and db_acc is not None:
        if gemm and db_acc.dtype == dout.dtype and db_acc.flags.c_contiguous:
            gemm_ex(_ones_row(d2.shape[0], dout.dtype), d2, db_acc.reshape(1, O), beta=1.0)
        else:
            db_acc += d2.sum(axis=0)
    return dx


_ARANGE = {}    # (device, n) -> cupy.arange(n) (int64), made once


def _arange(n: int):
    key = (cupy.cuda.runtime.getDevice(), n)
    if key not in _ARANGE:
        _ARANGE[key] = cupy.arange(n)
    return _ARANGE[key]


def softmax_nll(logits, labels, label_smoothing: float = 0.0):
    """:func:`minibert.nn.losses.softmax_nll` in six launches instead of nine: the row max,
    ``e = exp(x - max)`` (one kernel, into probs), the row sum, the division in place, the
    gather of ``x[row, label]``, and one kernel for ``nll = log(sum) - (x[label] - max)``
    (with label smoothing eps: ``(1 - eps) nll + eps (log(sum) - (mean(x) - max))``, one
    more launch for the row mean).

    Args:
        logits: (N, K) float32 / float64 CuPy array (the formula's caller casts float16);
        labels: (N,) int in [0, K); label_smoothing: eps in [0, 1).
    Returns:
        probs (N, K) and nll (N,), in the logits' dtype.
    """
    ctype = _ctype(logits.dtype)[0]
    N = logits.shape[0]
    m = logits.max(axis=-1, keepdims=True)                             # (N, 1)
    probs = cupy.empty(logits.shape, logits.dtype)
    _kernel("softmax_exp", ctype)(logits, m, probs)
    s = probs.sum(axis=-1, keepdims=True)                              # (N, 1)
    cupy.divide(probs, s, out=probs)
    picked = logits[_arange(N), labels]                                # (N,)
    xmean = logits.mean(axis=-1) if label_smoothing else m[:, 0]
    nll = _kernel("softmax_nll", ctype)(picked, m[:, 0], s[:, 0], xmean, label_smoothing)
    return probs, nll


def cross_entropy_backward(dloss, cache):
    """:func:`minibert.nn.losses.cross_entropy_backward` in one kernel (instead of eight
    launches): ``(probs - (1 - eps) one_hot(label) - eps / K) * valid / denom * dloss``,
    the row weight computed in double as the formula's NumPy promotion does, written into
    the cache's softmax.

    Args:
        dloss: a float or a 0-d CuPy array; cache: from the cross-entropy forward.
    Returns:
        dlogits (N, K), in the dtype of the forward's logits.
    """
    probs, safe, valid, denom, eps, out_dtype = cache
    N, K = probs.shape
    if isinstance(dloss, cupy.ndarray) and dloss.dtype != numpy.float64:
        dloss = dloss.astype(numpy.float64)
    denom = denom.astype(probs.dtype, copy=False)
    _kernel("cross_entropy_backward", _ctype(probs.dtype)[0])(
        probs, safe[:, None], _arange(K)[None, :], valid[:, None], denom, dloss,
        1.0 - eps, eps / K if eps else 0.0, probs)
    return probs.astype(out_dtype, copy=False)


def masked_softmax_forward(scores, mask_add):
    """:func:`minibert.nn.attention.masked_softmax_forward`: for float32 / float64 scores
    and a mask, three launches (the row max of ``scores + mask``, the row sum of
    ``exp(scores + mask - max)``, and the normalisation into ``scores``) instead of four;
    otherwise the formula's steps with the kernels of :func:`softmax_forward`.

    Args:
        scores: (B, NH, T, T) CuPy float array (overwritten); mask_add: (B, 1, 1, T) or None.
    Returns:
        probs (``scores`` itself when float32 / float64) and the softmax cache.
    """
    if mask_add is None or _compute(scores.dtype) != scores.dtype \
            or mask_add.dtype != scores.dtype:
        if mask_add is not None:
            scores += mask_add
        return softmax_forward(scores, -1, scores)
    ctype = _ctype(scores.dtype)[0]
    m = _reduction("masked_max", ctype)(scores, mask_add, axis=-1, keepdims=True)
    s = _reduction("masked_sum", ctype)(scores, mask_add, m, axis=-1, keepdims=True)
    _kernel("masked_softmax_normalise", ctype)(scores, mask_add, m, s, scores)
    return scores, (scores, -1)


def dropout_softmax_backward(ddropped, dropout_cache, softmax_cache):
    """:func:`minibert.nn.attention.dropout_softmax_backward`: for float32 / float64, two
    launches, ``row = sum(dd keep scale p)`` and ``dx = (dd keep scale - row) p`` into
    ddropped, instead of three; otherwise the dropout's and the softmax's kernels.

    Args:
        ddropped: (..., T) CuPy float array (overwritten); dropout_cache: ``(keep, scale)``
            or None; softmax_cache: ``(probs, axis)``.
    Returns:
        dscores, the shape of ddropped.
    """
    probs, axis = softmax_cache
    if (dropout_cache is None or _compute(probs.dtype) != probs.dtype
            or ddropped.dtype != probs.dtype):
        d = ddropped if dropout_cache is None else dropout_backward(ddropped, dropout_cache)
        return softmax_backward(d, softmax_cache, d)
    keep, scale = dropout_cache
    ctype = _ctype(probs.dtype)[0]
    row = _reduction("dropout_softmax_row", ctype)(ddropped, keep, scale, probs, axis=axis,
                                                   keepdims=True)
    _kernel("dropout_softmax_dx", ctype)(ddropped, keep, scale, row, probs, ddropped)
    return ddropped


def clip_grad_norm(grads, max_norm: float):
    """:func:`minibert.optim.clip_grad_norm` in three launches for one gradient buffer
    instead of eight: the squared norm (one reduction kernel, summed over the buffers), one
    kernel for ``norm = sqrt(sq)`` and ``coef = min(max_norm / (norm + 1e-6), 1)`` (in
    double), and ``g *= coef``.

    Args:
        grads: CuPy float arrays of one dtype (a flat buffer: one); max_norm: float (inf:
            no clipping).
    Returns:
        the norm before clipping, a 0-d array (no sync).
    """
    squares = _reduction("sum_squares", _ctype(grads[0].dtype)[0])
    sq = squares(grads[0].ravel())
    for g in grads[1:]:
        sq = sq + squares(g.ravel())
    total, coef = _kernel("clip_coef", _ctype(sq.dtype)[0])(sq, float(max_norm))
    for g in grads:
        g *= coef.astype(g.dtype, copy=False)
    return total


def add_grads(params, grads) -> None:
    """:func:`minibert.nn.module.add_grads` for three parameters of one shape and dtype
    (query / key / value), all trainable: ``grad_i = grad_i + g_i`` in one kernel. Any
    other case runs ``p.add_grad(g)`` for each pair.

    Args:
        params: Parameters; grads: CuPy arrays of their shapes.
    """
    if (len(params) == 3 and all(p.requires_grad for p in params)
            and len({(p.grad.shape, p.grad.dtype) for p in params}) == 1
            and all(g.shape == params[0].grad.shape and g.dtype == params[0].grad.dtype
                    for g in grads)):
        _kernel("add_grads", _ctype(grads[0].dtype)[0])(*grads, *(p.grad for p in params))
        return
    for p, g in zip(params, grads):
        p.add_grad(g)


FAST_PATHS.update({
    "bias_gelu_forward": bias_gelu_forward, "softmax_nll": softmax_nll, "cross_entropy_backward": cross_entropy_backward,
    "add_grads": add_grads, "clip_grad_norm": clip_grad_norm,
    "masked_softmax_forward": masked_softmax_forward,
    "dropout_softmax_backward": dropout_softmax_backward,
    "linear_forward": linear_forward, "linear_backward": linear_backward,
    "linear_backward_into": linear_backward_into,
    "layernorm_backward_into": layernorm_backward_into,
    "split_heads": split_heads, "merge_head_grads": merge_head_grads,
    "batched_matmul": batched_matmul,
    "bias_dropout_add_forward": bias_dropout_add_forward,
    "gelu_forward": gelu_forward, "gelu_backward": gelu_backward,
    "dropout_forward": dropout_forward, "dropout_backward": dropout_backward,
    "layernorm_forward": layernorm_forward, "layernorm_backward": layernorm_backward,
    "softmax_forward": softmax_forward, "softmax_backward": softmax_backward,
})
