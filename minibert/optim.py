"""AdamW, the learning-rate schedules (warmup + linear decay; warmup-stable-decay) and
global-norm gradient clipping.

BERT's optimizer is ``AdamWeightDecayOptimizer`` in google-research/bert
``optimization.py``: Adam (Kingma & Ba 2015) *without* bias correction, eps 1e-6, and
weight decay decoupled from the gradient (Loshchilov & Hutter 2019), not applied to
LayerNorm and bias parameters (see :func:`decays`). ``correct_bias=True`` gives the
bias-corrected form of ``torch.optim.AdamW``.
"""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from .backend import get_array_module, is_half, to_numpy
from .fast import fast_path
from .nn import FlatParameters, Parameter


def decays(param: Parameter) -> bool:
    """Whether ``param`` gets weight decay: exactly the weight matrices (``ndim >= 2``: the
    weights of Linear and Embedding), never a 1-d vector (a bias, a LayerNorm gain or shift).

    On BERT's parameters this is google-research/bert's name rule
    ``exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]`` (``optimization.py``,
    the same set as HF's ``no_decay = ["bias", "LayerNorm.weight"]``): every 1-d parameter
    of BERT is a bias or a LayerNorm vector and every matrix is a weight. Deciding by shape
    rather than by name means a new layer cannot fall through a list of names: a bias or
    gain called anything at all is not decayed. (The pre-LN final norm ``bert.encoder.ln``,
    which the reference does not have, is not decayed either, as every LayerNorm.)

    Args:
        param: a :class:`~minibert.nn.Parameter` (anything whose ``.data`` has ``ndim``,
            e.g. a torch parameter, works the same way).
    """
    return param.data.ndim >= 2


class DynamicLossScaler:
    """Dynamic loss scaling for float16 training (Micikevicius et al. 2018, "Mixed Precision
    Training", section 3.2), with the defaults of ``torch.cuda.amp.GradScaler``.

    The loss is multiplied by ``scale`` before the backward pass so small float16
    gradients do not flush to zero; a step whose unscaled gradients are not finite is
    skipped and the scale halves; after ``growth_interval`` applied steps in a row it
    doubles. Its state stays on the device: :meth:`update` reads nothing back.

    Args:
        xp: numpy or cupy. init_scale: first scale (> 0). growth_factor (> 1),
        backoff_factor (in (0, 1)), growth_interval (>= 1 steps).
    Raises:
        ValueError: an argument out of its range.
    """

    def __init__(self, xp, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1
                and growth_interval >= 1):
            raise ValueError("DynamicLossScaler: need init_scale > 0, growth_factor > 1, "
                             "0 < backoff_factor < 1, growth_interval >= 1")
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.scale = xp.asarray(init_scale, dtype=xp.float32)        # 0-d, on the device
        self.good_steps = xp.asarray(0, dtype=xp.int64)              # applied steps in a row

    def update(self, finite) -> None:
        """After a step: ``finite`` (0-d bool array) says whether it was applied; the state is
        updated in place."""
        xp = get_array_module(self.scale)
        grow = finite & (self.good_steps + 1 >= self.growth_interval)
        factor = xp.where(finite, xp.where(grow, self.growth_factor, 1.0), self.backoff_factor)
        # in place: a step captured as a CUDA graph reads and writes these same buffers
        self.scale[...] = self.scale * factor
        xp.multiply(self.good_steps + 1, finite & ~grow, out=self.good_steps)   # else 0

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host 0-d arrays: "scale" (float32) and "good_steps" (int64)."""
        return {"scale": to_numpy(self.scale), "good_steps": to_numpy(self.good_steps)}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` (KeyError if a field is missing)."""
        xp = get_array_module(self.scale)
        self.scale = xp.asarray(np.asarray(state["scale"]), dtype=xp.float32)
        self.good_steps = xp.asarray(np.asarray(state["good_steps"]), dtype=xp.int64)


def adamw_update(p, g, m, v, n_decay: int, lr, step_size, v_scale: float, b1: float,
                 b2: float, eps: float, weight_decay: float, scratch=None) -> None:
    """One AdamW update of flat buffers, in place on ``p``, ``m`` and ``v``: the formula.

    Adam's moments (Kingma & Ba 2015, Algorithm 1) with the weight decay decoupled from
    the gradient (Loshchilov & Hutter 2019, Algorithm 2) and eps added outside the square
    root, after the bias correction of v (google-research/bert ``optimization.py``;
    ``torch.optim.AdamW``). With the fast paths on, :func:`minibert.fast_cpu.adamw_update`
    (NumPy) or :func:`minibert.gpu_kernels.adamw_update` (CuPy) runs instead; both give
    the same result (tests/test_fast_cpu.py, tests/test_gpu.py).

    Args:
        p, g, m, v: (S,) float arrays of one dtype: parameters, gradient, first and second
            moments. The first ``n_decay`` scalars of ``p`` (the matrices) are decayed.
        lr: the learning rate of this step (a float or a 0-d array: 0 on a skipped step).
        step_size: lr / (1 - b1^t) with bias correction, else lr. v_scale: 1 / sqrt(1 -
            b2^t) with bias correction, else 1. b1, b2: the moments' decay rates in [0, 1).
        eps: added to the denominator. weight_decay: wd >= 0.
        scratch: unused here (the fast CPU path's (S,) workspace).
    """
    xp = get_array_module(p)
    if weight_decay and n_decay:
        p[:n_decay] *= 1.0 - lr * weight_decay          # p -= lr wd p, matrices only
    m[...] = b1 * m + (1.0 - b1) * g                    # first moment, (S,)
    v[...] = b2 * v + g * g * (1.0 - b2)                # second moment, (S,)
    p -= m / (xp.sqrt(v) * v_scale + eps) * step_size   # the Adam step, (S,)


class AdamW:
    """Adam with decoupled weight decay, over one flat buffer of all parameters.

    Per parameter p with gradient g, at step t (1-based):
        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        p -= lr * wd * p                          (matrices only, see :func:`decays`)
        p -= lr * m' / (sqrt(v') + eps)
    where m' = m / (1 - b1^t), v' = v / (1 - b2^t) if ``correct_bias`` else m, v (BERT).

    The constructor moves the parameters into a :class:`~minibert.nn.FlatParameters`
    buffer, decayed matrices first, so a step is a few whole-buffer passes (one fused
    kernel on the GPU) instead of a dozen small ones per parameter. Build it *after*
    ``model.to(device)``; ``flat.zero_grad()`` clears every gradient at once.

    Mixed precision (Micikevicius et al. 2018): with float16 or bfloat16 parameters the
    optimizer keeps float32 master weights, moments and gradients, and with float16 a
    :class:`DynamicLossScaler` (bfloat16 keeps float32's exponent range and needs none).
    The training step backpropagates ``loss * loss_scale()``, takes the float32 gradient
    from :meth:`unscaled_grad`, steps the master weights and copies them back to 16 bits.

    Args:
        named_parameters: (name, Parameter) pairs, e.g. ``model.named_parameters()``.
        lr: peak learning rate; the schedule scales it through ``step(lr=...)``.
        betas: (b1, b2). eps: added to sqrt(v). weight_decay: wd.
        correct_bias: use bias-corrected moments.
    Attributes:
        flat: the FlatParameters; m, v: (S,) moment buffers aligned with ``flat.data``.
        master: (S,) float32 master weights with float16 / bfloat16 parameters, else None.
        scaler: the DynamicLossScaler with float16 parameters, else None.
    Raises:
        ValueError: lr < 0, betas outside [0, 1), eps <= 0 or weight_decay < 0.
    """

    def __init__(self, named_parameters: Iterable[tuple[str, Parameter]], lr: float = 1e-4,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, correct_bias: bool = False):
        if lr < 0 or not all(0.0 <= b < 1.0 for b in betas) or eps <= 0 or weight_decay < 0:
            raise ValueError(f"AdamW: invalid hyper-parameters lr={lr} betas={betas} eps={eps} "
                             f"weight_decay={weight_decay}")
        named = list(named_parameters)
        self.params = ([(n, p) for n, p in named if decays(p)]
                       + [(n, p) for n, p in named if not decays(p)])
        self.flat = FlatParameters([p for _, p in self.params])
        self._index = {n: i for i, (n, _) in enumerate(self.params)}
        self.n_decay = sum(p.data.size for _, p in self.params if decays(p))
        self.lr, self.betas, self.eps = lr, betas, eps
        self.weight_decay, self.correct_bias = weight_decay, correct_bias
        self.t = 0
        xp = get_array_module(self.flat.data)
        self.master = self.master_grad = self.scaler = None
        if is_half(self.flat.data.dtype):
            self.master = self.flat.data.astype(np.float32)          # (S,) float32
            self.master_grad = xp.empty_like(self.master)             # (S,) float32
            if self.flat.data.dtype == np.float16:   # bfloat16 has float32's exponent range
                self.scaler = DynamicLossScaler(xp)
        weights = self.flat.data if self.master is None else self.master
        self.m = xp.zeros_like(weights)                               # (S,)
        self.v = xp.zeros_like(weights)                               # (S,)
        # (S,) workspace of the CPU fast path (fast_cpu.adamw_update); the formula and the
        # GPU's fused kernel need none
        self._tmp = xp.empty_like(weights) if xp is np else None
        self._staged = None      # GPU: (3,) device buffer of :meth:`stage`, made on first use

    def loss_scale(self):
        """What to multiply the loss by before backward: the dynamic scale (a 0-d device
        array) with float16 parameters, else 1.0."""
        return 1.0 if self.scaler is None else self.scaler.scale

    def unscaled_grad(self):
        """The (S,) gradient to clip, check and step on: ``flat.grad`` itself, or with
        16-bit parameters its float32 copy (float16: divided by the loss scale)."""
        if self.master is None:
            return self.flat.grad
        if self.scaler is None:
            self.master_grad[...] = self.flat.grad                   # bfloat16 -> float32
        else:
            xp = get_array_module(self.master_grad)
            xp.multiply(self.flat.grad, 1.0 / self.scaler.scale, out=self.master_grad)
        return self.master_grad

    def update_scale(self, finite) -> None:
        """Tell the loss scaler (if any) whether the step was applied (0-d bool array)."""
        if self.scaler is not None:
            self.scaler.update(finite)

    def zero_grad(self) -> None:
        """Every parameter's gradient to zero (one pass over the flat gradient buffer)."""
        self.flat.zero_grad()

    def moments(self, name: str):
        """(m, v) of the parameter called ``name``: views of its shape into the buffers.

        Raises:
            KeyError: no parameter of that name.
        """
        i = self._index.get(name)
        if i is None:
            raise KeyError(f"AdamW has no parameter {name!r}")
        a, b = self.flat.offsets[i], self.flat.offsets[i + 1]
        shape = self.params[i][1].data.shape
        return self.m[a:b].reshape(shape), self.v[a:b].reshape(shape)

    def stage(self, lr: float):
        """The host half of a step on the GPU: count the step (``t``) and copy its rates into
        a device buffer that :meth:`step` reads, so that nothing of the step is a host value
        a kernel bakes in (a step replayed as a CUDA graph, :mod:`minibert.graphs`, reads
        new rates on every replay). On the CPU it returns ``lr`` and does nothing else.

        Returns:
            ``lr`` on the CPU; on the GPU the (3,) buffer, of the weights' dtype:
            (lr, 1 / (1 - b1^t), 1 / sqrt(1 - b2^t)), the last two 1 without
            ``correct_bias``.
        """
        weights = self.m
        xp = get_array_module(weights)
        if xp is np:
            return lr
        b1, b2 = self.betas
        self.t += 1
        c1, c2 = ((1.0 / (1.0 - b1 ** self.t), 1.0 / math.sqrt(1.0 - b2 ** self.t))
                  if self.correct_bias else (1.0, 1.0))
        if self._staged is None:
            self._staged = xp.empty(3, weights.dtype)
        self._staged.set(np.array([lr, c1, c2], dtype=weights.dtype))
        return self._staged

    def step(self, lr=None, staged=None) -> None:
        """Update every parameter in place from its ``grad``; ``lr`` (a float or a 0-d
        array on the parameters' device, so a skipped step costs no host read) overrides
        self.lr. ``staged``: the buffer :meth:`stage` filled for this step (GPU): its bias
        corrections are read from the device and ``t`` was counted there.

        Raises:
            RuntimeError: the parameters no longer alias the flat buffer (the model was
                moved or its arrays rebound after the optimizer was built).
        """
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        step_size, v_scale = lr, 1.0
        if staged is not None:
            step_size, v_scale = lr * staged[1], staged[2]
        else:
            self.t += 1
        if staged is None and self.correct_bias:
            # a 0-d lr keeps its type: NumPy 1 widens float32 / Python float to float64
            correction = 1.0 - b1 ** self.t
            if hasattr(lr, "dtype"):
                correction = lr.dtype.type(correction)
            step_size = lr / correction
            v_scale = 1.0 / math.sqrt(1.0 - b2 ** self.t)
        p, g = self.flat.data, self.flat.grad
        if self.master is not None:
            p, g = self.master, self.master_grad
        update = fast_path("adamw_update", p) or adamw_update
        update(p, g, self.m, self.v, self.n_decay, lr, step_size, v_scale, b1, b2, self.eps,
               self.weight_decay, scratch=self._tmp)
        if self.master is not None:
            self.flat.data[...] = self.master                        # float32 -> 16 bits

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies of the moments ("m.<name>", "v.<name>", each of its parameter's
        shape) and the step count ("t"); with 16-bit parameters also the float32 master
        weights ("master.<name>"), and with float16 the loss scaler ("scaler.scale",
        "scaler.good_steps")."""
        state = {"t": np.asarray(self.t)}
        buffers = {"m.": to_numpy(self.m), "v.": to_numpy(self.v)}
        if self.master is not None:
            buffers["master."] = to_numpy(self.master)
        if self.scaler is not None:
            state.update({"scaler." + k: v for k, v in self.scaler.state_dict().items()})
        for (n, p), a, b in zip(self.params, self.flat.offsets[:-1], self.flat.offsets[1:]):
            for prefix, buf in buffers.items():
                state[prefix + n] = buf[a:b].reshape(p.data.shape).copy()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict`.

        Raises:
            KeyError: a parameter's moments are missing. ValueError: a shape differs.
        """
        missing = [n for n, _ in self.params if "m." + n not in state or "v." + n not in state]
        if missing:
            raise KeyError(f"optimizer state has no moments for {missing}")
        xp = get_array_module(self.m)
        stores = [("m.", self.m), ("v.", self.v)]
        if self.master is not None and all("master." + n in state for n, _ in self.params):
            stores.append(("master.", self.master))
            if self.scaler is not None:
                self.scaler.load_state_dict({k: state["scaler." + k]
                                             for k in ("scale", "good_steps")})
        for (n, p), a, b in zip(self.params, self.flat.offsets[:-1], self.flat.offsets[1:]):
            for key, store in ((prefix + n, buf) for prefix, buf in stores):
                arr = np.asarray(state[key])
                if arr.shape != p.data.shape:
                    raise ValueError(f"optimizer state {key!r}: expected shape "
                                     f"{tuple(p.data.shape)}, got {arr.shape}")
                store[a:b] = xp.asarray(arr.reshape(-1), dtype=store.dtype)
        if self.master is not None:
            self.flat.data[...] = self.master
        self.t = int(state["t"])


def linear_schedule_with_warmup(step: int, peak_lr: float, warmup_steps: int,
                                total_steps: int) -> float:
    """Learning rate at 0-based ``step``: linear warmup from 0 over ``warmup_steps``, then
    linear decay to 0 at ``total_steps`` (google-research/bert ``create_optimizer``; HF
    ``get_linear_schedule_with_warmup``). Returns the rate (same unit as peak_lr)."""
    if step < warmup_steps:
        return peak_lr * step / max(1, warmup_steps)
    return peak_lr * max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def decay_phase_start(warmup_steps: int, decay_steps: int, total_steps: int) -> int:
    """The first step (0-based) of a warmup-stable-decay schedule's decay phase:
    total_steps - decay_steps, but never inside the warmup (at least ``warmup_steps``)."""
    return max(warmup_steps, total_steps - decay_steps)


def warmup_stable_decay_schedule(step: int, peak_lr: float, warmup_steps: int,
                                 decay_steps: int, total_steps: int) -> float:
    """Learning rate at 0-based ``step`` of a warmup-stable-decay (WSD) schedule (MiniCPM,
    Hu et al. 2024, section 4.1; HF ``get_wsd_schedule``): linear warmup from 0 over
    ``warmup_steps``, then ``peak_lr`` held, then from step D = :func:`decay_phase_start`
    a "1-sqrt" decay over the last ``decay_steps`` steps, lr = peak (1 - sqrt((step - D) /
    (total_steps - D))), which is peak at D and reaches 0 at ``total_steps`` (Hägele et
    al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations",
    section 3: 1-sqrt cooldowns beat linear ones; HF's ``decay_type="1-sqrt"``).

    Everything before D is independent of ``total_steps``, so a run can be extended by
    re-planning the decay at a later end (:mod:`minibert.pretraining.extension`).
    Returns the rate (same unit as peak_lr)."""
    if step < warmup_steps:
        return peak_lr * step / max(1, warmup_steps)
    start = decay_phase_start(warmup_steps, decay_steps, total_steps)
    if step < start:
        return peak_lr
    return peak_lr * max(0.0, 1.0 - math.sqrt((step - start) / max(1, total_steps - start)))


def clip_grad_norm(parameters: Iterable, max_norm: float):
    """Scale all gradients so their joint L2 norm is at most ``max_norm``
    (``torch.nn.utils.clip_grad_norm_``: coefficient max_norm / (norm + 1e-6), capped at 1).

    Args:
        parameters: Parameters (their ``grad`` is scaled) or gradient arrays themselves,
            e.g. ``[optimizer.unscaled_grad()]``: one flat buffer is one pass.
    Returns the norm before clipping as a 0-d array on the parameters' device (no sync).
    With the fast paths on, CuPy arrays run :func:`minibert.gpu_kernels.clip_grad_norm`
    (the norm and the coefficient in one kernel).
    """
    grads = [getattr(p, "grad", p) for p in parameters]
    fast = fast_path("clip_grad_norm", grads[0])
    if fast is not None:
        return fast(grads, max_norm)
    xp = get_array_module(grads[0])
    squares = [xp.vdot(g.ravel(), g.ravel()) for g in grads]
    total = xp.sqrt(sum(squares[1:], squares[0]))
    # the constants in the norm's type: NumPy 1 widens a 0-d float32 with a Python number
    # to float64 (NumPy 2 and CuPy do not), and the sum above starts from no Python 0
    one = total.dtype.type
    coef = xp.minimum(one(max_norm) / (total + one(1e-6)), 1.0).astype(grads[0].dtype)
    for g in grads:
        g *= coef
    return total
