"""What every pretraining objective provides: its segments, and the metrics of its outputs.

An objective decides two things. On the data side, how a token store is cut into
unmasked sequences (:meth:`Objective.segments`); the MLM corruption that follows is the
same for every objective (:func:`minibert.pretraining.masking.create_masked_lm_predictions`).
On the model side, which sentence-level task the two-way head learns (``sentence_task``:
``"nsp"``, ``"sop"``, or None for a model built with ``seq_relationship_head=False``), and
the device-side sums from which the metrics of a batch are computed (:meth:`Objective.stats`,
then :meth:`Objective.summarize` on the host).

Shape legend: B = batch, T = sequence length, P = prediction slots per sequence,
V = vocabulary size, L = one segment's length, D = documents.
"""
from __future__ import annotations

import abc
import math
from typing import TYPE_CHECKING, Iterator, NamedTuple, Sequence

import numpy as np

from ..backend import get_array_module

if TYPE_CHECKING:  # the store lives in minibert.pretraining, which imports this package
    from ..pretraining.corpus import TokenStore

__all__ = ["Objective", "Segment", "segment_rng"]

# First word of the SeedSequence entropy of the generators that cut documents into
# segments (minibert.pretraining.batches keeps the tags of its own generators apart).
_TAG_SEGMENTS = 101


def segment_rng(seed: int, copy: int, document: int) -> np.random.Generator:
    """The generator of the segment draws for one document: seeded by (seed, copy, document)
    only, so a document's segments never depend on the draws made for other documents."""
    return np.random.default_rng([_TAG_SEGMENTS, seed, copy, document])


class Segment(NamedTuple):
    """One unmasked sequence, ready for masking.

    input_ids: (L,) int32, starting with [CLS] and ending with [SEP].
    token_type_ids: (L,) int8, 0 for the first segment, 1 for the second.
    label: the sentence-level label (0 or 1), or None when the objective has no sentence task.
    document: index in the store of the document the sequence starts in.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    label: int | None
    document: int


class Objective(abc.ABC):
    """A pretraining objective: masked-LM plus, optionally, a sentence-level task.

    Class attributes:
        name: the registry key (``--objective`` value), e.g. ``"mlm+nsp"``.
        sentence_task: ``"nsp"``, ``"sop"`` or None; None means the model has no
            sentence-level head (``BertForPreTraining(..., seq_relationship_head=False)``)
            and batches carry no ``next_sentence_label``.
        min_documents: the fewest documents a store must hold for :meth:`segments`.
        min_documents_reason: why (quoted in the error when a store has too few).
        min_seq_length: the smallest ``max_seq_length`` :meth:`segments` accepts.

    A new objective is a subclass in its own module plus an entry in
    :data:`minibert.objectives.OBJECTIVES`.
    """

    name: str
    sentence_task: str | None
    min_documents: int = 1
    min_documents_reason: str = "there must be text to train on"
    min_seq_length: int = 3

    @abc.abstractmethod
    def segments(self, store: "TokenStore", doc_order: Sequence[int], max_seq_length: int, *,
                 short_seq_prob: float, seed: int, copy: int, cls_id: int,
                 sep_id: int) -> Iterator[Segment]:
        """Cut the documents, visited in ``doc_order``, into unmasked segments.

        Contract (what makes ``start_batch`` resumption exact and the masks reproducible):
        the output is a function of the arguments only, and the segments that start in one
        document come out one after the other. Random draws for document ``d`` come from
        :func:`segment_rng` (seed, copy, d).

        Inputs:
            store: the documents (a ``TokenStore`` or a view on one).
            doc_order: (D',) document indices in visiting order.
            max_seq_length: T, the longest segment, [CLS] and [SEP] included.
            short_seq_prob: probability of a shorter target length (objectives that
                always fill the sequence ignore it).
            seed, copy: select the random draws (copy = the pass, ``epoch % dupe_factor``).
            cls_id, sep_id: ids of [CLS] and [SEP].
        Yields:
            :class:`Segment` with L <= max_seq_length.
        Raises:
            ValueError: max_seq_length < ``min_seq_length``.
        """

    def build_model(self, config, *, seed: int = 0, dtype=np.float32, **kwargs):
        """The model this objective trains: a :class:`~minibert.modeling.BertForPreTraining`
        (an :class:`~minibert.albert.AlbertForPreTraining` for an ALBERT ``config``) with
        the sentence-level head exactly when there is a sentence task. ``kwargs`` (e.g.
        ``label_smoothing``) go to the model."""
        from ..auto import model_class
        from ..modeling import BertForPreTraining
        return model_class(config, BertForPreTraining)(
            config, seed=seed, dtype=dtype, seq_relationship_head=self.sentence_task is not None,
            **kwargs)

    def check_max_seq_length(self, max_seq_length: int) -> None:
        """Raises ValueError when ``max_seq_length`` is below ``min_seq_length``."""
        if max_seq_length < self.min_seq_length:
            raise ValueError(f"objective {self.name!r}: max_seq_length must be at least "
                             f"{self.min_seq_length}, got {max_seq_length}")

    def stats(self, outputs, inputs: dict) -> dict:
        """Per-batch sums for the metrics, computed on the device (no host read).

        Inputs:
            outputs: a ``BertForPreTrainingOutput`` of a forward with labels: ``mlm_loss``
                (0-d, mean nats per counted slot), ``prediction_logits`` (B, P, V) and, with
                a sentence task, ``seq_relationship_loss`` (0-d) and
                ``seq_relationship_logits`` (B, 2).
            inputs: the keyword arguments of that forward (``PretrainingBatch.model_inputs()`` moved
                to the device): ``masked_lm_ids`` (B, P) int, ``masked_lm_weights`` (B, P)
                and, with a sentence task, ``next_sentence_label`` (B,) int.
        Returns:
            dict of 0-d arrays on the inputs' device: ``mlm_loss_sum`` (nats),
            ``mlm_correct``, ``mlm_count`` (slots of weight > 0) and, for a sentence task
            ``t``, ``t_loss_sum``, ``t_correct``, ``t_count``. Sum them over batches, convert
            to floats at the edge, and pass the totals to :meth:`summarize`.
        """
        xp = get_array_module(outputs.prediction_logits)
        real = inputs["masked_lm_weights"] > 0                                  # (B, P)
        predicted = outputs.prediction_logits.argmax(axis=-1)                   # (B, P)
        count = real.sum()
        out = {
            "mlm_loss_sum": outputs.mlm_loss * count,
            "mlm_correct": ((predicted == inputs["masked_lm_ids"]) & real).sum(),
            "mlm_count": count,
        }
        if self.sentence_task is not None:
            label = inputs["next_sentence_label"]                                # (B,)
            t = self.sentence_task
            out[f"{t}_loss_sum"] = outputs.seq_relationship_loss * label.shape[0]
            out[f"{t}_correct"] = (outputs.seq_relationship_logits.argmax(axis=-1) == label).sum()
            # made on the device (a fill), not copied from the host: a step captured as a
            # CUDA graph may not copy host data
            out[f"{t}_count"] = xp.full((), label.shape[0], dtype=count.dtype)
        return {k: xp.asarray(v) for k, v in out.items()}  # NumPy reductions give scalars

    @property
    def metric_tasks(self) -> tuple[str, ...]:
        """The prefixes ``t`` whose ``t_loss_sum``, ``t_correct`` and ``t_count`` sums
        :meth:`stats` gives and :meth:`summarize` turns into ``t_loss`` and ``t_acc``:
        ``"mlm"``, then the sentence task if there is one."""
        return ("mlm",) + ((self.sentence_task,) if self.sentence_task else ())

    def summarize(self, totals: dict) -> dict:
        """Host means from summed :meth:`stats`.

        Inputs:
            totals: the ``stats`` keys summed over batches, as Python floats.
        Returns:
            for each ``t`` of :attr:`metric_tasks`, ``t_loss`` (nats per counted item:
            prediction for ``mlm``, sequence for a sentence task) and ``t_acc``; nan where
            the count is 0.
        """
        out = {}
        for t in self.metric_tasks:
            n = totals[f"{t}_count"]
            out[f"{t}_loss"] = totals[f"{t}_loss_sum"] / n if n else math.nan
            out[f"{t}_acc"] = totals[f"{t}_correct"] / n if n else math.nan
        return out

    def __repr__(self) -> str:
        return f"<objective {self.name!r}>"
