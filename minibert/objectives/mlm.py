"""``mlm``: masked-LM alone on RoBERTa's FULL-SENTENCES inputs (Liu et al. 2019, section 4.2).

"Each input is packed with full sentences sampled contiguously from one or more
documents, such that the total length is at most 512 tokens. Inputs may cross document
boundaries. When we reach the end of one document, we begin sampling sentences from the
next document and add an extra separator token between documents." No sentence-level
task: the model is built with ``seq_relationship_head=False``.

Here a sequence is ``[CLS] s1 s2 ... [SEP]`` holding at most ``max_seq_length - 2``
tokens between [CLS] and the final [SEP], an extra [SEP] (counted in that budget)
wherever one document ends and the next begins, documents taken in the epoch's order.
Sentences are added greedily: one that does not fit closes the sequence and starts the
next. A sentence longer than the whole budget is cut into pieces of the budget, each
filling a sequence of its own, the last one packed like a sentence; no text is lost and
the work is a few NumPy calls per sequence. Segments carry no label and token_type_ids are
all 0. There are no random draws: ``short_seq_prob``, ``seed`` and ``copy`` do not change
the sequences (RoBERTa always trains on full-length inputs), only the epoch's document
order does; the masks still differ per copy / epoch.

Shape legend: L = one sequence's length (<= T = max_seq_length), n = tokens of a sentence.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from .base import Objective, Segment

if TYPE_CHECKING:
    from ..pretraining.corpus import TokenStore

__all__ = ["FullSentencesMLM"]


class FullSentencesMLM(Objective):
    """RoBERTa's MLM-only objective on packed full sentences (no sentence task)."""

    name = "mlm"
    sentence_task = None
    min_documents = 1
    min_seq_length = 3                     # [CLS] t [SEP]

    def segments(self, store: "TokenStore", doc_order: Sequence[int], max_seq_length: int, *,
                 short_seq_prob: float, seed: int, copy: int, cls_id: int,
                 sep_id: int) -> Iterator[Segment]:
        """Pack the documents, in ``doc_order``, into full-sentence sequences.

        ``Segment.document`` is the document of the sequence's first token. See
        :meth:`Objective.segments` for the contract; ``short_seq_prob``, ``seed`` and
        ``copy`` are accepted for it and unused.

        Raises:
            ValueError: max_seq_length < 3.
        """
        self.check_max_seq_length(max_seq_length)
        budget = max_seq_length - 2
        head = np.array([cls_id], dtype=np.int32)
        sep = np.array([sep_id], dtype=np.int32)

        def emit(parts: list[np.ndarray], document: int) -> Segment:
            ids = np.concatenate([head, *parts, sep]).astype(np.int32, copy=False)  # (L,)
            return Segment(ids, np.zeros(len(ids), dtype=np.int8), None, document)

        parts: list[np.ndarray] = []
        used, start_doc = 0, -1
        for d in doc_order:
            d = int(d)
            boundary = bool(parts)                      # the previous document ends mid-sequence
            for sentence in store.document(d):
                extra = 1 if boundary else 0
                if parts and used + extra + len(sentence) > budget:
                    yield emit(parts, start_doc)
                    parts, used, extra = [], 0, 0
                while len(sentence) > budget:           # only with an empty sequence
                    yield emit([sentence[:budget]], d)
                    sentence = sentence[budget:]
                if not parts:
                    start_doc = d
                if extra:
                    parts.append(sep)
                parts.append(sentence)
                used += extra + len(sentence)
                boundary = False
        if parts:
            yield emit(parts, start_doc)
