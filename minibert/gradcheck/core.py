"""Central-difference gradient checks: the primitives, one tensor, one whole Module.

The checks follow cs231n's ``gradient_check.py``: perturb one entry by +-h, evaluate a
scalar loss, and compare (L(x + h) - L(x - h)) / 2h with the analytic gradient. For tensors
too large to perturb entry by entry, :func:`directional_derivative` checks the gradient
along random unit directions u instead: (L(x + h u) - L(x - h u)) / 2h = <grad, u> (the
"check along a random direction" trick, e.g. Nocedal & Wright, Numerical Optimization,
section 8.1). Run in float64: with float32 the rounding error of the differences is ~1e-3.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..backend import get_array_module, to_numpy


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
    """(f(x + h u) - f(x - h u)) / 2h along ``direction`` u (shape of x), restoring ``x``
    afterwards."""
    old = x.copy()
    x += h * direction
    fp = f()
    x[...] = old - h * direction
    fm = f()
    x[...] = old
    return (fp - fm) / (2 * h)


# ---------------------------------------------------------------------------------------
# One tensor, and the report of many
# ---------------------------------------------------------------------------------------

@dataclass
class GradcheckRow:
    """One checked tensor.

    Attributes:
        name: parameter name (``named_parameters``) or input name.
        shape: the tensor's shape.
        method: ``"full"`` (every entry perturbed) or ``"dir xK"`` (K random unit
            directions).
        max_abs_error: max |analytic - numerical| over the compared values.
        rel_error: :func:`rel_error` of the compared values.
        result: ``"pass"`` (rel_error <= tol); ``"pass (abs)"`` when only the absolute
            tolerance held (a true gradient of ~0, such as the key bias's: softmax ignores
            a constant added to a row of scores, so only finite-difference noise is left
            to compare); ``"FAIL"``.
    """

    name: str
    shape: tuple
    method: str
    max_abs_error: float
    rel_error: float
    result: str

    @property
    def passed(self) -> bool:
        return self.result != "FAIL"


def check_tolerances(**values: float) -> None:
    """Raise ValueError naming the first of ``values`` (tol, atol, h ...) that is not a
    finite number > 0: a zero, negative, NaN or infinite tolerance makes every check pass
    or fail whatever the gradient, and such a step differences nothing."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) \
                or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {v!r}")


# Ulps of rounding error one evaluation of a loss carries through a deep float64 forward,
# with margin: a 6-depth ALBERT's key-bias check measured 19 (|L| 5.4, difference 1.15e-8).
LOSS_NOISE_ULPS = 64


def difference_noise(loss: float, h: float) -> float:
    """The smallest derivative a central difference of step ``h`` can tell from 0 for a
    loss of value ``loss``: LOSS_NOISE_ULPS * eps * |loss| / h, eps float64's machine
    epsilon (each of L(x + h) and L(x - h) is known to a few dozen ulps of |L|, and their
    difference is divided by 2h). A float, in the loss's units per unit of x."""
    return LOSS_NOISE_ULPS * float(np.finfo(np.float64).eps) * abs(loss) / h


def check_tensor(f: Callable[[], float], x, analytic, name: str = "", *, full: bool = True,
                 rng: np.random.Generator | None = None, directions: int = 4,
                 h: float = 1e-6, tol: float = 1e-5, atol: float = 1e-8) -> GradcheckRow:
    """Compare the analytic gradient of the scalar ``f()`` with respect to ``x`` with
    central differences.

    Args:
        f: evaluates the scalar loss (float64) from the current contents of ``x``.
        x: float64 array, perturbed in place and restored exactly.
        analytic: the gradient to check, shape of ``x`` (numpy or cupy).
        name: the row's name.
        full: perturb every entry; otherwise compare <analytic, u> with the directional
            derivative along ``directions`` random unit vectors u drawn from ``rng``.
        tol, atol: passes if rel_error <= tol or max abs error <= the larger of atol and
            :func:`difference_noise` of ``f()`` at ``x`` (a large loss cannot resolve a
            true gradient of 0, such as a key bias's, to a fixed atol).
        h: finite-difference step.
    Returns:
        A :class:`GradcheckRow`.
    Raises:
        ValueError: ``tol``, ``atol`` or ``h`` not a finite number > 0.
    """
    check_tolerances(tol=tol, atol=atol, h=h)
    analytic = np.array(to_numpy(analytic), dtype=np.float64)  # a copy, kept from f
    if full:
        numerical, method = numerical_gradient(f, x, h), "full"
    else:
        rng = rng if rng is not None else np.random.default_rng(0)
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
    if err <= tol:
        result = "pass"
    else:   # only now is the loss's own value needed
        result = "pass (abs)" if abs_err <= max(atol, difference_noise(f(), h)) else "FAIL"
    return GradcheckRow(name, tuple(x.shape), method, abs_err, err, result)


@dataclass
class GradcheckReport:
    """The result of :func:`check_module`: one :class:`GradcheckRow` per tensor.

    ``passed`` is True when every row passed; ``str(report)`` is the table printed by
    ``python -m minibert.gradcheck``; ``failures`` lists the failing rows.
    """

    title: str
    rows: list[GradcheckRow] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def failures(self) -> list[GradcheckRow]:
        return [r for r in self.rows if not r.passed]

    def __bool__(self) -> bool:  # `assert report` reads naturally
        return self.passed

    def __str__(self) -> str:
        lines = [self.title] if self.title else []
        w = max([len("tensor")] + [len(r.name) for r in self.rows])
        lines.append(f"  {'tensor':<{w}}  {'shape':<14} {'check':<7} {'max abs err':>11} "
                     f"{'rel err':>9}  result")
        for r in self.rows:
            shape = "(" + ", ".join(map(str, r.shape)) + ("," if len(r.shape) == 1 else "") + ")"
            lines.append(f"  {r.name:<{w}}  {shape:<14} {r.method:<7} {r.max_abs_error:>11.2e} "
                         f"{r.rel_error:>9.2e}  {r.result}")
        return "\n".join(lines)


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


def _require_float64(tensors: Sequence[tuple[str, Any]]) -> None:
    """Raise TypeError naming the first (name, array) of ``tensors`` that is not float64."""
    for name, x in tensors:
        if x.dtype != np.float64:
            raise TypeError(f"check_module: {name} is {x.dtype}; gradient checks need float64 "
                            "(build the module with dtype=np.float64 and cast the inputs)")


def _float64_tensors(module, inputs: Sequence, input_names: Sequence[str] | None):
    """``check_module``'s tensors: the module's named parameters, copies of the float
    inputs (other inputs as they are) and the inputs' names (default ``input0`` ...).
    Raises TypeError naming a parameter or float input that is not float64."""
    names = (list(input_names) if input_names is not None
             else [f"input{i}" for i in range(len(inputs))])
    inputs = [x.copy() if _is_float_array(x) else x for x in inputs]
    params = list(module.named_parameters())
    _require_float64([(n, p.data) for n, p in params] + [
        (names[i], x) for i, x in enumerate(inputs) if _is_float_array(x)])
    return params, inputs, names


def _evaluator(module, inputs: list, before_forward: Callable[[], None] | None):
    """A function of no arguments: ``module.forward(*inputs)`` on the current contents of
    the inputs and parameters, after ``before_forward()`` (if given)."""
    def evaluate():
        if before_forward is not None:
            before_forward()
        return module.forward(*inputs)
    return evaluate


def _backward(module, upstream):
    """``zero_grad``, then ``backward`` with the upstream gradient: ``backward(*upstream)``
    for a tuple, ``backward()`` for None; returns what backward returns."""
    module.zero_grad()
    if upstream is None:
        return module.backward()
    if isinstance(upstream, tuple):
        return module.backward(*upstream)
    return module.backward(upstream)


def _input_gradients(returned, inputs: list, names: list[str]) -> list[tuple[int, Any]]:
    """(input index, a copy of its gradient) for the float inputs ``backward`` returned a
    gradient for: a single array is the first float input's, a tuple is positional over
    ``inputs`` (None entries, entries past the inputs and non-float inputs skipped).

    Raises:
        ValueError: a gradient whose shape is not its input's.
    """
    if returned is None:
        return []
    float_idx = [i for i, x in enumerate(inputs) if _is_float_array(x)]
    pairs = (enumerate(returned) if isinstance(returned, (tuple, list))
             else [(float_idx[0], returned)] if float_idx else [])
    grads = []
    for i, g in pairs:
        if g is None or i >= len(inputs) or not _is_float_array(inputs[i]):
            continue
        if tuple(g.shape) != tuple(inputs[i].shape):
            raise ValueError(f"check_module: backward returned a gradient of shape "
                             f"{tuple(g.shape)} for {names[i]} of shape "
                             f"{tuple(inputs[i].shape)}")
        grads.append((i, g.copy()))
    return grads


def check_module(module, inputs: Sequence = (), loss: Callable | None = None, *,
                 input_names: Sequence[str] | None = None,
                 before_forward: Callable[[], None] | None = None, seed: int = 0,
                 tol: float = 1e-5, atol: float = 1e-8, h: float = 1e-6,
                 full_max_size: int = 100, directions: int = 4,
                 title: str = "", prefix: str = "") -> GradcheckReport:
    """Check every parameter gradient and input gradient of ``module`` numerically.

    Runs ``out = module.forward(*inputs)`` and ``loss(out) -> (value, upstream)``, then
    ``module.zero_grad()`` and ``module.backward(upstream)`` (``backward(*upstream)`` for a
    tuple, ``backward()`` for None), which must fill every ``Parameter.grad`` and return
    the input gradients. Each float tensor is then checked by :func:`check_tensor`: entry
    by entry up to ``full_max_size`` entries, else along ``directions`` random unit vectors.

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
        before_forward: called before every forward, e.g. to reset a dropout generator
            so that every evaluation uses the same mask.
        seed: seed of the upstream gradient and of the random directions. h: the step.
        tol, atol: a tensor passes if rel_error <= tol or max abs error <= atol, or the
            loss's own :func:`difference_noise` where that is larger (:func:`check_tensor`).
        title, prefix: report title and a prefix for every row name.
    Returns:
        A :class:`GradcheckReport` (``.passed``, ``.rows``; prints as a table). Gradients
        are left in the parameters' ``grad``; parameter values are restored exactly; the
        caller's input arrays are never modified.
    Raises:
        TypeError: a parameter or float input that is not float64, or a default loss on a
            non-array output.
        ValueError: ``tol``, ``atol`` or ``h`` not a finite number > 0 (before anything
            runs); ``backward`` returned an input gradient of the wrong shape.
    """
    check_tolerances(tol=tol, atol=atol, h=h)
    loss = loss or _random_upstream_loss(seed)
    params, inputs, names = _float64_tensors(module, inputs, input_names)
    evaluate = _evaluator(module, inputs, before_forward)
    returned = _backward(module, loss(evaluate())[1])
    # (row name, array perturbed in place, analytic gradient)
    targets = [(prefix + name, p.data, p.grad.copy()) for name, p in params] + [
        (prefix + names[i], inputs[i], g) for i, g in _input_gradients(returned, inputs, names)]

    def f() -> float:
        return float(loss(evaluate())[0])

    rng = np.random.default_rng(seed + 1)
    return GradcheckReport(title, [
        check_tensor(f, x, analytic, name, full=x.size <= full_max_size, rng=rng,
                     directions=directions, h=h, tol=tol, atol=atol)
        for name, x, analytic in targets])
