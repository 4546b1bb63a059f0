"""Documents a pretraining corpus leaves out, so that no sentence a model is evaluated on
downstream was ever pretrained on (``train_mlm.py --exclude-documents``).

The corpus format (one sentence per line, a blank line between documents) gives documents
no ids, so a document is named by its content: :func:`document_digest`, the SHA-256 of its
sentences as :func:`~minibert.pretraining.corpus.iter_documents` yields them (stripped,
non-blank lines) joined by ``"\\n"``, in UTF-8. The name survives a moved, renamed or
concatenated corpus file, and a listed document that the corpus does not hold is simply
not found.

A list file (UTF-8): one document per line, ``DIGEST<TAB>NAME`` (64 lower-case hex
digits; the name, e.g. ``brown ca10``, is for the messages); blank lines and lines that
start with ``#`` are skipped. ``data/tag/en/brown_pos/pretrain_exclude.tsv`` lists the
Brown documents of the POS dev and test splits (``data/README.md``).
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..textfiles import utf8_lines
from .errors import CorpusError

NONE = "none"   # --exclude-documents none: leave nothing out
SHOWN = 40      # the log line names at most this many of the documents left out
_DIGEST = re.compile(r"[0-9a-f]{64}")


def document_digest(sentences: Sequence[str]) -> str:
    """The name of a document: SHA-256 hex (64 characters) of ``"\\n".join(sentences)``
    in UTF-8, ``sentences`` as :func:`~minibert.pretraining.corpus.iter_documents`
    yields them."""
    return hashlib.sha256("\n".join(sentences).encode("utf-8", "surrogatepass")).hexdigest()


def read_document_list(path: str | os.PathLike) -> dict[str, str]:
    """One list file (see the module docstring): {digest: name} in file order.

    Raises:
        CorpusError: a missing file, a line that is not UTF-8, or a line that does not
            start with a 64-hex-digit digest (``path:line: ...``).
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"--exclude-documents {path}: no such file")
    out: dict[str, str] = {}
    for lineno, text in utf8_lines(path, error=CorpusError):
        text = text.strip().lstrip("\ufeff")
        if not text or text.startswith("#"):
            continue
        digest, _, name = text.partition("\t")
        if not _DIGEST.fullmatch(digest):
            raise CorpusError(f"{path}:{lineno}: expected 'SHA256<TAB>NAME' with 64 "
                              f"lower-case hex digits, got {text[:80]!r}")
        out[digest] = name.strip() or digest[:12]
    return out


@dataclass
class DocumentExclusion:
    """The documents a run leaves out, and those it found and left out.

    Fields:
        listed: {digest: name} of every list file, in order.
        files: the list files read (empty: nothing is left out).
        left_out: {digest: sentences} of the corpus documents that :meth:`keep` refused,
            in corpus order (filled while the corpus is read, or from a cached store). Every
            copy of a listed document is left out; a document the corpus holds more than
            once counts once here, as the corpus is read more than once per run.
    """

    listed: dict[str, str]
    files: list[str]
    left_out: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(cls, paths: Sequence[str | os.PathLike] | None) -> "DocumentExclusion":
        """The exclusion of ``--exclude-documents``: list files, or ``["none"]`` / None /
        ``[]`` for none. Raises CorpusError as :func:`read_document_list`, or for
        ``none`` beside a file."""
        paths = [str(p) for p in paths or ()]
        if NONE in paths:
            if len(paths) > 1:
                raise CorpusError("--exclude-documents: 'none' leaves nothing out; give it "
                                  "alone or give list files only")
            paths = []
        listed: dict[str, str] = {}
        for p in paths:
            listed.update(read_document_list(p))
        return cls(listed, paths)

    def keep(self, sentences: Sequence[str]) -> bool:
        """False (and the document noted in :attr:`left_out`) when it is listed."""
        if not self.listed:
            return True
        digest = document_digest(sentences)
        if digest in self.listed:
            self.left_out[digest] = len(sentences)
            return False
        return True

    @property
    def key(self) -> str:
        """What a token-store cache depends on: the listed digests (order-free)."""
        return hashlib.sha256("\n".join(sorted(self.listed)).encode()).hexdigest()

    def describe(self) -> str:
        """The log line: what was left out, from which lists ("" without lists)."""
        if not self.files:
            return ""
        where = ", ".join(self.files)
        if not self.left_out:
            return (f"corpus: left out no document (none of the {len(self.listed)} listed "
                    f"in {where} is in it)")
        names = ", ".join(self.listed[d] for d in list(self.left_out)[:SHOWN])
        if len(self.left_out) > SHOWN:
            names += f" and {len(self.left_out) - SHOWN} more (summary.json names them all)"
        return (f"corpus: left out {len(self.left_out)} of the {len(self.listed)} documents "
                f"listed in {where} ({sum(self.left_out.values()):,} sentences; "
                f"--exclude-documents none keeps them): {names}")

    def record(self) -> dict:
        """``summary.json``'s ``excluded_documents``: the list files, how many were
        listed, and the names and sentences of those left out."""
        return {"files": list(self.files), "listed": len(self.listed),
                "left_out": [{"name": self.listed[d], "sha256": d, "sentences": n}
                             for d, n in self.left_out.items()]}


__all__ = ["NONE", "document_digest", "read_document_list", "DocumentExclusion"]
