"""Reading UTF-8 text files whose bad bytes are reported by file, line and column.

Every text file minibert reads (corpora, vocabularies, datasets, document lists) is UTF-8,
and a file that is not should stop the job with one line that says where to look:

    data/train.tsv:4: not valid UTF-8 (byte 0xff at column 12: invalid start byte)

Lines are counted from 1 and end at ``\\n`` (as a binary file iterates them; a caller that
wants ``\\r`` to end a line too turns line ends into ``\\n`` first, which is safe on UTF-8
bytes: neither byte occurs inside a multi-byte character). Columns are 1-based byte offsets
within the line. This module needs the standard library only, so any layer can use it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["decode_utf8", "utf8_lines"]

BOM = "\ufeff"


def decode_utf8(data: bytes, where: str | os.PathLike, *, first_line: int = 1,
                error: type[Exception] = ValueError) -> str:
    """``data`` decoded as UTF-8, or an error that names the line and column of the first
    bad byte.

    Args:
        data: the bytes of a whole file, or of consecutive lines of it.
        where: the file, for the message.
        first_line: the line number (from 1) of the first line in ``data``.
        error: the exception class to raise (the caller's own, e.g. ``DatasetError``).
    Returns:
        the text, line ends and a byte-order mark kept.
    Raises:
        error: ``"{where}:{line}: not valid UTF-8 (byte 0x.. at column C: reason)"``.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise error(f"{where}:{line}: not valid UTF-8 (byte 0x{data[e.start]:02x} at column "
                    f"{column}: {e.reason})") from None


def utf8_lines(path: str | os.PathLike, *, error: type[Exception] = ValueError,
               on_bytes: Callable[[int], object] | None = None) -> Iterator[tuple[int, str]]:
    """The lines of a UTF-8 file, read one at a time, as (line number from 1, text without
    its line end; on line 1 without a byte-order mark).

    Args:
        path: the file (its existence is the caller's to check, with its own message).
        error: the exception class for a line that is not UTF-8 (see :func:`decode_utf8`).
        on_bytes: called with the byte length of each line as it is read (a progress bar's
            ``update``), or None.
    Raises:
        error: a line that is not UTF-8, naming the file, line and column.
        OSError: the file cannot be opened.
    """
    with open(Path(path), "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if on_bytes is not None:
                on_bytes(len(raw))
            text = decode_utf8(raw, path, first_line=lineno, error=error).rstrip("\r\n")
            yield lineno, (text.removeprefix(BOM) if lineno == 1 else text)
