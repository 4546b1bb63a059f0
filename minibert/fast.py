"""The one switch of the fast paths: off on import, on in the jobs.

The formulas of :mod:`minibert.nn` and :func:`minibert.optim.adamw_update` are what runs
on a plain import: each of them asks :func:`fast_path` for a faster form of itself, and
gets None. A job (``train_mlm.py``, ``finetune.py``, ``evaluate.py``, ``python -m
minibert``, :func:`minibert.pipeline`) calls :func:`set_fast_paths` ``(True)`` at its start
and names the setting in its first log lines (``--no-fast-cpu`` keeps it off); from then
on the formulas hand NumPy arrays to :mod:`minibert.fast_cpu` and AdamW's CuPy buffers to
the fused kernel of :mod:`minibert.gpu_kernels`. This module sits between the two: it
imports those modules only when the fast paths are switched on, and they do not import it.
"""
from __future__ import annotations

import contextlib

import numpy as np

from .backend import get_array_module

_fast_paths = False
_cpu_paths: dict = {}   # minibert.fast_cpu.FAST_PATHS, once set_fast_paths(True) has imported it

_GPU_ONLY = frozenset({"split_heads", "merge_head_grads", "linear_backward_into",
                       "layernorm_backward_into", "add_grads", "clip_grad_norm",
                       "masked_softmax_forward", "dropout_softmax_backward",
                       "batched_matmul"})
"""Formulas with a fused GPU kernel and no CPU fast path (NumPy arrays run the formula)."""


def set_fast_paths(enabled: bool) -> bool:
    """Switch the fast implementations of the formulas on or off, for the whole process.

    Off (the default on import): every function of :mod:`minibert.nn` and AdamW's update
    run the formula written in their own body, on either device; this is what
    ``python -m minibert.gradcheck``, the examples and a plain ``import minibert`` run.
    On (what ``train_mlm.py``, ``finetune.py``, ``evaluate.py``, ``python -m minibert``
    and the pipelines switch on, and name in their first log lines; ``--no-fast-cpu``
    keeps it off):

    - on NumPy arrays, the Linear layers' products, the attention core, dropout, GELU
      (with the bias before it in one pass: :func:`minibert.fast_cpu.bias_gelu_forward`),
      softmax, LayerNorm, the cross-entropy and AdamW run their entry of
      :data:`minibert.fast_cpu.FAST_PATHS` (the same formula in row blocks over the CPU's
      threads, in place, in cache-sized blocks; equal to the formula bit for bit except float32 GELU, within 2.5e-7:
      tests/test_fast_cpu.py), OpenBLAS runs on one thread while minibert splits the
      float32 products' rows over its own pool
      (:func:`minibert.fast_cpu.split_products`; switching off gives OpenBLAS its
      threads back; OpenBLAS found through threadpoolctl on every system), and glibc,
      where there is one, keeps freed memory for the next step
      (:func:`minibert.fast_cpu.keep_freed_memory`);
    - on CuPy arrays, AdamW, GELU, dropout, LayerNorm, softmax, the cross-entropy, the
      clipping, attention's head split and the gradient accumulations run their entry of
      :data:`minibert.gpu_kernels.FAST_PATHS` (fused kernels: fewer launches, the same
      formula; tests/test_gpu_kernels.py, docs/gpu.md "Kernel launches per step"), and
      each self-attention layer concatenates its query / key / value weights once per
      optimizer step instead of once per forward (:func:`frozen_parameters`).

    Returns:
        The setting before this call (so a caller can restore it).
    """
    global _fast_paths, _cpu_paths
    previous, _fast_paths = _fast_paths, bool(enabled)
    if _fast_paths:
        from .fast_cpu import FAST_PATHS, keep_freed_memory, split_products
        _cpu_paths = FAST_PATHS   # looked up on every call of a formula: no import there
        keep_freed_memory()
        split_products(True)
    elif previous:
        from .fast_cpu import split_products
        split_products(False)
    return previous


def fast_paths_enabled() -> bool:
    """Whether :func:`set_fast_paths` has switched the fast implementations on."""
    return _fast_paths


@contextlib.contextmanager
def fast_paths(enabled: bool = True):
    """Within the block, the fast implementations are on (or off, with ``enabled=False``);
    the previous setting is restored on exit, also after an error. See
    :func:`set_fast_paths`."""
    previous = set_fast_paths(enabled)
    try:
        yield
    finally:
        set_fast_paths(previous)


_frozen = None          # an object() while a frozen_parameters() block is running


@contextlib.contextmanager
def frozen_parameters():
    """A block in which the caller promises that no parameter is written: what
    :func:`minibert.training.train_step` wraps around its forward and backward passes
    (they write gradients only; the optimizer step comes after the block).

    With the fast paths on, a layer may keep a value derived from its parameters for the
    rest of the block: each self-attention layer stacks its query / key / value weights
    into one (3C, C) matrix on the first forward of the block and reuses it for every
    later micro-batch, so the stack is built once per optimizer step instead of once per
    forward. The kept value is tied to this block (a new block, or code outside any
    block, builds it again) and to the identity of the parameter arrays, so an optimizer
    step, a loaded checkpoint or a move to another device is never missed. Blocks nest.
    """
    global _frozen
    previous, _frozen = _frozen, object()
    try:
        yield
    finally:
        _frozen = previous


def frozen_block():
    """The token of the :func:`frozen_parameters` block in force while the fast paths are
    on, else None (a layer then derives everything from its parameters on each call)."""
    return _frozen if _fast_paths else None


def fast_path(name: str, x):
    """The fast implementation of the formula ``name`` for the device of ``x``, or None.

    None while the fast paths are off (:func:`set_fast_paths`): the caller then runs its
    formula. When on: for a NumPy array ``minibert.fast_cpu.FAST_PATHS[name]``; for a CuPy
    array ``minibert.gpu_kernels.FAST_PATHS.get(name)`` (None where the GPU has no fused
    kernel for it and runs the formula); None on NumPy arrays for the names of
    :data:`_GPU_ONLY`.

    Raises:
        KeyError: ``name`` has no CPU fast path (on NumPy arrays, with the fast paths on).
    """
    if not _fast_paths:
        return None
    if get_array_module(x) is np:
        return None if name in _GPU_ONLY else _cpu_paths[name]
    from .gpu_kernels import FAST_PATHS as GPU_FAST_PATHS
    return GPU_FAST_PATHS.get(name)
