"""An exponential moving average (EMA) of the weights, kept beside the model.

Training goes on with the raw weights; the average is what a run is judged by and what it
hands on: its evaluations, samples and minimal pairs, the weights a checkpoint offers to
other tools (``model/`` in :mod:`minibert.checkpoint`) and a Hugging Face export. GPT-BERT,
the BabyLM 2024 winner (Charpentier & Samuel 2024; repository davda54/babylm-v2, its
``4_pretrain`` training scripts), keeps such an average with decay 0.999, updated after
every optimizer step as ``ema = d * ema + (1 - d) * w``.

The average starts as the first weights (ema_0 = w_0, as GPT-BERT's copy of the model) and
the decay of step t (0-based) is ``min(d, (1 + t) / (10 + t))``: the ``num_updates`` rule of
TensorFlow's ``tf.train.ExponentialMovingAverage``. With a constant 0.999 the initial random
weights would still hold 0.999^3000 = 5% of the average after our default run's 3,000 steps;
with the rule the early steps forget them fast (0.1 at step 0, 0.5 at step 8, 0.9 at step
80) and the decay reaches d = 0.999 at step 8,990. The decay depends on the step only, so a
resumed run continues the same average.

Everything happens on the parameters' device in whole-buffer passes over the optimizer's
flat buffer (:class:`~minibert.nn.FlatParameters`): an update is two in-place passes and
reads nothing back to the host.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np

from .backend import get_array_module, to_numpy


def ema_decay_at(step: int, decay: float) -> float:
    """The decay of the update after optimizer step ``step`` (0-based):
    min(decay, (1 + step) / (10 + step)) (TensorFlow's ``ExponentialMovingAverage`` with
    ``num_updates``). Unitless, in [0.1, decay] for decay >= 0.1."""
    return min(decay, (1.0 + step) / (10.0 + step))


class WeightAverage:
    """The EMA of the weights an :class:`~minibert.optim.AdamW` trains.

    Args:
        optimizer: the run's AdamW; its weights are ``optimizer.master`` (float32) with
            float16 or bfloat16 parameters, else ``optimizer.flat.data``.
        decay: d in (0, 1) (GPT-BERT: 0.999).
    Attributes:
        average: (S,) array on the parameters' device, in the weights' dtype (float32, or
            float64 for a float64 model), laid out as the optimizer's flat buffer.
    Raises:
        ValueError: decay outside (0, 1).
    """

    def __init__(self, optimizer, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"WeightAverage: decay must be in (0, 1), got {decay}")
        self.optimizer, self.decay = optimizer, decay
        self.average = self._weights().copy()                       # ema_0 = w_0, (S,)
        self._scratch = get_array_module(self.average).empty_like(self.average)

    def _weights(self):
        opt = self.optimizer
        return opt.flat.data if opt.master is None else opt.master

    def update(self, step: int) -> None:
        """After optimizer step ``step`` (0-based): average = d * average + (1 - d) * w with
        d = :func:`ema_decay_at` (step, decay); in place, on the device."""
        d = ema_decay_at(step, self.decay)
        xp = get_array_module(self.average)
        xp.multiply(self._weights(), 1.0 - d, out=self._scratch)   # (1 - d) w
        self.average *= d
        self.average += self._scratch

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """A block in which the model's parameters hold the average (cast to their dtype);
        the raw weights are put back at its end, bit for bit, also when it raises. The
        optimizer's float32 master weights (16-bit runs) are not touched. Nothing may
        train inside the block."""
        flat = self.optimizer.flat.data
        saved = (self._scratch if self._scratch.dtype == flat.dtype
                 else get_array_module(flat).empty_like(flat))
        saved[...] = flat
        flat[...] = self.average
        try:
            yield
        finally:
            flat[...] = saved

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies of the average by parameter name, each of its parameter's shape (the
        names of ``optimizer.params``: tied weights once)."""
        host, opt = to_numpy(self.average), self.optimizer
        return {n: host[a:b].reshape(p.data.shape).copy()
                for (n, p), a, b in zip(opt.params, opt.flat.offsets[:-1], opt.flat.offsets[1:])}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict`.

        Raises:
            KeyError: a parameter missing (all of them named). ValueError: a shape differs.
        """
        opt, xp = self.optimizer, get_array_module(self.average)
        missing = [n for n, _ in opt.params if n not in state]
        if missing:
            raise KeyError(f"weight average has no entry for {missing}")
        for (n, p), a, b in zip(opt.params, opt.flat.offsets[:-1], opt.flat.offsets[1:]):
            arr = np.asarray(state[n])
            if arr.shape != p.data.shape:
                raise ValueError(f"weight average {n!r}: expected shape {tuple(p.data.shape)}, "
                                 f"got {arr.shape}")
            self.average[a:b] = xp.asarray(arr.reshape(-1), dtype=self.average.dtype)


def averaged(ema: WeightAverage | None):
    """``ema.swapped_in()``, or a block that changes nothing when there is no average."""
    return contextlib.nullcontext() if ema is None else ema.swapped_in()
