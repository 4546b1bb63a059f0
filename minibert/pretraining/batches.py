"""Epochs of masked instances and fixed-shape batches, generated on the fly from a token store.

An objective (:mod:`minibert.objectives`) cuts the documents into unmasked segments;
:func:`~.masking.create_masked_lm_predictions` masks them; a bounded shuffle buffer mixes
them; :func:`collate` lays them out in google-research/bert's fixed-shape features
(``run_pretraining.py``: ``input_ids``, ``input_mask``, ``segment_ids``,
``masked_lm_positions``, ``masked_lm_ids``, ``masked_lm_weights``,
``next_sentence_labels``), under Hugging Face's names where HF has one. Nothing
proportional to ``corpus x dupe_factor`` is ever held in memory.

Randomness. Every draw comes from a ``numpy.random.Generator`` seeded by a
``SeedSequence`` of small integers: the segments of document ``d`` from
(seed, copy, d) (:func:`minibert.objectives.segment_rng`), its masks from
(seed, mask copy, d), the epoch's document order and shuffle from (seed, epoch). A batch
therefore depends only on the arguments, which is what makes ``start_batch`` resumption
exact. Where a sequence's masking rate is only known once its batch is (a masking-rate
schedule) or batches are formed before masking (``line_by_line``, :mod:`.lines`), each
sequence is masked with a generator of its own, seeded by (seed, mask copy, d, number of
the sequence in document d).

Shape legend: B = batch, T = max_seq_length, P = max_predictions_per_seq, L = one
instance's length, P' = one instance's number of predictions, D = documents.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from ..objectives import Objective, get_objective
from .corpus import CorpusError, TokenStore, check_seed
from .lines import LineRows, line_batch_rows, line_rows, line_segment
from .masking import (VocabInfo, check_probability, check_replacement,
                      create_masked_lm_predictions, default_max_predictions)

__all__ = ["Instance", "PretrainingBatch", "collate", "iterate_instances", "count_instances",
           "iterate_batches", "make_eval_batches"]

# First words of the SeedSequence entropy of the mask and epoch-order generators (the
# segment generators use 101, see minibert.objectives.base; the held-out split 404), of
# the one-per-sequence mask generators (a masking-rate schedule, --line-by-line) and of
# the line-by-line batch order.
_TAG_MASKS, _TAG_ORDER, _TAG_KEYED_MASKS, _TAG_LINES = 202, 303, 505, 606


@dataclass
class Instance:
    """One masked sequence (the reference's ``TrainingInstance``).

    Fields:
        input_ids: (L,) int32, after masking; [CLS] first, [SEP] last.
        token_type_ids: (L,) int8, the segment of each token (0, or 1 for a pair's B).
        masked_lm_positions: (P',) int32, increasing positions that carry an MLM label.
        masked_lm_labels: (P',) int32, the original ids at those positions.
        sentence_label: the objective's sentence-level label (0/1), None without one.
        document: index (in the store) of the document the sequence starts in.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    masked_lm_positions: np.ndarray
    masked_lm_labels: np.ndarray
    sentence_label: int | None
    document: int = -1


@dataclass
class PretrainingBatch:
    """A fixed-shape batch for ``BertForPreTraining.forward``: always (B, T) and (B, P).

    Fields (host NumPy arrays):
        input_ids: (B, T) int64 token ids, [PAD] after the end.
        token_type_ids: (B, T) int64, 0 for [CLS] A [SEP], 1 for B [SEP], 0 at padding.
        attention_mask: (B, T) int64, 1 at real tokens, 0 at padding.
        masked_lm_positions: (B, P) int64, positions to predict (0 in a padding slot).
        masked_lm_ids: (B, P) int64, the original ids there (0 in a padding slot).
        masked_lm_weights: (B, P) float32, 1 for a real slot, 0 for a padding slot.
        next_sentence_label: (B,) int64 sentence-level label (NSP: 0 = IsNext,
            1 = random B; SOP: 0 = in order, 1 = swapped), or None when the objective
            has no sentence task.
        masked_lm_prob: the masking rate of a batch of a rate schedule (a float, not a
            model input), None otherwise.

    Line by line (``iterate_batches(line_by_line=True)``) T and P are the batch's own
    longest line and most predictions, not the run's maxima.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    masked_lm_positions: np.ndarray
    masked_lm_ids: np.ndarray
    masked_lm_weights: np.ndarray
    next_sentence_label: np.ndarray | None = None
    masked_lm_prob: float | None = None

    def model_inputs(self) -> dict[str, np.ndarray]:
        """The keyword arguments of ``BertForPreTraining.forward`` (None fields left out).
        Host arrays: move each to the device with ``xp.asarray``."""
        names = ("input_ids", "token_type_ids", "attention_mask", "masked_lm_positions",
                 "masked_lm_ids", "masked_lm_weights", "next_sentence_label")
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}

    def hf_kwargs(self) -> dict[str, np.ndarray]:
        """The same batch as Hugging Face's ``BertForPreTraining`` takes it: input_ids,
        token_type_ids, attention_mask (B, T), dense ``labels`` (B, T) int64 with -100
        where nothing is predicted, and next_sentence_label (B,) when present."""
        from ..modeling import labels_from_masked_lm
        d = {k: v for k, v in self.model_inputs().items() if not k.startswith("masked_lm_")}
        d["labels"] = labels_from_masked_lm(self.masked_lm_positions, self.masked_lm_ids,
                                            self.masked_lm_weights, self.input_ids.shape[1])
        return d


def collate(instances: Sequence[Instance], max_seq_length: int, max_predictions_per_seq: int,
            pad_id: int) -> PretrainingBatch:
    """Lay instances out as a :class:`PretrainingBatch` of shape (B, T) and (B, P).

    Inputs:
        instances: 1..B instances, all with a sentence label or all without.
        max_seq_length: T. max_predictions_per_seq: P.
        pad_id: id of [PAD].
    Raises:
        ValueError: no instance, an instance longer than T or with more than P
            predictions, or sentence labels on some instances only.
    """
    if not instances:
        raise ValueError("cannot collate an empty list of instances")
    with_label = [x.sentence_label is not None for x in instances]
    if any(with_label) != all(with_label):
        raise ValueError("cannot collate instances with and without a sentence label")
    B, T, P = len(instances), max_seq_length, max_predictions_per_seq
    input_ids = np.full((B, T), pad_id, dtype=np.int64)
    token_type_ids = np.zeros((B, T), dtype=np.int64)
    attention_mask = np.zeros((B, T), dtype=np.int64)
    positions = np.zeros((B, P), dtype=np.int64)
    ids = np.zeros((B, P), dtype=np.int64)
    weights = np.zeros((B, P), dtype=np.float32)
    for b, x in enumerate(instances):
        L, n = len(x.input_ids), len(x.masked_lm_positions)
        if L > T:
            raise ValueError(f"an instance has {L} tokens, over max_seq_length {T}")
        if n > P:
            raise ValueError(f"an instance has {n} predictions, over max_predictions_per_seq {P}")
        input_ids[b, :L] = x.input_ids
        token_type_ids[b, :L] = x.token_type_ids
        attention_mask[b, :L] = 1
        positions[b, :n] = x.masked_lm_positions
        ids[b, :n] = x.masked_lm_labels
        weights[b, :n] = 1.0
    labels = np.array([x.sentence_label for x in instances], dtype=np.int64) if all(with_label) else None
    return PretrainingBatch(input_ids, token_type_ids, attention_mask, positions, ids, weights,
                            labels)


# ----------------------------------------------------------------------------------------
# Checks and the shared instance stream
# ----------------------------------------------------------------------------------------


def _check_store(store: TokenStore, objective: Objective) -> None:
    if store.num_documents < objective.min_documents:
        raise CorpusError(
            f"the store holds {store.num_documents} document(s); objective {objective.name!r} "
            f"needs at least {objective.min_documents}: {objective.min_documents_reason}")


@dataclass(frozen=True)
class _Masking:
    """The masking options of a run together (see :func:`create_masked_lm_predictions`);
    called on one sequence, at the run's rate or at ``masked_lm_prob`` if given."""

    masked_lm_prob: float
    max_predictions_per_seq: int
    whole_word_mask: bool = False
    max_ngram: int = 1
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1

    def __call__(self, input_ids, vocab: VocabInfo, rng, masked_lm_prob: float | None = None):
        rate = self.masked_lm_prob if masked_lm_prob is None else masked_lm_prob
        return create_masked_lm_predictions(
            input_ids, vocab, rate, self.max_predictions_per_seq, rng, self.whole_word_mask,
            self.max_ngram, self.mask_replace_prob, self.random_replace_prob)


def _check_data_args(objective: Objective, max_seq_length: int, short_seq_prob: float,
                     masked_lm_prob: float, max_predictions_per_seq: int | None) -> int:
    """Validate the arguments shared by every entry point; returns P."""
    objective.check_max_seq_length(max_seq_length)
    check_probability("short_seq_prob", short_seq_prob)
    check_probability("masked_lm_prob", masked_lm_prob)
    if max_predictions_per_seq is None:
        return default_max_predictions(max_seq_length, masked_lm_prob)
    if max_predictions_per_seq < 1:
        raise ValueError(f"max_predictions_per_seq must be >= 1, got {max_predictions_per_seq}")
    return int(max_predictions_per_seq)


def _masking(objective: Objective, max_seq_length: int, short_seq_prob: float,
             masked_lm_prob: float, max_predictions_per_seq: int | None, whole_word_mask: bool,
             max_ngram: int, mask_replace_prob: float, random_replace_prob: float) -> _Masking:
    """Validate the data arguments (ValueError naming the bad one) and bundle the masking."""
    P = _check_data_args(objective, max_seq_length, short_seq_prob, masked_lm_prob,
                         max_predictions_per_seq)
    check_replacement(mask_replace_prob, random_replace_prob)
    return _Masking(masked_lm_prob, P, whole_word_mask, max_ngram, mask_replace_prob,
                    random_replace_prob)


def _copies(epoch: int, masking: str, dupe_factor: int) -> tuple[int, int]:
    """(segment copy, mask copy) of an epoch."""
    if masking not in ("static", "dynamic"):
        raise ValueError(f"masking must be 'static' or 'dynamic', got {masking!r}")
    if dupe_factor < 1:
        raise ValueError(f"dupe_factor must be >= 1, got {dupe_factor}")
    pair_copy = epoch % dupe_factor
    return pair_copy, (pair_copy if masking == "static" else epoch)


def _order_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator of an epoch's document order (its first draw) and shuffle buffer."""
    return np.random.default_rng([_TAG_ORDER, seed, epoch])


def _masked_instances(objective: Objective, store: TokenStore, vocab: VocabInfo,
                      doc_order: Sequence[int], max_seq_length: int, seed: int, copy: int,
                      mask_copy: int, short_seq_prob: float,
                      masking: _Masking) -> Iterator[Instance]:
    """The objective's segments, masked: one mask generator per (seed, mask_copy, document),
    drawn from in order by the segments that start in that document."""
    mask_rng, mask_doc = None, None
    for seg in objective.segments(store, doc_order, max_seq_length, short_seq_prob=short_seq_prob,
                                  seed=seed, copy=copy, cls_id=vocab.cls_id, sep_id=vocab.sep_id):
        if seg.document != mask_doc:
            mask_doc = seg.document
            mask_rng = np.random.default_rng([_TAG_MASKS, seed, mask_copy, mask_doc])
        ids, positions, labels = masking(seg.input_ids, vocab, mask_rng)
        yield Instance(ids, seg.token_type_ids, positions, labels, seg.label, seg.document)


def _numbered_segments(objective: Objective, store: TokenStore, vocab: VocabInfo,
                       doc_order: Sequence[int], max_seq_length: int, seed: int, copy: int,
                       short_seq_prob: float) -> Iterator[tuple]:
    """The objective's segments, unmasked, each with its number among the segments that
    start in its document (0, 1, ...): (Segment, number)."""
    doc, n = None, 0
    for seg in objective.segments(store, doc_order, max_seq_length, short_seq_prob=short_seq_prob,
                                  seed=seed, copy=copy, cls_id=vocab.cls_id, sep_id=vocab.sep_id):
        n = n + 1 if seg.document == doc else 0
        doc = seg.document
        yield seg, n


def _mask_one(seg, number: int, vocab: VocabInfo, masking: _Masking, seed: int,
              mask_copy: int, masked_lm_prob: float) -> Instance:
    """Mask one segment with its own generator, seeded by (seed, mask copy, document,
    number of the segment in its document): the mask does not depend on which batch or
    position the segment lands in, only the rate does (a masking-rate schedule,
    line-by-line batches)."""
    rng = np.random.default_rng([_TAG_KEYED_MASKS, seed, mask_copy, seg.document, number])
    ids, positions, labels = masking(seg.input_ids, vocab, rng, masked_lm_prob)
    return Instance(ids, seg.token_type_ids, positions, labels, seg.label, seg.document)


def _shuffled(items: Iterator, rng: np.random.Generator, cap: int) -> Iterator:
    """A bounded shuffle buffer of ``cap`` items: a random slot is emitted and refilled;
    the remainder comes out in random order."""
    buf: list = []
    for item in items:
        if len(buf) < cap:
            buf.append(item)
            continue
        j = int(rng.integers(0, cap))
        yield buf[j]
        buf[j] = item
    for j in rng.permutation(len(buf)):
        yield buf[j]


# ----------------------------------------------------------------------------------------
# Epochs: static (dupe_factor) and dynamic masking, resumable and bounded in memory
# ----------------------------------------------------------------------------------------


def iterate_instances(
    store: TokenStore, vocab: VocabInfo, max_seq_length: int, epoch: int, seed: int, *,
    objective: str | Objective = "mlm+nsp", masking: str = "dynamic", dupe_factor: int = 10,
    short_seq_prob: float = 0.1, masked_lm_prob: float = 0.15,
    max_predictions_per_seq: int | None = None, whole_word_mask: bool = False,
    shuffle_buffer: int = 10_000, max_ngram: int = 1,
    mask_replace_prob: float = 0.8, random_replace_prob: float = 0.1,
) -> Iterator[Instance]:
    """Yield one epoch of masked instances, shuffled, generated on the fly from the store.

    What an epoch contains. The reference makes ``dupe_factor`` passes over the
    documents, each cutting them into instances and masking them afresh, and trains on
    the union. Here epoch ``e`` is pass ``e % dupe_factor``: its segments are drawn from
    generators seeded by (seed, e % dupe_factor, document). The masks:

    * ``masking="static"``: also seeded by (seed, e % dupe_factor, document), so there are
      exactly ``dupe_factor`` distinct versions of the data, as in the reference;
    * ``masking="dynamic"``: seeded by (seed, e, document): fresh masks every epoch
      (RoBERTa's dynamic masking), segments still cycling with ``dupe_factor``.

    Order. Documents are visited in a permutation drawn from (seed, epoch) and their
    instances pass through a shuffle buffer of ``shuffle_buffer`` instances (a random
    slot is emitted and refilled; the remainder is emitted in random order), so memory
    stays at O(shuffle_buffer) instances. The same arguments always yield the same
    sequence.

    Inputs:
        objective: a name in ``minibert.objectives.OBJECTIVES`` or an ``Objective``.
        max_predictions_per_seq: P, the cap on predictions per instance; None =
            ``default_max_predictions(max_seq_length, masked_lm_prob)``.
        whole_word_mask, max_ngram: the masking unit (token, whole word, or ALBERT's
            n-gram of up to ``max_ngram`` words), see
            :func:`~.masking.create_masked_lm_predictions`.
        mask_replace_prob, random_replace_prob: the replacement rule (0.8 / 0.1:
            google-research/bert's 80/10/10), see there.
    Yields:
        :class:`Instance`, L <= max_seq_length, P' <= P.
    Raises:
        CorpusError: fewer documents than the objective needs.
        ValueError: unknown objective or masking mode, dupe_factor < 1, a negative seed or
            epoch, a probability outside [0, 1], max_predictions_per_seq < 1, a replacement
            rule that sums over 1, or max_seq_length below the objective's minimum.
    """
    obj, rule = _checked(objective, store, seed, epoch, max_seq_length, short_seq_prob,
                         masked_lm_prob, max_predictions_per_seq, whole_word_mask, max_ngram,
                         mask_replace_prob, random_replace_prob)
    yield from _epoch_stream(obj, store, vocab, max_seq_length, epoch, seed, masking,
                             dupe_factor, short_seq_prob, rule, shuffle_buffer, deferred=False)


def _checked(objective: str | Objective, store: TokenStore, seed: int, epoch: int,
             max_seq_length: int, short_seq_prob: float,
             *masking_args) -> tuple[Objective, _Masking]:
    """The first steps of :func:`iterate_instances` and :func:`iterate_batches`: the
    objective, checked against the store, seed and epoch checked, then the masking rule
    (``masking_args``: :func:`_masking`'s from ``masked_lm_prob`` on). Raises as they do."""
    obj = get_objective(objective)
    _check_store(store, obj)
    check_seed(seed=seed, epoch=epoch)
    return obj, _masking(obj, max_seq_length, short_seq_prob, *masking_args)


def _epoch_stream(obj: Objective, store: TokenStore, vocab: VocabInfo, max_seq_length: int,
                  epoch: int, seed: int, masking: str, dupe_factor: int, short_seq_prob: float,
                  rule: _Masking, shuffle_buffer: int, deferred: bool) -> Iterator:
    """:func:`iterate_instances`' epoch: masked :class:`Instance` objects or, ``deferred``,
    (Segment, number in its document) pairs for :func:`_mask_one` (same order: the
    shuffle does not depend on the masks)."""
    _check_store(store, obj)
    check_seed(seed=seed, epoch=epoch)
    copy, mask_copy = _copies(epoch, masking, dupe_factor)
    order_rng = _order_rng(seed, epoch)
    doc_order = order_rng.permutation(store.num_documents)
    items = (_numbered_segments(obj, store, vocab, doc_order, max_seq_length, seed, copy,
                                short_seq_prob) if deferred else
             _masked_instances(obj, store, vocab, doc_order, max_seq_length, seed, copy,
                               mask_copy, short_seq_prob, rule))
    return _shuffled(items, order_rng, max(1, int(shuffle_buffer)))


def count_instances(
    store: TokenStore,
    max_seq_length: int,
    epoch: int,
    seed: int,
    *,
    objective: str | Objective = "mlm+nsp",
    dupe_factor: int = 10,
    short_seq_prob: float = 0.1,
) -> int:
    """Number of instances ``iterate_instances`` yields for this epoch (segments only, no masking).

    For the sentence-pair objectives it depends on ``epoch`` only through
    ``epoch % dupe_factor``; for ``mlm`` only through the epoch's document order. Takes
    about half the time of generating the epoch; use it to size a learning-rate schedule.

    Raises:
        as ``iterate_instances``.
    """
    obj = get_objective(objective)
    _check_store(store, obj)
    check_seed(seed=seed, epoch=epoch)
    obj.check_max_seq_length(max_seq_length)
    check_probability("short_seq_prob", short_seq_prob)
    copy, _ = _copies(epoch, "static", dupe_factor)
    doc_order = _order_rng(seed, epoch).permutation(store.num_documents)
    segments = obj.segments(store, doc_order, max_seq_length, short_seq_prob=short_seq_prob,
                            seed=seed, copy=copy, cls_id=0, sep_id=0)
    return sum(1 for _ in segments)


def iterate_batches(
    store: TokenStore, vocab: VocabInfo, batch_size: int, max_seq_length: int, epoch: int,
    seed: int, start_batch: int = 0, *,
    objective: str | Objective = "mlm+nsp", masking: str = "dynamic", dupe_factor: int = 10,
    short_seq_prob: float = 0.1, masked_lm_prob: float = 0.15,
    max_predictions_per_seq: int | None = None, whole_word_mask: bool = False,
    shuffle_buffer: int = 10_000, drop_last: bool = True, max_ngram: int = 1,
    mask_replace_prob: float = 0.8, random_replace_prob: float = 0.1,
    batch_masked_lm_prob: Callable[[int], float] | None = None, line_by_line: bool = False,
) -> Iterator[PretrainingBatch]:
    """Yield the batches of one epoch, starting at batch ``start_batch``; reproducible and resumable.

    The instance stream is ``iterate_instances`` (see there for the objective, static vs
    dynamic masking, dupe_factor and shuffling). Batch ``k`` of epoch ``e`` is the same for
    the same arguments, so a run resumed at (e, k) with ``start_batch=k`` sees exactly the
    batches an uninterrupted run would have seen from k on. Resuming replays the epoch's
    instance generation up to that point (no collation), which costs about the time of
    generating those instances.

    Inputs:
        batch_size: B.
        max_seq_length: T, the width of every batch (the most, line by line).
        max_predictions_per_seq: P, the width of the masked_lm arrays; None =
            ``default_max_predictions(max_seq_length, masked_lm_prob)``.
        drop_last: drop the last, smaller batch, so every batch is (B, T) and (B, P). An
            epoch of fewer than B sequences is refused either way
            (:func:`_check_epoch_holds_a_batch`).
        mask_replace_prob, random_replace_prob: the replacement rule
            (:func:`~.masking.create_masked_lm_predictions`).
        batch_masked_lm_prob: a masking-rate schedule: batch k is masked at rate
            ``batch_masked_lm_prob(k)`` (called once per batch, k increasing from
            ``start_batch``), each sequence with a generator of its own (same sequences and
            order, other masks than without it), recorded in ``PretrainingBatch.masked_lm_prob``.
        line_by_line: one corpus line per sequence (:mod:`.lines`), ``mlm`` and ``electra``
            only: batches of lines of similar length, each (B, T_b) and (B, P_b) (its longest
            line, its most predictions); every line once per epoch; resuming skips the
            earlier batches without making them; ``shuffle_buffer``, ``short_seq_prob`` unused.
    Yields:
        :class:`PretrainingBatch`, (B, T) and (B, P) arrays; ``next_sentence_label`` (B,) or None.
    Raises:
        CorpusError: fewer documents than the objective needs, or an epoch of fewer
            sequences than ``batch_size`` (:func:`_check_epoch_holds_a_batch`; packed,
            raised once the epoch has been generated, before any batch is yielded).
        ValueError: bad arguments (see ``iterate_instances``), batch_size < 1,
            start_batch < 0, or ``line_by_line`` with a sentence-level objective.
    """
    if batch_size < 1 or start_batch < 0:
        raise ValueError(f"need batch_size >= 1 and start_batch >= 0, got {batch_size}, {start_batch}")
    obj, rule = _checked(objective, store, seed, epoch, max_seq_length, short_seq_prob,
                         masked_lm_prob, max_predictions_per_seq, whole_word_mask, max_ngram,
                         mask_replace_prob, random_replace_prob)
    if line_by_line:
        yield from _line_batches(obj, store, vocab, batch_size, max_seq_length, epoch, seed,
                                 start_batch, masking, dupe_factor, rule, drop_last,
                                 batch_masked_lm_prob)
        return
    yield from _packed_batches(obj, store, vocab, batch_size, max_seq_length, epoch, seed,
                               start_batch, masking, dupe_factor, short_seq_prob, rule,
                               shuffle_buffer, drop_last, batch_masked_lm_prob)


def _packed_batches(obj: Objective, store: TokenStore, vocab: VocabInfo, batch_size: int,
                    max_seq_length: int, epoch: int, seed: int, start_batch: int, masking: str,
                    dupe_factor: int, short_seq_prob: float, rule: _Masking,
                    shuffle_buffer: int, drop_last: bool,
                    rate_of: Callable[[int], float] | None) -> Iterator[PretrainingBatch]:
    """:func:`iterate_batches` of the objective's segments: the epoch's stream replayed up
    to ``start_batch``, then cut into batches (masked per batch at ``rate_of(k)`` if given)."""
    deferred = rate_of is not None
    stream = _epoch_stream(obj, store, vocab, max_seq_length, epoch, seed, masking, dupe_factor,
                           short_seq_prob, rule, shuffle_buffer, deferred)
    seen = sum(1 for _ in itertools.islice(stream, start_batch * batch_size))
    P, k = rule.max_predictions_per_seq, start_batch
    _, mask_copy = _copies(epoch, masking, dupe_factor)
    pending: list = []
    for item in stream:
        seen += 1
        pending.append(item)
        if len(pending) == batch_size:
            yield _batch(pending, k, deferred, vocab, rule, seed, mask_copy, max_seq_length, P,
                         rate_of)
            pending, k = [], k + 1
    _check_epoch_holds_a_batch(epoch, store, seen, f"packed for {obj.name}", batch_size)
    if pending and not drop_last:
        yield _batch(pending, k, deferred, vocab, rule, seed, mask_copy, max_seq_length, P,
                     rate_of)


def _batch(items: list, k: int, deferred: bool, vocab: VocabInfo, rule: _Masking, seed: int,
           mask_copy: int, T: int, P: int, rate_of: Callable[[int], float] | None
           ) -> PretrainingBatch:
    """Batch ``k`` of an epoch from its instances or, ``deferred``, from its (segment,
    number) pairs masked at ``rate_of(k)``."""
    if not deferred:
        return collate(items, T, P, vocab.pad_id)
    rate = float(rate_of(k))
    batch = collate([_mask_one(seg, n, vocab, rule, seed, mask_copy, rate) for seg, n in items],
                    T, P, vocab.pad_id)
    batch.masked_lm_prob = rate
    return batch


def _check_epoch_holds_a_batch(epoch: int, store: TokenStore, sequences: int, kind: str,
                               batch_size: int) -> None:
    """The one size rule of every instance mode, packed or line by line: an epoch of the
    training documents must give at least one whole batch, ``drop_last`` or not.

    A smaller epoch would make every step a batch of fewer rows than ``--batch-size`` asks
    (each step an epoch): a quiet change of the batch the learning rate was set for, and
    under data parallelism, where ``--batch-size`` is the global batch, ranks left with a
    row or two, or a stand-in. So it is refused, naming the counts and the way out.

    Inputs:
        sequences: the epoch's sequences; kind: how they are made, for the message
            ("one per line", "packed for mlm+nsp").
    Raises:
        CorpusError: ``sequences < batch_size``, 0 sequences included.
    """
    if sequences >= batch_size:
        return
    fix = (f"lower --batch-size to at most {sequences}, or add text" if sequences
           else "add text")
    raise CorpusError(
        f"epoch {epoch} of the training documents ({store.num_documents} documents) yields "
        f"{sequences} sequences ({kind}), fewer than one batch of --batch-size {batch_size}: "
        f"{fix}")


def _line_batches(obj: Objective, store: TokenStore, vocab: VocabInfo, batch_size: int,
                  max_seq_length: int, epoch: int, seed: int, start_batch: int, masking: str,
                  dupe_factor: int, rule: _Masking, drop_last: bool,
                  rate_of: Callable[[int], float] | None) -> Iterator[PretrainingBatch]:
    """:func:`iterate_batches` with ``line_by_line``: an epoch of length-grouped batches of
    single lines, in an order drawn from (seed, epoch)."""
    if obj.sentence_task is not None:
        raise ValueError(f"line_by_line gives one line per sequence: objective {obj.name!r} "
                         "needs sentence pairs; use mlm or electra")
    rows = line_rows(store, max_seq_length)
    _check_epoch_holds_a_batch(epoch, store, len(rows.length), "one per line", batch_size)
    order = line_batch_rows(rows.length, batch_size,
                            np.random.default_rng([_TAG_LINES, seed, epoch]))
    if drop_last and len(order[-1]) < batch_size:   # a full batch is left before it
        order = order[:-1]
    _, mask_copy = _copies(epoch, masking, dupe_factor)
    for k in range(start_batch, len(order)):
        rate = rule.masked_lm_prob if rate_of is None else float(rate_of(k))
        yield _line_batch(store, rows, order[k], vocab, rule, seed, mask_copy, rate,
                          record_rate=rate_of is not None)


def _line_batch(store: TokenStore, rows: LineRows, index: np.ndarray, vocab: VocabInfo,
                rule: _Masking, seed: int, mask_copy: int, rate: float,
                record_rate: bool = False) -> PretrainingBatch:
    """The lines ``index`` of ``rows``, masked at ``rate``, as a (B, T_b) batch padded to
    its longest line, with (B, P_b) prediction slots, P_b its most predictions."""
    insts = [_mask_one(line_segment(store, rows, int(r), vocab.cls_id, vocab.sep_id),
                       int(rows.number[r]), vocab, rule, seed, mask_copy, rate) for r in index]
    T = max(len(x.input_ids) for x in insts)
    P = max(1, max(len(x.masked_lm_positions) for x in insts))
    batch = collate(insts, T, P, vocab.pad_id)
    if record_rate:
        batch.masked_lm_prob = rate
    return batch


def make_eval_batches(
    store: TokenStore,
    vocab: VocabInfo,
    batch_size: int,
    max_seq_length: int,
    seed: int,
    *,
    objective: str | Objective = "mlm+nsp",
    max_instances: int | None = None,
    short_seq_prob: float = 0.1,
    masked_lm_prob: float = 0.15,
    max_predictions_per_seq: int | None = None,
    whole_word_mask: bool = False,
    max_ngram: int = 1,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
    line_by_line: bool = False,
) -> list[PretrainingBatch]:
    """A fixed evaluation set from held-out documents: the same batches every time.

    One pass over the documents in store order (segments and masks seeded by ``seed``,
    copy 0 and the document; no shuffling), cut to ``max_instances`` if given. Every batch
    is (B, T) and (B, P) except the last, which may hold fewer rows. Build it once and
    reuse it: the list is held in memory. With ``line_by_line`` the first
    ``max_instances`` lines, grouped by length without shuffling (each batch (B, T_b),
    (B, P_b); see :func:`iterate_batches`). The masking rate is ``masked_lm_prob``
    throughout (a run with a rate schedule passes its end rate).

    Returns:
        list of :class:`PretrainingBatch`; empty when the store holds no document (nothing
        held out).
    Raises:
        CorpusError: some documents, but fewer than the objective needs.
        ValueError: bad arguments (see ``iterate_instances``), batch_size < 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if store.num_documents == 0:
        return []
    obj = get_objective(objective)
    _check_store(store, obj)
    check_seed(seed=seed)
    rule = _masking(obj, max_seq_length, short_seq_prob, masked_lm_prob, max_predictions_per_seq,
                    whole_word_mask, max_ngram, mask_replace_prob, random_replace_prob)
    if line_by_line:
        rows = line_rows(store, max_seq_length)
        n = len(rows.length) if max_instances is None else min(max_instances, len(rows.length))
        return [_line_batch(store, rows, index, vocab, rule, seed, 0, masked_lm_prob)
                for index in line_batch_rows(rows.length[:n], batch_size, None)]
    stream = _masked_instances(obj, store, vocab, range(store.num_documents), max_seq_length, seed,
                               0, 0, short_seq_prob, rule)
    insts = list(itertools.islice(stream, max_instances))
    P = rule.max_predictions_per_seq
    return [collate(insts[i : i + batch_size], max_seq_length, P, vocab.pad_id)
            for i in range(0, len(insts), batch_size)]
