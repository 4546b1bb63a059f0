"""Reading and writing the standard BERT ``vocab.txt`` (one token per line, id = line number).

The Chinese BERT vocabulary holds tokens that are U+2028 (LINE SEPARATOR) and ``##`` +
U+2028, so the file is split on ``\\n`` only: ``str.splitlines()`` would cut those tokens
in two and ``str.strip()`` would empty them. Like transformers' ``load_vocab`` (which
opens the file in text mode with universal newlines), ``\\r\\n`` and ``\\r`` line ends
read the same as ``\\n``.

Unlike transformers' ``load_vocab``, a token on two lines is an error: the token -> id
dict would keep one of the ids, and the ids of the lines after it would no longer count
the tokens (a model sized by the dict then meets ids it has no row for).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Sequence

from ..atomic import atomic_write_bytes
from ..textfiles import decode_utf8
from ..untrusted import UntrustedFileError

__all__ = ["SPECIAL_TOKENS", "VOCAB_LINE_BYTES", "VocabError", "check_vocab_fits", "check_writable", "load_vocab",
           "read_vocab_tokens", "write_vocab"]

# The special tokens of a vocabulary we train, in id order (ids 0-4). Google's English and
# Chinese vocabularies hold the same five at ids 0, 100, 101, 102, 103.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

_SHOWN_DUPLICATES = 5  # duplicated tokens named in one error message

# the longest WordPiece token is 100 characters (BasicTokenizer's max_input_chars_per_word),
# at most 4 UTF-8 bytes each, with "##" and a line end: a bound on bytes per vocab line
VOCAB_LINE_BYTES = 406


class VocabError(ValueError):
    """A vocabulary that cannot be used: an empty file, bytes that are not UTF-8, or a
    token on more than one line."""


def _and_join(numbers: Sequence[int]) -> str:
    """[3] -> "3"; [3, 7] -> "3 and 7"; [3, 7, 9] -> "3, 7 and 9"."""
    text = [str(n) for n in numbers]
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " and " + text[-1]


def _check_distinct(tokens: Sequence[str], where: str) -> None:
    """Raise :class:`VocabError` if a token of ``tokens`` is on two lines, naming the first
    few such tokens (in order of their first line) and all their 1-based line numbers."""
    lines: dict[str, list[int]] = defaultdict(list)
    for i, tok in enumerate(tokens):
        lines[tok].append(i + 1)
    dups = [(tok, nums) for tok, nums in lines.items() if len(nums) > 1]  # dict order = first line
    if not dups:
        return
    parts = [f"duplicate token {tok!r} on lines {_and_join(nums)}" for tok, nums in dups[:_SHOWN_DUPLICATES]]
    if len(dups) > _SHOWN_DUPLICATES:
        parts.append(f"and {len(dups) - _SHOWN_DUPLICATES} more duplicated tokens")
    raise VocabError(f"{where}: {'; '.join(parts)} (each token must have one line; its id is its line number - 1)")


def read_vocab_tokens(vocab_file: str | os.PathLike) -> list[str]:
    """Read ``vocab_file`` into the list of its tokens, in file order (index = id).

    Raises:
        FileNotFoundError: the file does not exist (the message names it).
        IsADirectoryError: the path is a directory.
        VocabError (a ``ValueError``): the file holds no token, is not UTF-8 (the message
            gives the line), or has a token on two lines (the message gives the token and
            its 1-based line numbers).
    """
    path = Path(vocab_file)
    where = f"vocab file {str(path)!r}"
    if path.is_dir():
        raise IsADirectoryError(f"{where} is a directory; expected a vocab.txt file, one token per line")
    if not path.is_file():
        raise FileNotFoundError(f"{where} not found (expected a vocab.txt, one token per line)")
    # \r\n and \r end a line as \n does (Python's universal newlines), on the bytes: neither
    # byte occurs inside a multi-byte UTF-8 character, and a bad byte's line is then counted right
    data = path.read_bytes().replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    text = decode_utf8(data, path, error=VocabError)
    if text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise VocabError(f"{where} is empty: expected at least one token per line, got 0")
    tokens = text.split("\n")
    _check_distinct(tokens, where)
    return tokens


def check_vocab_fits(vocab_file: str | os.PathLike, vocab_size: int, source: str) -> list[str]:
    """The tokens of an untrusted ``vocab_file``, checked to fit a model of ``vocab_size``
    embedding rows: the file is read only when at most ``vocab_size`` x
    :data:`VOCAB_LINE_BYTES` bytes, and may not hold more tokens than rows (a token id
    without a row would index past the embedding).

    Args:
        vocab_file: the file. vocab_size: the rows of the model's word embedding.
        source: where vocab_size comes from (the config file), for messages.
    Returns:
        the tokens in id order (as :func:`read_vocab_tokens`).
    Raises:
        UntrustedFileError: too large, or more tokens than ``vocab_size``
            (:mod:`minibert.untrusted`).
        VocabError: not UTF-8, empty, or a token on two lines (:func:`read_vocab_tokens`).
    """
    size = Path(vocab_file).stat().st_size
    if size > vocab_size * VOCAB_LINE_BYTES:
        raise UntrustedFileError(f"{vocab_file}: {size:,} bytes, more than {vocab_size} tokens "
                                 f"(vocab_size in {source}) can take")
    tokens = read_vocab_tokens(vocab_file)
    if len(tokens) > vocab_size:
        raise UntrustedFileError(f"{vocab_file}: {len(tokens)} tokens, more than the "
                                 f"vocab_size {vocab_size} of {source} (the model has no "
                                 "embedding row for the rest)")
    return tokens


def load_vocab(vocab_file: str | os.PathLike) -> dict[str, int]:
    """Read ``vocab_file`` into a dict token -> id (id = 0-based line number).

    Raises as :func:`read_vocab_tokens` (a token on two lines is a :class:`VocabError`).
    """
    return {tok: i for i, tok in enumerate(read_vocab_tokens(vocab_file))}


def check_writable(path: str | os.PathLike) -> None:
    """Raise ``OSError`` now if a file could not be created at ``path`` later (for a long
    job that writes at the end); missing parent directories count as creatable.

    Raises:
        IsADirectoryError: ``path`` is a directory.
        NotADirectoryError: the nearest existing ancestor of ``path`` is not a directory.
        PermissionError: that ancestor is not writable.
    """
    path = Path(path)
    if path.is_dir():
        example = str(path / "vocab.txt")
        raise IsADirectoryError(f"{str(path)!r} is a directory; name the file to write, e.g. {example!r}")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(f"cannot create {str(path)!r}: {str(parent)!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot create {str(path)!r}: directory {str(parent)!r} is not writable")


def write_vocab(tokens: Iterable[str], path: str | os.PathLike) -> Path:
    """Write ``tokens`` one per line (UTF-8, ``\\n``) to ``path`` atomically.

    The file is written by :func:`minibert.atomic.atomic_write_bytes` (temporary file
    beside ``path``, then a rename), so a reader never sees half a vocabulary; missing
    parent directories are created.

    Raises:
        VocabError: a token contains ``\\n`` or ``\\r``, or appears twice (either way the
            file could not be read back with the same ids); nothing is written.
        OSError: ``path`` cannot be written (e.g. it is a directory).
    Returns:
        the path written.
    """
    path = Path(path)
    tokens = list(tokens)
    where = f"cannot write vocab file {str(path)!r}"
    for i, tok in enumerate(tokens):
        if "\n" in tok or "\r" in tok:
            raise VocabError(f"{where}: token {i} ({tok!r}) contains a line break")
    _check_distinct(tokens, where)
    data = "".join(tok + "\n" for tok in tokens).encode("utf-8")
    return atomic_write_bytes(path, data)
