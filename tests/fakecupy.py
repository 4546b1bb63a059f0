"""A NumPy-backed stand-in for the parts of ``cupy`` and ``cupyx`` that minibert's
``--device cuda`` path uses, so that tests/test_gpu.py runs on a machine without a GPU.

:func:`installed` puts it into ``sys.modules`` as ``cupy`` / ``cupyx``; ``cupy`` is the
module object :data:`cupy` below, not this file.

What it models
--------------
- ``cupy.ndarray``: a wrapper around a host ``numpy.ndarray``. It is deliberately *not* a
  NumPy subclass: NumPy can only reach its data through the hooks below, so no host read
  escapes the count. Its class's ``__module__`` is ``"cupy"``, which is what
  :func:`minibert.backend.get_array_module` looks at.
- Device-to-host reads (syncs): ``get()``, ``cupy.asnumpy``, ``float``, ``int``,
  ``complex``, ``bool``, ``item``, ``tolist``, ``repr`` / ``str`` / ``format``, pickling,
  and ``numpy.asarray(a)`` (which then raises TypeError, as CuPy does). Also the reads
  CuPy makes by itself to size an output: boolean-mask indexing (``a[mask]``,
  ``a[mask] = v``) and ``nonzero`` / ``flatnonzero`` / ``argwhere`` / ``unique`` /
  one-argument ``where``. Each is recorded, with the file:line that asked, by
  :func:`record`, and raises ``cupyx.DeviceSynchronized`` inside
  ``cupyx.allow_synchronize(False)`` (CuPy raises there from ``get``, which all of the
  above go through). ``runtime.deviceSynchronize`` and ``Device`` / stream
  ``synchronize`` count too (stricter than CuPy, which checks only ``Device.synchronize``).
  Host-to-device copies (``cupy.asarray`` of host data, NumPy index arrays) are recorded
  as uploads; they are not syncs.
- What CuPy refuses: a NumPy array as an operand of a ufunc, a kernel or a function
  (``TypeError: Unsupported type``), a non-scalar NumPy array assigned through basic
  indexing, ``operator.index`` of an array, a kernel argument whose dtype does not match
  its parameter (``Type is mismatched``), a scatter-add on a dtype without atomicAdd.
- ``ElementwiseKernel``: the C body is run by a small interpreter over whole arrays, with
  C's types (``T``, declared ``float`` / ``double`` / ``int`` locals, a ``double``
  literal widening a ``float`` expression; see :class:`ElementwiseKernel` for the
  subset). A body outside the subset raises NotImplementedError when the kernel is made:
  a kernel the stand-in cannot read never passes silently. ``ReductionKernel``: the map,
  a sum or max along the axis, and the post-map with the scalar inputs (see its class).
  There is no ``fuse`` or ``RawKernel``: minibert uses neither, and asking for one raises.
- Kernel launches: one per CuPy call that would launch on a GPU (see :func:`_launch`),
  recorded beside the syncs by :func:`record`.
- ``cupy.cublas.gemm`` (``out = alpha op(a) @ op(b) + beta out``, with CuPy's checks; its
  copies of strided operands counted as launches).
- ``cupy.matmul`` / ``@`` with the launches and cuBLAS call CuPy 14 makes (:func:`_matmul`:
  float16 batched products cast to float32 and back, strided operands copied), and the raw
  ``cupy.cuda.cublas.gemmEx`` / ``gemmStridedBatchedEx``, which read their pointer
  arguments as cuBLAS does (column-major, leading dimensions, batch strides; bounds and
  types checked against the array whose ``.data.ptr`` gave the pointer). Every product is
  recorded with its data and compute types (``record().products``).
- bfloat16 (``ml_dtypes``): operations whose array operands are all bfloat16 give
  bfloat16, as CuPy's bfloat16 loops do (NumPy with ml_dtypes widens some to float32).
- CUDA graphs (``cupy.cuda.Stream.begin_capture`` / ``end_capture``, ``Graph.launch``,
  ``cupy.cuda.using_allocator``, ``cupy.get_default_memory_pool().malloc``): while a
  stream captures, a cuBLAS call through CuPy, a host read or sync, a host-to-device copy,
  cuRAND and a launch on another stream raise; every launch records a replay that runs it
  again on the same host arrays; the capture leaves every existing buffer as it was (a GPU
  runs nothing while it records); a buffer allocated during the capture whose memory went
  back to the pool (no array and no allocator holds it) makes the graph refuse to launch.
  nvmath-python's cuBLAS bindings (``nvmath.bindings.cublas``: ``create``, ``set_stream``,
  ``set_workspace``, ``gemm_ex``, ``gemm_strided_batched_ex``) run on the stream set on
  their handle, captured only there.
- ``cupyx.scatter_add`` (``numpy.add.at``), ``cupyx.scipy.special.erf`` (SciPy's),
  ``cupy.random.RandomState`` (``seed``, ``random_sample``) and ``default_rng``
  (``random``), ``cupy.linalg.norm``, and the ``cupy.cuda`` queries of minibert's
  start-up check and ``device_summary``.

What it cannot model
--------------------
No device memory (arrays live in host RAM; ``a.data.ptr`` is a host address; no memory
pool, no out-of-memory), no asynchrony (every call has finished when it returns, so a
missing synchronisation or a race cannot show), no streams, no atomics (``scatter_add``
adds in NumPy's order, not in the GPU's), no NVRTC (a body the interpreter accepts may
still not compile, and nothing runs on a GPU's float unit: no FMA contraction, no CUDA
rounding of ``sqrt`` / ``exp`` / ``erf``), no cuBLAS (matrix products are NumPy's: no TF32,
no ``set_compute_type``, no math modes), no cuRAND (the draws are NumPy's Philox4x64 /
PCG64, not cuRAND's Philox4x32-10 or XORWOW streams), no NCCL, one device only; of CUDA
graphs, no graph memory pools, no kernel-node parameters (a replay reruns Python closures
over the recorded arrays), and a pool that never reuses memory on its own.
"""
from __future__ import annotations

import ast
import contextlib
import re
import sys
import threading
import types
from pathlib import Path

import numpy as np
import scipy.special
from numpy.lib.mixins import NDArrayOperatorsMixin

__all__ = ["DeviceSynchronized", "Transfers", "cupy", "cupyx", "installed", "record"]


# ------------------------------------------------------------------ counting transfers

class DeviceSynchronized(RuntimeError):
    """``cupyx.DeviceSynchronized``: a sync inside ``cupyx.allow_synchronize(False)``."""

    def __init__(self, message=None):
        super().__init__(message or "Device synchronization was detected while disallowed.")


class Transfers:
    """What crossed between host and device while :func:`record` was active.

    Attributes:
        syncs: one ``"<what> at <folder>/<file>:<line> (<function>)"`` string per
            device-to-host read, in order.
        uploads: the same for each host-to-device copy.
        launches: one ``"<what> at <folder>/<file>:<line> (<function>)"`` string per
            operation that launches a kernel on a GPU (see :func:`_launch`), in order.
        products: one :class:`Product` per cuBLAS matrix product, in order: the routine,
            the data types of A, B and C and the compute type CuPy or the caller chose.
    """

    def __init__(self):
        self.syncs: list[str] = []
        self.uploads: list[str] = []
        self.launches: list[str] = []
        self.products: list[Product] = []


class Product(tuple):
    """One cuBLAS product as recorded: ``(routine, a, b, c, compute, where)``; the types are
    NumPy dtype names ("float16", "float32", "bfloat16", "float64"), the compute type one
    of "float32", "tf32", "float64" (CuPy's legacy float32 batched path records "float32")."""

    def __new__(cls, routine, a, b, c, compute, where):
        return super().__new__(cls, (routine, a, b, c, compute, where))

    routine = property(lambda self: self[0])
    types = property(lambda self: self[1:4])
    compute = property(lambda self: self[4])
    where = property(lambda self: self[5])


def _product(routine: str, a, b, c, compute: str, replay=None) -> None:
    """Record one cuBLAS product (and its launch; ``replay``: see :func:`_launch`)."""
    _launch(routine, replay)
    if not _recorders:
        return
    names = [np.dtype(t).name if not isinstance(t, str) else t for t in (a, b, c)]
    event = Product(routine, *names, compute, _caller())
    for rec in _recorders:
        rec.products.append(event)


_local = threading.local()    # .allowed: what cupyx.allow_synchronize put in force
_recorders: list[Transfers] = []


@contextlib.contextmanager
def record():
    """Record every transfer made inside the block; yields the :class:`Transfers`."""
    rec = Transfers()
    _recorders.append(rec)
    try:
        yield rec
    finally:
        _recorders.remove(rec)


@contextlib.contextmanager
def allow_synchronize(allow: bool):
    """``cupyx.allow_synchronize``: with False, a sync raises :class:`DeviceSynchronized`
    (for the current thread, restored on exit)."""
    old = getattr(_local, "allowed", True)
    _local.allowed = bool(allow)
    try:
        yield
    finally:
        _local.allowed = old


def _caller() -> str:
    """Where the innermost frame outside this file and NumPy is."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name != __file__ and "numpy" not in Path(name).parts:
            return f"{'/'.join(Path(name).parts[-2:])}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "?"


def _sync(what: str) -> None:
    """A device-to-host read: record it, and refuse it where syncs are disallowed (and
    while a stream captures, as CUDA does)."""
    _refuse_while_capturing(f"{what}: the current stream is capturing, so D2H transfers "
                            "and synchronization are not allowed")
    if not _recorders and getattr(_local, "allowed", True):
        return
    event = f"{what} at {_caller()}"
    for rec in _recorders:
        rec.syncs.append(event)
    if not getattr(_local, "allowed", True):
        raise DeviceSynchronized(f"Device synchronization was detected while disallowed: "
                                 f"{event}")


def _upload(what: str) -> None:
    """A host-to-device copy: record it (it is not a sync); refused while a stream captures
    (CuPy's copies from host memory are synchronous, ``cupy/cuda/memory.pyx``)."""
    _refuse_while_capturing(f"{what}: the current stream is capturing, so H2D transfers "
                            "are not allowed")
    if not _recorders:
        return
    event = f"{what} at {_caller()}"
    for rec in _recorders:
        rec.uploads.append(event)


@contextlib.contextmanager
def _one_launch():
    """Inside the block, launches are not recorded (a kernel the stand-in runs in several
    NumPy passes, such as a ReductionKernel, records its one launch itself)."""
    old = getattr(_local, "silent", False)
    _local.silent = True
    try:
        yield
    finally:
        _local.silent = old


def _launch(what: str, replay=None) -> None:
    """A kernel launch: one per operation that would run a kernel on a GPU (a ufunc or
    operator, a reduction, a matrix product, an ``ElementwiseKernel`` call, a copy or fill,
    a gather / scatter, a random draw, ``erf``). Views (reshape, transpose, basic
    indexing), allocations without a fill (``empty``) and no-op casts are not launches.
    The count is one per CuPy call: a CuPy routine that runs two kernels (``var``,
    ``linalg.norm``) counts once, a cuBLAS product counts once.

    While a stream captures (:class:`Stream`), ``replay`` (a function that runs the launch
    again on the same buffers) is added to the graph; a launch without one, or on a stream
    other than the capturing one, raises."""
    if getattr(_local, "silent", False):
        return
    capture = _capturing()
    if capture is not None:
        if replay is None:
            raise NotImplementedError(f"{what} at {_caller()}: the stand-in cannot replay "
                                      "this launch from a CUDA graph (tests/fakecupy.py)")
        if _current_stream() is not capture.stream:
            raise RuntimeError(f"cudaErrorStreamCaptureImplicit: {what} at {_caller()} "
                               "launches on another stream than the capturing one")
        capture.replays.append(replay)
    if not _recorders:
        return
    event = f"{what} at {_caller()}"
    for rec in _recorders:
        rec.launches.append(event)


# ------------------------------------------------------------------ the array type

def _unwrap(x, host: str = "refuse"):
    """The host arrays behind ``x`` (an array, or lists / tuples / dicts of them).

    ``host`` says what a NumPy array among them means: "refuse" (CuPy's TypeError),
    "upload" (a host-to-device copy, recorded), or "allow" (taken as it is: a ``*_like``
    function's prototype, whose shape and dtype only are used).
    """
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray):
        if host == "refuse":
            raise TypeError(f"Unsupported type {type(x)} (a host array where CuPy needs a "
                            "device array; copy it with cupy.asarray)")
        if host == "upload":
            _upload(f"host array {x.shape} {x.dtype}")
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, host) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v, host) for k, v in x.items()}
    return x


def _wrap(x):
    """Device arrays for the host arrays in a result; a NumPy scalar becomes a 0-d array
    (CuPy returns 0-d arrays where NumPy returns scalars)."""
    if isinstance(x, np.ndarray):
        a = object.__new__(ndarray)
        a._a, a._mem = x, None
        _allocated(a)
        return a
    if isinstance(x, np.generic):
        return _wrap(np.asarray(x))
    if isinstance(x, (list, tuple)):
        return type(x)(_wrap(v) for v in x)
    return x


def _call(fn, args, kwargs, host: str = "refuse", launch: str | None = None):
    """``fn`` on the host arrays behind ``args``; the result as device arrays. With
    ``out=``, the device array(s) given are returned, as NumPy returns its ``out``.
    ``launch``: the name of the kernel launch to record (None: no launch, a view)."""
    hargs, hkwargs = _unwrap(args, host), _unwrap(kwargs, host)
    result = fn(*hargs, **hkwargs)
    if (launch is None and isinstance(result, np.ndarray) and result.size
            and getattr(fn, "__name__", "") not in ("empty", "empty_like")
            and not any(isinstance(h, np.ndarray) and np.shares_memory(result, h)
                        for h in (*hargs, getattr(fn, "__self__", None)))):
        # a reshape that cannot be a view (a transposed array's): CuPy copies, one launch
        launch = f"{getattr(fn, '__name__', fn)} (copy)"
    out = kwargs.get("out")
    if out is not None:
        if launch is not None:
            _launch(launch, lambda: fn(*hargs, **hkwargs))
        outs = out if isinstance(out, tuple) else (out,)
        return outs[0] if len(outs) == 1 else outs
    wrapped = _wrap(_bfloat16_loop(result, args))
    if launch is not None:
        targets = _unwrap(wrapped, "allow")
        _launch(launch, lambda: _refill(targets, _bfloat16_loop(fn(*hargs, **hkwargs), args)))
    return wrapped


def _refill(target, result) -> None:
    """A replay's result written into the host array(s) behind what the captured call
    returned (a replay holds host arrays, never the device arrays a caller may drop)."""
    if isinstance(target, np.ndarray):
        target[...] = result
    elif isinstance(target, (list, tuple)):
        for t, r in zip(target, result):
            _refill(t, r)


def _bfloat16_loop(result, args):
    """CuPy's result type for an operation on bfloat16 arrays: bfloat16 where every array
    operand is bfloat16 (CuPy 14 defines bfloat16 loops, ``cupy/_util.pyx``
    ``bf16_loop``, and Python scalars do not promote), where ml_dtypes under NumPy widens
    to float32 (its ``matmul``, and a bfloat16 array times a Python float)."""
    arrays = [a for a in args if isinstance(a, (ndarray, np.ndarray))]
    if (isinstance(result, np.ndarray) and result.dtype == np.float32 and arrays
            and all(a.dtype.name == "bfloat16" for a in arrays)):
        return result.astype(arrays[0].dtype)
    return result


class _Pointer:
    """``a.data``: CuPy's MemoryPointer, reduced to ``ptr`` (here a host address)."""

    def __init__(self, ptr: int):
        self.ptr = ptr


def _index(key):
    """A CuPy index as NumPy sees it: device arrays unwrapped, host index arrays uploaded,
    and a boolean mask counted as a sync (CuPy reads the number of True elements back to
    size the result: ``int(mask_scanned[-1])`` in ``_routines_indexing.pyx``)."""
    parts = key if isinstance(key, tuple) else (key,)
    out = []
    for k in parts:
        if isinstance(k, (list, np.ndarray)):
            k = np.asarray(_unwrap(k, "allow"))
            _upload("host index array")
        elif isinstance(k, ndarray):
            k = k._a
        if isinstance(k, np.ndarray) and k.dtype == np.bool_ and k.size:
            _sync("boolean-mask indexing")
        out.append(k)
    return tuple(out) if isinstance(key, tuple) else out[0]


def _is_basic(key) -> bool:
    """Whether an index (as from :func:`_index`) has no index arrays."""
    parts = key if isinstance(key, tuple) else (key,)
    return not any(isinstance(k, np.ndarray) for k in parts)


class ndarray(NDArrayOperatorsMixin):
    """``cupy.ndarray`` over host memory. Arithmetic and comparison operators go through
    ``__array_ufunc__`` (NumPy's operator mixin); NumPy functions through
    ``__array_function__`` to the stand-in's function of the same name; every host read
    through :meth:`_read`.

    Args (as CuPy's constructor): shape, dtype (default float64): an uninitialised array.
    """

    __slots__ = ("_a", "_mem")

    def __init__(self, shape, dtype=float):
        self._a = np.empty(shape, dtype)
        self._mem = None
        _allocated(self)

    # -- metadata (no sync) ---------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: _wrap(self._a.T))
    data = property(lambda self: _Pointer(_register(self._a)))
    device = property(lambda self: Device(0))

    def __len__(self):
        if self._a.ndim == 0:
            raise TypeError("len() of unsized object")
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self._a)))

    # -- host reads (syncs) -----------------------------------------------------------
    def _read(self, what: str) -> np.ndarray:
        """A host copy of the data; a sync (CuPy skips the sync for an empty array)."""
        if self._a.size:
            _sync(what)
        return self._a.copy()

    def get(self, stream=None, order="C", out=None, blocking=True):
        host = self._read("get()")
        if out is None:
            return host
        out[...] = host
        return out

    def set(self, arr, stream=None):
        """Copy the host array ``arr`` (same dtype and shape) into this one: an upload."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if arr.dtype != self.dtype or arr.shape != self.shape:
            raise TypeError(f"{arr.dtype} {arr.shape} array cannot be set to {self.dtype} "
                            f"{self.shape} array")
        _upload(f"set() {arr.shape} {arr.dtype}")
        self._a[...] = arr

    def item(self):
        if self._a.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self._read("item()").item()

    def tolist(self):
        return self._read("tolist()").tolist()

    def __float__(self):
        return float(self._read("float()"))

    def __int__(self):
        return int(self._read("int()"))

    def __complex__(self):
        return complex(self._read("complex()"))

    def __bool__(self):
        if self._a.size > 1:
            raise ValueError("The truth value of an array with more than one element is "
                             "ambiguous. Use a.any() or a.all()")
        return bool(self._read("bool()"))

    # no __index__: CuPy has none, so operator.index(a) and range(a) raise TypeError

    def __repr__(self):
        return repr(self._read("repr()"))

    def __str__(self):
        return str(self._read("str()"))

    def __format__(self, spec):
        return format(self._read("format()"), spec)

    def __reduce__(self):
        return array, (self._read("pickle"),)

    def __array__(self, dtype=None, copy=None):
        _sync("numpy.asarray()")
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    # -- copies on the device (no sync) -------------------------------------------------
    def __copy__(self):
        out, src = _wrap(self._a.copy()), self._a
        dst = out._a
        _launch("ndarray.__copy__", lambda: np.copyto(dst, src))
        return out

    def __deepcopy__(self, memo):
        return self.__copy__()

    # -- indexing ------------------------------------------------------------------------
    def __getitem__(self, key):
        key = _index(key)
        out, src = self._a[key], self._a
        if not _is_basic(key):
            _launch("ndarray.__getitem__ (gather)", lambda: np.copyto(out, src[key]))
        if not isinstance(out, np.ndarray):       # one element: CuPy gives a 0-d view
            out = self._a[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
        return _wrap(out)

    def __setitem__(self, key, value):
        key = _index(key)
        if isinstance(value, np.ndarray) and value.ndim and _is_basic(key):
            # CuPy (gh-2079) refuses a host array through basic indexing
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        host, dst = _unwrap(value, "upload"), self._a
        dst[key] = host

        def replay():
            dst[key] = host
        _launch("ndarray.__setitem__ (copy or fill)", replay)

    # -- NumPy's protocols ----------------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is np.matmul and method == "__call__":
            return _matmul(*inputs, **kwargs)
        name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
        return _call(getattr(ufunc, method), inputs, kwargs, launch=name)

    def __array_function__(self, func, types, args, kwargs):
        numpy_space, mine = {"numpy": (np, cupy), "numpy.linalg": (np.linalg, cupy.linalg)
                             }.get(func.__module__, (None, None))
        if getattr(numpy_space, func.__name__, None) is not func or (
                func.__name__ not in vars(mine)):
            raise TypeError(f"{func.__module__}.{func.__name__} on a cupy array: the "
                            "stand-in does not provide it (tests/fakecupy.py)")
        return vars(mine)[func.__name__](*args, **kwargs)


_VIEWS = frozenset("reshape ravel squeeze swapaxes transpose view expand_dims broadcast_to "
                   "empty empty_like".split())
"""Methods and functions that make a view or an uninitialised array: no kernel launch
(a ``reshape`` / ``ravel`` that cannot be a view copies, on a GPU too: :func:`_call`
counts that copy as a launch)."""


_CUBLAS_FUNCTIONS = frozenset("dot vdot inner tensordot einsum".split())
"""The functions CuPy runs through cuBLAS (besides matmul)."""


def _method(name: str, syncs: bool = False):
    """The ndarray method ``name``: NumPy's, on the host arrays, returning device arrays."""
    def method(self, *args, **kwargs):
        if name in _CUBLAS_FUNCTIONS:
            _no_cublas_while_capturing(f"ndarray.{name}")
        if syncs:
            _sync(f"ndarray.{name}()")
        launch = None if name in _VIEWS else f"ndarray.{name}"
        if name == "astype":
            dtype = np.dtype(args[0] if args else kwargs["dtype"])
            if dtype == self.dtype and not kwargs.get("copy", True):
                launch = None                            # no-op cast: the array itself
        return _call(getattr(self._a, name), args, kwargs, launch=launch)
    method.__name__ = name
    return method


# the ndarray methods it provides (each is one of cupy.ndarray's, cupy/_core/core.pyx)
for _name in ("all any argmax argmin argsort astype clip conj copy cumsum dot fill flatten "
              "max mean min prod ravel repeat reshape round sort squeeze std sum swapaxes "
              "take transpose var view").split():
    setattr(ndarray, _name, _method(_name))
ndarray.nonzero = _method("nonzero", syncs=True)
ndarray.__module__ = "cupy"


# ------------------------------------------------------------------ module functions

class _Ufunc:
    """A CuPy ufunc: NumPy's on the host arrays, with ``reduce`` / ``accumulate`` /
    ``outer`` / ``at``."""

    def __init__(self, ufunc: np.ufunc):
        self._ufunc, self.__name__ = ufunc, ufunc.__name__
        self.nin, self.nout = ufunc.nin, ufunc.nout

    def __call__(self, *args, **kwargs):
        if self._ufunc is np.matmul:
            return _matmul(*args, **kwargs)
        return _call(self._ufunc, args, kwargs, launch=self.__name__)

    def __getattr__(self, method):
        if method not in ("reduce", "accumulate", "outer", "at"):
            raise AttributeError(method)
        return lambda *args, **kwargs: _call(getattr(self._ufunc, method), args, kwargs,
                                             launch=f"{self.__name__}.{method}")


def _function(name: str):
    """The CuPy function ``name``: NumPy's on the host arrays, returning device arrays."""
    fn = getattr(np, name)
    if isinstance(fn, np.ufunc):
        return _Ufunc(fn)
    host = "allow" if name.endswith("_like") else "refuse"
    syncs = name in ("nonzero", "flatnonzero", "argwhere", "unique")

    def function(*args, **kwargs):
        if name in _CUBLAS_FUNCTIONS:
            _no_cublas_while_capturing(f"cupy.{name}")
        if syncs or (name == "where" and len(args) == 1):
            _sync(f"cupy.{name}()")          # the output's size is read back
        launch = None if name in _VIEWS else f"cupy.{name}"
        return _call(fn, args, kwargs, host, launch=launch)
    function.__name__ = name
    return function


def asarray(a, dtype=None, order=None):
    """A device array of ``a``: the same array if it is one (and of ``dtype``), else a
    copy of host data (an upload)."""
    if isinstance(a, ndarray):
        out = _wrap(np.asarray(a._a, dtype=dtype, order=order))
        if dtype is not None and np.dtype(dtype) != a.dtype:
            dst, src = out._a, a._a
            _launch("cupy.asarray (cast)", lambda: np.copyto(dst, src, casting="unsafe"))
        return out
    return array(a, dtype=dtype, order=order or "K")


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0):
    """``cupy.array``: a copy on the device (an upload unless ``obj`` is a device array or
    a list of them)."""
    host = _unwrap(obj, "upload")
    if not isinstance(obj, (ndarray, np.ndarray)) and not _only_device(obj):
        _upload(f"host data {type(obj).__name__}")
    out = _wrap(np.array(host, dtype=dtype, copy=True if copy is None else copy,
                         order=order, ndmin=ndmin))
    if _only_device(obj):
        dst = out._a
        _launch("cupy.array (device copy)", lambda: np.copyto(
            dst, np.array(host, dtype=dtype, ndmin=ndmin), casting="unsafe"))
    return out


def _only_device(obj) -> bool:
    """Whether ``obj`` is a device array or a (nested) sequence of them and nothing else."""
    if isinstance(obj, ndarray):
        return True
    return isinstance(obj, (list, tuple)) and bool(obj) and all(map(_only_device, obj))


def ascontiguousarray(a, dtype=None):
    copies = not a._a.flags.c_contiguous or (dtype is not None and np.dtype(dtype) != a.dtype)
    return _call(np.ascontiguousarray, (a,), {"dtype": dtype},
                 launch="cupy.ascontiguousarray" if copies else None)


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    """A host copy of ``a`` (a sync when ``a`` is a device array)."""
    if isinstance(a, ndarray):
        return a.get(out=out)
    return np.asarray(a, order=order)


def get_array_module(*args):
    return cupy if any(isinstance(a, ndarray) for a in args) else np


def scatter_add(a, slices, value):
    """``cupyx.scatter_add``: ``a[slices] += value`` with every repeated index counted
    (CUDA atomicAdd on the GPU; ``numpy.add.at`` here, so the order of the additions is
    NumPy's)."""
    if a.dtype.type not in (np.int32, np.int64, np.float16, np.float32, np.float64,
                            np.uint32, np.uint64):
        raise TypeError("cupy.add.at only supports int32, int64, float16, float32, float64, "
                        "uint32, uint64 as data type")
    host, index, dst = _unwrap(value, "upload"), _index(slices), a._a

    def add():
        np.add.at(dst, index, np.asarray(host, dtype=dst.dtype))   # CuPy casts it to a's
    add()
    _launch("cupyx.scatter_add", add)


def erf(x, out=None):
    """``cupyx.scipy.special.erf`` (SciPy's, on the host arrays)."""
    return _call(scipy.special.erf, (x,), {} if out is None else {"out": out},
                 launch="cupyx.scipy.special.erf")


# ------------------------------------------------------------------ ElementwiseKernel

_C_TYPES = {"float": np.float32, "double": np.float64, "int": np.int32, "bool": np.bool_,
            "half": np.float16}
_C_FUNCTIONS = {"sqrt": np.sqrt, "exp": np.exp, "log": np.log, "log1p": np.log1p,
                "expm1": np.expm1, "tanh": np.tanh, "erf": scipy.special.erf,
                "fabs": np.abs, "abs": np.abs, "pow": np.power,
                "max": np.fmax, "min": np.fmin, "fmax": np.fmax, "fmin": np.fmin}
_BINARY = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.divide,
           ast.BitXor: np.bitwise_xor, ast.BitAnd: np.bitwise_and, ast.BitOr: np.bitwise_or,
           ast.RShift: np.right_shift, ast.LShift: np.left_shift}
_INTEGER_SUFFIX = r"(?<![\w.])(0[xX][0-9a-fA-F]+|\d+)(?:[uU][lL]{0,2}|[lL]{1,2}[uU]?)(?![\w.])"
_COMPARE = {ast.Lt: np.less, ast.LtE: np.less_equal, ast.Gt: np.greater,
            ast.GtE: np.greater_equal, ast.Eq: np.equal, ast.NotEq: np.not_equal}
_NAME = r"[A-Za-z_]\w*"
_FLOAT_SUFFIX = "__float_literal__"     # 1.0f is read as __float_literal__(1.0): float32


class _Param:
    """One kernel parameter: ``"T x"`` (a type placeholder, one letter, as in CuPy) or
    ``"float32 x"`` (a NumPy dtype name)."""

    def __init__(self, text: str, kernel: str):
        words = text.split()
        if len(words) != 2:                      # e.g. "raw T x": raw arrays index freely
            raise NotImplementedError(f"{kernel}: parameter {text!r} is outside the C subset "
                                      "the stand-in interprets ('TYPE name')")
        self.type, self.name = words
        self.dtype = None if len(self.type) == 1 else np.dtype(self.type)


class ElementwiseKernel:
    """``cupy.ElementwiseKernel`` whose C body is interpreted over whole NumPy arrays.

    The body may hold, separated by ``;``: ``TYPE name = expr`` (TYPE a placeholder of
    the parameters, ``float``, ``double``, ``int``, ``bool`` or ``half``; ``const``
    allowed), ``name = expr`` (to a local or an output parameter) and ``if (expr) name =
    expr``. Expressions: names (parameters, locals, ``i`` the element index), int and
    float literals (``1.0`` is a C ``double``, ``1.0f`` a ``float``; integer suffixes such as
    ``ull`` are read), unary ``-``/``+``, ``+ - * /`` (not ``/`` on two integers: C
    truncates), ``^ & | >> <<``, with C's conversion of a signed operand to unsigned 64
    bits (and NumPy's wrap-around, as C's unsigned arithmetic), one comparison, and calls of
    sqrt, exp, log, log1p, expm1, tanh, erf, fabs, abs, pow, fmax / max, fmin / min.
    Values keep C's types: ``float`` arithmetic stays float32 unless a ``double`` enters,
    and an assignment rounds to the variable's type. Anything else (blocks, loops,
    ``?:``, ``&&``, casts, compound assignment, ``%``, indexing, atomics, raw
    parameters, a preamble, an assignment to an input or an undeclared name) raises
    here, at construction.

    Calls follow CuPy: the inputs, then optionally the outputs; arrays broadcast to one
    shape; the arrays bound to a placeholder share one dtype and scalars are cast to it;
    outputs given must have the broadcast shape; returns the output(s).
    """

    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "kernel",
                 reduce_dims: bool = True, preamble: str = "", no_return: bool = False,
                 return_tuple: bool = False, loop_prep: str = "", after_loop: str = "",
                 **options):
        self.name = name
        if preamble.strip() or loop_prep.strip() or after_loop.strip() or options:
            raise self._unsupported("a preamble, loop_prep, after_loop or compile options")
        self.in_params = [_Param(p, name) for p in in_params.split(",") if p.strip()]
        self.out_params = [_Param(p, name) for p in out_params.split(",") if p.strip()]
        self.no_return, self.return_tuple = no_return, return_tuple
        self._placeholders = {p.type for p in self.in_params + self.out_params
                              if p.dtype is None}
        readable = {p.name for p in self.in_params + self.out_params} | {"i"}
        writable = {p.name for p in self.out_params}
        self._program = []                 # ("let", ctype, name, expr) | ("set", name, expr)
        for text in self._statements(operation):     # | ("if", cond, name, expr)
            op = self._statement(text)
            for tree in op:
                if isinstance(tree, ast.AST):
                    for node in ast.walk(tree):
                        if isinstance(node, ast.Name) and node.id not in readable:
                            raise NameError(f"{name}: identifier {node.id!r} is undefined")
            target = op[-2]
            if op[0] == "let":
                if target in readable:
                    raise self._unsupported(f"redeclaring {target!r}")
                readable.add(target)
                writable.add(target)
            elif target not in writable:
                raise self._unsupported(f"assigning to {target!r} (an input or undeclared)")
            self._program.append(op)
        self._uses_i = any(isinstance(n, ast.Name) and n.id == "i" for op in self._program
                           for tree in op if isinstance(tree, ast.AST) for n in ast.walk(tree))

    # -- reading the body -------------------------------------------------------------
    def _unsupported(self, what: str):
        return NotImplementedError(f"{self.name}: {what} is outside the C subset the "
                                   "stand-in interprets (tests/fakecupy.py)")

    def _statements(self, operation: str) -> list[str]:
        body = re.sub(r"//[^\n]*|/\*.*?\*/", " ", operation, flags=re.DOTALL)
        if re.search(r"[{}]", body):
            raise self._unsupported("a block { ... }")
        return [s.strip() for s in body.split(";") if s.strip()]

    def _statement(self, text: str) -> tuple:
        if re.match(r"if\s*\(", text):
            depth, start = 0, text.index("(")
            for end in range(start, len(text)):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            m = re.fullmatch(rf"({_NAME})\s*=(?!=)\s*(.+)", text[end + 1:].strip(), re.DOTALL)
            if depth or not m:
                raise self._unsupported(f"the statement {text!r}")
            return ("if", self._expr(text[start + 1:end]), m[1], self._expr(m[2]))
        m = re.fullmatch(rf"(?:const\s+)?({_NAME})\s+({_NAME})\s*=(?!=)\s*(.+)", text,
                         re.DOTALL)
        if m:
            if m[1] not in _C_TYPES and m[1] not in self._placeholders:
                raise self._unsupported(f"the type {m[1]!r}")
            return ("let", m[1], m[2], self._expr(m[3]))
        m = re.fullmatch(rf"({_NAME})\s*=(?!=)\s*(.+)", text, re.DOTALL)
        if m:
            return ("set", m[1], self._expr(m[2]))
        raise self._unsupported(f"the statement {text!r}")

    def _expr(self, text: str) -> ast.expr:
        """The expression's syntax tree, after checking every node is in the subset."""
        src = re.sub(_INTEGER_SUFFIX, r"\1", text.strip())     # 0x9E37...ull: C's integer
        src = re.sub(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)[fF](?!\w)",
                     rf"{_FLOAT_SUFFIX}(\1)", src)
        try:
            tree = ast.parse(src, mode="eval").body
        except SyntaxError:
            raise self._unsupported(f"the expression {text!r}") from None
        for node in ast.walk(tree):
            ok = (isinstance(node, (ast.Name, ast.Load, ast.USub, ast.UAdd, *_BINARY,
                                    *_COMPARE))
                  or (isinstance(node, ast.UnaryOp) and type(node.op) in (ast.USub, ast.UAdd))
                  or (isinstance(node, ast.BinOp) and type(node.op) in _BINARY)
                  or (isinstance(node, ast.Constant) and type(node.value) in (int, float))
                  or (isinstance(node, ast.Compare) and len(node.ops) == 1)
                  or (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                      and node.func.id in (*_C_FUNCTIONS, _FLOAT_SUFFIX)
                      and not node.keywords))
            if not ok:
                raise self._unsupported(f"{ast.unparse(node)!r} in {text!r}")
        for node in ast.walk(tree):          # the called names are not identifiers
            if isinstance(node, ast.Call):
                node.func = ast.Constant(node.func.id)
        return tree

    # -- running it ---------------------------------------------------------------------
    def __call__(self, *args, size=None, block_size=None, stream=None):
        nin, nout = len(self.in_params), len(self.out_params)
        if len(args) not in (nin, nin + nout):
            raise TypeError(f"Wrong number of arguments for {self.name!r}. It must be either "
                            f"{nin} or {nin + nout} (with outputs), but given {len(args)}.")
        if any(isinstance(a, np.ndarray) for a in args):
            raise TypeError(f"Unsupported type {np.ndarray}")
        ins, outs = list(args[:nin]), list(args[nin:])
        if not all(isinstance(a, ndarray) for a in outs):
            raise TypeError("Output arguments must be cupy.ndarray")
        types = {}                         # placeholder -> dtype: outputs first, as CuPy
        for p, a in [*zip(self.out_params, outs), *zip(self.in_params, ins)]:
            if isinstance(a, ndarray):
                expected = p.dtype if p.dtype is not None else types.setdefault(p.type, a.dtype)
                if a.dtype != expected:
                    raise TypeError(f"Type is mismatched. {p.name} {a.dtype} {expected}")
        if self._placeholders - set(types):
            raise TypeError(f"{self.name}: no array argument fixes the type(s) "
                            f"{sorted(self._placeholders - set(types))}")
        ctypes = {**{t: np.dtype(d) for t, d in _C_TYPES.items()}, **types}
        dtype = {p.name: p.dtype if p.dtype is not None else types[p.type]
                 for p in self.in_params + self.out_params}
        shapes = [a.shape for a in args if isinstance(a, ndarray)]
        if not shapes:
            raise ValueError("Loop size is undecided")
        shape = np.broadcast_shapes(*shapes)
        if any(a.shape != shape for a in outs):
            raise ValueError("Out shape is mismatched")
        outs = outs or [ndarray(shape, dtype[p.name]) for p in self.out_params]

        host_ins = [a._a if isinstance(a, ndarray) else a for a in ins]
        host_outs = [a._a for a in outs]

        def run():
            self._run(host_ins, host_outs, shape, dict(dtype), ctypes)
        run()
        _launch(f"ElementwiseKernel {self.name}", run)
        if self.no_return:
            return None
        return outs[0] if nout == 1 and not self.return_tuple else tuple(outs)

    def _run(self, ins, outs, shape, dtype, ctypes) -> None:
        """The body over the broadcast host arrays ``ins``, written into ``outs``."""
        env = {p.name: np.broadcast_to(a, shape) if isinstance(a, np.ndarray)
               else np.asarray(a, dtype=dtype[p.name])[()]          # a scalar of C's type
               for p, a in zip(self.in_params, ins)}
        env.update({p.name: a.copy() for p, a in zip(self.out_params, outs)})
        if self._uses_i:                           # the element index (C's ptrdiff_t)
            env["i"] = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        with np.errstate(all="ignore"):            # a GPU raises no float exceptions
            for op in self._program:
                if op[0] == "let":
                    dtype[op[2]] = ctypes[op[1]]
                target = op[-2]
                value = np.asarray(self._eval(op[-1], env)).astype(dtype[target])
                if op[0] == "if":
                    value = np.where(np.asarray(self._eval(op[1], env)) != 0, value,
                                     env[target])
                env[target] = value
        for p, a in zip(self.out_params, outs):
            a[...] = env[p.name]

    def _eval(self, node, env):
        if isinstance(node, ast.Constant):          # C: 2 is an int, 2.0 a double
            return np.float64(node.value) if isinstance(node.value, float) else node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.UnaryOp):
            value = self._eval(node.operand, env)
            return -value if isinstance(node.op, ast.USub) else +value
        if isinstance(node, ast.BinOp):
            a, b = self._eval(node.left, env), self._eval(node.right, env)
            if isinstance(node.op, ast.Div) and all(
                    np.asarray(v).dtype.kind in "iub" for v in (a, b)):
                raise self._unsupported("integer division")
            kinds = [np.asarray(v).dtype for v in (a, b)]
            if np.dtype(np.uint64) in kinds:       # C: a signed operand converts to unsigned
                a, b = (np.asarray(v).astype(np.uint64) if not isinstance(v, int)
                        and np.asarray(v).dtype.kind == "i" else v for v in (a, b))
            return _BINARY[type(node.op)](a, b)
        if isinstance(node, ast.Compare):
            return _COMPARE[type(node.ops[0])](self._eval(node.left, env),
                                               self._eval(node.comparators[0], env))
        args = [self._eval(a, env) for a in node.args]             # a call
        if node.func.value == _FLOAT_SUFFIX:
            return np.float32(*args)
        return _C_FUNCTIONS[node.func.value](*args)


# ------------------------------------------------------------------ cuBLAS

def gemm(transa, transb, a, b, out=None, alpha=1.0, beta=0.0):
    """``cupy.cublas.gemm``: ``out = alpha op(a) @ op(b) + beta out`` (op: 'N' as is, 'T'
    transposed), with CuPy's checks (2-D operands of one dtype, float32 / float64 only,
    ``out`` of the product's shape and dtype). One launch when a, b and out are C- or
    F-contiguous; CuPy copies a strided operand first (one more launch each) and a strided
    ``out`` into an F-ordered buffer and back (two more)."""
    _no_cublas_while_capturing("cupy.cublas.gemm")
    if a.ndim != 2 or b.ndim != 2 or a.dtype != b.dtype:
        raise AssertionError("gemm: a and b must be 2-D arrays of one dtype")
    if a.dtype.char not in "fdFD":
        raise TypeError("invalid dtype")
    op = {"N": lambda m: m, "T": lambda m: m.T}
    if transa not in op or transb not in op:
        raise TypeError(f"invalid trans {transa!r} / {transb!r}")
    product = op[transa](a._a) @ op[transb](b._a)
    for operand in (a, b):
        if not (operand.flags.c_contiguous or operand.flags.f_contiguous):
            _launch("cupy.cublas.gemm (copy of a strided operand)")
    if out is None:
        out = _wrap(np.asfortranarray(product * a.dtype.type(alpha)))
    else:
        if out.ndim != 2 or out.shape != product.shape or out.dtype != a.dtype:
            raise AssertionError("gemm: out must be 2-D, of the product's shape and dtype")
        if not (out.flags.c_contiguous or out.flags.f_contiguous):
            _launch("cupy.cublas.gemm (copy of a strided out)")
            _launch("cupy.cublas.gemm (copy back into out)")
        t = a.dtype.type
        out._a[...] = t(alpha) * product + t(beta) * out._a
    _product("cupy.cublas.gemm", a.dtype, b.dtype, out.dtype, a.dtype.name)
    return out


def _matmul(a, b, out=None, **kwargs):
    """``cupy.matmul`` / ``a @ b`` with the launches and cuBLAS call CuPy 14 makes
    (``cupy/_core/_routines_linalg.pyx``, ``matmul``, ``dot``, ``tensordot_core``):

    - both operands 2-D (or 1-D): ``dot``, one ``gemmEx`` in the operands' type (float16
      and bfloat16 with float32 compute); an operand neither C- nor F-contiguous is copied
      first (one launch);
    - more dimensions: float16 is promoted to float32 (``if dtype.char == 'e': dtype =
      numpy.dtype('f')``), each operand made C-contiguous in that type (one launch where it
      is not already), one ``gemmStridedBatchedEx`` in float32 with a legacy compute type
      (``sgemmBatched`` plus three pointer kernels when an operand is broadcast), and a
      copy back into a float16 result (one launch).
    """
    _no_cublas_while_capturing("cupy.matmul")
    if kwargs:
        raise TypeError(f"matmul: the stand-in takes no {sorted(kwargs)}")
    x, y = _unwrap(a), _unwrap(b)
    result = _bfloat16_loop(np.matmul(x, y), (x, y))
    if x.ndim <= 2 and y.ndim <= 2:
        for op in (x, y):
            if not (op.flags.c_contiguous or op.flags.f_contiguous):
                _launch("cupy.matmul (copy of a strided operand)")
        kind = result.dtype
        _product("gemmEx (cupy.matmul)", kind, kind, kind,
                 "float64" if kind == np.float64 else "float32")
    else:
        kind = np.dtype(np.float32) if result.dtype == np.float16 else result.dtype
        for op in (x, y):
            if op.dtype != kind:
                _launch(f"cupy.matmul (cast of an operand to {kind.name})")
            elif not op.flags.c_contiguous:
                _launch("cupy.matmul (copy of a strided operand)")
        if x.shape[:-2] != y.shape[:-2]:
            for _ in range(3):
                _launch("cupy.matmul (_mat_ptrs)")
            _product("sgemmBatched (cupy.matmul)", kind, kind, kind, kind.name)
        else:
            _product("gemmStridedBatchedEx (cupy.matmul)", kind, kind, kind, kind.name)
        if kind != result.dtype:
            _launch(f"cupy.matmul (cast of the result to {result.dtype.name})")
        elif out is not None and not out.flags.c_contiguous:
            _launch("cupy.matmul (copy into out)")
    if out is not None:
        out._a[...] = result
        return out
    return _wrap(result)


# cuBLAS / CUDA enums (cublas_api.h, library_types.h), as cupy.cuda.cublas / runtime name them
_CUDA_TYPES = {0: np.dtype(np.float32), 1: np.dtype(np.float64), 2: np.dtype(np.float16),
               14: "bfloat16"}
_COMPUTE_TYPES = {68: "float32", 77: "tf32", 70: "float64"}     # CUBLAS_COMPUTE_*
_registered: dict = {}          # host address -> weakrefs of the arrays whose .data was asked there


def _register(a: np.ndarray) -> int:
    """``a.data.ptr``: the host address of ``a``'s first element, remembered so that a raw
    cuBLAS call given that pointer finds the array (and its extent) again."""
    import weakref
    ptr = a.__array_interface__["data"][0]
    refs = [r for r in _registered.get(ptr, []) if r() is not None and r() is not a]
    _registered[ptr] = refs + [weakref.ref(a)]     # a view may start where its base does
    return ptr


def _scalar(ptr: int, compute: str) -> float:
    """The host scalar at ``ptr`` (alpha, beta): float32 for a float32 / TF32 compute type,
    float64 for float64 (CUBLAS_POINTER_MODE_HOST, CuPy's default)."""
    import ctypes
    kind = np.float64 if compute == "float64" else np.float32
    size = np.dtype(kind).itemsize
    return float(np.frombuffer((ctypes.c_char * size).from_address(ptr), kind)[0])


def _matrices(what, ptr, cuda_type, rows, cols, ld, stride, batch):
    """The (batch, rows, cols) column-major matrices cuBLAS reads at ``ptr``: element
    (b, i, j) at ``ptr + (b stride + i + j ld) itemsize``. Raises AssertionError (where
    cuBLAS would read or write past the array, or misread it) for an unknown pointer, a
    dtype other than ``cuda_type``, ``ld < rows`` or an extent past the array."""
    def span(x):
        return sum((n - 1) * st for n, st in zip(x.shape, x.strides)) + x.itemsize \
            if x.size else 0
    # of the live arrays whose .data.ptr this is (a base and a view of it may share one),
    # the widest: cuBLAS reads memory, not arrays
    live = [r() for r in _registered.get(ptr, []) if r() is not None]
    arr = max(live, key=span) if live else None
    if arr is None:
        raise AssertionError(f"{what}: pointer {ptr:#x} is no live array's .data.ptr")
    kind = _CUDA_TYPES.get(cuda_type)
    if kind is None or arr.dtype != kind:
        raise AssertionError(f"{what}: declared CUDA type {cuda_type} ({kind}), "
                             f"the array is {arr.dtype}")
    if ld < max(1, rows) or stride < 0 or batch < 1 or rows < 1 or cols < 1:
        raise AssertionError(f"{what}: invalid ld {ld} for {rows} rows, stride {stride}, "
                             f"batch {batch}")
    isz = arr.itemsize
    if any(st < 0 for st in arr.strides):
        raise AssertionError(f"{what}: an array with negative strides")
    span = span(arr)
    extent = ((batch - 1) * stride + (rows - 1) + (cols - 1) * ld + 1) * isz
    if extent > span:
        raise AssertionError(f"{what}: cuBLAS would reach {extent} bytes from the pointer; "
                             f"the array {arr.shape} {arr.dtype} spans {span}")
    return np.lib.stride_tricks.as_strided(arr, (batch, rows, cols),
                                           (stride * isz, isz, ld * isz))


def _gemm_raw(routine, transa, transb, m, n, k, alpha, A, Atype, lda, strideA,
              B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batch, compute, algo):
    """What a cuBLAS GemmEx call computes, column-major: ``C = alpha op(A) op(B) + beta C``
    with op(A) m x k, op(B) k x n, C m x n (C is not read when beta is 0), in float32 (or
    float64) arithmetic, rounded once into C's type. Records the product with its types."""
    kind = _COMPUTE_TYPES.get(compute)
    if kind is None:
        raise AssertionError(f"{routine}: compute type {compute} is not one the stand-in knows")
    if transa not in (0, 1) or transb not in (0, 1):
        raise AssertionError(f"{routine}: trans {transa} / {transb}")
    a = _matrices(f"{routine} A", A, Atype, *((m, k) if transa == 0 else (k, m)), lda,
                  strideA, batch)
    b = _matrices(f"{routine} B", B, Btype, *((k, n) if transb == 0 else (n, k)), ldb,
                  strideB, batch)
    c = _matrices(f"{routine} C", C, Ctype, m, n, ldc, strideC, batch)
    if strideC and strideC < m + (n - 1) * ldc and batch > 1:
        raise AssertionError(f"{routine}: the batches of C overlap (stride {strideC})")
    arith = np.float64 if kind == "float64" else np.float32
    alpha_value, beta_value = _scalar(alpha, kind), _scalar(beta, kind)   # read at the call

    def run():
        op_a = (a if transa == 0 else a.transpose(0, 2, 1)).astype(arith)
        op_b = (b if transb == 0 else b.transpose(0, 2, 1)).astype(arith)
        result = arith(alpha_value) * np.matmul(op_a, op_b)
        if beta_value != 0:
            result = result + arith(beta_value) * c.astype(arith)
        c[...] = result.astype(c.dtype)
    run()
    _product(routine, _CUDA_TYPES[Atype], _CUDA_TYPES[Btype], _CUDA_TYPES[Ctype], kind, run)


def gemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
           Ctype, ldc, computeType, algo):
    """``cupy.cuda.cublas.gemmEx`` (cublasGemmEx): see :func:`_gemm_raw`."""
    _no_cublas_while_capturing("cupy.cuda.cublas.gemmEx")
    _gemm_raw("cublas.gemmEx", transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype,
              ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType, algo)


def gemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B,
                         Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
                         computeType, algo):
    """``cupy.cuda.cublas.gemmStridedBatchedEx`` (cublasGemmStridedBatchedEx): see
    :func:`_gemm_raw`; a stride of 0 repeats one matrix over the batch."""
    _no_cublas_while_capturing("cupy.cuda.cublas.gemmStridedBatchedEx")
    _gemm_raw("cublas.gemmStridedBatchedEx", transa, transb, m, n, k, alpha, A, Atype, lda,
              strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
              computeType, algo)


class ReductionKernel:
    """``cupy.ReductionKernel`` run as ElementwiseKernel passes over NumPy arrays: the map
    expression (ElementwiseKernel's C subset) on the broadcast inputs, a reduction along
    ``axis`` (``reduce_expr`` ``a + b`` or ``max(a, b)`` only), and ``post_map_expr`` (one
    or more statements of the subset) with ``a``, the output and the *scalar* inputs only:
    in CuPy an array input is not defined outside the map. One output; no
    ``reduce_type``, preamble or options. Anything else raises NotImplementedError when the
    kernel is made. One launch per call.
    """

    def __init__(self, in_params: str, out_params: str, map_expr: str, reduce_expr: str,
                 post_map_expr: str, identity, name: str = "reduce_kernel",
                 reduce_type=None, reduce_dims: bool = True, preamble: str = "",
                 options=()):
        self.name = name
        if reduce_type is not None or preamble.strip() or options:
            raise NotImplementedError(f"{name}: reduce_type, a preamble or options are "
                                      "outside what the stand-in interprets")
        reduce = re.sub(r"\s", "", reduce_expr)
        if reduce not in ("a+b", "max(a,b)"):
            raise NotImplementedError(f"{name}: reduce_expr {reduce_expr!r} is outside what "
                                      "the stand-in interprets ('a + b', 'max(a, b)')")
        self._reduce = np.add if reduce == "a+b" else np.fmax
        float(str(identity))                       # a number literal
        outs = [p for p in out_params.split(",") if p.strip()]
        if len(outs) != 1:
            raise NotImplementedError(f"{name}: one output parameter")
        self._out = _Param(outs[0], name)
        self._map = ElementwiseKernel(in_params, f"{self._out.type} _mapped",
                                      f"_mapped = {map_expr}", name)
        self._post = post_map_expr
        ElementwiseKernel(f"{in_params}, {self._out.type} a", out_params, post_map_expr,
                          name)                   # the post-map must be readable

    def __call__(self, *args, axis=None, keepdims=False, stream=None):
        params = self._map.in_params
        if len(args) != len(params):
            raise TypeError(f"Wrong number of arguments for {self.name!r}")
        out = self._reduced(args, axis, keepdims)
        dst, hosts = out._a, [a._a if isinstance(a, ndarray) else a for a in args]
        _launch(f"ReductionKernel {self.name}", lambda: np.copyto(dst, self._reduced(
            [_wrap(h) if isinstance(h, np.ndarray) else h for h in hosts], axis, keepdims)._a))
        return out

    def _reduced(self, args, axis, keepdims):
        """The map, the reduction and the post-map, in one (uncounted) launch."""
        params = self._map.in_params
        with _one_launch():
            mapped = self._map(*args)
            reduced = self._reduce.reduce(mapped._a, axis=axis, keepdims=keepdims)
            a = _wrap(np.asarray(reduced, dtype=mapped.dtype))
            scalars = [(p, v) for p, v in zip(params, args) if not isinstance(v, ndarray)]
            post = ElementwiseKernel(
                ", ".join([f"{p.type} {p.name}" for p, _ in scalars] + [f"{self._out.type} a"]),
                f"{self._out.type} {self._out.name}", self._post, self.name)
            return post(*[v for _, v in scalars], a)


# ------------------------------------------------------------------ random, cuda, linalg

class RandomState:
    """``cupy.random.RandomState``: ``seed`` and ``random_sample``, drawing from NumPy's
    Philox (4x64) instead of cuRAND's generator ``method``."""

    def __init__(self, seed=None, method=None):
        self.method = _curand.CURAND_RNG_PSEUDO_DEFAULT if method is None else method
        self.seed(seed)

    def seed(self, seed=None):
        if seed is not None:
            seed_arr = np.asarray(seed)
            if seed_arr.dtype.kind not in "biu":
                raise TypeError("Seed must be an integer.")
            if not 0 <= int(seed_arr) < 2**64:
                raise ValueError("Seed must be an integer between 0 and 2**64 - 1")
            seed = int(seed_arr)
        self._rng = np.random.Generator(np.random.Philox(seed))

    def random_sample(self, size=None, dtype=float):
        dtype = np.dtype(dtype)
        if dtype.char not in "fd":
            raise TypeError(f"cupy.random only supports float32 and float64, got {dtype}")
        _refuse_while_capturing("cuRAND (RandomState.random_sample) during stream capture")
        _launch("RandomState.random_sample")
        return _wrap(np.asarray(self._rng.random(size, dtype=dtype)))


class Generator:
    """``cupy.random.default_rng(seed)``: ``random`` only (NumPy's PCG64 here)."""

    def __init__(self, seed=None):
        self._rng = np.random.default_rng(seed)

    def random(self, size=None, dtype=np.float64):
        _refuse_while_capturing("cuRAND (Generator.random) during stream capture")
        _launch("Generator.random")
        return _wrap(np.asarray(self._rng.random(size, dtype=dtype)))


# ------------------------------------------------------------------ CUDA graphs

class _Capture:
    """What a capturing stream has recorded: one replay per launch, in order, and a weak
    reference to the memory of each buffer allocated meanwhile."""

    def __init__(self, stream):
        self.stream, self.replays, self.memory = stream, [], []
        # a capture runs nothing on a GPU; the stand-in computes as it records, so it keeps
        # what every existing buffer held and puts it back when the capture ends
        self.saved = [(ref, ref().copy()) for ref in list(_LIVE.values()) if ref() is not None]


def _capturing():
    """The capture in progress on this thread, or None."""
    return getattr(_local, "capture", None)


def _refuse_while_capturing(what: str) -> None:
    if _capturing() is not None:
        raise RuntimeError(f"{what} (at {_caller()}) is not allowed while a stream captures "
                           "a CUDA graph")


def _no_cublas_while_capturing(routine: str) -> None:
    """CuPy sets its cuBLAS handle's stream on each call and refuses while the current
    stream captures (``cupy_backends/cuda/libs/cublas.pyx``, ``_setStream``)."""
    if _capturing() is not None:
        raise NotImplementedError(f"{routine} at {_caller()}: calling cuBLAS API during "
                                  "stream capture is currently unsupported")


class _Memory:
    """A block of the memory pool (``cupy.cuda.MemoryPointer``): it goes back to the pool
    when the last reference to it goes."""

    __slots__ = ("size", "__weakref__")

    def __init__(self, size: int):
        self.size = size


class _MemoryPool:
    """``cupy.get_default_memory_pool()``: ``malloc(size)`` gives a :class:`_Memory`."""

    def malloc(self, size: int) -> _Memory:
        return _Memory(int(size))


_POOL = _MemoryPool()


@contextlib.contextmanager
def using_allocator(allocator=None):
    """``cupy.cuda.using_allocator``: each device allocation in the block (on this
    thread) calls ``allocator(nbytes)`` for its memory."""
    old = getattr(_local, "allocator", None)
    _local.allocator = allocator
    try:
        yield
    finally:
        _local.allocator = old


_LIVE: dict = {}                # id -> weakref of every host array that owns device data
_HELD: dict = {}                # id of an owner allocated in a capture -> (its ref, memory ref)


def _owner(x: np.ndarray) -> np.ndarray:
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x


def _allocated(a: "ndarray") -> None:
    """A new device buffer: remembered weakly (a capture restores what it wrote, see
    :meth:`Stream.begin_capture`); while a stream captures, its memory comes from the
    allocator in force (or the pool) and the capture remembers it weakly too: a graph whose
    buffer went back to the pool refuses to launch (:meth:`Graph.launch`)."""
    import weakref
    owner = _owner(a._a)
    if id(owner) not in _LIVE or _LIVE[id(owner)]() is not owner:
        _LIVE[id(owner)] = weakref.ref(owner)
        if len(_LIVE) > 4 * getattr(_allocated, "pruned", 1024):
            for key in [k for k, r in _LIVE.items() if r() is None]:
                del _LIVE[key]
            _allocated.pruned = len(_LIVE)
    if a._a.base is not None:                     # a view holds its owner's memory
        held = _HELD.get(id(owner))
        if held is not None and held[0]() is owner:
            a._mem = held[1]()
        return
    capture = _capturing()
    if capture is None:
        return
    allocator = getattr(_local, "allocator", None)
    memory = (allocator or _POOL.malloc)(a._a.nbytes)
    if not isinstance(memory, _Memory):
        raise TypeError(f"the allocator gave {type(memory).__name__}, not a MemoryPointer")
    a._mem = memory
    _HELD[id(owner)] = (weakref.ref(owner), weakref.ref(memory))
    capture.memory.append((weakref.ref(memory), f"{a.shape} {a.dtype} at {_caller()}"))


class Graph:
    """``cupy.cuda.Graph``: what a stream captured. :meth:`launch` reruns the recorded
    launches on the same buffers (one launch), and raises if a buffer allocated during the
    capture has gone back to the memory pool (no array and no allocator holds it)."""

    def __init__(self, capture: _Capture):
        self._replays, self._memory = capture.replays, capture.memory

    def launch(self, stream=None):
        freed = [what for ref, what in self._memory if ref() is None]
        if freed:
            raise RuntimeError(f"{len(freed)} buffer(s) of this graph went back to the memory "
                               f"pool after the capture (the next allocation may reuse them "
                               f"while the graph writes them), e.g. {freed[0]}")
        _refuse_while_capturing("cupy.cuda.Graph.launch")
        with _one_launch():
            for replay in self._replays:
                replay()
        _launch("cupy.cuda.Graph.launch")


_STREAMS: list = []             # the current stream stack (``with stream:``), per process
_ALL_STREAMS = __import__("weakref").WeakValueDictionary()   # ptr -> every live Stream


class Stream:
    """``cupy.cuda.Stream``: ``with stream:`` makes it current; ``begin_capture`` /
    ``end_capture`` capture what is launched on it into a :class:`Graph`. The null stream
    (``ptr`` 0) cannot capture. As on a GPU a capture changes no buffer that existed before
    it: the stand-in computes while it records, then restores them at ``end_capture``
    (buffers made during the capture keep the values computed, which a GPU leaves
    unwritten until the graph launches)."""

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.ptr = 0 if null else id(self)
        _ALL_STREAMS[self.ptr] = self

    def __enter__(self):
        _STREAMS.append(self)
        return self

    def __exit__(self, *exc):
        _STREAMS.pop()
        return False

    def synchronize(self):
        _sync("cupy.cuda.Stream.synchronize()")

    def is_capturing(self) -> bool:
        capture = _capturing()
        return capture is not None and capture.stream is self

    def begin_capture(self, mode=None):
        if self.ptr == 0:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if _capturing() is not None:
            raise RuntimeError("cudaErrorIllegalState: a capture is already in progress")
        _local.capture = _Capture(self)

    def end_capture(self) -> Graph:
        capture = _capturing()
        if capture is None or capture.stream is not self:
            raise RuntimeError("cudaErrorIllegalState: this stream is not capturing")
        _local.capture = None
        for ref, saved in capture.saved:           # the capture wrote nothing for real
            owner = ref()
            if owner is not None:
                owner[...] = saved
        return Graph(capture)


_NULL_STREAM = Stream(null=True)


def _current_stream() -> Stream:
    return _STREAMS[-1] if _STREAMS else _NULL_STREAM


# nvmath-python's cuBLAS bindings (``nvmath.bindings.cublas``): a handle of one's own, on
# the stream set on it, without CuPy's refusal during capture
_HANDLES: dict = {}             # handle -> the stream set on it (None: the null stream)


def _nvmath_create() -> int:
    handle = len(_HANDLES) + 1
    _HANDLES[handle] = _NULL_STREAM
    return handle


def _nvmath_set_stream(handle: int, stream_ptr: int) -> None:
    stream = _ALL_STREAMS.get(stream_ptr)
    if handle not in _HANDLES or stream is None:
        raise AssertionError(f"cublasSetStream: handle {handle} or stream {stream_ptr:#x} unknown")
    _HANDLES[handle] = stream


def _on_handle_stream(handle: int, routine: str):
    """Run a product as if on the handle's stream (a graph captures it only there)."""
    if handle not in _HANDLES:
        raise AssertionError(f"{routine}: handle {handle} was not made by create()")
    stream = _HANDLES[handle]
    capture = _capturing()
    if capture is not None and stream is not capture.stream:
        raise RuntimeError(f"{routine} at {_caller()}: the handle's stream is not the "
                           "capturing one (cublasSetStream before the capture)")
    return contextlib.nullcontext() if stream is _current_stream() else _within(stream)


@contextlib.contextmanager
def _within(stream):
    with stream:
        yield


def _nvmath_gemm_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb,
                    beta, C, Ctype, ldc, compute_type, algo):
    with _on_handle_stream(handle, "nvmath cublas.gemm_ex"):
        _gemm_raw("nvmath cublas.gemm_ex", transa, transb, m, n, k, alpha, A, Atype, lda, 0,
                  B, Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1, compute_type, algo)


def _nvmath_gemm_strided_batched_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda,
                                    stride_a, B, Btype, ldb, stride_b, beta, C, Ctype, ldc,
                                    stride_c, batch_count, compute_type, algo):
    with _on_handle_stream(handle, "nvmath cublas.gemm_strided_batched_ex"):
        _gemm_raw("nvmath cublas.gemm_strided_batched_ex", transa, transb, m, n, k, alpha, A,
                  Atype, lda, stride_a, B, Btype, ldb, stride_b, beta, C, Ctype, ldc,
                  stride_c, batch_count, compute_type, algo)


class Device:
    """``cupy.cuda.Device``: device 0, the only one."""

    compute_capability = "90"       # what CuPy reports for an H100; nothing here uses it

    def __init__(self, device=None):
        self.id = 0 if device is None else int(device)
        if self.id != 0:
            raise RuntimeError("cudaErrorInvalidDevice: the stand-in has one device")

    def use(self):
        return self

    def synchronize(self):
        _sync("cupy.cuda.Device.synchronize()")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _runtime:
    getDeviceCount = staticmethod(lambda: 1)
    getDevice = staticmethod(lambda: 0)
    runtimeGetVersion = staticmethod(lambda: 0)
    CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF = 0, 1, 2, 14
    driverGetVersion = staticmethod(lambda: 0)

    @staticmethod
    def deviceSynchronize():
        _sync("cupy.cuda.runtime.deviceSynchronize()")

    @staticmethod
    def getDeviceProperties(device):
        return {"name": b"fakecupy NumPy stand-in (no GPU)", "totalGlobalMem": 0}


_curand = types.SimpleNamespace(CURAND_RNG_PSEUDO_DEFAULT=100, CURAND_RNG_PSEUDO_XORWOW=101,
                                CURAND_RNG_PSEUDO_PHILOX4_32_10=161)   # curand.h's values


def _missing(module: str):
    def __getattr__(name):
        raise AttributeError(f"{module}.{name} is not in the NumPy stand-in "
                             "(tests/fakecupy.py); add it there with what it cannot check")
    return __getattr__


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name, f"NumPy stand-in for {name} (tests/fakecupy.py)")
    module.__dict__.update(attrs, __getattr__=_missing(name))
    return module


# the NumPy functions the stand-in's cupy provides (each is in CuPy's cupy/__init__.py)
_NUMPY_NAMES = (
    "abs absolute add all allclose any arange argmax argmin argsort around array_equal "
    "broadcast_to ceil clip concatenate copyto cos count_nonzero cumsum divide dot einsum "
    "empty empty_like equal exp expand_dims expm1 eye floor full full_like greater "
    "greater_equal isclose isfinite isinf isnan less less_equal linspace log log1p "
    "logical_and logical_not logical_or matmul max maximum mean min minimum multiply "
    "negative not_equal ones ones_like outer power prod repeat reshape round sign sin sqrt "
    "square squeeze stack subtract sum take tanh tile transpose true_divide vdot where "
    "zeros zeros_like nonzero flatnonzero argwhere unique argpartition take_along_axis").split()
_PASSED_THROUGH = ("bool_ int8 int16 int32 int64 uint8 uint32 uint64 float16 float32 float64 "
                   "complex64 complex128 dtype finfo iinfo inf nan newaxis pi e "
                   "result_type can_cast").split()

cupy = _module(
    "cupy", __version__="0+fakecupy", ndarray=ndarray, asarray=asarray, array=array,
    ascontiguousarray=ascontiguousarray, asnumpy=asnumpy, get_array_module=get_array_module,
    ElementwiseKernel=ElementwiseKernel, ReductionKernel=ReductionKernel,
    get_default_memory_pool=lambda: _POOL,
    **{n: _function(n) for n in _NUMPY_NAMES}, **{n: getattr(np, n) for n in _PASSED_THROUGH},
    random=_module("cupy.random", RandomState=RandomState,
                   default_rng=lambda seed=None: Generator(seed)),
    linalg=_module("cupy.linalg", norm=lambda x, ord=None, axis=None, keepdims=False: _call(
        np.linalg.norm, (x,), {"ord": ord, "axis": axis, "keepdims": keepdims},
        launch="cupy.linalg.norm")),
    cublas=_module("cupy.cublas", gemm=gemm),
    cuda=_module("cupy.cuda", Device=Device, runtime=_runtime, curand=_curand,
                 cublas=_module("cupy.cuda.cublas", gemmEx=gemmEx,
                                gemmStridedBatchedEx=gemmStridedBatchedEx),
                 get_cublas_handle=lambda: 0,
                 nvrtc=types.SimpleNamespace(getVersion=lambda: (0, 0)),
                 get_current_stream=_current_stream, Stream=Stream, Graph=Graph,
                 using_allocator=using_allocator),
)
_special = _module("cupyx.scipy.special", erf=erf)
_scipy = _module("cupyx.scipy", special=_special)
cupyx = _module("cupyx", allow_synchronize=allow_synchronize,
                DeviceSynchronized=DeviceSynchronized, scatter_add=scatter_add, scipy=_scipy)
_nvmath_cublas = types.ModuleType("nvmath.bindings.cublas", "NumPy stand-in (tests/fakecupy.py)")
_nvmath_cublas.__dict__.update(create=_nvmath_create, set_stream=_nvmath_set_stream,
                               set_workspace=lambda handle, ptr, size: None,
                               destroy=lambda handle: _HANDLES.pop(handle, None),
                               gemm_ex=_nvmath_gemm_ex,
                               gemm_strided_batched_ex=_nvmath_gemm_strided_batched_ex,
                               __getattr__=_missing("nvmath.bindings.cublas"))
_nvmath_bindings = _module("nvmath.bindings", cublas=_nvmath_cublas)
_nvmath = _module("nvmath", bindings=_nvmath_bindings)
MODULES = {"cupy": cupy, "cupy.cublas": cupy.cublas, "cupyx": cupyx, "cupyx.scipy": _scipy, "cupyx.scipy.special": _special,
           "nvmath": _nvmath, "nvmath.bindings": _nvmath_bindings,
           "nvmath.bindings.cublas": _nvmath_cublas}


# ------------------------------------------------------------------ installing it

_ABSENT = object()


@contextlib.contextmanager
def installed():
    """``import cupy`` / ``import cupyx`` give the stand-in inside the block.

    Also resets what :mod:`minibert.backend` caches about CuPy (the passed start-up check,
    the device in force, TF32) and drops ``minibert.gpu_kernels`` (it binds the ``cupy``
    it imported), and puts all of it back afterwards, whatever was there before (a real
    CuPy included). Yields the stand-in ``cupy`` module.
    """
    import minibert
    from minibert import backend
    names = (*MODULES, "minibert.gpu_kernels")
    saved = {n: sys.modules.get(n, _ABSENT) for n in names}
    saved_kernels = minibert.__dict__.get("gpu_kernels", _ABSENT)
    saved_backend = (backend._device, backend._cupy_checked, backend._tf32)
    sys.modules.pop("minibert.gpu_kernels", None)
    minibert.__dict__.pop("gpu_kernels", None)
    sys.modules.update(MODULES)
    backend._device, backend._cupy_checked, backend._tf32 = "cpu", None, False
    try:
        yield cupy
    finally:
        backend._device, backend._cupy_checked, backend._tf32 = saved_backend
        for n, module in saved.items():
            if module is _ABSENT:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = module
        minibert.__dict__.pop("gpu_kernels", None)
        if saved_kernels is not _ABSENT:
            minibert.gpu_kernels = saved_kernels
