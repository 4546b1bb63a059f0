"""One contiguous buffer for many Parameters: what makes AdamW, zero_grad, clipping and a
data-parallel all-reduce one pass (or one collective) over the whole model.

After ``FlatParameters(params)`` every Parameter's ``data`` and ``grad`` are views into two
flat 1-d arrays, ``flat.data`` and ``flat.grad``, in the order given. Layers keep using
``p.data`` / ``p.grad`` as before (in-place updates go to the buffer); only code that
*rebinds* ``p.data`` (``Module.to``) breaks the aliasing, so build the optimizer after
moving the model, as with PyTorch. This is the flat-buffer layout of apex's
``multi_tensor_apply`` optimizers and of DeepSpeed / Megatron's contiguous gradient buffers.

Shape legend: S = total number of scalars of all parameters.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..backend import get_array_module
from .module import Parameter


def _address(a) -> int:
    """Device or host address of an array's first element."""
    if get_array_module(a) is not np:  # pragma: no cover - GPU only
        return int(a.data.ptr)
    return int(a.__array_interface__["data"][0])


class FlatParameters:
    """The values and gradients of ``params`` in two contiguous 1-d arrays.

    Args:
        params: distinct Parameters, all of one dtype on one device; their current values
            and gradients are copied into the buffers.
    Attributes:
        data, grad: (S,) arrays; ``params[i].data`` is ``data[offsets[i]:offsets[i+1]]``
            reshaped, the same for ``grad``.
        offsets: S-offsets of each parameter, len(params) + 1 entries.
    Raises:
        ValueError: no parameters, a parameter listed twice, or mixed dtypes or devices.
    """

    def __init__(self, params: Sequence[Parameter]):
        params = list(params)
        if not params:
            raise ValueError("FlatParameters needs at least one parameter")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("FlatParameters: a parameter is listed twice")
        xp = get_array_module(params[0].data)
        dtype = params[0].data.dtype
        if any(p.data.dtype != dtype or get_array_module(p.data) is not xp for p in params):
            raise ValueError("FlatParameters: parameters must share one dtype and device, got "
                             f"{sorted({str(p.data.dtype) for p in params})}")
        self.params = params
        self.offsets = [0]
        for p in params:
            self.offsets.append(self.offsets[-1] + p.data.size)
        self.data = xp.empty(self.offsets[-1], dtype=dtype)          # (S,)
        self.grad = xp.empty(self.offsets[-1], dtype=dtype)          # (S,)
        for p, a, b in zip(params, self.offsets[:-1], self.offsets[1:]):
            self.data[a:b] = p.data.reshape(-1)
            self.grad[a:b] = p.grad.reshape(-1)
            p.data = self.data[a:b].reshape(p.data.shape)
            p.grad = self.grad[a:b].reshape(p.data.shape)

    def is_bound(self) -> bool:
        """Whether every parameter still aliases the buffer (False after a rebinding such
        as ``Module.to``)."""
        size = self.data.dtype.itemsize
        for p, a in zip(self.params, self.offsets[:-1]):
            if (_address(p.data) != _address(self.data) + a * size
                    or _address(p.grad) != _address(self.grad) + a * size):
                return False
        return True

    def zero_grad(self) -> None:
        """Every gradient to zero, in one pass."""
        self.grad.fill(0)
