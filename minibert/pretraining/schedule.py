"""The masking-rate schedule (``--masked-lm-prob-end``): the rate moves linearly from
``--masked-lm-prob`` to the end rate over the run, as a function of the optimizer step a
batch belongs to.

GPT-BERT (Charpentier & Samuel 2024, the BabyLM 2024 winner; repository davda54/babylm-v2,
``apply_mask``) lowers the rate from 30% to 15%: ``mask_p = start + (end - start) * step /
max_steps`` with ``step`` the steps done before the batch, and validates at the end rate.
:func:`masked_lm_prob_at` is that formula.

Which step a batch belongs to is decided by the training loop's grouping of micro-batches
into steps (:func:`minibert.training.step_batches`: ``ramped_accumulation(step, ...)``
micro-batches a step, a step ends with its epoch). :class:`BatchSteps` follows the same
rule along the batch stream from a known position (a fresh run's (step 0, epoch 0, batch 0),
or a resumed run's :class:`~minibert.training.TrainState`), so the rate of every batch is a
function of the run's settings and its position only: a resumed run masks each batch as the
uninterrupted run did.
"""
from __future__ import annotations

from ..training import ramped_accumulation

__all__ = ["BatchSteps", "masked_lm_prob_at"]


def masked_lm_prob_at(step: int, start: float, end: float | None, max_steps: int) -> float:
    """The masking rate of a batch of optimizer step ``step`` (0-based):
    ``start + (end - start) * min(step, max_steps) / max_steps`` (GPT-BERT's ``apply_mask``),
    ``start`` when ``end`` is None. Step 0 masks at ``start``; the rate reaches ``end`` at
    ``max_steps`` (the rate the held-out batches use). Raises ValueError for max_steps < 1."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if end is None:
        return start
    return start + (end - start) * min(step, max_steps) / max_steps


class BatchSteps:
    """The optimizer step of each micro-batch of the stream, from a known position on.

    Args:
        step, epoch, batch_in_epoch: the position: the next batch (batch ``batch_in_epoch``
            of ``epoch``) is the first of step ``step`` (what a
            :class:`~minibert.training.TrainState` holds after any whole step).
        accumulation, ramp_steps: ``gradient_accumulation_steps`` and
            ``batch_size_ramp_steps`` of the :class:`~minibert.training.TrainingConfig`.

    Call :meth:`start_epoch` when the loop asks for the batches of (epoch, start_batch),
    :meth:`next_batch` for each batch in order, :meth:`end_epoch` when the epoch runs out.
    """

    def __init__(self, step: int, epoch: int, batch_in_epoch: int, accumulation: int,
                 ramp_steps: int = 0):
        self.step, self.epoch, self.batch = int(step), int(epoch), int(batch_in_epoch)
        self.accumulation, self.ramp_steps = int(accumulation), int(ramp_steps)
        self.taken = 0                        # micro-batches of self.step handed out so far

    def start_epoch(self, epoch: int, start_batch: int) -> None:
        """Check that the stream goes on where this counter is.

        Raises:
            ValueError: (epoch, start_batch) is not the next position (the batches were
                asked for out of order: their steps, and so their rates, are unknown).
        """
        if (epoch, start_batch) != (self.epoch, self.batch):
            raise ValueError(f"batches asked for at epoch {epoch}, batch {start_batch}; the "
                             f"masking-rate schedule is at epoch {self.epoch}, batch "
                             f"{self.batch}")

    def next_batch(self) -> int:
        """The step of the next batch of the epoch (and count it)."""
        if self.taken == ramped_accumulation(self.step, self.accumulation, self.ramp_steps):
            self.step, self.taken = self.step + 1, 0
        self.taken += 1
        self.batch += 1
        return self.step

    def end_epoch(self) -> None:
        """The epoch ran out: a step begun in it ends with it (the loop's rule)."""
        if self.taken:
            self.step, self.taken = self.step + 1, 0
        self.epoch, self.batch = self.epoch + 1, 0
