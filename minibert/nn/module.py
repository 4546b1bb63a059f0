"""Parameter and Module: the core contract every layer follows.

* A :class:`Parameter` holds ``data`` and ``grad`` of the same shape on the same device.
  Gradients accumulate (``grad += ...``) and are reset in one place only,
  :meth:`Module.zero_grad`. Weight tying is sharing one Parameter object between two
  modules: both uses add into the same ``grad``.
* A :class:`Module` caches in ``forward`` what its ``backward(dout)`` needs; ``backward``
  returns the gradient for the input(s) and adds into its parameters' ``grad``. Each
  module names the attributes that hold such a cache in ``cache_attributes``. A cache
  leaves a module one way for each reason: a ``backward`` takes it
  (:meth:`Module.take_cache`, once per forward), an inference-only caller drops them all
  (:meth:`Module.release_caches`), and a module applied several times in one forward
  (ALBERT's shared layers) moves them aside and back (:meth:`Module.stash_caches`,
  :meth:`Module.restore_caches`).

Parameter names follow the attribute path, as in PyTorch (``encoder.layer.0.attention.
self.query.weight``), so state dicts line up with Hugging Face checkpoints key for key.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ..backend import get_array_module, to_numpy, xp_for


class Parameter:
    """A trainable array and its accumulated gradient.

    Args:
        data: array (numpy or cupy) of any shape and float dtype.
    Attributes:
        data: the values.
        grad: same shape, dtype and device as ``data``; zero after :meth:`zero_grad`.
        requires_grad: False for a frozen parameter: :meth:`add_grad` then adds nothing, so
            its ``grad`` stays zero (set by ``BertPreTrainedModel.freeze``).
    """

    def __init__(self, data):
        self.data = data
        self.grad = get_array_module(data).zeros_like(data)
        self.requires_grad = True

    @property
    def shape(self):
        return self.data.shape

    def zero_grad(self) -> None:
        self.grad[...] = 0

    def add_grad(self, g) -> None:
        """``grad += g`` (g: the shape of ``data``), or nothing if the parameter is frozen."""
        if self.requires_grad:
            self.grad += g

    def __repr__(self) -> str:
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype})"


def backward_into(name: str, backward, dout, cache, dw_acc, db_acc):
    """``dx`` of ``backward(dout, cache) -> (dx, dw, db)`` (a layer's pure backward), with
    dw and db added into the accumulators ``dw_acc`` / ``db_acc`` (its parameters'
    ``grad``; None for a frozen parameter, and db None for a layer without bias), as a
    Module's backward does with them. With the fast paths on, the fast path ``name``
    (:func:`minibert.fast.fast_path`) runs instead with the same arguments.
    """
    from ..fast import fast_path
    fast = fast_path(name, dout)
    if fast is not None:
        return fast(dout, cache, dw_acc, db_acc)
    dx, dw, db = backward(dout, cache)
    for acc, g in ((dw_acc, dw), (db_acc, db)):
        if acc is not None and g is not None:
            acc += g
    return dx


def add_grads(params, grads) -> None:
    """``p.add_grad(g)`` for each pair: the slices of one stacked gradient given back to
    the parameters it was stacked from (BertSelfAttention's query / key / value).

    Args:
        params: Parameters; grads: arrays of their shapes, one per parameter.
    With the fast paths on (:func:`minibert.fast.set_fast_paths`), CuPy arrays run
    :func:`minibert.gpu_kernels.add_grads` (three additions in one kernel).
    """
    from ..fast import fast_path
    fast = fast_path("add_grads", grads[0]) if grads else None
    if fast is not None:
        return fast(params, grads)
    for p, g in zip(params, grads):
        p.add_grad(g)


def _host_copy(a) -> np.ndarray:
    """A host NumPy copy of ``a``; bfloat16 (a type NumPy does not know: ``ml_dtypes``)
    widened to float32."""
    host = to_numpy(a)
    return host.astype(np.float32) if host.dtype.name == "bfloat16" else host.copy()


class Module:
    """Base class of every layer and model.

    Sub-modules and Parameters are found from instance attributes in assignment order
    (own Parameters first, then sub-modules, as PyTorch does), which fixes the order of
    ``named_parameters`` and ``state_dict``.

    Attributes:
        cache_attributes: the names of the instance attributes where ``forward`` keeps what
            ``backward`` needs (inputs, masks, softmax outputs, shapes) or what it exposes
            from the last batch only (e.g. attention probabilities). ``("_cache",)`` by
            default, the convention of every layer; a class that keeps more, or keeps it
            elsewhere, lists its own. :meth:`release_caches` sets them to None.
    """

    training: bool = True
    cache_attributes: tuple[str, ...] = ("_cache",)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):  # pragma: no cover - interface
        raise NotImplementedError

    def backward(self, *args, **kwargs):  # pragma: no cover - interface
        raise NotImplementedError

    # -- traversal -----------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value

    def modules(self) -> Iterator["Module"]:
        """This module and all sub-modules, depth first."""
        yield self
        for _, child in self.named_children():
            yield from child.modules()

    def _named_parameters_all(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        for name, value in vars(self).items():
            if isinstance(value, Parameter):
                yield prefix + name, value
        for name, child in self.named_children():
            yield from child._named_parameters_all(prefix + name + ".")

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """(name, Parameter) pairs, each tied Parameter once under its first name."""
        seen: set[int] = set()
        for name, p in self._named_parameters_all():
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def named_trainable_parameters(self) -> list[tuple[str, Parameter]]:
        """The (name, Parameter) pairs of :meth:`named_parameters` whose ``requires_grad``
        is True: what an optimizer should update when part of the model is frozen."""
        return [(n, p) for n, p in self.named_parameters() if p.requires_grad]

    def trainable_parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_trainable_parameters()]

    def num_parameters(self) -> int:
        """Number of distinct trainable scalars (tied weights counted once)."""
        return int(sum(p.data.size for p in self.parameters()))

    # -- state ---------------------------------------------------------------------
    def zero_grad(self) -> None:
        """Reset every gradient to zero: the one place gradients are cleared."""
        for p in self.parameters():
            p.zero_grad()

    def release_caches(self) -> "Module":
        """Drop what this module and every sub-module keep from their last forward (each
        one's ``cache_attributes`` that it has, set to None), so a model used for
        inference only holds no activations between batches. A ``backward`` after this
        raises RuntimeError (its :meth:`take_cache` finds nothing), as one without a forward
        does.
        Returns self."""
        for m in self.modules():
            for name in m.cache_attributes:
                if name in vars(m):
                    setattr(m, name, None)
        return self

    def stash_caches(self) -> list[tuple["Module", str, object]]:
        """Take what the last forward left in this module and every sub-module (each one's
        ``cache_attributes``, as :meth:`release_caches` finds them) out of the modules and
        return it; the modules are left as if no forward had run. Give the list back to
        :meth:`restore_caches` before the backward of that forward.

        This is how one module serves several applications in one forward, as an ALBERT
        layer group shared across depths (:mod:`minibert.albert`): each application's
        caches are stashed after its forward, and restored in reverse order, one
        application at a time, before its backward."""
        stash = []
        for m in self.modules():
            for name in m.cache_attributes:
                if name in vars(m):
                    stash.append((m, name, getattr(m, name)))
                    setattr(m, name, None)
        return stash

    @staticmethod
    def restore_caches(stash: list[tuple["Module", str, object]]) -> None:
        """Put back what :meth:`stash_caches` took, so the next backward differentiates
        that forward."""
        for m, name, value in stash:
            setattr(m, name, value)

    def take_cache(self, name: str = "_cache"):
        """Hand what the last forward kept under ``name`` (one of ``cache_attributes``) to
        the backward, once: the attribute is cleared, so a second backward needs a new
        forward.

        Raises:
            RuntimeError: no forward came before (or its cache was taken or released).
        """
        cache = getattr(self, name, None)
        if cache is None:
            raise RuntimeError("backward() needs a preceding forward")
        setattr(self, name, None)
        return cache

    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def to(self, device: str, dtype=None) -> "Module":
        """Move (and optionally cast) every parameter and array buffer to ``device``."""
        xp = xp_for(device)
        for m in self.modules():
            for name, value in list(vars(m).items()):
                if isinstance(value, Parameter):
                    data = to_numpy(value.data) if xp is np else value.data
                    value.data = xp.asarray(data, dtype=dtype or value.data.dtype)
                    value.grad = xp.zeros_like(value.data)
                elif name.endswith("_buffer"):
                    data = to_numpy(value) if xp is np else value
                    setattr(m, name, xp.asarray(data, dtype=dtype or value.dtype))
        return self

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host NumPy copies of all parameters, keyed by name; tied weights appear under
        every name they have (as in PyTorch's ``state_dict``). bfloat16 parameters come as
        float32 (exact: every bfloat16 is a float32), so checkpoints and exports hold
        NumPy's own types."""
        return {name: _host_copy(p.data) for name, p in self._named_parameters_all()}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Copy arrays from ``state`` into the parameters.

        Args:
            state: name -> array (NumPy, or anything ``numpy.asarray`` accepts, e.g. a
                CPU torch tensor's ``.numpy()``). Values are cast to each parameter's dtype.
            strict: if True, missing and unexpected keys are errors. A tied parameter
                counts as present if any one of its names is given.
        Raises:
            KeyError: missing or unexpected keys (all of them listed).
            ValueError: a key whose shape differs (expected vs got).
        """
        names = list(self._named_parameters_all())
        expected = {n for n, _ in names}
        unexpected = sorted(set(state) - expected)
        given_ids = {id(p) for n, p in names if n in state}
        missing = sorted(n for n, p in names if id(p) not in given_ids)
        if strict and (missing or unexpected):
            raise KeyError(f"state dict does not match the model: missing keys {missing}, "
                           f"unexpected keys {unexpected}")
        for n, p in names:
            if n not in state:
                continue
            value = np.asarray(to_numpy(state[n]))
            if value.shape != p.data.shape:
                raise ValueError(f"state dict key {n!r}: expected shape {tuple(p.data.shape)}, "
                                 f"got {tuple(value.shape)}")
            xp = get_array_module(p.data)
            p.data[...] = xp.asarray(value, dtype=p.data.dtype)


class ModuleList(Module):
    """An indexable list of modules, named "0", "1", ... in parameter names."""

    def __init__(self, modules):
        for i, m in enumerate(modules):
            setattr(self, str(i), m)
        self._len = len(modules)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> Module:
        if not -self._len <= i < self._len:
            raise IndexError(i)
        return getattr(self, str(i % self._len))

    def __iter__(self):
        return (self[i] for i in range(self._len))
