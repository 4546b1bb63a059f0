"""MLM corruption, shared by every objective (Devlin et al. 2019, section 3.1, "Task #1").

google-research/bert ``create_masked_lm_predictions``: about ``masked_lm_prob`` of a
sequence's tokens are chosen to be predicted; each chosen token becomes [MASK] (80%), a
random token (10%) or stays itself (10%). That replacement rule is two options,
``mask_replace_prob`` and ``random_replace_prob`` (transformers'
``DataCollatorForLanguageModeling`` names; :func:`check_replacement`): BabyBERTa
(Huebner et al. 2021) never leaves a chosen token as itself (1.0 / 0.0). Masking rates up
to 0.4 work as well or better for large models (Wettig et al. 2023, "Should You Mask 15%
in Masked Language Modeling?"); size ``max_predictions_per_seq`` with
:func:`default_max_predictions` so the cap does not silently lower the rate.

The unit of masking is a token, a whole word (``whole_word_mask``), or ALBERT's n-gram of
up to ``max_ngram`` whole words (Lan et al. 2020, section 4.1; google-research/albert
``create_pretraining_data.py``): :func:`choose_word_spans` picks the spans.

Shape legend: L = one sequence's length, P' = its number of predictions, V = vocabulary size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Mapping

import numpy as np

from ..tokenization.vocab import SPECIAL_TOKENS

__all__ = ["VocabInfo", "check_probability", "check_replacement", "choose_word_spans",
           "create_masked_lm_predictions", "default_max_predictions", "keep_share",
           "ngram_probabilities"]


def check_probability(name: str, p: float) -> None:
    """Raises ValueError unless ``p`` is a number in [0, 1] (the message names ``name``)."""
    if not 0.0 <= p <= 1.0:  # also refuses nan
        raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")


def check_replacement(mask_replace_prob: float, random_replace_prob: float) -> None:
    """Raises ValueError unless both are probabilities whose sum is at most 1 (the rest of
    the chosen tokens stay themselves). The sum is taken on the numbers as written
    (shortest decimal form), so 0.9 + 0.1 is exactly 1."""
    check_probability("mask_replace_prob", mask_replace_prob)
    check_probability("random_replace_prob", random_replace_prob)
    if Fraction(repr(float(mask_replace_prob))) + Fraction(repr(float(random_replace_prob))) > 1:
        raise ValueError(f"mask_replace_prob + random_replace_prob must be at most 1, got "
                         f"{mask_replace_prob:g} + {random_replace_prob:g}")


@lru_cache(maxsize=64)   # once per rule, not once per sequence
def keep_share(mask_replace_prob: float, random_replace_prob: float) -> float:
    """The share of the chosen tokens *not* replaced by [MASK] that stay themselves:
    keep / (1 - mask) with keep = 1 - mask - random, computed exactly on the numbers as
    written and rounded once, so google-research/bert's 0.8 / 0.1 gives exactly 0.5 (its
    ``rng.random() < 0.5``; in floating point (1 - 0.8 - 0.1) / (1 - 0.8) is 0.4999...).
    0 when mask_replace_prob is 1 (nothing is left to share). Raises as
    :func:`check_replacement`."""
    check_replacement(mask_replace_prob, random_replace_prob)
    m, r = Fraction(repr(float(mask_replace_prob))), Fraction(repr(float(random_replace_prob)))
    return 0.0 if m == 1 else float((1 - m - r) / (1 - m))


def default_max_predictions(max_seq_length: int, masked_lm_prob: float) -> int:
    """Prediction slots per sequence that never cap ``masked_lm_prob``: ceil(T * p), at least 1.

    ``create_masked_lm_predictions`` predicts ``round(L * p)`` tokens of a length-L sequence,
    which is at most ``ceil(T * p)`` for L <= T (T = 128, p = 0.15 gives 20, the reference's
    setting; p = 0.4 gives 52). A tolerance of 1e-9 keeps float error (100 * 0.07 =
    7.000000000000001) from adding a slot.

    Raises:
        ValueError: max_seq_length < 1 or masked_lm_prob outside [0, 1].
    """
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
    check_probability("masked_lm_prob", masked_lm_prob)
    return max(1, math.ceil(max_seq_length * masked_lm_prob - 1e-9))


@dataclass(frozen=True)
class VocabInfo:
    """What instance creation needs to know about the vocabulary.

    Fields:
        vocab_size: V (largest id + 1).
        pad_id, unk_id, cls_id, sep_id, mask_id: ids of the special tokens.
        is_continuation: (V,) bool, True for ``##`` pieces (whole-word masking).
        random_ids: (R,) int64, the ids the 10% "random token" replacement draws from.
    """

    vocab_size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: np.ndarray
    random_ids: np.ndarray

    @classmethod
    def from_vocab(cls, vocab: Mapping[str, int], exclude_special_from_random: bool = True) -> "VocabInfo":
        """Build from a token -> id mapping holding [PAD], [UNK], [CLS], [SEP] and [MASK].

        The reference draws the random replacement from the whole vocabulary. By default
        we leave out the five special tokens: a [CLS] or [SEP] dropped mid-sequence looks
        like a segment boundary, a [PAD] is a token the model never otherwise attends to,
        and a random [MASK] would quietly raise the [MASK] share above 80%. These tokens
        are a handful out of tens of thousands, so the distribution barely changes.

        Raises:
            ValueError: a special token is missing.
        """
        missing = [t for t in SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise ValueError(f"vocabulary lacks special token(s) {missing}")
        V = max(vocab.values()) + 1
        is_cont = np.zeros(V, dtype=bool)
        present = np.zeros(V, dtype=bool)
        for tok, i in vocab.items():
            present[i] = True
            if tok.startswith("##") and len(tok) > 2:
                is_cont[i] = True
        allowed = present.copy()
        if exclude_special_from_random:
            for t in SPECIAL_TOKENS:
                allowed[vocab[t]] = False
        return cls(
            vocab_size=int(V),
            pad_id=int(vocab["[PAD]"]),
            unk_id=int(vocab["[UNK]"]),
            cls_id=int(vocab["[CLS]"]),
            sep_id=int(vocab["[SEP]"]),
            mask_id=int(vocab["[MASK]"]),
            is_continuation=is_cont,
            random_ids=np.flatnonzero(allowed).astype(np.int64),
        )

    @classmethod
    def from_tokenizer(cls, tokenizer, exclude_special_from_random: bool = True) -> "VocabInfo":
        """Build from a tokenizer's ``vocab`` dict (see ``from_vocab``)."""
        return cls.from_vocab(tokenizer.vocab, exclude_special_from_random)


def ngram_probabilities(max_ngram: int) -> np.ndarray:
    """ALBERT's span-length distribution p(n) = (1/n) / sum_k (1/k), n = 1..max_ngram
    (Lan et al. 2020, section 4.1: 6/11, 3/11, 2/11 for max_ngram 3). Returns
    (max_ngram,) float64. Raises ValueError for max_ngram < 1."""
    if max_ngram < 1:
        raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
    p = 1.0 / np.arange(1, max_ngram + 1)
    return p / p.sum()


def choose_word_spans(input_ids: np.ndarray, vocab: VocabInfo, num_to_predict: int,
                      max_ngram: int, rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """Spans of whole words to mask, at most ``num_to_predict`` tokens in all.

    A word is a candidate token (not [CLS], [SEP] or [PAD]) with the ``##`` pieces right
    after it. Words are visited in random order, each as the first word of a span of n
    words, n drawn with :func:`ngram_probabilities` among the lengths that fit before the
    sequence end or a special token (so no span crosses [SEP]); a span that would overshoot
    the budget is shortened until it fits or skipped, and one that overlaps a chosen span
    is skipped (google-research/albert ``create_masked_lm_predictions``; there the spans may
    cross [SEP]). With ``max_ngram`` 1 this is BERT's whole-word masking, draw for draw.

    Inputs:
        input_ids: (L,) integer ids.
        num_to_predict: the budget, in tokens.
        max_ngram: the longest span, in words (>= 1).
        rng: the generator: one permutation of the words, then (max_ngram > 1) one
            uniform per word.
    Returns:
        [(start, stop, n)]: token positions [start, stop) of each span and its n words,
        in the order chosen.
    Raises:
        ValueError: max_ngram < 1.
    """
    cum = np.cumsum(ngram_probabilities(max_ngram))
    ids = np.asarray(input_ids)
    cand = np.flatnonzero((ids != vocab.cls_id) & (ids != vocab.sep_id) & (ids != vocab.pad_id))
    if not len(cand):
        return []
    # A candidate starts a new word unless it is a ## piece directly after another candidate.
    joins = vocab.is_continuation[ids[cand]]
    joins[0] = False
    joins[1:] &= np.diff(cand) == 1
    starts = cand[~joins]                                 # first position of each word
    stops = np.append(cand[np.flatnonzero(~joins)[1:] - 1], cand[-1]) + 1   # one past each
    W = len(starts)
    # run[w]: words from w on that follow each other with no special token between (<= max)
    follows = np.append(starts[1:] == stops[:-1], False)
    run = np.ones(W, dtype=np.int64)
    for w in range(W - 2, -1, -1):
        run[w] = min(max_ngram, run[w + 1] + 1) if follows[w] else 1
    order = rng.permutation(W).tolist()
    u = rng.random(W) if max_ngram > 1 else np.zeros(W)
    taken = np.zeros(W, dtype=bool)
    spans, count = [], 0
    for w in order:
        if count >= num_to_predict:
            break
        avail = int(run[w])
        n = int(np.searchsorted(cum[:avail] / cum[avail - 1], u[w], side="right")) + 1
        while n > 1 and count + stops[w + n - 1] - starts[w] > num_to_predict:
            n -= 1                                       # shorten to fit the budget
        size = int(stops[w + n - 1] - starts[w])
        if count + size > num_to_predict or taken[w:w + n].any():
            continue                                     # overshoots, or overlaps a span
        taken[w:w + n] = True
        count += size
        spans.append((int(starts[w]), int(stops[w + n - 1]), n))
    return spans


def create_masked_lm_predictions(
    input_ids: np.ndarray,
    vocab: VocabInfo,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    rng: np.random.Generator,
    whole_word_mask: bool = False,
    max_ngram: int = 1,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Choose MLM positions and corrupt them (reference ``create_masked_lm_predictions``).

    ``num_to_predict = min(max_predictions_per_seq, max(1, round(L * masked_lm_prob)))``
    (Python's ``round``, L counts [CLS] and [SEP]). Candidates are all positions except
    [CLS] and [SEP] (and [PAD], should one be present), taken in random order. With
    ``whole_word_mask`` a ``##`` piece belongs to the group of the token just before it
    and groups are masked whole; a group that would overshoot ``num_to_predict`` is
    skipped, as in the reference. (Unlike the reference, a ``##`` piece right after a
    [SEP] starts its own group instead of joining the last word of A.) With
    ``max_ngram`` > 1 the unit is ALBERT's n-gram of up to ``max_ngram`` whole words
    (:func:`choose_word_spans`; whole words whatever ``whole_word_mask`` says). Each chosen
    position independently becomes [MASK] with probability ``mask_replace_prob`` (0.8), a
    random id from ``vocab.random_ids`` with ``random_replace_prob`` (0.1), or stays
    unchanged with the rest (0.1).

    Draws, in this order (the reference's rule, and the same arrays for 0.8 / 0.1 as
    before the rule was an option): the positions; u (P',) uniform, [MASK] where
    u < mask_replace_prob; keep (P',) uniform, unchanged where keep < :func:`keep_share`
    (else random); then P' random ids, drawn whether used or not.

    Inputs:
        input_ids: (L,) integer ids; not modified.
        masked_lm_prob: in [0, 1]; 0 still predicts one token, as in the reference.
        max_predictions_per_seq: >= 1, the cap on P' (see ``default_max_predictions``).
        rng: the generator every draw comes from.
        max_ngram: >= 1; above 1, n-gram masking (ALBERT's max_ngram is 3).
        mask_replace_prob, random_replace_prob: the replacement rule, sum <= 1.
    Returns:
        output_ids (L,) int32, masked_positions (P',) int32 increasing,
        masked_labels (P',) int32 original ids, with P' <= num_to_predict.
    Raises:
        ValueError: masked_lm_prob outside [0, 1], max_predictions_per_seq < 1,
            max_ngram < 1 or a bad replacement rule (:func:`check_replacement`).
    """
    check_probability("masked_lm_prob", masked_lm_prob)
    keep = keep_share(mask_replace_prob, random_replace_prob)
    if max_predictions_per_seq < 1:
        raise ValueError(f"max_predictions_per_seq must be >= 1, got {max_predictions_per_seq}")
    if max_ngram < 1:
        raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
    ids = np.asarray(input_ids)
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(ids) * masked_lm_prob))))
    positions = _choose_positions(ids, vocab, num_to_predict, rng, whole_word_mask, max_ngram)
    out = _replace(ids, positions, vocab, rng, mask_replace_prob, keep)
    positions = np.sort(positions, kind="stable").astype(np.int32)
    return out, positions, ids[positions].astype(np.int32)


def _choose_positions(ids: np.ndarray, vocab: VocabInfo, num_to_predict: int,
                      rng: np.random.Generator, whole_word_mask: bool,
                      max_ngram: int) -> np.ndarray:
    """:func:`create_masked_lm_predictions`' first draws: (P',) int64 positions to
    predict, in the order chosen (whole-word / n-gram spans, or single candidates)."""
    if whole_word_mask or max_ngram > 1:
        spans = choose_word_spans(ids, vocab, num_to_predict, max_ngram, rng)
        return np.sort([p for a, b, _ in spans for p in range(a, b)]).astype(np.int64)
    cand = np.flatnonzero((ids != vocab.cls_id) & (ids != vocab.sep_id) & (ids != vocab.pad_id))
    return cand[rng.permutation(len(cand))[:num_to_predict]]


def _replace(ids: np.ndarray, positions: np.ndarray, vocab: VocabInfo,
             rng: np.random.Generator, mask_replace_prob: float, keep: float) -> np.ndarray:
    """(L,) int32 copy of ``ids`` with ``positions`` corrupted by the replacement rule
    (``keep``: its :func:`keep_share`): draws u (P',), then a (P',) uniform compared with
    ``keep``, then P' random ids (see :func:`create_masked_lm_predictions`)."""
    k = len(positions)
    u = rng.random(k)
    keep_draw = rng.random(k)
    replacement = vocab.random_ids[rng.integers(0, len(vocab.random_ids), size=k)]
    out = ids.astype(np.int32, copy=True)
    out[positions] = np.where(u < mask_replace_prob, vocab.mask_id,
                              np.where(keep_draw < keep, ids[positions], replacement))
    return out
