"""Read a ``pytorch_model.bin`` state dict into NumPy arrays without torch, and without
running the code a pickle may carry.

``torch.save`` (torch >= 1.6, the zip format; see torch/serialization.py ``_save``) writes a
zip archive ``<name>/data.pkl`` + ``<name>/data/<key>`` + ``<name>/byteorder``:

* ``data.pkl`` is a pickle of the state dict (an ``OrderedDict`` of tensors). Each tensor is
  the call ``torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
  requires_grad, backward_hooks[, metadata])``; a ``Parameter`` wraps one in
  ``torch._utils._rebuild_parameter(data, requires_grad, backward_hooks)``.
* ``storage`` is a persistent id ``("storage", torch.<Dtype>Storage, key, location, numel)``
  whose bytes are the archive member ``<name>/data/<key>``, in the order named by
  ``byteorder`` (little-endian when absent).

:func:`load_torch_state_dict` unpickles with a closed list of globals: those three
constructors and the storage type names, each handed out as a fresh stand-in object, so
the pickle can neither reach other code (``os.system`` ... raises :class:`TorchBinError`
before anything is called) nor alter the stand-ins for later loads. Tensors are bounded by
their storage. The legacy pre-1.6 format (a bare pickle stream, not a zip) is refused.

Sizes are checked before anything is inflated, so a small file whose members would inflate
to gigabytes is refused from its zip directory: ``data.pkl`` may declare at most
:data:`PICKLE_LIMIT` bytes, the storages together no more than the memory available, and
each storage member exactly the bytes its persistent id's element count needs.
"""
from __future__ import annotations

import os
import pickle
import struct
import zipfile
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .untrusted import available_memory

# what a damaged archive or pickle raises on the way (a bad CRC or header, a compression
# method zipfile lacks, an opcode out of place or a truncated stream)
_DAMAGED = (zipfile.BadZipFile, zlib.error, NotImplementedError, pickle.UnpicklingError,
            EOFError, TypeError, AttributeError, ValueError, KeyError, IndexError,
            OverflowError, RecursionError, struct.error)
# a state dict's pickle holds ~100 bytes per tensor; BERT-large's is ~40 KB
PICKLE_LIMIT = 64 << 20


class TorchBinError(ValueError):
    """A ``.bin`` file that is not a torch zip state dict of plain tensors."""


# torch.<Name>Storage -> NumPy dtype; bfloat16 has none and is widened to float32.
_STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16", "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class _ReadOnly:
    """Base of the stand-ins the unpickler hands out: a pickle BUILD cannot set anything on
    them, so it cannot change what they do for later loads."""

    __slots__ = ()

    def __setattr__(self, name, value):
        raise TorchBinError(f"the pickle tries to set {name!r} on {type(self).__name__}")


class _StorageType(_ReadOnly):
    """A stand-in for ``torch.<Name>Storage``."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        object.__setattr__(self, "name", name)


def _rebuild_tensor_v2(flat, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
    # flat: the storage, a 1-D array from _Unpickler.persistent_load
    if not isinstance(flat, np.ndarray):
        raise TorchBinError(f"tensor built from {type(flat).__name__}, not a storage")
    size, stride = tuple(int(n) for n in size), tuple(int(s) for s in stride)
    if (len(size) != len(stride) or any(n < 0 for n in size) or any(s < 0 for s in stride)
            or storage_offset < 0):
        raise TorchBinError(f"tensor with bad size {size}, stride {stride} or offset "
                            f"{storage_offset}")
    count = int(np.prod(size, dtype=np.int64))
    if count > flat.size:  # views of a state dict never hold more than their storage
        raise TorchBinError(f"tensor of size {size} has more elements than its storage "
                            f"({flat.size})")
    if count:
        last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= flat.size:
            raise TorchBinError(f"tensor of size {size} stride {stride} offset "
                                f"{storage_offset} runs past its storage of {flat.size}")
        view = np.lib.stride_tricks.as_strided(
            flat[storage_offset:], shape=size, strides=[s * flat.itemsize for s in stride])
        return np.array(view)  # a copy: contiguous, owns its memory
    return np.zeros(size, dtype=flat.dtype)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None):
    return data


class _Global(_ReadOnly):
    """A stand-in for an allowed global, fresh per lookup, that calls the function."""

    __slots__ = ("_fn",)

    def __init__(self, fn):
        object.__setattr__(self, "_fn", fn)

    def __call__(self, *args):
        return self._fn(*args)


_ALLOWED = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): OrderedDict,
}


class _Unpickler(pickle.Unpickler):
    """Unpickles ``data.pkl`` against the closed list of globals; its errors do not name
    the file (:func:`load_torch_state_dict` adds it)."""

    def __init__(self, file, archive: zipfile.ZipFile, prefix: str, byteorder: str):
        super().__init__(file)
        self._archive, self._prefix, self._byteorder = archive, prefix, byteorder
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return _Global(_ALLOWED[(module, name)])
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise TorchBinError(
            f"refusing to unpickle the global {module}.{name}; only a state "
            "dict of tensors (OrderedDict, torch._utils._rebuild_tensor_v2, torch.*Storage) "
            "is read")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise TorchBinError(f"unexpected persistent id {pid!r}")
        _, stype, key, _location, numel = pid
        if key not in self._storages:
            member = f"{self._prefix}/data/{key}"
            try:
                info = self._archive.getinfo(member)
            except KeyError:
                raise TorchBinError(f"storage {member} is missing") from None
            dtype = _STORAGE_DTYPES[stype.name]
            width = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
            if info.file_size % width:
                raise TorchBinError(f"storage {member} has {info.file_size} bytes, "
                                    f"not a multiple of its item size {width}")
            if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0 \
                    or info.file_size != numel * width:
                raise TorchBinError(f"storage {member} declares {info.file_size:,} bytes, "
                                    f"its tensor's storage needs {numel!r:.40} x {width} "
                                    "bytes")
            raw = self._archive.read(member)
            if dtype == "bfloat16":  # the top 16 bits of a float32
                bits = np.frombuffer(raw, dtype=self._byteorder + "u2").astype(np.uint32)
                arr = (bits << 16).view(np.float32)
            else:
                arr = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder(self._byteorder))
                arr = arr.astype(np.dtype(dtype).newbyteorder("="), copy=False)
            self._storages[key] = arr
        return self._storages[key]


def load_torch_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a state dict saved by ``torch.save`` (zip format) as NumPy arrays.

    Args:
        path: a ``pytorch_model.bin`` / ``.pt`` file holding a dict of name -> tensor.
    Returns:
        {name: array}, each a contiguous copy in its stored dtype (bfloat16 -> float32).
    Raises:
        TorchBinError: not a zip archive (the legacy format, or a damaged file), no
            ``data.pkl``, a global outside the allowed list, a missing or malformed storage,
            a tensor that does not fit its storage, or a top-level object that is not a dict
            of arrays.
    """
    path = Path(path)
    with _open_archive(path) as archive:
        pkls = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pkls) != 1:
            raise TorchBinError(f"{path}: expected one <name>/data.pkl, found {pkls}")
        prefix = pkls[0][: -len("/data.pkl")]
        _check_member_sizes(path, archive, pkls[0], prefix)
        try:
            order = "<"
            if f"{prefix}/byteorder" in archive.namelist():
                order = {"little": "<", "big": ">"}.get(
                    archive.read(f"{prefix}/byteorder").decode().strip(), "<")
            with archive.open(pkls[0]) as f:
                obj = _Unpickler(f, archive, prefix, order).load()
        except TorchBinError as e:
            raise TorchBinError(f"{path}: {e}") from e
        except _DAMAGED as e:
            raise TorchBinError(f"{path}: damaged or unexpected contents ({e})") from e
    if not isinstance(obj, dict) or not all(isinstance(v, np.ndarray) for v in obj.values()):
        raise TorchBinError(f"{path}: expected a dict of tensors (a state dict), got "
                            f"{type(obj).__name__}")
    return dict(obj)


def _check_member_sizes(path: Path, archive: zipfile.ZipFile, pkl: str, prefix: str) -> None:
    """Refuse, from the zip directory alone, a pickle over :data:`PICKLE_LIMIT`, a
    byteorder entry over 16 bytes and storages that together exceed the memory available."""
    size = archive.getinfo(pkl).file_size
    if size > PICKLE_LIMIT:
        raise TorchBinError(f"{path}: {pkl} declares {size:,} bytes, expected at most "
                            f"{PICKLE_LIMIT:,} for a state dict's pickle")
    if f"{prefix}/byteorder" in archive.namelist() and \
            archive.getinfo(f"{prefix}/byteorder").file_size > 16:
        raise TorchBinError(f"{path}: {prefix}/byteorder declares more than 16 bytes")
    total, avail = _storage_bytes(archive), available_memory()
    if avail is not None and total > avail:
        raise TorchBinError(f"{path}: its storages declare {total:,} bytes, more than the "
                            f"{avail:,} bytes of memory available")


def _storage_bytes(archive: zipfile.ZipFile) -> int:
    return sum(i.file_size for i in archive.infolist()
               if i.filename.partition("/")[2].startswith("data/"))


def declared_storage_bytes(path: str | os.PathLike) -> int:
    """The bytes the storage members (``<name>/data/<key>``) of a torch zip archive
    declare, from its directory (nothing is inflated).

    Raises:
        TorchBinError: not a zip archive. OSError: unreadable.
    """
    with _open_archive(path) as archive:
        return _storage_bytes(archive)


def _open_archive(path: str | os.PathLike) -> zipfile.ZipFile:
    """The zip archive at ``path``; TorchBinError naming it when it is not a zip (a bare
    pickle of torch < 1.6, a truncated file) or its directory is damaged (a member name
    that is not the UTF-8 it is flagged as ...)."""
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            head = f.read(2)
        if head[:1] == b"\x80":  # a bare pickle stream: torch.save before 1.6
            raise TorchBinError(f"{path}: saved in the format of torch < 1.6, which is not "
                                "supported; re-save it with a current torch")
        raise TorchBinError(f"{path}: not a torch zip archive (truncated or not a torch file?)")
    try:
        return zipfile.ZipFile(path)
    except _DAMAGED as e:
        raise TorchBinError(f"{path}: damaged zip archive ({e})") from e


__all__ = ["PICKLE_LIMIT", "TorchBinError", "declared_storage_bytes", "load_torch_state_dict"]
