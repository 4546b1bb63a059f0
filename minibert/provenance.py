"""What a result was computed from: content fingerprints of the files a run reads.

A pretraining checkpoint records the fingerprint of its corpus, its vocabulary and the
corpus documents it left out (:func:`data_fingerprint`), and ``train_mlm.py --resume``
compares them with the files as they are now (:func:`check_same_data`), so a run does not
continue on other data without a word. ``evaluate.py`` reuses an earlier fine-tuning run of a start only when the start's
content is the same (:func:`start_fingerprint`), whatever its path.

A file's fingerprint is the SHA-256 of its bytes, read once per process (the result is
kept per path, size, modification time and inode). A file over :data:`FULL_HASH_BYTES`
is not read whole: its size, its modification time and :data:`SAMPLES` chunks of
:data:`SAMPLE_BYTES` at evenly spaced offsets (the first and the last included) are
hashed, so fingerprinting a corpus of any size reads at most 4 MiB of it. A sampled
fingerprint misses an edit between the samples that keeps the size and the mtime.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

FULL_HASH_BYTES = 64 << 20
SAMPLES = 64
SAMPLE_BYTES = 64 << 10
_READ = 1 << 20


class DataChangedError(ValueError):
    """A run resumed on other data than it was trained on, without permission."""


def file_fingerprint(path: str | os.PathLike) -> str:
    """``"sha256:<hex>"`` of the file's bytes, or for a file over :data:`FULL_HASH_BYTES`
    ``"sampled:<hex>"`` of its size, mtime and sampled chunks (see the module docstring).

    Raises:
        OSError: the file cannot be read.
    """
    st = os.stat(path)
    return _fingerprint(str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


@lru_cache(maxsize=256)
def _fingerprint(path: str, size: int, mtime_ns: int, inode: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= FULL_HASH_BYTES:
            while chunk := f.read(_READ):
                h.update(chunk)
            return "sha256:" + h.hexdigest()
        h.update(f"{size}|{mtime_ns}".encode())
        for i in range(SAMPLES):
            f.seek((size - SAMPLE_BYTES) * i // (SAMPLES - 1))
            h.update(f.read(SAMPLE_BYTES))
    return "sampled:" + h.hexdigest()


def files_fingerprint(paths: Iterable[str | os.PathLike]) -> str:
    """One fingerprint of several files in order: the SHA-256 of their
    :func:`file_fingerprint` lines (names are left out, so a moved corpus is the same
    data; a file added, removed or reordered changes it)."""
    lines = "\n".join(file_fingerprint(p) for p in paths)
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def data_fingerprint(corpus_files: Iterable[str | os.PathLike],
                     vocab_file: str | os.PathLike,
                     left_out: Iterable[str] = ()) -> dict[str, str | None]:
    """{"corpus": :func:`files_fingerprint` of the corpus files, "vocab": the vocab file's
    fingerprint, or None while it does not exist (it is learned later)}, and when
    documents were left out of the corpus (``left_out``: their
    :func:`~minibert.pretraining.exclusion.document_digest` names) "excluded": the
    SHA-256 of those names, sorted: what a pretraining checkpoint records under
    ``data``."""
    vocab = Path(vocab_file)
    out = {"corpus": files_fingerprint(corpus_files),
           "vocab": file_fingerprint(vocab) if vocab.is_file() else None}
    if names := sorted(left_out):
        out["excluded"] = "sha256:" + hashlib.sha256("\n".join(names).encode()).hexdigest()
    return out


def check_same_data(recorded: Mapping[str, Any] | None, current: Mapping[str, Any],
                    allow: bool, source: str,
                    keys: Sequence[str] = ("corpus", "vocab")) -> list[str]:
    """Compare the data a checkpoint was trained on with the data now.

    Args:
        recorded: the checkpoint's ``data`` record (None for one written before it).
        current: :func:`data_fingerprint` now.
        allow: continue anyway (``--allow-data-change``); the change is then printed as a
            warning on stderr.
        source: the checkpoint, for messages.
        keys: what to compare: "corpus" and "vocab" when both sides have one (a None is
            not compared); "excluded" always (a missing one: nothing was left out).
    Returns:
        the names of what changed, empty when nothing did.
    Raises:
        DataChangedError: something changed and ``allow`` is False.
    """
    if not recorded:
        return []
    changed = [k for k in keys if recorded.get(k) != current.get(k)
               and (k == "excluded" or (recorded.get(k) and current.get(k)))]
    if not changed:
        return []
    what = " and ".join("excluded documents" if k == "excluded" else k for k in changed)
    detail = "; ".join(f"{k} {str(recorded.get(k))[:19]}... now {str(current.get(k))[:19]}..."
                       for k in changed)
    if not allow:
        raise DataChangedError(f"cannot resume {source}: its {what} changed since the "
                               f"checkpoint was written ({detail}); the run would continue on "
                               "other data. Restore the files, or pass --allow-data-change "
                               "to continue on the new data")
    print(f"warning: resuming {source} on changed {what} (--allow-data-change): {detail}",
          file=sys.stderr)
    return changed


def start_fingerprint(pre) -> str:
    """The content of a starting model (:class:`minibert.runs.Pretrained`): its config,
    tokenizer options, labels, architecture, every tensor (name, dtype, shape, bytes) and
    its vocabulary file's bytes, as ``"sha256:<hex>"``. Two starts with the same content
    at different paths have the same fingerprint; a start replaced at the same path has
    another."""
    h = hashlib.sha256()
    h.update(json.dumps([pre.config.to_dict(), pre.tokenizer_options, pre.labels,
                         pre.architecture], sort_keys=True, default=str).encode())
    for name in sorted(pre.state):
        a = np.ascontiguousarray(pre.state[name])
        h.update(f"\n{name}|{a.dtype.str}|{a.shape}\n".encode())
        h.update(a.data)
    h.update(file_fingerprint(pre.vocab_file).encode())
    return "sha256:" + h.hexdigest()
