"""The error of the pretraining data: one class, below both the corpus reader
(:mod:`.corpus`) and the document exclusion lists (:mod:`.exclusion`), which raise it and
which the corpus reader uses, so that neither imports the other to share it."""
from __future__ import annotations

__all__ = ["CorpusError"]


class CorpusError(ValueError):
    """The pretraining corpus (or a saved token store, or a list of documents to leave out)
    cannot be used; the message says why and where."""
