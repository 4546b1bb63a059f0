"""AdamW, the warmup + linear-decay schedule, and global-norm gradient clipping.

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

from .backend import get_array_module, to_numpy
from .nn import Parameter


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


class AdamW:
    """Adam with decoupled weight decay.

    Per parameter p with gradient g, at step t (1-based):
        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        p -= lr * wd * p                          (matrices only, see :func:`decays`)
        p -= lr * m' / (sqrt(v') + eps)
    where m' = m / (1 - b1^t), v' = v / (1 - b2^t) if ``correct_bias`` else m, v (BERT).

    Args:
        named_parameters: (name, Parameter) pairs, e.g. ``model.named_parameters()``.
        lr: peak learning rate; the schedule scales it through ``step(lr=...)``.
        betas: (b1, b2). eps: added to sqrt(v). weight_decay: wd.
        correct_bias: use bias-corrected moments.
    Raises:
        ValueError: lr < 0, betas outside [0, 1), eps <= 0 or weight_decay < 0.
    """

    def __init__(self, named_parameters: Iterable[tuple[str, Parameter]], lr: float = 1e-4,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, correct_bias: bool = False):
        if lr < 0 or not all(0.0 <= b < 1.0 for b in betas) or eps <= 0 or weight_decay < 0:
            raise ValueError(f"AdamW: invalid hyper-parameters lr={lr} betas={betas} eps={eps} "
                             f"weight_decay={weight_decay}")
        self.params = list(named_parameters)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.weight_decay, self.correct_bias = weight_decay, correct_bias
        self.t = 0
        self.m = {n: get_array_module(p.data).zeros_like(p.data) for n, p in self.params}
        self.v = {n: get_array_module(p.data).zeros_like(p.data) for n, p in self.params}

    def step(self, lr: float | None = None) -> None:
        """Update every parameter in place from its ``grad``; ``lr`` overrides self.lr."""
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        self.t += 1
        step_size, v_scale = lr, 1.0
        if self.correct_bias:
            step_size = lr / (1.0 - b1 ** self.t)
            v_scale = 1.0 / math.sqrt(1.0 - b2 ** self.t)
        for name, p in self.params:
            xp = get_array_module(p.data)
            m, v, g = self.m[name], self.v[name], p.grad
            m *= b1
            m += (1.0 - b1) * g
            v *= b2
            v += (1.0 - b2) * (g * g)
            if self.weight_decay and decays(p):
                p.data *= 1.0 - lr * self.weight_decay
            denom = xp.sqrt(v)
            if v_scale != 1.0:
                denom *= v_scale
            denom += self.eps
            p.data -= step_size * (m / denom)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies of the moments ("m.<name>", "v.<name>") and the step count ("t")."""
        state = {"t": np.asarray(self.t)}
        for n, _ in self.params:
            state["m." + n] = to_numpy(self.m[n]).copy()
            state["v." + n] = to_numpy(self.v[n]).copy()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict`.

        Raises:
            KeyError: a parameter's moments are missing. ValueError: a shape differs.
        """
        missing = [n for n, _ in self.params if "m." + n not in state or "v." + n not in state]
        if missing:
            raise KeyError(f"optimizer state has no moments for {missing}")
        for n, p in self.params:
            xp = get_array_module(p.data)
            for key, store in (("m." + n, self.m), ("v." + n, self.v)):
                arr = np.asarray(state[key])
                if arr.shape != p.data.shape:
                    raise ValueError(f"optimizer state {key!r}: expected shape "
                                     f"{tuple(p.data.shape)}, got {arr.shape}")
                store[n] = xp.array(arr, dtype=p.data.dtype)  # a copy, never an alias
        self.t = int(state["t"])


def linear_schedule_with_warmup(step: int, peak_lr: float, warmup_steps: int,
                                total_steps: int) -> float:
    """Learning rate at 0-based ``step``: linear warmup from 0 over ``warmup_steps``, then
    linear decay to 0 at ``total_steps`` (google-research/bert ``create_optimizer``; HF
    ``get_linear_schedule_with_warmup``). Returns the rate (same unit as peak_lr)."""
    if step < warmup_steps:
        return peak_lr * step / max(1, warmup_steps)
    return peak_lr * max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def clip_grad_norm(parameters: Iterable[Parameter], max_norm: float):
    """Scale all gradients so their joint L2 norm is at most ``max_norm``
    (``torch.nn.utils.clip_grad_norm_``: coefficient max_norm / (norm + 1e-6), capped at 1).

    Returns the norm before clipping as a 0-d array on the parameters' device (no sync).
    """
    params = list(parameters)
    xp = get_array_module(params[0].grad)
    total = xp.sqrt(sum(xp.vdot(p.grad.ravel(), p.grad.ravel()) for p in params))
    coef = xp.minimum(max_norm / (total + 1e-6), 1.0).astype(params[0].grad.dtype)
    for p in params:
        p.grad *= coef
    return total
