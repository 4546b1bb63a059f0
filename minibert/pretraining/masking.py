"""MLM corruption, shared by every objective (Devlin et al. 2019, section 3.1, "Task #1").

google-research/bert ``create_masked_lm_predictions``: about ``masked_lm_prob`` of a
sequence's tokens are chosen to be predicted; each chosen token becomes [MASK] (80%), a
random token (10%) or stays itself (10%). Masking rates up to 0.4 work as well or better
for large models (Wettig et al. 2023, "Should You Mask 15% in Masked Language Modeling?");
size ``max_predictions_per_seq`` with :func:`default_max_predictions` so the cap does not
silently lower the rate.

Shape legend: L = one sequence's length, P' = its number of predictions, V = vocabulary size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..tokenization.vocab import SPECIAL_TOKENS

__all__ = ["VocabInfo", "check_probability", "create_masked_lm_predictions", "default_max_predictions"]


def check_probability(name: str, p: float) -> None:
    """Raises ValueError unless ``p`` is a number in [0, 1] (the message names ``name``)."""
    if not 0.0 <= p <= 1.0:  # also refuses nan
        raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")


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


def create_masked_lm_predictions(
    input_ids: np.ndarray,
    vocab: VocabInfo,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    rng: np.random.Generator,
    whole_word_mask: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Choose MLM positions and corrupt them (reference ``create_masked_lm_predictions``).

    ``num_to_predict = min(max_predictions_per_seq, max(1, round(L * masked_lm_prob)))``
    (Python's ``round``, L counts [CLS] and [SEP]). Candidates are all positions except
    [CLS] and [SEP] (and [PAD], should one be present), taken in random order. With
    ``whole_word_mask`` a ``##`` piece belongs to the group of the token just before it
    and groups are masked whole; a group that would overshoot ``num_to_predict`` is
    skipped, as in the reference. (Unlike the reference, a ``##`` piece right after a
    [SEP] starts its own group instead of joining the last word of A.) Each chosen
    position independently becomes [MASK] with probability 0.8, stays unchanged with
    0.1, or becomes a random id from ``vocab.random_ids`` with 0.1.

    Inputs:
        input_ids: (L,) integer ids; not modified.
        masked_lm_prob: in [0, 1]; 0 still predicts one token, as in the reference.
        max_predictions_per_seq: >= 1, the cap on P' (see ``default_max_predictions``).
        rng: the generator every draw comes from.
    Returns:
        output_ids (L,) int32, masked_positions (P',) int32 increasing,
        masked_labels (P',) int32 original ids, with P' <= num_to_predict.
    Raises:
        ValueError: masked_lm_prob outside [0, 1] or max_predictions_per_seq < 1.
    """
    check_probability("masked_lm_prob", masked_lm_prob)
    if max_predictions_per_seq < 1:
        raise ValueError(f"max_predictions_per_seq must be >= 1, got {max_predictions_per_seq}")
    ids = np.asarray(input_ids)
    L = len(ids)
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(L * masked_lm_prob))))
    is_cand = (ids != vocab.cls_id) & (ids != vocab.sep_id) & (ids != vocab.pad_id)
    cand = np.flatnonzero(is_cand)
    if whole_word_mask and len(cand):
        # A candidate starts a new group unless it is a ## piece directly after another candidate.
        joins = vocab.is_continuation[ids[cand]]
        joins[0] = False
        joins[1:] &= np.diff(cand) == 1
        group_of = np.cumsum(~joins) - 1                     # group index of each candidate
        sizes = np.bincount(group_of).tolist()
        taken = np.zeros(len(sizes), dtype=bool)
        count = 0
        for g in rng.permutation(len(sizes)).tolist():       # groups in random order
            if count >= num_to_predict:
                break
            if count + sizes[g] > num_to_predict:            # would overshoot: skip this word
                continue
            taken[g] = True
            count += sizes[g]
        positions = cand[taken[group_of]]
    else:
        positions = cand[rng.permutation(len(cand))[:num_to_predict]]

    k = len(positions)
    u = rng.random(k)
    keep_draw = rng.random(k)
    replacement = vocab.random_ids[rng.integers(0, len(vocab.random_ids), size=k)]
    out = ids.astype(np.int32, copy=True)
    new = np.where(u < 0.8, vocab.mask_id, np.where(keep_draw < 0.5, ids[positions], replacement))
    out[positions] = new
    order = np.argsort(positions, kind="stable")
    positions = positions[order].astype(np.int32)
    return out, positions, ids[positions].astype(np.int32)
