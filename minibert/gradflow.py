"""Gradient flow: per-layer gradient norms and update-to-weight ratios (their plot:
:func:`minibert.viz.plot_grad_flow`).

What people look at when a deep network's gradients vanish or explode: for each layer
(``embeddings``, ``encoder.layer.N``, ``encoder.ln``, ``pooler``, ``cls.predictions``,
``cls.seq_relationship``), the L2 norm of its gradient and the ratio ||dtheta|| / ||theta||
of the optimizer's last update to the weights. cs231n ("Neural Networks Part 3", section
"Ratio of weights:updates") suggests a ratio around 1e-3: much lower and the layer learns
too slowly, much higher and the learning rate is probably too high.

    python -m minibert.gradflow runs/pretrain/metrics.jsonl -o grad_flow.png

Statistics are computed on the device (NumPy or CuPy) and copied to the host once per
call, as one small array (convert at the edge).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Iterable

import numpy as np

from .backend import get_array_module, to_numpy
from .optim import AdamW, decays
from .viz import plot_grad_flow


def layer_of(name: str) -> str:
    """The layer a parameter belongs to, for grouping: ``bert.`` is dropped, then
    ``encoder.layer.N.*`` -> ``encoder.layer.N``, ``cls.X.*`` -> ``cls.X``, anything else
    -> its first component (``embeddings``, ``pooler``, ``encoder.ln`` for the pre-LN
    final norm; a user model's top-level children)."""
    parts = name.split(".")
    if parts[0] == "bert" and len(parts) > 1:
        parts = parts[1:]
    if parts[:2] == ["encoder", "layer"] and len(parts) > 3:
        return ".".join(parts[:3])
    if parts[0] in ("cls", "encoder") and len(parts) > 2:
        return ".".join(parts[:2])
    return parts[0] if len(parts) > 1 else name


def adamw_updates(optimizer: AdamW, lr: float) -> dict:
    """The update dtheta = theta_after - theta_before of the last ``optimizer.step(lr)``,
    reconstructed from the optimizer's state after the step (no copy of the weights
    before the step is needed).

    :class:`minibert.optim.AdamW` does p <- p (1 - lr wd) - s with s = step_size * m /
    (sqrt(v) v_scale + eps) (Loshchilov & Hutter 2019); so p_before = (p + s) / (1 - lr wd)
    and dtheta = -s - lr wd p_before, computed without subtracting nearly equal numbers.

    Args:
        optimizer: the AdamW whose ``step`` was just called (``t`` >= 1).
        lr: the learning rate passed to that step.
    Returns:
        name -> dtheta, arrays of each parameter's shape, dtype and device.
    Raises:
        ValueError: the optimizer has not stepped yet.
    """
    if optimizer.t < 1:
        raise ValueError("adamw_updates: the optimizer has not taken a step yet")
    b1, b2 = optimizer.betas
    step_size, v_scale = lr, 1.0
    if optimizer.correct_bias:
        step_size = lr / (1.0 - b1 ** optimizer.t)
        v_scale = 1.0 / math.sqrt(1.0 - b2 ** optimizer.t)
    out = {}
    for name, p in optimizer.params:
        xp = get_array_module(p.data)
        m, v = optimizer.moments(name)
        s = step_size * m / (xp.sqrt(v) * v_scale + optimizer.eps)
        d = -s
        if optimizer.weight_decay and decays(p):
            decay = lr * optimizer.weight_decay
            d = d - decay * (p.data + s) / (1.0 - decay)
        out[name] = d
    return out


def _group_norms(named: Iterable[tuple[str, object]]) -> tuple[list[str], object]:
    """Per-layer L2 norms of named arrays, as (layers, device array (L,))."""
    sq = defaultdict(list)
    for name, a in named:
        xp = get_array_module(a)
        sq[layer_of(name)].append(xp.vdot(a.ravel(), a.ravel()).astype(np.float64))
    layers = list(sq)
    xp = get_array_module(*(v[0] for v in sq.values())) if sq else np
    return layers, xp.sqrt(xp.stack([sum(v[1:], v[0]) for v in sq.values()])) if sq else np.zeros(0)


def grad_flow_stats(model, optimizer: AdamW | None = None, lr: float | None = None,
                    total_grad_norm=None) -> dict:
    """Per-layer statistics of the current gradients and of the last update.

    Call after ``optimizer.step(lr)`` (gradients are still in ``.grad``; they are zeroed
    at the start of the next step).

    Args:
        model: a Module; its ``named_parameters`` are grouped by :func:`layer_of`.
        optimizer, lr: the AdamW that just stepped and its learning rate; without them
            no update statistics are returned.
        total_grad_norm: the global gradient norm *before* clipping (what
            ``clip_grad_norm`` returns, host or 0-d device value). Clipping scales every
            gradient by one factor, so the layers' pre-clip norms are the post-clip ones
            times total_grad_norm / sqrt(sum of squares); without it the norms are those
            of the gradients in ``.grad``.
    Returns:
        {"grad_norm": {layer: float}, "weight_norm": {layer: float},
         "update_ratio": {layer: ||dtheta|| / ||theta_before||}} (the last only with an
        optimizer), host floats, layers in parameter order. ``update_ratio`` uses the
        weights before the step, reconstructed by :func:`adamw_updates`.
    """
    named = list(model.named_parameters())
    layers, g = _group_norms((n, p.grad) for n, p in named)
    xp = get_array_module(g)
    if total_grad_norm is not None:
        total = xp.sqrt((g * g).sum())
        g = g * (xp.asarray(total_grad_norm, dtype=np.float64) / xp.maximum(total, 1e-30))
    _, w = _group_norms((n, p.data) for n, p in named)
    rows = [g, w]
    if optimizer is not None:
        if lr is None:
            raise ValueError("grad_flow_stats: lr is needed with an optimizer")
        updates = adamw_updates(optimizer, lr)
        _, u = _group_norms((n, updates[n]) for n, _ in named)
        # theta_before = theta_after - dtheta, per layer
        _, wb = _group_norms((n, p.data - updates[n]) for n, p in named)
        rows.append(u / xp.maximum(wb, 1e-30))
    host = to_numpy(xp.stack(rows)).astype(float)  # one transfer
    keys = ["grad_norm", "weight_norm", "update_ratio"][:len(rows)]
    return {k: dict(zip(layers, map(float, host[i]))) for i, k in enumerate(keys)}


def grad_flow_record(step: int, model, optimizer: AdamW | None = None, lr: float | None = None,
                     total_grad_norm=None) -> dict:
    """A metrics.jsonl record: {"kind": "grad_flow", "step": step, "grad_norm": {...},
    "weight_norm": {...}, "update_ratio": {...}} (see :func:`grad_flow_stats`)."""
    return {"kind": "grad_flow", "step": int(step),
            **grad_flow_stats(model, optimizer, lr, total_grad_norm)}


def read_grad_flow(path: str | Path) -> list[dict]:
    """The ``grad_flow`` records of a metrics.jsonl file, in file order.

    Raises:
        FileNotFoundError: no such file. ValueError: a line other than the last that is
            not JSON (with its line number), or no grad_flow record at all (run train_mlm.py with
            --log-grad-norms N).
    """
    records = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):  # a torn last line: the run is live or was killed
                break
            raise ValueError(f"{path}:{i}: not a JSON line ({e.msg})") from None
        if rec.get("kind") == "grad_flow":
            records.append(rec)
    if not records:
        raise ValueError(f"{path}: no grad_flow records (train with --log-grad-norms N)")
    return records


def main(argv=None) -> int:
    """``python -m minibert.gradflow METRICS.jsonl -o OUT.png``."""
    p = argparse.ArgumentParser(prog="python -m minibert.gradflow",
                                description="Plot the grad_flow records of a metrics.jsonl.")
    p.add_argument("metrics", help="metrics.jsonl written by train_mlm.py --log-grad-norms N")
    p.add_argument("-o", "--output", default=None,
                   help="PNG path (default: grad_flow.png next to the metrics file)")
    p.add_argument("--title", default=None)
    p.add_argument("--dpi", type=int, default=100)
    args = p.parse_args(argv)
    out = args.output or str(Path(args.metrics).with_name("grad_flow.png"))
    try:
        path = plot_grad_flow(read_grad_flow(args.metrics), out,
                              args.title or f"gradient flow: {Path(args.metrics).parent.name}",
                              args.dpi)
    except (OSError, ValueError) as e:
        print(f"gradflow: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
