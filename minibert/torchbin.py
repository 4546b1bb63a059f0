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
constructors and the storage type names. Any other global (``os.system`` ...) raises
:class:`TorchBinError` before anything is called, so a hostile file cannot run code.
The legacy pre-1.6 format (a bare pickle stream, not a zip) is refused.
"""
from __future__ import annotations

import os
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np


class TorchBinError(ValueError):
    """A ``.bin`` file that is not a torch zip state dict of plain tensors."""


# torch.<Name>Storage -> NumPy dtype; bfloat16 has none and is widened to float32.
_STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16", "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class _StorageType:
    def __init__(self, name: str):
        self.name = name


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
    flat = storage
    size, stride = tuple(size), tuple(stride)
    if any(s < 0 for s in stride) or storage_offset < 0:
        raise TorchBinError(f"tensor with negative stride or offset {stride} {storage_offset}")
    if size and 0 not in size:
        last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= flat.size:
            raise TorchBinError(f"tensor of size {size} stride {stride} offset "
                                f"{storage_offset} runs past its storage of {flat.size}")
    view = np.lib.stride_tricks.as_strided(
        flat[storage_offset:], shape=size, strides=[s * flat.itemsize for s in stride])
    return np.array(view)  # a copy: contiguous, owns its memory


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None):
    return data


_ALLOWED = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): OrderedDict,
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, archive: zipfile.ZipFile, prefix: str, byteorder: str,
                 source: str):
        super().__init__(file)
        self._archive, self._prefix, self._byteorder = archive, prefix, byteorder
        self._source = source
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise TorchBinError(
            f"{self._source}: refusing to unpickle the global {module}.{name}; only a state "
            "dict of tensors (OrderedDict, torch._utils._rebuild_tensor_v2, torch.*Storage) "
            "is read")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise TorchBinError(f"{self._source}: unexpected persistent id {pid!r}")
        _, stype, key, _location, numel = pid
        if key not in self._storages:
            member = f"{self._prefix}/data/{key}"
            try:
                raw = self._archive.read(member)
            except KeyError:
                raise TorchBinError(f"{self._source}: storage {member} is missing") from None
            dtype = _STORAGE_DTYPES[stype.name]
            if dtype == "bfloat16":  # the top 16 bits of a float32
                bits = np.frombuffer(raw, dtype=self._byteorder + "u2").astype(np.uint32)
                arr = (bits << 16).view(np.float32)
            else:
                arr = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder(self._byteorder))
                arr = arr.astype(np.dtype(dtype).newbyteorder("="), copy=False)
            if arr.size != numel:
                raise TorchBinError(f"{self._source}: storage {key} holds {arr.size} values, "
                                    f"its header says {numel}")
            self._storages[key] = arr
        return self._storages[key]


def load_torch_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a state dict saved by ``torch.save`` (zip format) as NumPy arrays.

    Args:
        path: a ``pytorch_model.bin`` / ``.pt`` file holding a dict of name -> tensor.
    Returns:
        {name: array}, each a contiguous copy in its stored dtype (bfloat16 -> float32).
    Raises:
        TorchBinError: not a zip archive (the legacy format), no ``data.pkl``, a global
            outside the allowed list, a missing or short storage, or a top-level object that
            is not a dict of arrays.
    """
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise TorchBinError(f"{path}: not a torch zip archive (files saved by torch < 1.6 are "
                            "not supported; re-save it with a current torch)")
    with zipfile.ZipFile(path) as archive:
        pkls = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pkls) != 1:
            raise TorchBinError(f"{path}: expected one <name>/data.pkl, found {pkls}")
        prefix = pkls[0][: -len("/data.pkl")]
        order = "<"
        if f"{prefix}/byteorder" in archive.namelist():
            order = {"little": "<", "big": ">"}.get(
                archive.read(f"{prefix}/byteorder").decode().strip(), "<")
        with archive.open(pkls[0]) as f:
            obj = _Unpickler(f, archive, prefix, order, str(path)).load()
    if not isinstance(obj, dict) or not all(isinstance(v, np.ndarray) for v in obj.values()):
        raise TorchBinError(f"{path}: expected a dict of tensors (a state dict), got "
                            f"{type(obj).__name__}")
    return dict(obj)


__all__ = ["TorchBinError", "load_torch_state_dict"]
