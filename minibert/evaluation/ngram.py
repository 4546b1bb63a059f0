"""Count-based floors a masked LM's grammar is measured against (``python -m minibert
minimal-pairs``): a word trigram with interpolated Kneser-Ney smoothing and an add-k word
unigram (:class:`AddKUnigram`).

Interpolated Kneser-Ney (Kneser & Ney 1995; the interpolated form of Chen & Goodman 1998,
"An Empirical Study of Smoothing Techniques for Language Modeling", eqs. 17-18), one
absolute discount D per order, D = n1 / (n1 + 2 n2) from the counts of counts of that
order (Ney et al. 1994):

    P3(w | u v) = max(c(u v w) - D3, 0) / c(u v .) + D3 N1+(u v .) / c(u v .) P2(w | v)
    P2(w | v)   = max(N1+(. v w) - D2, 0) / N1+(. v .) + D2 N1+(v .) / N1+(. v .) P1(w)
    P1(w)       = max(N1+(. w) - D1, 0) / N1+(. .) + D1 N1+types / N1+(. .) / (|V| + 1)

where c counts trigrams, N1+(. v w) is the number of distinct words seen before ``v w``
(continuation counts), and the last term spreads the unigram level's discounted mass
evenly over the vocabulary and one unknown word, so an unseen word has a small non-zero
probability. A context never seen passes its whole mass to the lower order. Sentences are
padded with two ``<s>`` and end with ``</s>``; words are lower-cased runs of letters and
digits, each other non-space character a word of its own (the BERT basic tokenizer's split
of English text, by one regular expression, ten times faster).

nltk's ``KneserNeyInterpolated`` computes the same kind of estimate but scores one word
in milliseconds by re-scanning its counts; this keeps the few dictionaries the formulas
need, so a corpus of millions of words is counted in seconds.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Sequence

import regex

BOS, EOS = "<s>", "</s>"
_WORD = regex.compile(r"[\p{L}\p{M}\p{N}]+|[^\p{L}\p{M}\p{N}\s]")


def _discount(counts: Iterable[int]) -> float:
    """D = n1 / (n1 + 2 n2) (n_k: how many n-grams occur exactly k times), 0.75 when
    there are no singletons or doubletons."""
    cc = Counter(c for c in counts if c <= 2)
    n1, n2 = cc[1], cc[2]
    return n1 / (n1 + 2 * n2) if n1 and n2 else 0.75


class KneserNeyTrigram:
    """Counts of a corpus and the interpolated Kneser-Ney trigram probability.

    Build with :meth:`fit` on sentences (strings); :meth:`sentence_logprob` gives the
    log-probability (nats) of a sentence, ``</s>`` included.
    """

    def __init__(self, lowercase: bool = True):
        self.lowercase = lowercase

    def words(self, sentence: str) -> list[str]:
        return _WORD.findall(sentence.lower() if self.lowercase else sentence)

    def fit(self, sentences: Iterable[str]) -> "KneserNeyTrigram":
        tri: Counter = Counter()
        for s in sentences:
            w = [BOS, BOS, *self.words(s), EOS]
            tri.update(zip(w, w[1:], w[2:]))
        self.tri = tri
        self.ctx2 = Counter()                       # c(u v .)
        self.ctx2_types = Counter()                 # N1+(u v .)
        bi_cont = Counter()                         # N1+(. v w)
        for (u, v, w), c in tri.items():
            self.ctx2[u, v] += c
            self.ctx2_types[u, v] += 1
            bi_cont[v, w] += 1
        self.bi_cont = bi_cont
        self.mid = Counter()                        # N1+(. v .)
        self.mid_types = Counter()                  # N1+(v .)
        uni_cont = Counter()                        # N1+(. w)
        for (v, w), n in bi_cont.items():
            self.mid[v] += n
            self.mid_types[v] += 1
            uni_cont[w] += 1
        self.uni_cont = uni_cont
        self.uni_total = sum(uni_cont.values())     # N1+(. .)
        self.vocab_size = len(uni_cont)
        self.d3, self.d2 = _discount(tri.values()), _discount(bi_cont.values())
        self.d1 = _discount(uni_cont.values())
        return self

    def _p1(self, w: str) -> float:
        d, total = self.d1, self.uni_total
        return (max(self.uni_cont.get(w, 0) - d, 0) / total
                + d * self.vocab_size / total / (self.vocab_size + 1))

    def _p2(self, v: str, w: str) -> float:
        n = self.mid.get(v, 0)
        if not n:
            return self._p1(w)
        return (max(self.bi_cont.get((v, w), 0) - self.d2, 0) / n
                + self.d2 * self.mid_types[v] / n * self._p1(w))

    def prob(self, u: str, v: str, w: str) -> float:
        """P3(w | u v) of the module docstring."""
        n = self.ctx2.get((u, v), 0)
        if not n:
            return self._p2(v, w)
        return (max(self.tri.get((u, v, w), 0) - self.d3, 0) / n
                + self.d3 * self.ctx2_types[u, v] / n * self._p2(v, w))

    def sentence_logprob(self, sentence: str) -> float:
        """log P(sentence </s>) in nats."""
        w = [BOS, BOS, *self.words(sentence), EOS]
        return math.fsum(math.log(self.prob(a, b, c)) for a, b, c in zip(w, w[1:], w[2:]))

    def score(self, sentences: Sequence[str]) -> list[float]:
        """log P of each sentence (nats), as :meth:`sentence_logprob`."""
        return [self.sentence_logprob(s) for s in sentences]


class AddKUnigram:
    """Word frequencies of a corpus: the floor that knows no order and no context.

    P(w) = (c(w) + k) / (N + k (|V| + 1)), with N the corpus's words (``</s>`` counted
    once per sentence), |V| its word types and one more type for every unseen word (add-k
    or Lidstone smoothing; Chen & Goodman 1998, section 2.1). Words are split as
    :class:`KneserNeyTrigram` splits them. A sentence's log-probability is summed exactly
    (``math.fsum``), so two sentences of the same words in another order tie to the bit,
    and a minimal pair of that kind counts half (:func:`..minimal_pairs.accuracy`).
    """

    def __init__(self, k: float = 0.1, lowercase: bool = True):
        if not k > 0:
            raise ValueError(f"k must be > 0, got {k}")
        self.k, self.lowercase = k, lowercase

    words = KneserNeyTrigram.words

    def fit(self, sentences: Iterable[str]) -> "AddKUnigram":
        counts: Counter = Counter()
        for s in sentences:
            counts.update(self.words(s))
            counts[EOS] += 1
        self.counts, self.total = counts, sum(counts.values())
        self.denominator = self.total + self.k * (len(counts) + 1)
        return self

    def sentence_logprob(self, sentence: str) -> float:
        """log P(sentence </s>) in nats, the words taken as independent."""
        return math.fsum(math.log((self.counts.get(w, 0) + self.k) / self.denominator)
                         for w in [*self.words(sentence), EOS])

    def score(self, sentences: Sequence[str]) -> list[float]:
        """log P of each sentence (nats), as :meth:`sentence_logprob`."""
        return [self.sentence_logprob(s) for s in sentences]


__all__ = ["AddKUnigram", "KneserNeyTrigram"]
