"""Derived files: the record written with every file a job writes and later reads back.

A file a job derives (the token store cached in ``RUN/cache``, the evaluation harness's
``settings.json`` and the ``summary.json`` of each fine-tuning run it reuses) is not trusted
because the project wrote it: a disk, a copy or a hand can damage it afterwards. Each such
file carries a record of its size and SHA-256 (:func:`digest`), written atomically
(:mod:`minibert.atomic`) after the file itself, so that a crash between the two leaves a
file without a record, never a record that vouches for the wrong bytes. Before the file is
read back, :func:`check` compares it with its record; a mismatch is rebuilt where the file
can be rebuilt (the token store: from the corpus and the vocab) and otherwise ends the job
in an ``error:`` line naming the file and what to delete (:class:`DerivedFileError`).

The record sits beside the file as ``NAME.record.json`` (:func:`record_path`), or inside a
manifest the file set already has (the token store's ``store.json``, ``"files"``).
``docs/reliability.md`` ("Files a run leaves behind are verified") lists every record.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

from .atomic import atomic_write_bytes, atomic_write_json

RECORD_SUFFIX = ".record.json"
_CHUNK = 1 << 20


class DerivedFileError(ValueError):
    """A derived file that fails its check and cannot be rebuilt by the job; the message
    names the file, what is wrong and what to delete."""


def digest(path: str | os.PathLike) -> dict[str, Any]:
    """The record of one file: ``{"size": bytes, "sha256": hex digest}``, read in 1 MiB
    chunks.

    Raises:
        OSError: the file cannot be read.
    """
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": h.hexdigest()}


def check(path: str | os.PathLike, record: Mapping[str, Any] | None) -> str | None:
    """What is wrong with the file ``path`` against its ``record`` (:func:`digest`'s
    dict), in words, or None when it matches. Checked in this order: the file is there, is
    not empty when the record says otherwise, has the recorded size (truncated or
    extended), has the recorded SHA-256 (damaged bytes). A record that is not a dict with
    an int size and a str sha256 is itself damaged.

    Returns:
        None, or a phrase such as ``"is missing"``, ``"is empty (1234 bytes recorded)"``,
        ``"holds 100 bytes, 1234 recorded (truncated or extended)"``, ``"does not match
        its recorded SHA-256 (damaged bytes)"``.
    """
    if (not isinstance(record, Mapping) or not isinstance(record.get("size"), int)
            or not isinstance(record.get("sha256"), str)):
        return "has a damaged record (no size and SHA-256 in it)"
    p = Path(path)
    if not p.is_file():
        return "is missing"
    size = p.stat().st_size
    if size != record["size"]:
        if size == 0:
            return f"is empty ({record['size']} bytes recorded)"
        return f"holds {size} bytes, {record['size']} recorded (truncated or extended)"
    try:
        if digest(p)["sha256"] != record["sha256"]:
            return "does not match its recorded SHA-256 (damaged bytes)"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return None


def record_path(path: str | os.PathLike) -> Path:
    """Where the record of ``path`` sits beside it: ``NAME.record.json``."""
    p = Path(path)
    return p.with_name(p.name + RECORD_SUFFIX)


def write_record(path: str | os.PathLike) -> Path:
    """Write the record of the existing file ``path`` beside it (:func:`record_path`),
    atomically. Returns the record's path.

    Raises:
        OSError: ``path`` cannot be read; WriteError: the record cannot be written.
    """
    p = Path(path)
    return atomic_write_json(record_path(p), {"file": p.name, **digest(p)})


def write_with_record(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically with its record beside it: the old record is
    removed first and the new one written last, so no moment leaves a record that vouches
    for other bytes. Returns ``path``.

    Raises:
        WriteError: either file cannot be written.
    """
    p = Path(path)
    record_path(p).unlink(missing_ok=True)
    atomic_write_bytes(p, data)
    write_record(p)
    return p


def check_recorded(path: str | os.PathLike) -> str | None:
    """:func:`check` of ``path`` against the record beside it.

    Returns:
        None when the file matches its record; ``"has no record"`` when there is no
        record (a file written before records, or by a job killed between the file and
        its record: the caller verifies what it can, or rebuilds); else what is wrong
        (a record that cannot be read counts as damaged).
    """
    rec = record_path(path)
    if not rec.is_file():
        return "has no record"
    try:
        record = json.loads(rec.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"has a damaged record ({rec.name} cannot be read)"
    return check(path, record)


def discard(path: str | os.PathLike) -> None:
    """Remove the file ``path`` and its record beside it, when there (a derived file
    about to be rebuilt)."""
    p = Path(path)
    record_path(p).unlink(missing_ok=True)
    p.unlink(missing_ok=True)
