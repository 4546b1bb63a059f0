"""``mlm+sop``: masked-LM with ALBERT's sentence-order prediction (Lan et al. 2020, section 3.2).

"As positive examples, two consecutive segments from the same document; as negative
examples, the same two consecutive segments but with their order swapped." The segments
are cut as BERT cuts its chunks (:class:`.pairs.SentencePairObjective`); with probability
0.5 A and B change places (label 1), otherwise they stay in order (label 0), and the
swapped pair is then trimmed like any pair (google-research/albert
``create_instances_from_document`` without ``random_next_sentence``).

Unlike ALBERT's script, which falls back to a random next sentence from another document
when a chunk holds a single sentence, a one-sentence chunk is split inside the sentence, at
a point uniform among its inner token boundaries, so no second document is ever read
(``min_documents`` = 1). A one-token chunk (only possible as the last sentence of a
document) cannot make two non-empty segments and is dropped: its token is not trained on.

Shape legend: n = tokens of a segment.
"""
from __future__ import annotations

import numpy as np

from .pairs import SentencePairObjective

__all__ = ["SentenceOrderPrediction"]


class SentenceOrderPrediction(SentencePairObjective):
    """ALBERT's MLM + SOP: label 0 = the two segments in document order, 1 = swapped."""

    name = "mlm+sop"
    sentence_task = "sop"
    min_documents = 1

    def split_chunk(self, chunk, target_seq_length, store, document_index, rng):
        """Two consecutive segments of the chunk, swapped with probability 0.5.

        A = the chunk's first ``a_end`` sentences and B the rest (``a_end`` uniform in
        [1, len(chunk) - 1]); a one-sentence chunk of n >= 2 tokens is cut after token k,
        k uniform in [1, n - 1]; a one-token chunk gives None. Returns (A, B, label, 0).
        """
        if len(chunk) >= 2:
            a_end = self.draw_a_end(chunk, rng)
            first, second = np.concatenate(chunk[:a_end]), np.concatenate(chunk[a_end:])
        else:
            sentence = chunk[0]
            if len(sentence) < 2:
                return None
            k = int(rng.integers(1, len(sentence)))
            first, second = sentence[:k], sentence[k:]
        if rng.random() < 0.5:
            return second, first, 1, 0
        return first, second, 0, 0
