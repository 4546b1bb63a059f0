"""Reading and writing the standard BERT ``vocab.txt`` (one token per line, id = line number).

The Chinese BERT vocabulary holds tokens that are U+2028 (LINE SEPARATOR) and ``##`` +
U+2028, so the file is split on ``\\n`` only: ``str.splitlines()`` would cut those tokens
in two and ``str.strip()`` would empty them. Like transformers' ``load_vocab``, the file is
opened in text mode with universal newlines, so ``\\r\\n`` files read the same as ``\\n``
files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable

__all__ = ["load_vocab", "read_vocab_tokens", "write_vocab"]


def read_vocab_tokens(vocab_file: str | os.PathLike) -> list[str]:
    """Read ``vocab_file`` into the list of its tokens, in file order.

    Raises:
        FileNotFoundError: the file does not exist (the message names it).
        ValueError: the file holds no token.
    """
    path = Path(vocab_file)
    if not path.is_file():
        raise FileNotFoundError(f"vocab file not found: {str(path)!r} (expected a vocab.txt, one token per line)")
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    if text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise ValueError(f"vocab file {str(path)!r} is empty: expected at least one token per line, got 0")
    return text.split("\n")


def load_vocab(vocab_file: str | os.PathLike) -> dict[str, int]:
    """Read ``vocab_file`` into a dict token -> id (id = 0-based line number).

    A token listed twice keeps the id of its last line, as transformers' ``load_vocab``
    does. Raises as :func:`read_vocab_tokens`.
    """
    return {tok: i for i, tok in enumerate(read_vocab_tokens(vocab_file))}


def write_vocab(tokens: Iterable[str], path: str | os.PathLike) -> Path:
    """Write ``tokens`` one per line to ``path`` atomically (temp file + ``os.replace``).

    Raises:
        ValueError: a token contains ``\\n`` or ``\\r`` (it could not be read back).
    Returns:
        the path written.
    """
    path = Path(path)
    tokens = list(tokens)
    for i, tok in enumerate(tokens):
        if "\n" in tok or "\r" in tok:
            raise ValueError(f"vocab token {i} ({tok!r}) contains a line break; cannot write it to {str(path)!r}")
    parent = path.parent if str(path.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for tok in tokens:
                f.write(tok)
                f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
