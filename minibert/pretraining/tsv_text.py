"""The text of a fine-tuning TSV as a pretraining corpus (continued pretraining on a task's
own unlabelled text, Gururangan et al. 2020, "Don't Stop Pretraining", section 4: task-adaptive
pretraining on the task's training text).

A ``.tsv`` given to ``train_mlm.py --corpus`` is read by the fine-tuning reader
(:func:`minibert.finetuning.data.read_tsv`: a ``label<TAB>sentence`` or
``label<TAB>sentence_a<TAB>sentence_b`` header, one example a row) and each row becomes one
document: its sentence, or its two sentences for a pair, each as one line of a text corpus
(no sentence splitting inside a row). The label column is never read into the corpus: the
model sees the same text a fine-tuning run would, without its answers.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from .errors import CorpusError
from .exclusion import DocumentExclusion

TSV_SUFFIX = ".tsv"


def tsv_documents(path: str | os.PathLike, progress=None,
                  exclude: DocumentExclusion | None = None) -> Iterator[list[str]]:
    """The documents of a fine-tuning TSV, in row order: one list per row holding its
    stripped text column(s) (``[sentence]`` or ``[sentence_a, sentence_b]``), as
    :func:`~minibert.pretraining.corpus.iter_documents` yields those of a text file.

    Args:
        path: the ``.tsv`` file.
        progress: optional tqdm bar counting bytes; advanced by the file's size once read.
        exclude: documents to leave out (:class:`~.exclusion.DocumentExclusion`; a row's
            name is the digest of its text lines, as for a text file), or None.
    Yields:
        list[str]: the non-empty sentences of one row.
    Raises:
        CorpusError: what the fine-tuning reader refuses (a missing file, another header,
            a row with a missing column or an empty field, a line that is not UTF-8, no
            rows), with its ``path:line:`` message.
    """
    from ..finetuning.data import DatasetError, read_tsv
    path = Path(path)
    try:
        examples = read_tsv(path)
    except DatasetError as e:
        raise CorpusError(f"corpus file {e}") from None
    if progress is not None:
        progress.update(path.stat().st_size)
    for e in examples:
        doc = [t.strip() for t in (e.text_a, e.text_b) if t is not None and t.strip()]
        if doc and (exclude is None or exclude.keep(doc)):
            yield doc
