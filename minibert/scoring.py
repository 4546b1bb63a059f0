"""How probable a masked LM finds a sentence: pseudo-log-likelihood (PLL).

PLL (Salazar et al. 2020, "Masked Language Model Scoring", eq. 2) masks each token of the
sentence in turn and adds up log p(original token | the rest):

    PLL(W) = sum_t log P(w_t | W with w_t masked)

PLL-word-l2r (Kauf & Ivanova 2023, "A Better Way to Do Masked Language Model Scoring")
also masks the pieces of the same word to the right of t, so a word split into pieces
("sur ##vey ##ed") cannot be guessed from its own later pieces, which inflates the plain
PLL of rare words:

    PLL-word-l2r(W) = sum_t log P(w_t | W with w_t and the later pieces of its word masked)

Words are the tokenizer's words (BERT's basic tokenizer: whitespace and punctuation
splits), as ``word_ids()``. Scores are in nats (natural log), over the pieces between
``[CLS]`` and ``[SEP]``.

Every masked copy of every sentence is one row; the rows of all sentences are sorted by
length and run ``batch_size`` at a time, the MLM head only at the scored position, and
each batch is read back from the device once. The interface follows minicons'
``MaskedLMScorer.sequence_score`` / awslabs mlm-scoring: a total per sentence, with the
per-token scores on request.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .backend import get_array_module, to_numpy
from .finetuning.data import EncodedSplit, length_batches
from .nn.losses import softmax_nll

METHODS = ("pll-word-l2r", "pll")


class ScoringError(ValueError):
    """A sentence or option that cannot be scored; the message says which."""


def masked_copies(ids: Sequence[int], word_ids: Sequence[int | None], mask_id: int,
                  method: str = "pll-word-l2r") -> list[tuple[list[int], int]]:
    """The rows that score one sentence: per scored position t (every non-special token),
    ``(ids with t masked, t)``; with ``pll-word-l2r`` the later pieces of t's word are
    masked too.

    Args:
        ids: ``[CLS] pieces [SEP]`` token ids.
        word_ids: per token, its word's index (None for special tokens).
        mask_id: the ``[MASK]`` id.
        method: one of :data:`METHODS`.
    """
    rows = []
    for t, w in enumerate(word_ids):
        if w is None:
            continue
        row = list(ids)
        row[t] = mask_id
        if method == "pll-word-l2r":
            u = t + 1
            while u < len(ids) and word_ids[u] == w:
                row[u] = mask_id
                u += 1
        rows.append((row, t))
    return rows


def score_ids(model, sentences: Sequence[tuple[Sequence[int], Sequence[int | None]]],
              mask_id: int, pad_id: int = 0, method: str = "pll-word-l2r",
              batch_size: int = 64) -> list[np.ndarray]:
    """Per sentence, the (n,) float64 log-probabilities (nats) of its n scored tokens.

    Args:
        model: a :class:`~minibert.modeling.BertForPreTraining` (any device; its mode is
            set to eval and restored).
        sentences: ``(ids, word_ids)`` per sentence (see :func:`masked_copies`).
        mask_id, pad_id: the tokenizer's ``[MASK]`` and ``[PAD]`` ids.
        method: ``"pll-word-l2r"`` or ``"pll"``.
        batch_size: masked rows per forward (>= 1).
    Raises:
        ScoringError: an unknown method or a batch size below 1.
    """
    if method not in METHODS:
        raise ScoringError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
    if batch_size < 1:
        raise ScoringError(f"batch_size must be >= 1, got {batch_size}")
    rows, target, owner = [], [], []
    for s, (ids, wids) in enumerate(sentences):
        for row, t in masked_copies(ids, wids, mask_id, method):
            rows.append(row)
            target.append((t, int(ids[t])))
            owner.append(s)
    xp = get_array_module(next(iter(model.parameters())).data)
    logp = np.zeros(len(rows))
    split = EncodedSplit(rows, [[0] * len(r) for r in rows], None)
    was_training = model.training
    model.eval()
    try:
        for b in length_batches(split, batch_size, pad_id):
            pos = np.array([[target[i][0]] for i in b.index])             # (B, 1)
            gold = xp.asarray(np.array([target[i][1] for i in b.index]))  # (B,)
            d = b.to(xp)
            z = model(d.input_ids, d.token_type_ids, d.attention_mask,
                      masked_lm_positions=xp.asarray(pos)).prediction_logits[:, 0]
            nll = softmax_nll(z.astype(xp.float64), gold)[1]             # (B,) -log p
            logp[b.index] = -to_numpy(nll)
    finally:
        model.train(was_training)
    out: list[list[float]] = [[] for _ in sentences]
    for i, s in enumerate(owner):
        out[s].append(logp[i])
    return [np.asarray(v, dtype=np.float64) for v in out]


def encode_sentence(tokenizer, text: str) -> tuple[list[int], list[int | None]]:
    """``([CLS] ids [SEP], word_ids)`` of one sentence, as :func:`score_ids` takes it
    (word ids None on the special tokens)."""
    a = tokenizer.text_to_ids_with_offsets(text)
    return ([tokenizer.cls_token_id, *a.ids, tokenizer.sep_token_id],
            [None, *a.word_ids, None])


def unscorable(tokenizer, ids: Sequence[int], limit: int) -> str | None:
    """Why an encoded sentence (``ids`` with [CLS] and [SEP]) cannot be scored by a model
    of ``limit`` positions: "gives no token", "gives only [UNK]", "N tokens, more than the
    L allowed"; None when it can."""
    if len(ids) == 2:
        return "gives no token"
    if all(i == tokenizer.unk_token_id for i in ids[1:-1]):
        return "gives only [UNK]"
    if len(ids) > limit:
        return f"{len(ids)} tokens, more than the {limit} allowed"
    return None


def score_texts(model, tokenizer, texts: Sequence[str], method: str = "pll-word-l2r",
                batch_size: int = 64, per_token: bool = False,
                max_length: int | None = None) -> list[dict]:
    """PLL of each text: ``{"text", "score" (nats, the sum), "tokens" (how many were
    scored)}``, plus ``"token_scores"``: ``[[piece, log p], ...]`` with ``per_token``.

    Raises:
        ScoringError: a text that gives no token, or only ``[UNK]`` (the message gives its
            position from 1), or is longer than ``max_length`` (default: the model's
            positions) tokens (:func:`unscorable`); see :func:`score_ids`.
    """
    limit = max_length or model.config.max_position_embeddings
    sentences = [encode_sentence(tokenizer, t) for t in texts]
    for n, (text, (ids, _)) in enumerate(zip(texts, sentences), 1):
        if why := unscorable(tokenizer, ids, limit):
            raise ScoringError(f"text {n}: {text[:60]!r} {why}")
    scores = score_ids(model, sentences, tokenizer.mask_token_id, tokenizer.pad_token_id,
                       method, batch_size)
    out = []
    for text, (ids, _), s in zip(texts, sentences, scores):
        r = {"text": text, "score": float(s.sum()), "tokens": int(len(s))}
        if per_token:
            pieces = tokenizer.convert_ids_to_tokens(ids[1:-1])
            r["token_scores"] = [[p, float(v)] for p, v in zip(pieces, s)]
        out.append(r)
    return out


__all__ = ["METHODS", "ScoringError", "encode_sentence", "masked_copies", "score_ids",
           "score_texts", "unscorable"]
