"""Sentence-pair objectives: BERT's chunking of a document into ``[CLS] A [SEP] B [SEP]``.

Next-sentence prediction (:mod:`.nsp`) and sentence-order prediction (:mod:`.sop`) cut a
document the same way (google-research/bert ``create_instances_from_document``, kept by
google-research/albert): whole sentences are gathered into a chunk until it reaches a
target length, the chunk is split into A and B, and the pair is trimmed to fit. They differ
only in how a chunk becomes a labelled pair (:meth:`SentencePairObjective.split_chunk`).

Shape legend: L = one pair's length (<= T = max_seq_length), n = tokens of a segment.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from .base import Objective, Segment, segment_rng

if TYPE_CHECKING:
    from ..pretraining.corpus import TokenStore

__all__ = ["SentencePairObjective", "truncate_seq_pair", "pack_pair"]


def truncate_seq_pair(len_a: int, len_b: int, max_num_tokens: int,
                      rng: np.random.Generator) -> tuple[int, int, int, int]:
    """Trim a pair to ``max_num_tokens`` tokens in total (reference ``truncate_seq_pair``).

    The reference removes one token at a time from the longer of the two (B when they tie),
    from the front or the back by a fair coin. Which side loses each token is fixed by the
    lengths: the longer side loses ``|len_a - len_b|`` tokens until the two are equal, then
    the sides alternate, B first. Only the coins are random, so all ``k`` of them are drawn
    in one ``rng.random(k)`` (the same values, and the same generator state afterwards, as
    ``k`` calls of ``rng.random()``) and the front removals of each side are counted with
    array operations: O(1) NumPy calls, whatever the lengths.

    Inputs:
        len_a, len_b: segment lengths in tokens (>= 0).
        max_num_tokens: the most tokens A and B may keep together (>= 0).
        rng: the generator the coins come from; no draw when nothing is removed.
    Returns:
        (a_start, a_end, b_start, b_end): keep ``a[a_start:a_end]`` and ``b[b_start:b_end]``.
    """
    k = len_a + len_b - max_num_tokens                    # tokens to remove
    if k <= 0:
        return 0, len_a, 0, len_b
    front = rng.random(k) < 0.5                           # (k,) coin of removal j: front?
    first = min(abs(len_a - len_b), k)                    # removals before the lengths meet
    # Removals first + j (after the lengths meet) take from B when j is even, A when odd.
    rest = front[first:]
    cut_a, cut_b = len(rest) // 2, len(rest) - len(rest) // 2
    front_a, front_b = int(np.count_nonzero(rest[1::2])), int(np.count_nonzero(rest[0::2]))
    head = int(np.count_nonzero(front[:first]))           # front removals of the longer side
    if len_a > len_b:
        cut_a, front_a = cut_a + first, front_a + head
    else:
        cut_b, front_b = cut_b + first, front_b + head
    return front_a, len_a - (cut_a - front_a), front_b, len_b - (cut_b - front_b)


def pack_pair(tokens_a: np.ndarray, tokens_b: np.ndarray, max_num_tokens: int,
              rng: np.random.Generator, cls_id: int, sep_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Trim a pair with :func:`truncate_seq_pair` and lay it out as ``[CLS] A [SEP] B [SEP]``.

    Inputs:
        tokens_a: (n_a,) int ids; tokens_b: (n_b,) int ids.
        max_num_tokens: the most tokens A and B keep together (max_seq_length - 3).
    Returns:
        input_ids (L,) int32 and token_type_ids (L,) int8 (0 up to the first [SEP], 1 after),
        L = min(n_a + n_b, max_num_tokens) + 3.
    """
    a0, a1, b0, b1 = truncate_seq_pair(len(tokens_a), len(tokens_b), max_num_tokens, rng)
    la, lb = a1 - a0, b1 - b0
    ids = np.empty(la + lb + 3, dtype=np.int32)                              # (L,)
    ids[0] = cls_id
    ids[1 : 1 + la] = tokens_a[a0:a1]
    ids[1 + la] = sep_id
    ids[2 + la : 2 + la + lb] = tokens_b[b0:b1]
    ids[-1] = sep_id
    types = np.zeros(len(ids), dtype=np.int8)                                # (L,)
    types[la + 2 :] = 1
    return ids, types


class SentencePairObjective(Objective):
    """Cuts each document into chunks of whole sentences and each chunk into a labelled pair.

    Per document (reference ``create_instances_from_document``): the target length is
    ``max_seq_length - 3``, or with probability ``short_seq_prob`` uniform in
    [2, max_seq_length - 3], drawn once per document. Sentences are added to a chunk until it
    reaches the target or the document ends; :meth:`split_chunk` turns the chunk into
    (A, B, label) and may put sentences back to start the next chunk; the pair is trimmed to
    ``max_seq_length - 3`` tokens. The draws for document ``d`` come from
    ``segment_rng(seed, copy, d)``, so they do not depend on the other documents.
    """

    min_seq_length = 5                     # [CLS] a [SEP] b [SEP]
    sentence_task: str

    @abc.abstractmethod
    def split_chunk(self, chunk: list[np.ndarray], target_seq_length: int, store: "TokenStore",
                    document_index: int, rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray, int, int] | None:
        """Turn a chunk of sentences into a labelled pair.

        Inputs:
            chunk: the chunk's sentences, each a (n,) int32 array; at least one.
            target_seq_length: the document's target length (tokens of A and B).
            store, document_index: where the chunk comes from (for draws from elsewhere).
            rng: the document's generator.
        Returns:
            (tokens_a, tokens_b, label, put_back): the two segments, the sentence label, and
            how many of the chunk's last sentences go back to start the next chunk; or None
            when the chunk cannot make a pair (it is then dropped).
        """

    @staticmethod
    def draw_a_end(chunk: list[np.ndarray], rng: np.random.Generator) -> int:
        """How many of the chunk's sentences go to A: uniform in [1, len(chunk) - 1], or 1
        for a one-sentence chunk (no draw), as in the reference."""
        return int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1

    def document_pairs(self, store: "TokenStore", document_index: int, max_seq_length: int,
                       short_seq_prob: float, rng: np.random.Generator, cls_id: int,
                       sep_id: int) -> list[tuple[np.ndarray, np.ndarray, int]]:
        """The unmasked pairs of one document, every draw from ``rng``.

        Returns:
            list of (input_ids (L,) int32, token_type_ids (L,) int8, label), L <= max_seq_length.
        Raises:
            ValueError: max_seq_length < 5.
        """
        self.check_max_seq_length(max_seq_length)
        document = store.document(document_index)
        max_num_tokens = max_seq_length - 3
        target_seq_length = max_num_tokens
        if rng.random() < short_seq_prob:
            target_seq_length = int(rng.integers(2, max_num_tokens + 1))
        out = []
        chunk: list[np.ndarray] = []
        chunk_len = 0
        i = 0
        while i < len(document):
            chunk.append(document[i])
            chunk_len += len(document[i])
            if i == len(document) - 1 or chunk_len >= target_seq_length:
                pair = self.split_chunk(chunk, target_seq_length, store, document_index, rng)
                if pair is not None:
                    tokens_a, tokens_b, label, put_back = pair
                    i -= put_back
                    ids, types = pack_pair(tokens_a, tokens_b, max_num_tokens, rng, cls_id, sep_id)
                    out.append((ids, types, label))
                chunk = []
                chunk_len = 0
            i += 1
        return out

    def segments(self, store: "TokenStore", doc_order: Sequence[int], max_seq_length: int, *,
                 short_seq_prob: float, seed: int, copy: int, cls_id: int,
                 sep_id: int) -> Iterator[Segment]:
        """The pairs of each document in ``doc_order`` (see :meth:`Objective.segments`)."""
        self.check_max_seq_length(max_seq_length)
        for d in doc_order:
            d = int(d)
            pairs = self.document_pairs(store, d, max_seq_length, short_seq_prob,
                                        segment_rng(seed, copy, d), cls_id, sep_id)
            for ids, types, label in pairs:
                yield Segment(ids, types, label, d)
