"""Runs that can go on: ``train_mlm.py --resume DIR --max-steps N`` with a larger N, and the
options of the learning-rate schedule and the weight average that go with it.

A run whose loss still falls at its end is worth more steps. With the linear schedule
(``--lr-scheduler-type linear``, the default) the learning rate has already decayed to 0
by then, and no later schedule continues that curve, so a larger ``--max-steps`` is
refused with an ``error:`` line that says what to do instead. With
``--lr-scheduler-type warmup_stable_decay`` (MiniCPM, Hu et al. 2024, section 4.1) the rate
is held at its peak until the last ``--decay-ratio`` of the steps (10% by default: MiniCPM
decays over about 10% of a run), and nothing before that decay depends on where the run
ends. The run keeps ``checkpoint-stable.npz``, its state at the first step of the decay
(:func:`minibert.training.train`), and a larger ``--max-steps`` then:

* continues from ``checkpoint.npz`` when the run has not entered its decay phase yet;
* goes back to ``checkpoint-stable.npz`` when it has (or is finished): the records of the
  steps after it are dropped from metrics.jsonl (:class:`minibert.runs.MetricsLog`,
  rewritten atomically) and the finished run's summary.json is removed;

and in both cases the decay is planned again at the new end. Each step then sees the same
batch, masks, dropout and learning rate as in a run planned for N steps from the start
with the same warmup, so the two agree bit for bit
(``tests/test_train_mlm.py::test_an_extended_run_is_the_run_planned_for_the_longer_schedule``).

Pinned to the first run's values when a run is extended (they would otherwise move with
``--max-steps``): ``--warmup-steps`` (its default, 10% of ``--max-steps``, is resolved
once and kept in args.json like every argument), the batch-size ramp
(``--batch-size-ramp`` is a share of the first run's ``--max-steps``; the steps it spans
are kept in the checkpoint as ``batch_size_ramp_steps``) and the masking-rate schedule
(``--masked-lm-prob-end``: the rate reaches its end at the first run's ``--max-steps``,
kept in the checkpoint as ``masked_lm_prob_steps``, and stays there for the steps added),
so the steps the first run planned see the masks they saw there
(:func:`pinned_schedule`). An extended run equals a run planned for N steps only when
that run is given the same ``--warmup-steps``, no ramp and a constant masking rate.
Any other setting still cannot change on ``--resume``.
"""
from __future__ import annotations

import math

from ..checkpoint import CheckpointError, load_checkpoint, rewrite_checkpoint
from ..cli import float_in
from ..optim import decay_phase_start
from ..runs import RunError


def add_schedule_arguments(g) -> None:
    """``--lr-scheduler-type``, ``--decay-ratio`` and ``--ema-decay`` on the argparse
    group ``g`` (the ranges of :attr:`PretrainingConfig.CHECKS`)."""
    g.add_argument("--lr-scheduler-type", choices=["linear", "warmup_stable_decay"],
                   default="linear", help="after the warmup: linear decay to 0, or the "
                   "peak held, then a 1-sqrt decay over the last --decay-ratio of the steps "
                   "(MiniCPM's WSD); only a warmup_stable_decay run can be extended with "
                   "--resume DIR --max-steps N (README: resuming)")
    g.add_argument("--decay-ratio", type=float_in(0.0, 1.0, low_open=True, high_open=True),
                   default=0.1, help="warmup_stable_decay: share of --max-steps decayed")
    g.add_argument("--ema-decay", type=float_in(0.0, 1.0, high_open=True), default=0.0,
                   help="keep an exponential moving average of the weights with this decay "
                   "(GPT-BERT: 0.999), used to evaluate and in the saved model; 0: off")


def decay_steps(decay_ratio: float, max_steps: int) -> int:
    """Steps of the warmup_stable_decay schedule's decay phase: ceil(decay_ratio x
    max_steps), at least 1 (a ceiling, so that the decay's start never moves back when
    ``max_steps`` grows)."""
    return max(1, math.ceil(decay_ratio * max_steps))


def _stable_phase_end(cfg, max_steps: int) -> int:
    """The decay's first step (0-based) of ``cfg``'s schedule planned for ``max_steps``."""
    return decay_phase_start(cfg.warmup_steps, decay_steps(cfg.decay_ratio, max_steps),
                             max_steps)


def check_extension(cfg, resumed: dict, stable_path) -> dict | None:
    """Whether the resumed run may go on to ``cfg.max_steps`` and from where.

    Args:
        cfg: the options, with the run's own (:func:`minibert.runs.resume_args`).
        resumed: the run's checkpoint (:func:`~minibert.checkpoint.load_checkpoint`).
        stable_path: the run's ``checkpoint-stable.npz``.
    Returns:
        None: continue from ``resumed`` (no change of ``--max-steps``, or a longer run that
        has not entered its decay phase); else the stable-phase checkpoint to go back to.
    Raises:
        RunError: a smaller ``--max-steps``; a larger one with the linear schedule; a run
            in its decay phase whose stable-phase checkpoint is missing, unreadable or not
            at the decay's first step.
    """
    planned = int(resumed["trainer"].get("args", {}).get("max_steps", cfg.max_steps))
    if cfg.max_steps == planned:
        return None
    if cfg.max_steps < planned:
        raise RunError(f"--max-steps {cfg.max_steps}: the run is planned for {planned} "
                       "steps; a resumed run can go on longer, not stop sooner")
    if cfg.lr_scheduler_type != "warmup_stable_decay":
        raise RunError(f"--max-steps {cfg.max_steps}: the run's learning rate decays "
                       f"linearly to 0 at step {planned}, so no longer run continues its "
                       "curve; a run started with --lr-scheduler-type warmup_stable_decay "
                       "can be extended (or start a new run from these weights with "
                       "--init-checkpoint)")
    step, start = int(resumed["trainer"].get("step", 0)), _stable_phase_end(cfg, planned)
    if step <= start:
        return None
    try:
        stable = load_checkpoint(stable_path)
    except CheckpointError as e:
        raise RunError(f"--max-steps {cfg.max_steps}: the run is in its decay phase (step "
                       f"{step} of {planned}) and goes back to the start of it, but {e}") from None
    if int(stable["trainer"].get("step", -1)) != start:
        raise RunError(f"--max-steps {cfg.max_steps}: {stable_path} holds step "
                       f"{stable['trainer'].get('step')}, not step {start} where the decay "
                       "of the run's schedule starts")
    return stable


def extend_run(cfg, run, resumed: dict, stable: dict | None, leader: bool) -> dict:
    """The checkpoint an extended run goes on from (``stable`` if given, else ``resumed``);
    says so on stdout. The leader first writes that checkpoint as checkpoint.npz
    (atomically) with ``--max-steps`` N in its arguments, so that the run directory never
    holds a checkpoint past records that were dropped and a plain ``--resume`` after an
    interruption goes on to step N; and removes the finished run's summary.json.

    Raises:
        WriteError: checkpoint.npz cannot be written."""
    planned = int(resumed["trainer"].get("args", {}).get("max_steps", cfg.max_steps))
    if cfg.max_steps == planned:
        return resumed
    where = (f"from the start of its decay phase, step {stable['trainer']['step']} "
             f"({run.stable_checkpoint}; the records after it are dropped)"
             if stable is not None else f"from step {resumed['trainer'].get('step')}")
    print(f"extending the run from {planned} to {cfg.max_steps} steps, {where}; the decay "
          f"is planned again to end at step {cfg.max_steps}")
    source = stable if stable is not None else resumed
    if leader:   # the values the first --max-steps fixed, before it changes
        trainer = {**source["trainer"], **pinned_schedule(cfg, source)}
        trainer["args"] = {**trainer.get("args", {}), "max_steps": cfg.max_steps}
        rewrite_checkpoint(run.checkpoint if stable is None else run.stable_checkpoint,
                           run.checkpoint, trainer)
        run.summary.unlink(missing_ok=True)
    return source


def pinned_schedule(cfg, resumed: dict | None) -> dict:
    """The schedule values fixed by a run's first ``--max-steps``, which a larger one on
    ``--resume`` leaves as they were (they go into the trainer record of each checkpoint):

    * ``batch_size_ramp_steps``: the steps of the batch-size ramp, --batch-size-ramp x
      the first --max-steps;
    * ``masked_lm_prob_steps`` (only with ``--masked-lm-prob-end``): the step at which the
      masking rate reaches its end rate (:func:`~.schedule.masked_lm_prob_at`), the
      first --max-steps; past it the end rate holds.

    A new run (``resumed`` None) takes them from ``cfg``; a resumed one from its
    checkpoint, or, for a checkpoint written before a value was recorded, from the
    --max-steps in its arguments (the run's own unless it was extended since).
    """
    trainer = {} if resumed is None else resumed["trainer"]
    first = int(trainer.get("args", {}).get("max_steps", cfg.max_steps))
    pinned = {"batch_size_ramp_steps": int(trainer.get(
        "batch_size_ramp_steps", round(cfg.batch_size_ramp * first)))}
    if cfg.masked_lm_prob_end is not None:
        pinned["masked_lm_prob_steps"] = int(trainer.get("masked_lm_prob_steps", first))
    return pinned
