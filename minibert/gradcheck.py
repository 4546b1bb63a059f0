"""Numerical gradient checking (central differences, float64), shared by tests and users.

The checks follow cs231n's ``gradient_check.py``: perturb one entry by +-h, evaluate a
scalar loss, and compare (L(x + h) - L(x - h)) / 2h with the analytic gradient. For tensors
too large to perturb entry by entry, :func:`directional_derivative` checks the gradient
along random unit directions u instead: (L(x + h u) - L(x - h u)) / 2h = <grad, u>.
Run in float64: with float32 the rounding error of the differences is ~1e-3.

Three levels of API:

* :func:`rel_error`, :func:`numerical_gradient`, :func:`directional_derivative`: the
  primitives (NumPy arrays, perturbed in place and restored exactly);
* :func:`check_module`: every parameter and input gradient of a :class:`~minibert.nn.Module`
  (yours or ours) against central differences, returned as a :class:`GradcheckReport`
  that prints as a table;
* the command line, ``python -m minibert.gradcheck --layer all``, which checks every
  layer of minibert on small shapes and exits 1 if any tensor fails. ``--perturb NAME``
  corrupts one term of one backward pass (see :data:`PERTURBATIONS`) for the duration of
  the check, to show what a wrong gradient looks like.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .backend import get_array_module


def rel_error(a, b, floor: float = 1e-8) -> float:
    """max |a - b| / max(max |a|, max |b|, floor): a scale-aware relative error.

    Args:
        a, b: arrays of the same shape (or scalars).
        floor: smallest denominator, so that two all-but-zero gradients (e.g. a key bias,
            whose true gradient is 0) compare as equal.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(np.abs(a).max(initial=0.0), np.abs(b).max(initial=0.0), floor)
    return float(np.abs(a - b).max(initial=0.0) / scale)


def numerical_gradient(f: Callable[[], float], x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """d f / d x by central differences, perturbing ``x`` in place entry by entry.

    Args:
        f: evaluates the scalar loss from the current contents of ``x``.
        x: float64 array (numpy or cupy), restored exactly after each perturbation.
        h: step.
    Returns:
        Host float64 array of the shape of ``x``.
    """
    grad = np.zeros(x.shape, dtype=np.float64)
    for i in np.ndindex(*x.shape):
        old = float(x[i])
        x[i] = old + h
        fp = f()
        x[i] = old - h
        fm = f()
        x[i] = old
        grad[i] = (fp - fm) / (2 * h)
    return grad


def directional_derivative(f: Callable[[], float], x: np.ndarray, direction: np.ndarray,
                           h: float = 1e-6) -> float:
    """(f(x + h u) - f(x - h u)) / 2h along ``direction`` u, restoring ``x`` afterwards."""
    old = x.copy()
    x += h * direction
    fp = f()
    x[...] = old - h * direction
    fm = f()
    x[...] = old
    return (fp - fm) / (2 * h)


# ---------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------

@dataclass
class GradcheckRow:
    """One checked tensor.

    Attributes:
        name: parameter name (``named_parameters``) or input name.
        shape: the tensor's shape.
        method: ``"full"`` (every entry perturbed) or ``"dir x K"`` (K random unit
            directions, for tensors larger than ``full_max_size``).
        max_abs_error: max |analytic - numerical| over the compared values.
        rel_error: :func:`rel_error` of the compared values.
        passed: rel_error <= tol or max_abs_error <= atol.
    """

    name: str
    shape: tuple
    method: str
    max_abs_error: float
    rel_error: float
    passed: bool

    @property
    def result(self) -> str:
        """``pass``; ``pass (abs)`` when only the absolute tolerance held (a true gradient of
        ~0, such as the key bias's: softmax ignores a constant added to a row of scores,
        so only finite-difference noise is left to compare); ``FAIL``."""
        if not self.passed:
            return "FAIL"
        return "pass" if self.rel_error <= self._tol else "pass (abs)"

    _tol: float = field(default=1e-5, repr=False)


@dataclass
class GradcheckReport:
    """The result of :func:`check_module`: one :class:`GradcheckRow` per tensor.

    ``passed`` is True when every row passed; ``str(report)`` is the table printed by
    ``python -m minibert.gradcheck``; ``failures`` lists the failing rows.
    """

    title: str
    rows: list[GradcheckRow] = field(default_factory=list)
    tol: float = 1e-5
    atol: float = 1e-8

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def failures(self) -> list[GradcheckRow]:
        return [r for r in self.rows if not r.passed]

    def __bool__(self) -> bool:  # `assert report` reads naturally
        return self.passed

    def table(self, header: bool = True) -> str:
        lines = [self.title] if self.title else []
        w = max([len("tensor")] + [len(r.name) for r in self.rows])
        if header:
            lines.append(f"  {'tensor':<{w}}  {'shape':<14} {'check':<7} {'max abs err':>11} "
                         f"{'rel err':>9}  result")
        for r in self.rows:
            shape = "(" + ", ".join(map(str, r.shape)) + ("," if len(r.shape) == 1 else "") + ")"
            lines.append(f"  {r.name:<{w}}  {shape:<14} {r.method:<7} {r.max_abs_error:>11.2e} "
                         f"{r.rel_error:>9.2e}  {r.result}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


# ---------------------------------------------------------------------------------------
# check_module
# ---------------------------------------------------------------------------------------

def _is_float_array(x) -> bool:
    return hasattr(x, "dtype") and hasattr(x, "shape") and x.dtype.kind == "f"


def _as_tuple(x) -> tuple:
    if x is None:
        return ()
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _random_upstream_loss(seed: int):
    """The default loss: L = sum_i <out_i, G_i> with G_i ~ N(0, 1) fixed by ``seed``.

    A random upstream gradient (not all ones) is what exposes, for example, a LayerNorm
    backward that forgets its mean term: with G = 1 that term is zero by construction."""
    state: dict[int, Any] = {}

    def loss(out):
        outs = _as_tuple(out)
        if not outs or not all(_is_float_array(o) for o in outs):
            raise TypeError("check_module: with the default loss, forward must return a float "
                            "array or a tuple of float arrays; pass loss=callable for anything "
                            f"else (got {type(out).__name__})")
        if not state:
            rng = np.random.default_rng(seed)
            for i, o in enumerate(outs):
                xp = get_array_module(o)
                state[i] = xp.asarray(rng.standard_normal(o.shape), dtype=o.dtype)
        value = sum((o * state[i]).sum() for i, o in enumerate(outs))
        upstream = tuple(state[i] for i in range(len(outs)))
        return value, (upstream if isinstance(out, (tuple, list)) else upstream[0])
    return loss


def check_module(module, inputs: Sequence = (), loss: Callable | None = None, *,
                 input_names: Sequence[str] | None = None, check_inputs: bool = True,
                 before_forward: Callable[[], None] | None = None, seed: int = 0,
                 tol: float = 1e-5, atol: float = 1e-8, h: float = 1e-6,
                 full_max_size: int = 100, directions: int = 4,
                 title: str = "", prefix: str = "") -> GradcheckReport:
    """Check every parameter gradient (and input gradient) of ``module`` numerically.

    The module is run as ``out = module.forward(*inputs)``; the scalar loss and the
    upstream gradient come from ``loss(out) -> (value, upstream)``; then
    ``module.zero_grad()`` and ``module.backward(upstream)`` (``backward(*upstream)`` if
    ``upstream`` is a tuple, ``backward()`` if it is None) must fill every
    ``Parameter.grad`` and return the input gradients. Each float tensor is then compared
    with central differences (L(x + h e) - L(x - h e)) / 2h: entry by entry when it has at
    most ``full_max_size`` entries, otherwise along ``directions`` random unit vectors u,
    comparing <grad, u> (cs231n ``gradient_check.py``; the directional form is the
    standard "check along a random direction" trick, e.g. Nocedal & Wright, Numerical
    Optimization, section 8.1).

    Args:
        module: a :class:`minibert.nn.Module` with ``forward``, ``backward``,
            ``named_parameters`` and ``zero_grad``; its parameters must be float64.
        inputs: positional arguments of ``forward``. Float arrays (float64) are copied and
            checked against the gradients ``backward`` returns (a single array is the
            first float input's gradient; a tuple is positional over ``inputs``, None
            entries skipped); integer arrays and other objects are passed through.
        loss: ``loss(out) -> (scalar, upstream)``. Default: L = sum(out * G) with a random
            G ~ N(0, 1) drawn from ``seed``, upstream G (out may be a tuple of arrays).
        input_names: labels of the inputs in the report (default ``input0``, ``input1``...).
        check_inputs: also check input gradients.
        before_forward: called before every forward, e.g. to reset a dropout generator
            so that every evaluation uses the same mask.
        seed: seed of the upstream gradient and of the random directions.
        tol, atol: a tensor passes if rel_error <= tol or max abs error <= atol.
        h: finite-difference step.
        full_max_size: largest tensor checked entry by entry.
        directions: random directions for larger tensors.
        title, prefix: report title and a prefix for every row name.
    Returns:
        A :class:`GradcheckReport` (``.passed``, ``.rows``; prints as a table).
        Gradients are left in the parameters' ``grad``; parameter values are restored
        exactly; the caller's input arrays are never modified.
    Raises:
        TypeError: a parameter or float input that is not float64, or a default loss on a
            non-array output.
        ValueError: ``backward`` returned an input gradient of the wrong shape.
    """
    loss = loss or _random_upstream_loss(seed)
    names = list(input_names) if input_names is not None else [f"input{i}" for i in range(len(inputs))]
    inputs = [x.copy() if _is_float_array(x) else x for x in inputs]
    params = list(module.named_parameters())
    for name, x in [(n, p.data) for n, p in params] + [
            (names[i], x) for i, x in enumerate(inputs) if _is_float_array(x)]:
        if x.dtype != np.float64:
            raise TypeError(f"check_module: {name} is {x.dtype}; gradient checks need float64 "
                            "(build the module with dtype=np.float64 and cast the inputs)")

    def evaluate():
        if before_forward is not None:
            before_forward()
        return module.forward(*inputs)

    value, upstream = loss(evaluate())
    module.zero_grad()
    if upstream is None:
        returned = module.backward()
    elif isinstance(upstream, tuple):
        returned = module.backward(*upstream)
    else:
        returned = module.backward(upstream)

    targets: list[tuple[str, Any, Any]] = []  # (name, array perturbed in place, analytic)
    for name, p in params:
        targets.append((prefix + name, p.data, p.grad.copy()))
    if check_inputs and returned is not None:
        float_idx = [i for i, x in enumerate(inputs) if _is_float_array(x)]
        grads = _as_tuple(returned)
        pairs = (zip(range(len(inputs)), grads) if isinstance(returned, (tuple, list))
                 else [(float_idx[0], returned)] if float_idx else [])
        for i, g in pairs:
            if g is None or i >= len(inputs) or not _is_float_array(inputs[i]):
                continue
            if tuple(g.shape) != tuple(inputs[i].shape):
                raise ValueError(f"check_module: backward returned a gradient of shape "
                                 f"{tuple(g.shape)} for {names[i]} of shape {tuple(inputs[i].shape)}")
            targets.append((prefix + names[i], inputs[i], g.copy()))

    def f() -> float:
        return float(loss(evaluate())[0])

    rng = np.random.default_rng(seed + 1)
    report = GradcheckReport(title, tol=tol, atol=atol)
    for name, x, analytic in targets:
        analytic = np.asarray(_to_host(analytic), dtype=np.float64)
        if x.size <= full_max_size:
            numerical = numerical_gradient(f, x, h)
            method = "full"
        else:
            xp = get_array_module(x)
            ana, num = [], []
            for _ in range(directions):
                u = rng.standard_normal(x.shape)
                u /= np.linalg.norm(u)
                num.append(directional_derivative(f, x, xp.asarray(u), h))
                ana.append(float((analytic * u).sum()))
            analytic, numerical, method = np.array(ana), np.array(num), f"dir x{directions}"
        abs_err = float(np.abs(analytic - numerical).max(initial=0.0))
        err = rel_error(analytic, numerical)
        report.rows.append(GradcheckRow(name, tuple(x.shape), method, abs_err, err,
                                        err <= tol or abs_err <= atol, tol))
    return report


def _to_host(x):
    from .backend import to_numpy
    return to_numpy(x)


# ---------------------------------------------------------------------------------------
# Perturbations: wrong backward passes, swapped in for the duration of a check
# ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def _swap_function(original, replacement) -> Iterator[None]:
    """Replace ``original`` by ``replacement`` wherever a minibert module refers to it: as a
    module-level name (``from .activations import softmax_backward`` copies the reference
    into the importing module) or inside a module-level dict of tuples (``ACTIVATIONS``).
    Everything is restored on exit."""
    undo = []
    for mod in [m for n, m in list(sys.modules.items()) if n.startswith("minibert") and m]:
        for attr, value in list(vars(mod).items()):
            if value is original:
                undo.append((setattr, mod, attr, value))
                setattr(mod, attr, replacement)
            elif isinstance(value, dict):
                for key, entry in list(value.items()):
                    if isinstance(entry, tuple) and original in entry:
                        undo.append((dict.__setitem__, value, key, entry))
                        value[key] = tuple(replacement if e is original else e for e in entry)
    try:
        yield
    finally:
        for setter, obj, key, value in reversed(undo):
            setter(obj, key, value)


@contextlib.contextmanager
def _swap_method(cls, name: str, make: Callable) -> Iterator[None]:
    original = getattr(cls, name)
    setattr(cls, name, make(original))
    try:
        yield
    finally:
        setattr(cls, name, original)


def _softmax_no_diagonal():
    from .nn import activations

    def softmax_backward(dprobs, probs, axis=-1):
        # correct: p * dp - p * sum(dp * p); the diag(p) term p * dp is dropped
        return -probs * (dprobs * probs).sum(axis=axis, keepdims=True)
    return _swap_function(activations.softmax_backward, softmax_backward)


def _layernorm_no_mean():
    from .nn import layernorm

    def layernorm_backward(dout, cache):
        xhat, rstd, w = cache
        C = xhat.shape[-1]
        g = dout * w
        dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))  # no - mean(g)
        return dx, (dout * xhat).reshape(-1, C).sum(0), dout.reshape(-1, C).sum(0)
    return _swap_function(layernorm.layernorm_backward, layernorm_backward)


def _gelu_no_pdf():
    from .nn import activations

    def gelu_backward(dout, cache):
        x, cdf = cache
        return dout * cdf  # correct: dout * (cdf + x * pdf)
    return _swap_function(activations.gelu_backward, gelu_backward)


def _attention_no_scale():
    from .nn import attention
    original = attention.attention_backward

    def attention_backward(dctx, cache):
        return original(dctx, cache[:-1] + (1.0,))  # dq, dk without the 1/sqrt(HS) factor
    return _swap_function(original, attention_backward)


def _tied_decoder_dropped():
    from .modeling import BertLMPredictionHead

    def make(original):
        def backward(self, dlogits):
            w = self.decoder.weight           # the word-embedding Parameter
            saved = w.grad.copy()
            dx = original(self, dlogits)
            w.grad[...] = saved               # forget the decoder's dW = dlogits^T @ h
            return dx
        return backward
    return _swap_method(BertLMPredictionHead, "backward", make)


def _embedding_fancy_index():
    from .nn import embedding

    def scatter_add_rows(dst, ids, src):
        dst[ids] += src  # the bug: with repeated ids only one update per row survives
    return _swap_function(embedding.scatter_add_rows, scatter_add_rows)


def _cross_entropy_counts_ignored():
    from .nn import losses
    original = losses.cross_entropy_backward

    def cross_entropy_backward(dloss, cache):
        logp, safe, valid, denom, eps = cache
        n = logp.dtype.type(logp.shape[0])  # divides by N, not by the counted rows
        return original(dloss, (logp, safe, valid, n, eps))
    return _swap_function(original, cross_entropy_backward)


def _residual_dropped():
    from .modeling import BertOutput

    def make(original):
        def backward(self, dout):
            dh, dres = original(self, dout)
            return dh, 0 * dres  # the skip connection's identity path forgotten
        return backward
    return _swap_method(BertOutput, "backward", make)


PERTURBATIONS: dict[str, tuple[str, Callable]] = {
    "softmax-diagonal": ("softmax JVP without the diag(p) term of J = diag(p) - p p^T",
                         _softmax_no_diagonal),
    "layernorm-mean": ("LayerNorm dx without the -mean(g) term (the gradient through the mean)",
                       _layernorm_no_mean),
    "gelu-pdf": ("exact GELU derivative Phi(x) + x phi(x) without x phi(x)", _gelu_no_pdf),
    "attention-scale": ("dq, dk without the 1/sqrt(HS) factor", _attention_no_scale),
    "tied-decoder": ("the MLM decoder's contribution to the tied word-embedding grad dropped",
                     _tied_decoder_dropped),
    "embedding-fancy-index": ("embedding scatter-add done as dW[ids] += g (repeated ids lost)",
                              _embedding_fancy_index),
    "cross-entropy-ignored": ("cross-entropy grad divided by all rows, ignored ones included",
                              _cross_entropy_counts_ignored),
    "residual": ("the residual (identity) path's gradient dropped in BertOutput.backward",
                 _residual_dropped),
}


@contextlib.contextmanager
def perturbed(name: str | None) -> Iterator[None]:
    """Context manager: run the body with one backward term corrupted (see
    :data:`PERTURBATIONS`), restoring the real functions on exit. ``None`` does nothing.

    Raises:
        ValueError: unknown name (the known ones are listed).
    """
    if name is None:
        yield
        return
    if name not in PERTURBATIONS:
        raise ValueError(f"unknown perturbation {name!r}: expected one of "
                         f"{', '.join(PERTURBATIONS)}")
    with PERTURBATIONS[name][1]():
        yield


# ---------------------------------------------------------------------------------------
# The layer checks of the command line
# ---------------------------------------------------------------------------------------

@dataclass
class Shapes:
    """Sizes of the command-line checks: batch B, sequence T, hidden C, heads NH,
    intermediate I, vocab V, encoder layers L (all positive; NH divides C)."""

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
    (B, P) int64 0/1 (integers, so gradient checks do not take them for inputs; see :func:`minibert.modeling.masked_lm_from_labels`);
    ``next_sentence_label`` (B,) 0/1. Keys in the positional order of
    ``BertForPreTraining.forward``. :func:`minibert.testing.token_batches` draws its
    batches through this function.
    """
    from .modeling import masked_lm_from_labels
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
    labels = np.where(masked, rng.integers(0, config.vocab_size, size=(B, T)), -100)
    positions, ids, weights = masked_lm_from_labels(labels)
    return dict(input_ids=input_ids, token_type_ids=token_type_ids,
                attention_mask=attention_mask, masked_lm_positions=positions,
                masked_lm_ids=ids, masked_lm_weights=weights.astype(np.int64),
                next_sentence_label=rng.integers(0, 2, size=B))


def _config(s: Shapes, norm_position: str = "post", dropout: float = 0.0, act: str = "gelu"):
    from .modeling import BertConfig
    return BertConfig(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                      num_attention_heads=s.heads, intermediate_size=s.intermediate,
                      hidden_act=act, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout, max_position_embeddings=s.seq_len,
                      norm_position=norm_position, initializer_range=0.5)


def _module(forward, backward, **children):
    """A throw-away Module from two functions (children give it its parameters)."""
    from .nn import Module

    class _Wrapped(Module):
        def forward(self, *a):
            return forward(self, *a)

        def backward(self, *d):
            return backward(self, *d)
    m = _Wrapped()
    for k, v in children.items():
        setattr(m, k, v)
    return m


def _set(module, rng, scale=0.5):
    """Random parameter values (so LayerNorm weights are not all ones, biases not zero)."""
    for _, p in module.named_parameters():
        p.data[...] = rng.standard_normal(p.data.shape) * scale
    return module


def _mask_add(rng, B, T):
    from .nn import extended_attention_mask
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0] = T
    return extended_attention_mask((np.arange(T)[None] < lengths[:, None]).astype(np.int64),
                                   np.float64)


def layer_checks(s: Shapes, seed: int = 0) -> dict[str, Callable[..., list[GradcheckReport]]]:
    """name -> function(**check_kw) returning the reports of that layer's checks."""
    from . import modeling as M
    from .nn import Activation, Dropout, Embedding, LayerNorm, Linear
    # functions are looked up on their modules at call time, so that --perturb reaches them
    from .nn import activations as A, attention as Att, losses as Lo
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
        def fwd(self, z):
            self.probs = A.softmax_forward(z)                  # (B, NH, T, T)
            return self.probs
        m = _module(fwd, lambda self, d: A.softmax_backward(d, self.probs))
        return [check_module(m, [x(B, NH, T, T) * 2], input_names=["scores"],
                             title=f"softmax over the last axis (B={B}, NH={NH}, T={T}, T={T})",
                             prefix="softmax.", **kw)]

    def attention(**kw):
        mask_add = _mask_add(rng(4), B, T)
        state = {}

        def fwd(self, q, k, v):
            ctx, _, state["cache"] = Att.attention_forward(q, k, v, mask_add, NH, s.dropout,
                                                       np.random.default_rng(seed))
            return ctx
        m = _module(fwd, lambda self, d: Att.attention_backward(d, state["cache"]))
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
        labels[rng(9).random(N) < 0.3] = -100
        labels[0] = 1
        for eps in (0.0, s.label_smoothing):
            cache = {}

            def fwd(self, logits, eps=eps):
                loss, cache["c"] = Lo.cross_entropy_forward(logits, labels, eps)
                return loss
            m = _module(fwd, lambda self, d: Lo.cross_entropy_backward(d, cache["c"]))
            reports.append(check_module(
                m, [x(N, V) * 2], input_names=["logits"],
                loss=lambda out: (out * 1.7, np.float64(1.7)),
                title=f"softmax cross-entropy N={N} K={V}, {int((labels == -100).sum())} "
                f"ignored rows, label smoothing {eps}", prefix=f"cross_entropy(eps={eps}).", **kw))
        return reports

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
                mlm_head=mlm_head, nsp_head=nsp_head, cross_entropy=cross_entropy, model=model)


LAYERS = ("linear", "embedding", "layernorm", "gelu", "softmax", "attention", "ffn",
          "encoder_layer", "mlm_head", "nsp_head", "cross_entropy", "model")


def run_checks(layers: Sequence[str], shapes: Shapes, seed: int = 0,
               perturbation: str | None = None, **check_kw) -> list[GradcheckReport]:
    """Run the named layer checks (see :data:`LAYERS`), optionally under a perturbation.

    Returns one report per checked configuration. Raises ValueError for an unknown layer
    or perturbation name.
    """
    unknown = [l for l in layers if l not in LAYERS]
    if unknown:
        raise ValueError(f"unknown layer(s) {unknown}: expected {', '.join(LAYERS)} or all")
    checks = layer_checks(shapes, seed)
    reports = []
    with perturbed(perturbation):
        for name in layers:
            reports.extend(checks[name](seed=seed, **check_kw))
    return reports


def main(argv=None) -> int:
    """``python -m minibert.gradcheck``: print the table; exit 1 if any tensor fails."""
    p = argparse.ArgumentParser(
        prog="python -m minibert.gradcheck",
        description="Compare minibert's hand-written gradients with float64 central "
                    "differences, layer by layer.",
        epilog="perturbations (--perturb): " + "; ".join(
            f"{k}: {v[0]}" for k, v in PERTURBATIONS.items()),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--layer", choices=LAYERS + ("all",), default="all", nargs="+",
                   help="which checks to run")
    d = Shapes()
    p.add_argument("--batch", type=int, default=d.batch, help="B, sequences")
    p.add_argument("--seq-len", type=int, default=d.seq_len, help="T, tokens per sequence")
    p.add_argument("--hidden", type=int, default=d.hidden, help="C, hidden size")
    p.add_argument("--heads", type=int, default=d.heads, help="NH, attention heads (divides C)")
    p.add_argument("--intermediate", type=int, default=d.intermediate, help="I, FFN width")
    p.add_argument("--vocab", type=int, default=d.vocab, help="V, vocabulary size")
    p.add_argument("--layers", type=int, default=d.layers, help="encoder layers of the model")
    p.add_argument("--dropout", type=float, default=d.dropout,
                   help="dropout probability (masks fixed during a check)")
    p.add_argument("--label-smoothing", type=float, default=d.label_smoothing)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=float, default=1e-5, help="largest passing relative error")
    p.add_argument("--atol", type=float, default=1e-8, help="an abs error this small passes too")
    p.add_argument("--full-max-size", type=int, default=100,
                   help="tensors up to this many entries are checked entry by entry, larger "
                        "ones along random directions")
    p.add_argument("--perturb", choices=list(PERTURBATIONS), default=None,
                   help="corrupt one backward term to see what a wrong gradient looks like")
    args = p.parse_args(argv)
    for name in ("batch", "seq_len", "hidden", "heads", "intermediate", "vocab", "layers"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.hidden % args.heads:
        p.error(f"--hidden ({args.hidden}) must be divisible by --heads ({args.heads})")
    if not 0 <= args.dropout < 1:
        p.error("--dropout must be in [0, 1)")
    layers = LAYERS if "all" in args.layer else tuple(dict.fromkeys(args.layer))
    shapes = Shapes(args.batch, args.seq_len, args.hidden, args.heads, args.intermediate,
                    args.vocab, args.layers, args.dropout, args.label_smoothing)
    if args.perturb:
        print(f"PERTURBED backward ({args.perturb}): {PERTURBATIONS[args.perturb][0]}\n")
    t0 = time.perf_counter()
    reports = run_checks(layers, shapes, args.seed, args.perturb, tol=args.tol, atol=args.atol,
                         full_max_size=args.full_max_size)
    elapsed = time.perf_counter() - t0
    for r in reports:
        print(r.table(), end="\n\n")
    rows = [row for r in reports for row in r.rows]
    failed = [row.name for row in rows if not row.passed]
    print(f"{len(rows)} tensors checked in {elapsed:.1f} s (float64, central differences, "
          f"h=1e-6, tol {args.tol:g}): {len(rows) - len(failed)} passed, {len(failed)} failed")
    if failed:
        print("FAILED: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
