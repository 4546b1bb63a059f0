"""Line-by-line instances (``--line-by-line``): one corpus line, one sequence.

Hugging Face's ``run_mlm.py --line_by_line``: "distinct lines of text are handled as distinct
sequences". A line of the corpus is a sentence of the token store (one sentence per line,
:mod:`.corpus`); here it becomes ``[CLS] line [SEP]``, cut to ``max_seq_length`` tokens, and
is never packed with another line. BabyBERTa (Huebner et al. 2021) trains on one utterance
per input: its notes find agreement rises above chance only when an input holds no more
than one utterance.

Lines are of very different lengths, so an epoch's lines are put into batches of similar
length (:func:`~minibert.finetuning.data.length_grouped_batches`, transformers'
``group_by_length``), and each batch is padded to its own longest line: a batch is
(B, T_b) with T_b <= max_seq_length. The batch order is drawn from (seed, epoch), so the
batches of an epoch are known from the line lengths alone, before any line is masked, and
an epoch resumes at any batch without replaying the ones before.

Shape legend: N = lines (sentences) of the store, T = max_seq_length, L = a line's
sequence length (<= T).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..finetuning.data import length_grouped_batches
from ..objectives.base import Segment
from .corpus import TokenStore

__all__ = ["LineRows", "line_rows", "line_segment", "line_batch_rows"]


class LineRows(NamedTuple):
    """Every line of a store, in store order (documents, then lines).

    document: (N,) int64, the line's document (an index of the store, or view).
    number: (N,) int64, the line's number in its document (0, 1, ...).
    start: (N,) int64, offset of its first token in ``store.tokens``.
    length: (N,) int64, L = tokens of its sequence: min(line, T - 2) + 2 ([CLS], [SEP]).
    """

    document: np.ndarray
    number: np.ndarray
    start: np.ndarray
    length: np.ndarray


def line_rows(store: TokenStore, max_seq_length: int) -> LineRows:
    """The lines of ``store`` (a few (N,) arrays; no tokens copied).

    Raises:
        ValueError: max_seq_length < 3 (no room for a token between [CLS] and [SEP]).
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
    first, end = store._sentence_bounds()                      # (D,) each, underlying ids
    per_doc = (end - first).astype(np.int64)                   # lines per document
    document = np.repeat(np.arange(len(per_doc), dtype=np.int64), per_doc)     # (N,)
    offsets = np.cumsum(per_doc) - per_doc                     # first row of each document
    number = np.arange(len(document), dtype=np.int64) - np.repeat(offsets, per_doc)
    sentence = np.repeat(first.astype(np.int64), per_doc) + number             # (N,)
    so = np.asarray(store.sentence_offsets)
    start = so[sentence].astype(np.int64)
    length = np.minimum(so[sentence + 1] - start, max_seq_length - 2) + 2
    return LineRows(document, number, start, length.astype(np.int64))


def line_segment(store: TokenStore, rows: LineRows, r: int, cls_id: int, sep_id: int) -> Segment:
    """Row ``r`` as an unmasked :class:`~minibert.objectives.base.Segment`:
    ``[CLS] line[:L - 2] [SEP]``, (L,) int32, token types 0, no label."""
    n = int(rows.length[r]) - 2
    t0 = int(rows.start[r])
    ids = np.empty(n + 2, dtype=np.int32)                      # (L,)
    ids[0], ids[-1] = cls_id, sep_id
    ids[1:-1] = store.tokens[t0:t0 + n]
    return Segment(ids, np.zeros(n + 2, dtype=np.int8), None, int(rows.document[r]))


def line_batch_rows(lengths: np.ndarray, batch_size: int,
                    rng: np.random.Generator | None) -> list[np.ndarray]:
    """The rows of each batch: rows of similar length together
    (:func:`~minibert.finetuning.data.length_grouped_batches`: mega-batches of up to 50
    batches sorted by length), the full batches in an order drawn from ``rng`` (None: in
    store order, for evaluation), the one short batch last. Every row comes exactly once.

    Raises:
        ValueError: batch_size < 1.
    """
    return length_grouped_batches(np.asarray(lengths), batch_size, rng)
