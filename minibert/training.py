"""THE training loop, shared by every job (pretraining, fine-tuning, benchmarks).

One optimizer step (:func:`train`):

    zero_grad
    for each of k micro-batches:  forward -> backward(dloss = 1/k)    (gradient accumulation)
    all-reduce of the gradients   (data parallelism: the sum over ranks, see below)
    clip the global norm          (the norm is measured even when clipping is off)
    non-finite check              (on the device: a bad step zeroes its gradients and
                                   its learning rate, so the parameters stay as they were)
    optimizer step at the scheduled learning rate (:func:`scheduled_lr`)
    weight average update         (with an EMA of the weights, :mod:`minibert.averaging`)

Nothing in a step reads a device value on the host: losses, metric sums and the
non-finite counters stay on the device and are read at log steps, evaluations and
checkpoints only. Dropout draws from a generator seeded by (seed, step, micro-batch), and
the data position (epoch, batch in epoch) is in every checkpoint together with the
not-yet-logged metric sums, so a run resumed from any checkpoint continues the same loss
curve as an uninterrupted one.

The loop (:func:`train`) around the steps: :func:`step_batches` groups a workload's batches
into steps (the batch-size ramp, steps that end with their epoch); :class:`NonfiniteGuard`
counts bad steps in a row on the device; :class:`LogWindow` adds up what the next
:func:`train_record` reports; evaluations and checkpoints come at their cadence.

A job supplies a :class:`Workload`: what the loop trains on and how, i.e. its batches, its
forward pass with metric sums, how to turn sums into metrics, and optionally an
evaluation (:class:`~minibert.pretraining.job.PretrainingWorkload`,
:class:`~minibert.finetuning.tasks.FinetuningWorkload`). The word "task" is kept for the
fine-tuning and evaluation tasks (sequence classification, tagging, QA).

Data parallelism (:mod:`minibert.distributed`): every rank draws the same global batches
and trains on its slice of rows (:func:`~minibert.distributed.shard_rows`), its backward
weighted by the slice's share of the batch, so that the sum of the ranks' gradients (one
all-reduce of the flat buffer, before clipping) is the gradient of the whole batch's mean
loss. Parameters are broadcast from rank 0 at the start; dropout streams are keyed by
(seed, step, micro-batch x world size + rank). Only rank 0 logs, shows progress,
evaluates and writes checkpoints; the metric sums of all ranks are added at log steps.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np
from tqdm.auto import tqdm

from . import backend
from .averaging import WeightAverage, averaged
from .backend import get_array_module
from .checkpoint import save_checkpoint
from .distributed import Communicator, shard_rows
from .fast import frozen_parameters
from .optim import (clip_grad_norm, decay_phase_start, linear_schedule_with_warmup,
                    warmup_stable_decay_schedule)
from .prefetch import prefetch


class TrainingError(RuntimeError):
    """Training cannot go on (no batch in an epoch, non-finite steps in a row)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or any KeyboardInterrupt) inside :func:`train`, after ``step`` optimizer
    steps; the checkpoint on disk is the last one saved (an atomic write is never torn)."""

    def __init__(self, step: int):
        super().__init__(f"interrupted at step {step}")
        self.step = step


# loop sums that are equal on every rank (the rest are per-rank and added up at log steps)
REPLICATED = frozenset({"loss", "grad_norm", "steps", "skipped"})


class Workload(Protocol):
    """What a job gives the loop to train on: its batches, forward pass and metrics.

    ``batches(epoch, start_batch)`` yields the host batches of one epoch from batch
    ``start_batch`` on, the same ones for the same arguments; each has a host
    ``attention_mask`` (B, T) (to count tokens).
    ``forward(model, batch)`` runs the model with labels and returns (loss, sums): loss a
    0-d device array, sums a dict of 0-d device arrays (e.g. correct predictions) that the
    loop adds up between log steps.
    ``backward(model, dloss)`` (optional) back-propagates the last forward's loss times
    ``dloss`` when the workload computes the loss itself from the model's outputs (e.g. soft
    labels); without it the loop calls ``model.backward(dloss=dloss)``.
    ``summarize(totals)`` turns host totals of those sums (and ``steps``) into metrics.
    ``evaluate(step)`` (may be None) evaluates and returns a record (host floats). A
    workload may also have ``samples`` (None, or a callable returning JSON-able dicts with a
    ``lines(dicts)`` method), written after each evaluation as a "samples" record.
    ``trainer_record()`` returns job fields for the checkpoint (job name, arguments ...).
    """

    def batches(self, epoch: int, start_batch: int) -> Iterator[Any]: ...
    def forward(self, model, batch) -> tuple[Any, dict[str, Any]]: ...
    def summarize(self, totals: dict[str, float]) -> dict[str, float]: ...
    def trainer_record(self) -> dict[str, Any]: ...
    evaluate: Callable[[int], dict] | None


@dataclass
class TrainingConfig:
    """The loop's settings (units: optimizer steps unless stated).

    max_steps: optimizer steps of the run (>= 1). lr: peak learning rate.
    warmup_steps: linear warmup, then (``lr_scheduler_type``) "linear": linear decay to 0
        at max_steps; "warmup_stable_decay": the peak held, then a 1-sqrt decay to 0 over
        the last ``decay_steps`` steps (:func:`scheduled_lr`).
    max_grad_norm: global-norm clipping threshold; 0 = no clipping.
    gradient_accumulation_steps: micro-batches per step (>= 1; fewer in the last step of an
        epoch), each weighted 1/k: the
        step equals one on the k micro-batches together when each holds the same number
        of counted targets (sequences for classification); with MLM the micro-batches'
        mean losses are averaged, as HF's Trainer does.
    batch_size_ramp_steps: over the first this many steps the micro-batches per step grow
        linearly from 1 to ``gradient_accumulation_steps`` (:func:`ramped_accumulation`);
        0 = no ramp.
    seed: the run seed (dropout streams derive from it).
    log_every / eval_every / save_every: cadence; eval and save also happen at the end;
        0 = at the end only.
    max_nonfinite_steps: stop after this many non-finite steps in a row (>= 1).
    log_grad_norms: every N steps a "grad_flow" record (0 = off).
    progress: show a tqdm bar. desc: its label.
    report_to: ``"tensorboard"``: metrics.jsonl's records also as TensorBoard event files
        (:mod:`minibert.reporting`); ``"none"`` (default).
    cuda_graphs: replay the steps from CUDA graphs (:class:`minibert.graphs.GraphedStep`)
        where the run allows it (:func:`minibert.graphs.unsupported`), else train uncaptured
        and say why.
    """

    max_steps: int
    lr: float
    warmup_steps: int = 0
    lr_scheduler_type: str = "linear"
    decay_steps: int = 0
    max_grad_norm: float = 1.0
    gradient_accumulation_steps: int = 1
    batch_size_ramp_steps: int = 0
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0
    save_every: int = 0
    max_nonfinite_steps: int = 5
    log_grad_norms: int = 0
    progress: bool = True
    desc: str = "train"
    report_to: str = "none"
    cuda_graphs: bool = False


@dataclass
class TrainState:
    """Where a run is: ``step`` optimizer steps done; the next micro-batch is batch
    ``batch_in_epoch`` of ``epoch``; ``elapsed_s`` seconds of training so far; ``window``:
    host sums of the steps since the last train record; ``nonfinite_run``: non-finite steps
    in a row up to now, the first of them step ``nonfinite_since`` (0-based);
    ``world_size``: the number of data-parallel ranks that trained it; all kept across a
    resume."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    elapsed_s: float = 0.0
    window: dict[str, float] = field(default_factory=dict)
    nonfinite_run: int = 0
    nonfinite_since: int = 0
    world_size: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainState":
        return cls(int(d.get("step", 0)), int(d.get("epoch", 0)), int(d.get("batch_in_epoch", 0)),
                   float(d.get("elapsed_s", 0.0)), dict(d.get("window") or {}),
                   int(d.get("nonfinite_run", 0)), int(d.get("nonfinite_since", 0)),
                   int(d.get("world_size", 1)))


def resume_state(checkpoint: dict, optimizer, ema: WeightAverage | None = None) -> TrainState:
    """Load a checkpoint's optimizer state into ``optimizer`` (and its weight average into
    ``ema``) and return its TrainState.

    Args:
        checkpoint: :func:`minibert.checkpoint.load_checkpoint`'s dict.
    Raises:
        TrainingError: the optimizer state does not fit the model (moments missing or of
            another shape), or ``ema`` is given and the checkpoint's average is missing
            or does not fit.
    """
    try:
        optimizer.load_state_dict(checkpoint["optim"])
    except (KeyError, ValueError) as e:
        raise TrainingError(f"optimizer state: {e}") from None
    if ema is not None:
        try:
            ema.load_state_dict(checkpoint.get("ema") or {})
        except (KeyError, ValueError) as e:
            raise TrainingError(f"weight average: {e}") from None
    return TrainState.from_dict(checkpoint["trainer"])


def decay_start(cfg: TrainingConfig) -> int | None:
    """The first step (0-based) of a warmup_stable_decay schedule's decay phase
    (:func:`~minibert.optim.decay_phase_start`); None for the linear schedule."""
    if cfg.lr_scheduler_type != "warmup_stable_decay":
        return None
    return decay_phase_start(cfg.warmup_steps, cfg.decay_steps, cfg.max_steps)


def scheduled_lr(step: int, cfg: TrainingConfig) -> float:
    """The learning rate of optimizer step ``step`` (0-based): ``cfg.lr_scheduler_type``
    "linear" (:func:`~minibert.optim.linear_schedule_with_warmup`) or
    "warmup_stable_decay" (:func:`~minibert.optim.warmup_stable_decay_schedule`)."""
    if cfg.lr_scheduler_type == "warmup_stable_decay":
        return warmup_stable_decay_schedule(step, cfg.lr, cfg.warmup_steps, cfg.decay_steps,
                                            cfg.max_steps)
    return linear_schedule_with_warmup(step, cfg.lr, cfg.warmup_steps, cfg.max_steps)


def ramped_accumulation(step: int, k: int, ramp_steps: int) -> int:
    """Micro-batches in optimizer step ``step`` (0-based) of a linear batch-size ramp:
    ceil(k * (step + 1) / ramp_steps) (>= 1 for k >= 1), and k from step ramp_steps - 1 on
    (k without a ramp, ``ramp_steps`` 0). The batch grows from one micro-batch to k:
    Cramming's batch-size schedule (Geiping & Goldstein 2023, "Batch Size Schedule"; their
    ``batch_size_ramp`` raises the accumulation count linearly over a fraction of the
    budget), so early steps are cheap and noisy, later ones large."""
    if ramp_steps <= 0:
        return k
    return min(k, math.ceil(k * (step + 1) / ramp_steps))


def micro_batches(workload: Workload, epoch: int, start: int) -> Iterator[tuple[int, int, Any]]:
    """Endless (epoch, position after this batch, batch) over epochs from (epoch, start).

    Raises:
        TrainingError: an epoch that yields no batch at all.
    """
    while True:
        n = 0
        for batch in workload.batches(epoch, start):
            n += 1
            start += 1
            yield epoch, start, batch
        if n == 0 and start == 0:
            raise TrainingError(f"epoch {epoch} yields no batch: too little data for the "
                                "batch size")
        epoch, start = epoch + 1, 0


def train_step(model, optimizer, workload: Workload, micro: list, step: int, lr: float,
               cfg: TrainingConfig, *, comm: Communicator | None = None,
               device: str | None = None, dropout_rng: backend.DropoutRNG | None = None):
    """One optimizer step over the micro-batches ``micro`` (k = len(micro)); no host read.

    zero_grad -> (forward -> backward(w/k)) per micro-batch -> all-reduce -> clip ->
    non-finite check -> optimizer step at ``lr``. w is this rank's share of the batch
    (1 on one process). A step whose loss or gradient norm is not finite has its
    gradients zeroed and its learning rate set to 0: the parameters stay as they were
    (Adam's moments decay by one step). Zeroing, clipping and the update are whole-buffer
    passes over the optimizer's flat gradient buffer. The host half
    (:func:`prepare_step`: the dropout seeds and, on the GPU, the step's rates copied to
    the device) comes first, then the device half (:func:`device_step`), which a CUDA
    graph can replay (:mod:`minibert.graphs`).

    Args:
        micro: the step's global batches; each rank trains on its rows of each.
        optimizer: :class:`minibert.optim.AdamW` (its ``flat`` buffer holds the grads).
        comm: the data-parallel :class:`~minibert.distributed.Communicator` (None: one
            process). With several ranks the flat gradients and the step's loss are
            summed across ranks before clipping.
        dropout_rng: the run's :class:`~minibert.backend.DropoutRNG` (one is made if None).
    Returns:
        (loss, grad_norm, finite, sums): 0-d device arrays (mean loss over the micro-
        batches and ranks, gradient norm before clipping, whether the step was applied;
        the same on every rank) and this rank's sum of the workload's per-micro-batch sums.
    """
    comm = comm or Communicator()
    rng = dropout_rng or backend.DropoutRNG(device)
    staged = prepare_step(optimizer, len(micro), step, lr, cfg, comm, rng)
    return device_step(model, optimizer, workload, micro, cfg, comm, rng, staged)


def prepare_step(optimizer, k: int, step: int, lr: float, cfg: TrainingConfig,
                 comm: Communicator, rng):
    """The host half of :func:`train_step`: the k micro-batches' dropout seeds (from the
    run seed, the step and the micro-batch, so a resumed run draws the same masks) loaded
    into ``rng``, and the optimizer's rates of the step (:meth:`AdamW.stage`: ``lr`` on the
    CPU, a device buffer on the GPU). Returns what :func:`device_step` takes as ``staged``."""
    rng.load([backend.derive_seed(cfg.seed, step, i * comm.world_size + comm.rank)
              for i in range(k)])
    return optimizer.stage(lr)


def device_step(model, optimizer, workload: Workload, micro: list, cfg: TrainingConfig,
                comm: Communicator, rng, staged):
    """The device half of :func:`train_step`, after :func:`prepare_step` (``staged``: its
    result); launches kernels and reads nothing on the host. Returns train_step's result."""
    flat = optimizer.flat
    xp = get_array_module(flat.grad)
    model.set_dropout_rng(rng)
    optimizer.zero_grad()
    scale = optimizer.loss_scale()          # 1.0, or the dynamic scale of float16 training
    with frozen_parameters():            # no parameter changes until the optimizer step
        loss_sum, sums = _forward_backward(model, workload, micro, rng, comm, scale, xp)
    if comm.world_size > 1:
        comm.allreduce_(flat.grad)
        loss_sum = comm.allreduce_(xp.array(loss_sum, ndmin=1))[0]
    grad = optimizer.unscaled_grad()                                # (S,), float32 or wider
    grad_norm = clip_grad_norm([grad], cfg.max_grad_norm or float("inf"))
    finite = xp.isfinite(grad_norm) & xp.isfinite(loss_sum)
    xp.copyto(grad, 0, where=~finite)                               # NaN * 0 is NaN: zero them
    if xp is np:
        # lr 0 on a bad step; lr cast first, as NumPy 1 would widen a 0-d float32 times a
        # Python float to float64 (NumPy 2 keeps float32)
        optimizer.step(finite.astype(grad.dtype) * grad.dtype.type(staged))
    else:
        optimizer.step(finite.astype(grad.dtype) * staged[0], staged=staged)
    optimizer.update_scale(finite)
    return loss_sum, grad_norm, finite, sums


def _forward_backward(model, workload: Workload, micro: list, rng, comm: Communicator,
                      scale, xp):
    """Forward and backward of this rank's rows of each micro-batch (micro-batch i with
    the dropout seed ``rng.select(i)``), the gradients weighted ``scale`` x (rank's share)
    / k; returns (the weighted loss sum, the workload's per-micro-batch sums added up),
    device values (:func:`train_step`)."""
    world, rank, k = comm.world_size, comm.rank, len(micro)
    backward = getattr(workload, "backward", None)   # a workload that computes its own loss
    loss_sum, sums = 0.0, {}
    for i, batch in enumerate(micro):
        shard, weight = shard_rows(batch, rank, world)
        rng.select(i)
        loss, batch_sums = workload.forward(model, shard)
        if backward is None:
            model.backward(dloss=scale * weight / k)
        else:
            backward(model, scale * weight / k)
        # on the GPU the first term is kept as it is: 0 + v would be a kernel launch
        first = i == 0 and xp is not np
        term = loss * weight / k
        loss_sum = term if first else loss_sum + term
        for key, v in batch_sums.items():   # a stand-in row (weight 0) counts nothing
            v = v if weight else 0 * v
            sums[key] = v if first else sums.get(key, 0) + v
    return loss_sum, sums


def step_batches(workload: Workload, cfg: TrainingConfig, state: TrainState) -> Iterator[list]:
    """The global micro-batches of each optimizer step, from step ``state.step`` on.

    Step s takes ``ramped_accumulation(s, cfg.gradient_accumulation_steps,
    cfg.batch_size_ramp_steps)`` micro-batches in a row, fewer when its epoch runs out
    first: a step ends with its epoch (as HF's Trainer), so an epoch holds a whole number of
    steps and grouping restarts at every epoch. Each batch taken moves ``state.epoch`` /
    ``state.batch_in_epoch`` to the position after it (the first batch of the next epoch,
    looked at to see the epoch end, is held back for the next step). Each rank then trains
    on its rows of every micro-batch (:func:`train_step`).

    A workload whose ``prefetch_batches`` attribute is n > 0 has its batches made up to n
    ahead on a background thread (:mod:`minibert.prefetch`: the same batches in the same
    order); closing this generator (or its end, or an error) stops that thread.

    Raises:
        TrainingError: see :func:`micro_batches`.
    """
    stream = prefetch(micro_batches(workload, state.epoch, state.batch_in_epoch),
                      getattr(workload, "prefetch_batches", 0))
    try:
        pending = None                             # a batch looked at but not yet trained on
        for step in itertools.count(state.step):
            k = ramped_accumulation(step, cfg.gradient_accumulation_steps,
                                    cfg.batch_size_ramp_steps)
            micro = []
            while len(micro) < k:
                item, pending = (pending or next(stream)), None
                state.epoch, state.batch_in_epoch, batch = item
                micro.append(batch)
                if len(micro) < k:
                    pending = next(stream)
                    if pending[0] != state.epoch:
                        break
            yield micro
    finally:
        stream.close()                   # a Prefetcher, or micro_batches' generator itself


class NonfiniteGuard:
    """Counts the non-finite steps in a row on the device, so that a step reads nothing on
    the host; :meth:`check` (a host read) stops the run at the next log step or checkpoint.

    Args:
        xp: the array module of the parameters (numpy or cupy).
        limit: ``cfg.max_nonfinite_steps`` (>= 1). checkpoint_path: named in the error.
        run, since: a resumed :class:`TrainState`'s ``nonfinite_run`` / ``nonfinite_since``.
    Attributes (0-d int64 device arrays): ``run`` non-finite steps in a row up to now, the
    first of them step ``since`` (0-based); ``hit_since`` / ``hit_at`` the first and last
    step of the first run that reached ``limit`` (-1: none yet).
    """

    def __init__(self, xp, limit: int, checkpoint_path, run: int = 0, since: int = 0):
        self.xp, self.limit, self.checkpoint_path = xp, limit, checkpoint_path
        self.run = xp.asarray(run, dtype=xp.int64)
        self.since = xp.asarray(since, dtype=xp.int64)
        self.hit_since = xp.asarray(-1, dtype=xp.int64)
        self.hit_at = xp.asarray(-1, dtype=xp.int64)

    def update(self, step: int, finite, loss, loss_scaled: bool) -> None:
        """Count step ``step`` (0-based) given :func:`train_step`'s ``finite`` and ``loss``.
        With float16 (``loss_scaled``) a gradient overflow at a finite loss is the loss
        scaler's business (it skips the step and halves the scale), not a bad step."""
        xp = self.xp
        ok = finite | (xp.isfinite(loss) if loss_scaled else False)
        self.since = xp.where(ok | (self.run > 0), self.since, step)
        self.run = xp.where(ok, 0, self.run + 1)
        first_hit = (self.hit_at < 0) & (self.run >= self.limit)
        self.hit_since = xp.where(first_hit, self.since, self.hit_since)
        self.hit_at = xp.where(first_hit, step, self.hit_at)

    def check(self, step: int) -> None:
        """Raise TrainingError if ``limit`` non-finite steps came in a row at some step so
        far (``step``: the steps done, named in the message). Reads the device."""
        if int(self.hit_at) >= 0:
            from .runs import checkpoint_job
            ckpt = Path(self.checkpoint_path)  # named only when it exists
            kept = (f"the last checkpoint, {ckpt} (step {checkpoint_job(ckpt)[1]}), holds "
                    "the last good parameters" if ckpt.is_file() else
                    "no checkpoint had been written yet")
            raise TrainingError(
                f"loss or gradient norm not finite in {self.limit} steps in a row "
                f"since step {int(self.hit_since) + 1} (to step {int(self.hit_at) + 1}); stopped "
                f"at step {step} (the updates of non-finite steps were skipped; {kept})")


class LogWindow:
    """What the loop adds up between two train records: device sums of the applied steps'
    loss, gradient norm and workload sums, the counts ``steps`` / ``skipped``, and the host
    count of tokens (attention-mask ones) with the time the window opened (seconds,
    ``time.perf_counter``).

    Args:
        resumed: a checkpoint's window (``TrainState.window``): host sums over all ranks,
            so the per-rank sums restart from 0 on every rank but the leader.
        comm: the data-parallel communicator. xp, dtype: the parameters' array module and
            float dtype (of the step counts).
    """

    def __init__(self, resumed: dict[str, float], comm: Communicator, xp, dtype):
        self.comm, self.xp, self.dtype = comm, xp, dtype
        self.sums: dict[str, Any] = {key: v if comm.is_leader or key in REPLICATED else 0.0
                                     for key, v in resumed.items()}
        self.tokens, self.opened = 0, time.perf_counter()

    def count_tokens(self, micro: list) -> None:
        """Add the real tokens of a step's global micro-batches (their host masks)."""
        for batch in micro:
            self.tokens += int(batch.attention_mask.sum())          # host array

    def add(self, loss, grad_norm, finite, step_sums: dict[str, Any]) -> None:
        """Add one step's :func:`train_step` results (device arithmetic only)."""
        for key, v in (("loss", loss), ("grad_norm", grad_norm), *step_sums.items()):
            self.sums[key] = self.sums.get(key, 0.0) + self.xp.where(finite, v, 0)
        keep = finite.astype(self.dtype)
        self.sums["steps"] = self.sums.get("steps", 0.0) + keep
        self.sums["skipped"] = self.sums.get("skipped", 0.0) + (1 - keep)

    def totals(self) -> dict[str, float]:
        """Host totals over all ranks (a collective: every rank calls it at the same step)."""
        host = {key: float(v) for key, v in self.sums.items()}
        own = sorted(key for key in host if key not in REPLICATED)
        if self.comm.world_size > 1 and own:
            host.update(zip(own, self.comm.allreduce_host([host[key] for key in own]).tolist()))
        return host

    def close(self, now: float) -> tuple[dict[str, float], float]:
        """(:meth:`totals`, tokens per second since the window opened); opens the next."""
        totals, tokens_per_s = self.totals(), round(self.tokens / max(now - self.opened, 1e-9), 1)
        self.sums, self.tokens, self.opened = {}, 0, now
        return totals, tokens_per_s


def train_record(state: TrainState, lr: float, totals: dict[str, float],
                 metrics: dict[str, float], elapsed_s: float, tokens_per_s: float,
                 loss_scale: float | None = None) -> dict[str, Any]:
    """The "train" record of metrics.jsonl (host values, in this key order): step, epoch,
    elapsed_s (seconds), lr, the mean loss over the window's applied steps, the workload's
    ``metrics``, the mean gradient norm, skipped_steps, loss_scale (float16 runs only) and
    tokens_per_s; loss and grad_norm are None when every step of the window was skipped.

    Args:
        state: the run's position after the window's last step.
        totals: :meth:`LogWindow.totals` (sums of ``loss``, ``grad_norm`` over the applied
            steps, counts ``steps`` and ``skipped``).
        metrics: ``workload.summarize(totals)``.
    """
    steps = totals["steps"]                                 # 0 when every step was skipped
    return {"kind": "train", "step": state.step, "epoch": state.epoch, "elapsed_s": elapsed_s,
            "lr": lr, "loss": totals["loss"] / steps if steps else None, **metrics,
            "grad_norm": totals["grad_norm"] / steps if steps else None,
            "skipped_steps": int(totals["skipped"]),
            **({"loss_scale": loss_scale} if loss_scale is not None else {}),
            "tokens_per_s": tokens_per_s}


def _progress_fields(record: dict[str, Any]) -> dict[str, str]:
    """The progress bar's postfix: loss, lr, tokens/s and accuracies of a train record."""
    return {key: f"{v:.3g}" for key, v in record.items()
            if v is not None and (key in ("loss", "lr", "tokens_per_s") or key.endswith("acc"))}


def _due(every: int, step: int, end: bool = False) -> bool:
    """Whether a cadence of ``every`` steps (0: never) falls on ``step``, or it is the end."""
    return end or bool(every and step % every == 0)


class _RunOutputs:
    """What the leader writes as a run goes (metrics.jsonl, the progress bar, the
    checkpoints) and the run's clock: seconds of training, a resumed run's included. On the
    other ranks nothing is written and the bar is hidden; the collectives (the window's
    totals, the checkpoint's record) run on every rank.

    Args:
        model, optimizer, workload, ema: the run's (what the records and checkpoints hold).
        guard, window: the run's :class:`NonfiniteGuard` and :class:`LogWindow`.
    """

    def __init__(self, metrics_path, checkpoint_path, cfg: TrainingConfig, state: TrainState,
                 leader: bool, *, model, optimizer, workload: Workload,
                 guard: NonfiniteGuard, window: LogWindow, ema: WeightAverage | None = None):
        from .runs import MetricsLog

        self.checkpoint_path, self.leader, self.cfg = checkpoint_path, leader, cfg
        self.model, self.optimizer, self.workload, self.ema = model, optimizer, workload, ema
        self.guard, self.window = guard, window
        self.t_start = time.perf_counter() - state.elapsed_s
        self.metrics = (MetricsLog(metrics_path, resume_step=state.step,
                                   report_to=cfg.report_to) if leader else None)
        self.bar = tqdm(total=cfg.max_steps, initial=state.step,
                        disable=not (cfg.progress and leader), desc=cfg.desc, dynamic_ncols=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def write(self, record: dict[str, Any]) -> None:
        if self.leader:
            self.metrics.write(record)

    def after_step(self, state: TrainState, lr: float, grad_norm) -> dict[str, Any] | None:
        """The outputs due once step ``state.step`` is done: the bar moves on, then, where
        their cadences (or the run's end) fall, a "grad_flow" record, a "train" record, an
        evaluation (with the weight average swapped in) and a checkpoint. Returns the
        evaluation record, None when there was none."""
        cfg, step = self.cfg, state.step
        end, record = step == cfg.max_steps, None
        self.bar.update(1)
        if self.leader and _due(cfg.log_grad_norms, step):
            self.grad_flow(step, lr, grad_norm)
        if _due(cfg.log_every, step, end):
            self.guard.check(step)
            self.log_train(state, lr)
        if self.leader and self.workload.evaluate and _due(cfg.eval_every, step, end):
            with averaged(self.ema):
                record = self.log_eval(step)
            self.model.train()
        if _due(cfg.save_every, step, end):
            self.save(state)
        return record

    def grad_flow(self, step: int, lr: float, grad_norm) -> None:
        """Write a "grad_flow" record (:func:`minibert.gradflow.grad_flow_record`)."""
        from .gradflow import grad_flow_record
        self.write(grad_flow_record(step, self.model, self.optimizer, lr, grad_norm))

    def log_train(self, state: TrainState, lr: float) -> None:
        """Close the window into a :func:`train_record` (a collective), write it, show it."""
        now = time.perf_counter()
        totals, tokens_per_s = self.window.close(now)
        optimizer = self.optimizer
        scale = float(optimizer.loss_scale()) if optimizer.scaler is not None else None
        record = train_record(state, lr, totals, self.workload.summarize(totals),
                              round(now - self.t_start, 3), tokens_per_s, scale)
        self.write(record)
        self.bar.set_postfix(_progress_fields(record))

    def log_eval(self, step: int) -> dict[str, Any]:
        """Run ``workload.evaluate(step)`` (leader only), write and print its "eval" record;
        then, for a workload with ``samples``, its "samples" record and lines."""
        record = {"kind": "eval", "step": step, "elapsed_s": round(self.elapsed(), 3),
                  **self.workload.evaluate(step)}
        self.write(record)
        self.bar.write(f"step {step}: " + ", ".join(
            f"{key} {v:.4g}" for key, v in record.items()
            if isinstance(v, float) and key != "elapsed_s"))
        samples = getattr(self.workload, "samples", None)
        if samples is not None:
            filled = samples()
            self.write({"kind": "samples", "step": step, "samples": filled})
            for line in samples.lines(filled):
                self.bar.write(line)
        return record

    def save(self, state: TrainState, path=None) -> None:
        """Check the guard (TrainingError after too many non-finite steps, so that no
        checkpoint holds their parameters), then write the resumable state to ``path``
        (default the checkpoint): parameters, optimizer, the weight average (if any),
        ``workload.trainer_record()`` and ``state`` with the open window and the guard's
        counters (a collective: every rank calls it at the same step; the leader writes)."""
        guard = self.guard
        guard.check(state.step)
        state.window = self.window.totals()
        state.nonfinite_run, state.nonfinite_since = int(guard.run), int(guard.since)
        state.elapsed_s = self.elapsed()
        if self.leader:
            save_checkpoint(path or self.checkpoint_path, self.model, self.optimizer,
                            {**self.workload.trainer_record(), **state.to_dict()},
                            ema=self.ema)

    def close(self) -> None:
        self.bar.close()
        if self.metrics is not None:
            self.metrics.close()


def _share_parameters(optimizer, comm: Communicator) -> None:
    """Start every rank from rank 0's parameters (and float32 master copy).

    Raises:
        TrainingError: the model's parameters no longer alias the optimizer's flat buffer.
    """
    if not optimizer.flat.is_bound():
        raise TrainingError("the model's parameters no longer alias the optimizer's buffer "
                            "(was the model moved after the optimizer was built?)")
    comm.broadcast_(optimizer.flat.data)
    if optimizer.master is not None:
        comm.broadcast_(optimizer.master)


def _start(model, optimizer, cfg: TrainingConfig, state: TrainState, comm: Communicator,
           checkpoint_path) -> tuple["NonfiniteGuard", "LogWindow"]:
    """The loop's start: the parameters shared over the ranks (rank 0's broadcast), the
    world size recorded in ``state``, and the non-finite guard and log window resumed from
    ``state``."""
    _share_parameters(optimizer, comm)
    state.world_size = comm.world_size
    data = model.parameters()[0].data
    xp = get_array_module(data)
    guard = NonfiniteGuard(xp, cfg.max_nonfinite_steps, checkpoint_path, state.nonfinite_run,
                           state.nonfinite_since)
    return guard, LogWindow(state.window, comm, xp, data.dtype)


def plain_step(model, optimizer, workload, cfg, comm, device, rng):
    """:func:`train_step` as the loop calls it: ``f(micro, step, lr)``."""
    return lambda micro, step, lr: train_step(model, optimizer, workload, micro, step, lr, cfg,
                                              comm=comm, device=device, dropout_rng=rng)


def train(model, optimizer, workload: Workload, cfg: TrainingConfig, state: TrainState, *,
          metrics_path, checkpoint_path, comm: Communicator | None = None,
          device: str | None = None, ema: WeightAverage | None = None,
          stable_checkpoint_path=None, make_step=None) -> tuple[TrainState, dict | None]:
    """Train ``model`` from ``state`` to ``cfg.max_steps``; returns the final state and the
    last evaluation record (None without evaluation).

    Args:
        model: a BertPreTrainedModel whose ``backward(dloss=...)`` follows a forward.
        optimizer: :class:`minibert.optim.AdamW` over the model's parameters.
        workload: the job's :class:`Workload`.
        metrics_path: the run's metrics.jsonl (:class:`minibert.runs.MetricsLog`): records
            {"kind": "train" | "eval" | "samples" | "grad_flow", "step", "elapsed_s", ...}
            (an interrupted run's records after ``state.step`` are dropped first).
        checkpoint_path: where the resumable state is saved (atomically).
        comm: the data-parallel :class:`~minibert.distributed.Communicator` (None: one
            process). Rank 0's parameters are broadcast first; only rank 0 writes
            ``metrics_path`` and ``checkpoint_path``, shows progress and evaluates (the
            others return None as the evaluation record).
        ema: a :class:`~minibert.averaging.WeightAverage` updated after every step; it is
            swapped into the model for each evaluation and saved with each checkpoint.
        stable_checkpoint_path: with the warmup_stable_decay schedule, where the state at
            the start of the decay phase is saved (atomically), the point from which a
            longer run continues (:mod:`minibert.pretraining.extension`).
        make_step: ``make_step(model, optimizer, workload, cfg, comm, device, rng)`` gives
            the step the loop calls, ``f(micro, step, lr)`` -> :func:`train_step`'s result
            (:func:`minibert.graphs.step_function` replays it from CUDA graphs with
            ``cfg.cuda_graphs``); default train_step itself.
    Raises:
        TrainingError: the model's parameters no longer alias the optimizer's buffer;
            see :func:`micro_batches`; ``cfg.max_nonfinite_steps`` non-finite steps in a
            row (the last checkpoint holds the last good parameters).
        Interrupted: a KeyboardInterrupt (Ctrl-C), with the steps done.
        WriteError: a checkpoint or metrics line was not written (the last checkpoint stays).
    """
    comm = comm or Communicator()
    guard, window = _start(model, optimizer, cfg, state, comm, checkpoint_path)
    groups, dropout_rng = step_batches(workload, cfg, state), backend.DropoutRNG(device)
    step_fn = (make_step or plain_step)(model, optimizer, workload, cfg, comm, device,
                                         dropout_rng)
    out = _RunOutputs(metrics_path, checkpoint_path, cfg, state, comm.is_leader, model=model,
                      optimizer=optimizer, workload=workload, guard=guard, window=window, ema=ema)
    last_eval, stable_at = None, (decay_start(cfg) if stable_checkpoint_path else None)
    model.train()
    try:
        while (step := state.step) < cfg.max_steps:
            if step == stable_at:          # the state before the first step of the decay
                out.save(state, stable_checkpoint_path)
            lr = scheduled_lr(step, cfg)
            window.count_tokens(micro := next(groups))
            loss, grad_norm, finite, step_sums = step_fn(micro, step, lr)
            if ema is not None:
                ema.update(step)
            guard.update(step, finite, loss, loss_scaled=optimizer.scaler is not None)
            window.add(loss, grad_norm, finite, step_sums)
            state.step += 1
            last_eval = out.after_step(state, lr, grad_norm) or last_eval
    except KeyboardInterrupt:
        raise Interrupted(state.step) from None
    finally:
        groups.close()                     # stops the background batch thread at once
        out.close()
    state.elapsed_s = out.elapsed()
    return state, last_eval
