"""Checks on untrusted model files, made before any of their arrays is allocated.

A model handed to minibert (a Hugging Face directory, a ``.npz`` checkpoint, a
``pytorch_model.bin``) is read as hostile in size as well as in content: every size it
declares is checked against what the rest of the file says and against the memory this
process can still get, from headers alone, before the arrays behind it are read.

* :func:`read_json_object`: a bounded ``config.json`` / ``tokenizer_config.json`` that is a
  JSON object;
* :func:`check_config_fields`: the config's fields have their types and ranges
  (:data:`INT_FIELDS`, :data:`FLOAT_FIELDS`);
* :func:`parameter_count` and :func:`check_model_fits`: the parameters the config implies
  fit in the memory available (:func:`available_memory`);
* :func:`check_weight_bytes`: the bytes a weights file declares fit the config;
* :func:`safetensors_header`: a ``.safetensors`` header checked as the format's
  specification asks (github.com/huggingface/safetensors, "Format");
* :func:`check_npz_members`: every ``.npy`` member of an ``.npz`` has the size its header
  implies;
* :func:`check_state_matches_config`: the weights' shapes are the config's;
* :func:`check_finite`: loaded weights hold no NaN or infinity.

The tokenizer's file is checked where it is read:
:func:`minibert.tokenization.vocab.check_vocab_fits`.

Every error is an :class:`UntrustedFileError` naming the file, the field and what was
expected; the jobs turn it into one ``error:`` line.
"""
from __future__ import annotations

import json
import math
import os
import struct
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

# config.json and tokenizer_config.json of real models are a few KB
JSON_LIMIT_BYTES = 1 << 20
# the safetensors library's own bound on a header (MAX_HEADER_SIZE)
SAFETENSORS_HEADER_LIMIT = 100_000_000
SAFETENSORS_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2,
                        "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8,
                        "U64": 8, "F64": 8}

# integer config fields: (smallest value, largest value or None); sizes are bounded
# together by check_model_fits, the rest here
INT_FIELDS: dict[str, tuple[int, int | None]] = {
    "vocab_size": (1, None), "hidden_size": (1, None), "num_hidden_layers": (1, None),
    "num_attention_heads": (1, None), "intermediate_size": (1, None),
    "max_position_embeddings": (1, None), "type_vocab_size": (1, None),
    "num_labels": (1, None), "pad_token_id": (0, None),
    # ALBERT's: the factorised embedding width, the groups of shared layers
    "embedding_size": (1, None), "num_hidden_groups": (1, None), "inner_group_num": (1, None)}
# float config fields: (low, high, low end open, high end open); None is allowed only for
# the classifier dropouts (then hidden_dropout_prob is used)
FLOAT_FIELDS: dict[str, tuple[float, float, bool, bool]] = {
    "hidden_dropout_prob": (0.0, 1.0, False, True),
    "attention_probs_dropout_prob": (0.0, 1.0, False, True),
    "classifier_dropout": (0.0, 1.0, False, True),
    "classifier_dropout_prob": (0.0, 1.0, False, True),
    "initializer_range": (0.0, math.inf, False, True),
    "layer_norm_eps": (0.0, 1.0, True, True)}
STR_FIELDS = ("hidden_act", "position_embedding_type", "norm_position", "classifier_pooling",
              "model_type")
# what building a model from a file costs: per parameter the file's copy, the model's
# float32 weight and its gradient (allocated with it); per tensor the Python objects
# around its arrays (measured ~600 bytes; a model of 10^6 one-byte layers is Python
# objects, not floats)
BYTES_PER_PARAMETER = 12
BYTES_PER_TENSOR = 2048
# the sizes whose product the parameter count is, named when a model does not fit
SIZE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size",
               "max_position_embeddings", "num_labels")


_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}


class UntrustedFileError(ValueError):
    """A model file that fails a check before loading; the message names the file, the
    field and what was expected."""


def available_memory() -> int | None:
    """Bytes this process can still allocate, or None where the system does not say.

    The smaller of the system's free memory and, under an address-space limit
    (``ulimit -v``, ``RLIMIT_AS``), that limit less the process's current virtual size
    (``VmSize`` of ``/proc/self/status``; 0 where that file is missing). The free memory:
    ``MemAvailable`` of ``/proc/meminfo`` (Linux), else :func:`system_memory`. The
    limit is read where Python has the ``resource`` module (Linux, macOS); Windows has
    none.

    Returns:
        bytes, or None when neither the free memory nor a limit is known (a Windows
        without ``GlobalMemoryStatusEx``, an unusual system): the checks against memory
        are then skipped, and the other checks of a file still run.
    """
    avail = _proc_kb("/proc/meminfo", "MemAvailable:")
    if avail is None:
        avail = system_memory()
    limit = _address_space_limit()
    if limit is not None:
        left = max(0, limit - (_proc_kb("/proc/self/status", "VmSize:") or 0))
        avail = left if avail is None else min(avail, left)
    return avail


def system_memory() -> int | None:
    """The memory the system reports free without ``/proc``: on Windows the available
    physical memory (``GlobalMemoryStatusEx``), elsewhere the physical memory
    (``os.sysconf``: macOS, the BSDs, Linux); None where neither can be asked."""
    if hasattr(os, "sysconf"):
        try:
            pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):   # a name this system does not know
            pass
        else:
            if pages > 0 and size > 0:
                return pages * size
    return _windows_available_memory()


def _windows_available_memory() -> int | None:
    """``ullAvailPhys`` of kernel32's ``GlobalMemoryStatusEx``; None off Windows or when
    the call fails."""
    import ctypes
    windll = getattr(ctypes, "windll", None)
    if windll is None:
        return None

    class MemoryStatusEx(ctypes.Structure):   # MEMORYSTATUSEX (sysinfoapi.h)
        _fields_ = [("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong),
                    ("ullTotalPhys", ctypes.c_ulonglong), ("ullAvailPhys", ctypes.c_ulonglong),
                    ("ullTotalPageFile", ctypes.c_ulonglong),
                    ("ullAvailPageFile", ctypes.c_ulonglong),
                    ("ullTotalVirtual", ctypes.c_ulonglong),
                    ("ullAvailVirtual", ctypes.c_ulonglong),
                    ("ullAvailExtendedVirtual", ctypes.c_ulonglong)]

    status = MemoryStatusEx()
    status.dwLength = ctypes.sizeof(MemoryStatusEx)
    try:
        ok = windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))
    except (AttributeError, OSError):
        return None
    return int(status.ullAvailPhys) if ok else None


def _address_space_limit() -> int | None:
    """The soft ``RLIMIT_AS`` in bytes; None when there is none (unlimited) or no
    ``resource`` module to ask (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    which = getattr(resource, "RLIMIT_AS", None)
    if which is None:
        return None
    try:
        soft, _ = resource.getrlimit(which)
    except (ValueError, OSError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def _proc_kb(path: str, key: str) -> int | None:
    """The bytes of the last ``key N kB`` line of a /proc file, or None when the file
    cannot be read or has no such line."""
    found = None
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                found = int(line.split()[1]) * 1024
    except OSError:
        pass
    return found


def _gb(n: int) -> str:
    return f"{n / 1e9:.3g} GB"


def read_json_object(path: str | os.PathLike, limit: int = JSON_LIMIT_BYTES) -> dict:
    """The JSON object in ``path``, read only when the file is at most ``limit`` bytes.

    Raises:
        UntrustedFileError: a larger file, bytes that are not UTF-8 JSON, or JSON that is
            not an object (a list, a number ...).
        OSError: the file cannot be read.
    """
    path = Path(path)
    size = path.stat().st_size
    if size > limit:
        raise UntrustedFileError(f"{path}: {size:,} bytes, expected a JSON object of at most "
                                 f"{limit:,} bytes")
    try:
        d = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise UntrustedFileError(f"{path}: not valid UTF-8 JSON ({e})") from None
    if not isinstance(d, dict):
        raise UntrustedFileError(f"{path}: expected a JSON object {{...}}, got a JSON "
                                 f"{type(d).__name__}")
    return d


def _check_float(name: str, v: Any, source: str) -> None:
    low, high, low_open, high_open = FLOAT_FIELDS[name]
    if v is None and name.startswith("classifier_dropout"):
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v < low or v > high or (low_open and v == low) or (high_open and v == high):
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise UntrustedFileError(f"{source}: field {name!r} is {v!r}, expected a finite "
                                 f"number in {lo}{low:g}, {high:g}{hi}")


def check_config_fields(d: Mapping[str, Any], source: str) -> None:
    """Check the types and ranges of a model config's fields (those present; a missing
    field takes its default later): :data:`INT_FIELDS` are integers (not booleans) in
    range, :data:`FLOAT_FIELDS` finite numbers in range, :data:`STR_FIELDS` strings,
    ``pad_token_id`` below ``vocab_size``, ``id2label`` an object of integer keys and
    ``architectures`` a list of strings.

    Args:
        d: the config as read (a ``config.json`` or a checkpoint's "config" record).
        source: the file, for messages.
    Raises:
        UntrustedFileError: naming the first field that is wrong and what it should be.
    """
    if not isinstance(d, Mapping):
        raise UntrustedFileError(f"{source}: expected a config object, got "
                                 f"{type(d).__name__}")
    for name, (low, high) in INT_FIELDS.items():
        v = d.get(name)
        if name in d and (isinstance(v, bool) or not isinstance(v, int) or v < low
                          or (high is not None and v > high)):
            raise UntrustedFileError(f"{source}: field {name!r} is {v!r}, expected an "
                                     f"integer >= {low}")
    for name in FLOAT_FIELDS:
        if name in d:
            _check_float(name, d[name], source)
    for name in STR_FIELDS:
        if name in d and not isinstance(d[name], str):
            raise UntrustedFileError(f"{source}: field {name!r} is {d[name]!r}, expected a "
                                     "string")
    if isinstance(d.get("pad_token_id"), int) and d["pad_token_id"] >= d.get("vocab_size", 1):
        raise UntrustedFileError(f"{source}: field 'pad_token_id' is {d['pad_token_id']}, "
                                 f"expected less than vocab_size {d.get('vocab_size')}")
    labels = d.get("id2label")
    if "id2label" in d and not (isinstance(labels, Mapping) and all(
            isinstance(k, (str, int)) and str(k).lstrip("-").isdigit() for k in labels)):
        raise UntrustedFileError(f"{source}: field 'id2label' is {labels!r:.80}, expected an "
                                 "object whose keys are class ids (\"0\", \"1\" ...)")
    archs = d.get("architectures")
    if archs is not None and not (isinstance(archs, list)
                                  and all(isinstance(a, str) for a in archs)):
        raise UntrustedFileError(f"{source}: field 'architectures' is {archs!r:.80}, expected "
                                 "a list of class names")


def _distinct_layers(config) -> int:
    """Encoder layers with parameters of their own: num_hidden_layers, or for ALBERT's
    shared layers (an AlbertConfig) num_hidden_groups x inner_group_num."""
    if hasattr(config, "num_hidden_groups"):
        return int(config.num_hidden_groups) * int(getattr(config, "inner_group_num", 1))
    return int(config.num_hidden_layers)


def parameter_count(config) -> int:
    """The parameters of a :class:`~minibert.modeling.BertForPreTraining` of ``config``
    with a ``num_labels`` classifier beside it: an upper bound on every model minibert
    builds from a config (exact Python integer arithmetic, so absurd sizes do not wrap).

    With V = vocab_size, C = hidden_size, L = the layers with parameters of their own
    (:func:`_distinct_layers`), I = intermediate_size, P = max_position_embeddings (learned
    positions only), S = type_vocab_size, K = num_labels, E = embedding_size (ALBERT; C
    otherwise):
        embeddings (V + P + S) E + 2E, and E C + C to project E to C when E != C;
        per layer 4 (C^2 + C) + 2 C I + I + C + 4C; pooler C^2 + C; MLM head C^2 + 3C + V
        (the decoder weight is tied); NSP 2C + 2; classifier K C + K.
    """
    V, C, L, I = (int(config.vocab_size), int(config.hidden_size), _distinct_layers(config),
                  int(config.intermediate_size))
    E = int(getattr(config, "embedding_size", C))
    P = int(config.max_position_embeddings) if config.position_embedding_type == "absolute" \
        else 0
    S, K = int(config.type_vocab_size), int(config.num_labels)
    layer = 4 * (C * C + C) + 2 * C * I + I + C + 4 * C
    embeddings = (V + P + S) * E + 2 * E + (E * C + C if E != C else 0)
    return (embeddings + L * layer + C * C + C + C * C + 3 * C + V + 2 * C + 2 + K * C + K)


def check_model_fits(config, source: str) -> None:
    """Refuse a config whose model cannot be built in :func:`available_memory`:
    :data:`BYTES_PER_PARAMETER` x :func:`parameter_count` plus :data:`BYTES_PER_TENSOR`
    for each of its 16 tensors per distinct layer and 20 others. Nothing is refused where
    the memory is not known (:func:`available_memory` gives None).

    Raises:
        UntrustedFileError: naming the sizes and the bytes they need.
    """
    params, tensors = parameter_count(config), 16 * _distinct_layers(config) + 20
    need = BYTES_PER_PARAMETER * params + BYTES_PER_TENSOR * tensors
    avail = available_memory()
    if avail is not None and need > avail:
        sizes = ", ".join(f"{k}={getattr(config, k)}" for k in SIZE_FIELDS)
        raise UntrustedFileError(f"{source}: the config's sizes ({sizes}) mean {params:,} "
                                 f"parameters in {tensors:,} tensors, {_gb(need)} to load, "
                                 f"more than the {_gb(avail)} of memory available")


def check_weight_bytes(declared: int, config, path: str | os.PathLike,
                       bytes_per_parameter: int = 8) -> None:
    """Refuse a weights file whose arrays declare more bytes than its config's model could
    fill, or than the memory available, before any of them is read.

    The bound is ``bytes_per_parameter`` x (:func:`parameter_count` + an untied decoder
    V x C + the P position ids) + 1 MiB: 8 for a Hugging Face file (float64 at most), more
    for a checkpoint that also holds the optimizer's moments.

    Args:
        declared: the bytes the file's headers give for all its arrays.
    Raises:
        UntrustedFileError: naming the file, the bytes and the bound.
    """
    V, C, P = config.vocab_size, config.hidden_size, config.max_position_embeddings
    bound = bytes_per_parameter * (parameter_count(config) + V * C + P) + (1 << 20)
    if declared > bound:
        raise UntrustedFileError(f"{path}: its arrays declare {declared:,} bytes, more than "
                                 f"a model of its config holds ({bound:,} bytes at most)")
    avail = available_memory()
    if avail is not None and declared > avail:
        raise UntrustedFileError(f"{path}: its arrays declare {_gb(declared)}, more than the "
                                 f"{_gb(avail)} of memory available")


def safetensors_header(path: str | os.PathLike) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Read and check the header of a ``.safetensors`` file (its tensors are not read).

    The format: an 8-byte little-endian header length N, N bytes of a UTF-8 JSON object
    (name -> {"dtype", "shape", "data_offsets": [begin, end]}, and an optional
    "__metadata__" of strings), then the byte buffer. Checked: N at most the file's
    remaining bytes and :data:`SAFETENSORS_HEADER_LIMIT`; every dtype known, every shape
    a list of non-negative integers; ``end - begin`` = elements x item size; the tensors,
    in offset order, tile the buffer from 0 to its end without gap or overlap (the
    library's ``validate``).

    Returns:
        {name: (dtype, shape)} in file order.
    Raises:
        UntrustedFileError: naming the file, the tensor or field, and what was expected.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise UntrustedFileError(f"{path}: {size} bytes, too short for a safetensors "
                                     "header length (8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, SAFETENSORS_HEADER_LIMIT):
            raise UntrustedFileError(f"{path}: header length {n:,} bytes, expected at most "
                                     f"{min(size - 8, SAFETENSORS_HEADER_LIMIT):,} (the file "
                                     f"has {size:,} bytes)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise UntrustedFileError(f"{path}: header is not UTF-8 JSON ({e})") from None
    if not isinstance(header, dict):
        raise UntrustedFileError(f"{path}: header is a JSON {type(header).__name__}, expected "
                                 "an object")
    header.pop("__metadata__", None)
    out, spans = {}, []
    for name, entry in header.items():
        dtype, shape, span = _safetensors_entry(path, name, entry)
        out[name] = (dtype, shape)
        spans.append((span, name))
    return _check_tiling(path, out, spans, size - 8 - n)


def _safetensors_entry(path: Path, name: str, entry: Any):
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise UntrustedFileError(f"{where}: expected an object with dtype, shape and "
                                 f"data_offsets, got {entry!r:.80}")
    dtype, shape, span = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in SAFETENSORS_ITEMSIZE:
        raise UntrustedFileError(f"{where}: dtype {dtype!r:.40}, expected one of "
                                 f"{sorted(SAFETENSORS_ITEMSIZE)}")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool)
                                            and d >= 0 for d in shape)):
        raise UntrustedFileError(f"{where}: shape {shape!r:.80}, expected a list of "
                                 "non-negative integers")
    if not (isinstance(span, list) and len(span) == 2 and all(
            isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in span)
            and span[0] <= span[1]):
        raise UntrustedFileError(f"{where}: data_offsets {span!r:.80}, expected [begin, end] "
                                 "with 0 <= begin <= end")
    need = math.prod(shape) * SAFETENSORS_ITEMSIZE[dtype]
    if span[1] - span[0] != need:
        raise UntrustedFileError(f"{where}: data_offsets {span} hold {span[1] - span[0]:,} "
                                 f"bytes, its shape {shape} of {dtype} needs {need:,}")
    return dtype, tuple(shape), tuple(span)


def _check_tiling(path: Path, out: dict, spans: list, buffer: int) -> dict:
    end = 0
    for (begin, stop), name in sorted(spans):
        if begin != end:
            raise UntrustedFileError(f"{path}: tensor {name!r} starts at byte {begin:,} of the "
                                     f"data, expected {end:,} (tensors must tile the data "
                                     "without gap or overlap)")
        end = stop
    if end != buffer:
        raise UntrustedFileError(f"{path}: the tensors end at byte {end:,} of the data, the "
                                 f"file holds {buffer:,} bytes of data")
    return out


def safetensors_bytes(header: Mapping[str, tuple[str, tuple[int, ...]]]) -> int:
    """The bytes the tensors of a checked header (:func:`safetensors_header`) hold."""
    return sum(math.prod(shape) * SAFETENSORS_ITEMSIZE[dtype]
               for dtype, shape in header.values())


def check_npz_members(path: str | os.PathLike) -> int:
    """Check every member of an ``.npz`` archive from its headers: an ``.npy`` file whose
    declared size is its header plus elements x item size of the shape and dtype that
    header gives (no object arrays), and whose sizes together fit in the memory available.
    Reads only the archive's directory and each member's first bytes.

    Returns:
        the bytes all members declare.
    Raises:
        UntrustedFileError: naming the file, the member and the sizes.
        zipfile.BadZipFile, OSError: not a zip archive, or unreadable.
    """
    path = Path(path)
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        total = sum(i.file_size for i in infos)
        avail = available_memory()
        if avail is not None and total > avail:
            raise UntrustedFileError(f"{path}: its members declare {_gb(total)}, more than the "
                                     f"{_gb(avail)} of memory available")
        for info in infos:
            with z.open(info) as f:
                try:
                    read_header = _NPY_HEADERS.get(np.lib.format.read_magic(f))
                    if read_header is None:
                        raise ValueError("a .npy format version other than 1.0 or 2.0")
                    shape, _, dtype = read_header(f)
                except ValueError as e:
                    raise UntrustedFileError(f"{path}: member {info.filename}: not a .npy "
                                             f"array ({e})") from None
                header = f.tell()
            if dtype.hasobject:
                raise UntrustedFileError(f"{path}: member {info.filename}: object array, "
                                         "expected numbers")
            need = header + math.prod(shape) * dtype.itemsize
            if info.file_size != need:
                raise UntrustedFileError(f"{path}: member {info.filename}: declares "
                                         f"{info.file_size:,} bytes, its header (shape "
                                         f"{shape}, {dtype}) needs {need:,}")
    return total


def check_state_matches_config(state: Mapping[str, np.ndarray], config, source: str) -> None:
    """Refuse weights whose shapes contradict the config before a model is built from it:
    the embedding tables (vocab_size, max_position_embeddings, type_vocab_size rows of
    hidden_size, ALBERT's embedding_size) and the first layer's feed-forward weight
    (intermediate_size x hidden_size), where the state has them (names ``bert.*``,
    ``albert.*`` or bare ``embeddings.*`` / ``encoder.*``). Those pin every size a model's memory grows with but the layer count,
    which :func:`check_model_fits` bounds; the other tensors, and extra or missing layers,
    are checked when loaded (:func:`minibert.hf.load_pretrained_weights`).

    Raises:
        UntrustedFileError: naming the tensor, its shape and the config's.
    """
    C = config.hidden_size
    E = getattr(config, "embedding_size", C)
    ffn = ("encoder.albert_layer_groups.0.albert_layers.0.ffn.weight"
           if hasattr(config, "num_hidden_groups") else "encoder.layer.0.intermediate.dense.weight")
    want = {"embeddings.word_embeddings.weight": (config.vocab_size, E),
            "embeddings.token_type_embeddings.weight": (config.type_vocab_size, E),
            ffn: (config.intermediate_size, C)}
    if config.position_embedding_type == "absolute":
        want["embeddings.position_embeddings.weight"] = (config.max_position_embeddings, E)
    prefix = next((p for p in ("bert.", "albert.", "electra.")
                   if any(k.startswith(p) for k in state)), "")
    for name, shape in want.items():
        got = state.get(prefix + name)
        if got is not None and tuple(got.shape) != shape:
            raise UntrustedFileError(f"{source}: tensor {prefix + name} has shape "
                                     f"{tuple(got.shape)}, the config says {shape} "
                                     "(vocab_size, hidden_size ... disagree with the weights)")


def check_finite(state: Mapping[str, np.ndarray], source: str) -> None:
    """Refuse weights holding NaN or infinity (a model trained from them would be NaN).

    Args:
        state: name -> array; only floating-point arrays are checked.
    Raises:
        UntrustedFileError: naming the file, the first such tensor and how many values.
    """
    for name, a in state.items():
        if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            raise UntrustedFileError(f"{source}: tensor {name} holds {bad} non-finite "
                                     f"value(s) (NaN or inf) of {a.size}; expected finite "
                                     "weights")
