"""``mlm+nsp``: masked-LM with BERT's next-sentence prediction (Devlin et al. 2019, section 3.1).

Pairs as google-research/bert ``create_instances_from_document``: B is the rest of A's
chunk (IsNext, label 0) or, for a one-sentence chunk or with probability 0.5, sentences
read from a random place in another document (label 1, as in the reference and Hugging
Face), in which case the chunk's sentences after A are put back to start the next chunk.
The same seed gives the same pairs as the single-module ``minibert.pretraining`` did.

Shape legend: L = one pair's length (<= T = max_seq_length), n = tokens of a segment.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .pairs import SentencePairObjective

if TYPE_CHECKING:
    from ..pretraining.corpus import TokenStore

__all__ = ["NextSentencePrediction", "create_instances_from_document"]


class NextSentencePrediction(SentencePairObjective):
    """BERT's MLM + NSP: label 0 = B follows A in the document, 1 = B is from another one."""

    name = "mlm+nsp"
    sentence_task = "nsp"
    min_documents = 2
    min_documents_reason = ("next-sentence prediction draws its random B sentences from "
                            "another document; separate documents with a blank line")

    def split_chunk(self, chunk, target_seq_length, store, document_index, rng):
        """A = the chunk's first ``a_end`` sentences; B = the rest (label 0) or random (label 1).

        Random B (reference): up to 10 draws of a document other than this one (the last
        draw is kept even if it is this one), a uniform starting sentence in it, and whole
        sentences from there until B reaches ``target_seq_length - len(A)`` tokens or the
        document ends (at least one sentence). Returns (A, B, label, put_back).
        """
        a_end = self.draw_a_end(chunk, rng)
        tokens_a = np.concatenate(chunk[:a_end])                                 # (n_a,)
        if len(chunk) == 1 or rng.random() < 0.5:
            for _ in range(10):
                rand_doc = int(rng.integers(0, store.num_documents))
                if rand_doc != document_index:
                    break
            start = int(rng.integers(0, store.num_sentences_in(rand_doc)))
            tokens_b = store.read_from(rand_doc, start, target_seq_length - len(tokens_a))
            return tokens_a, tokens_b, 1, len(chunk) - a_end
        return tokens_a, np.concatenate(chunk[a_end:]), 0, 0


def create_instances_from_document(store: "TokenStore", document_index: int, max_seq_length: int,
                                   short_seq_prob: float, rng: np.random.Generator, cls_id: int,
                                   sep_id: int) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Unmasked NSP pairs from one document (reference ``create_instances_from_document``).

    Inputs:
        store: the documents (``num_documents >= 2`` for a random B to differ).
        document_index: the document to read A from, in [0, store.num_documents).
        max_seq_length: T >= 5, counting [CLS] and two [SEP].
        short_seq_prob: probability of a short target length.
        rng: the generator every draw comes from.
        cls_id, sep_id: ids of [CLS] and [SEP].
    Returns:
        list of (input_ids (L,) int32, token_type_ids (L,) int8, next_sentence_label),
        L <= max_seq_length; masking is applied separately.
    Raises:
        ValueError: max_seq_length < 5.
    """
    return NextSentencePrediction().document_pairs(store, document_index, max_seq_length,
                                                   short_seq_prob, rng, cls_id, sep_id)
