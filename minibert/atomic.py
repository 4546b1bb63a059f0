"""Atomic file writes: the one way minibert writes a file.

A file is written to a temporary name in its own directory, flushed and fsync-ed, given
the permissions a plain ``open(path, "w")`` would give (0666 less the umask; ``mkstemp``
alone gives 0600, which hides a model from other users), then renamed over the target.
A crash or a kill at any moment leaves either the old file or the new one, never a torn
one; what it can leave is a ``*.tmp`` file, which :func:`remove_stale_tmp` clears (only
the owner of the directory does, :func:`minibert.runs.lock_run_dir`). A write that fails
(disk full, read-only file system, permission) raises :class:`WriteError` naming the
target, which is then as it was before.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

TMP_SUFFIX = ".tmp"


class WriteError(OSError):
    """A file could not be written; ``filename`` is the target path, which is left as it
    was (the old file, or no file); ``errno`` / ``strerror`` are the system's."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable) -> Path:
    """Call ``write(binary_file)`` on a temporary file beside ``path``, then rename it to
    ``path`` (parent directories are created). Returns the final path.

    Raises:
        WriteError: the directory cannot be created or the file written (any OSError on
            the way: disk full, read-only, permission); the temporary file is removed and
            ``path`` is left as it was.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=TMP_SUFFIX, dir=path.parent)
    except OSError as e:
        raise WriteError(e.errno, e.strerror or str(e), str(path)) from e
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            Path(tmp).unlink(missing_ok=True)
        except OSError:  # left for the directory's owner to clear (remove_stale_tmp)
            pass
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            raise WriteError(e.errno, e.strerror or str(e), str(path)) from e
        raise
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """:func:`atomic_write` of ``data``."""
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """:func:`atomic_write` of ``obj`` as indented UTF-8 JSON (non-ASCII kept as is)."""
    data = json.dumps(obj, indent=2, ensure_ascii=False).encode("utf-8")
    return atomic_write_bytes(path, data + b"\n")


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Copy the file ``src`` to ``dst`` atomically; nothing is done when both name the
    same file. Returns ``dst``.

    Raises:
        OSError: ``src`` cannot be read; WriteError: ``dst`` cannot be written.
    """
    src, dst = Path(src), Path(dst)
    if dst.exists() and src.resolve() == dst.resolve():
        return dst
    return atomic_write_bytes(dst, src.read_bytes())


def remove_stale_tmp(directory: str | os.PathLike) -> list[Path]:
    """Delete the ``*.tmp`` files a killed :func:`atomic_write` left in ``directory`` (not
    recursive). Returns the paths removed."""
    removed = []
    for p in Path(directory).glob("*" + TMP_SUFFIX):
        if p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed
