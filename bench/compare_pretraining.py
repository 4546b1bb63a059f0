#!/usr/bin/env python
"""Pretraining runs side by side: held-out MLM loss and minimal-pair accuracy at each
evaluation, from each run's metrics.jsonl, as a table and a plot against training minutes.

    python bench/compare_pretraining.py runs/pretrain runs/vocab4096 --plot docs/pairs_vs_minutes.png
    python bench/compare_pretraining.py runs/a runs/b --seconds-per-step 0.287 0.301
    python bench/compare_pretraining.py runs/a runs/b --probe pairs

Minutes are the run's own wall clock at each evaluation (``elapsed_s``) unless
--seconds-per-step gives each run a pace measured on a quiet machine (a run timed while
the machine was shared reads slower than it is): minutes = step x pace / 60. Each row: the
last evaluation's step, minutes, held-out MLM loss (nats, on the run's own held-out
sequences) and minimal-pair macro accuracy of the probe: ``--probe blimp`` (the default),
``blimp_acc``, the sample of BLiMP's development set, or ``--probe pairs``, ``pairs_acc``,
the ``--eval-pairs`` sample; and the best accuracy of any evaluation with its step. The
unigram and trigram floors printed and drawn are the first run's (``PROBE_unigram_acc``,
``PROBE_trigram_acc``): the runs compared share their pairs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from minibert.runs import METRICS, MetricsLog  # noqa: E402
from minibert.viz import plot_pretraining_runs  # noqa: E402


def evaluations(run: Path, pace: float | None) -> list[dict]:
    """The run's eval records with ``minutes`` added, in step order."""
    out = [r for r in MetricsLog.read(run / METRICS)
           if r.get("kind") == "eval" and "mlm_loss" in r]
    for r in out:
        r["minutes"] = (r["step"] * pace if pace else r["elapsed_s"]) / 60
    return sorted(out, key=lambda r: r["step"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="train_mlm.py run directories")
    p.add_argument("--labels", nargs="+", help="a name per run (default: the directory name)")
    p.add_argument("--seconds-per-step", nargs="+", type=float,
                   help="a quiet machine's pace per run (default: the run's own clock)")
    p.add_argument("--probe", choices=("blimp", "pairs"), default="blimp",
                   help="which minimal pairs: BLiMP dev's sample or our pairs' sample")
    p.add_argument("--plot", type=Path, help="write the two-panel PNG here")
    args = p.parse_args(argv)
    labels = args.labels or [r.name for r in args.runs]
    paces = args.seconds_per_step or [None] * len(args.runs)
    if len(labels) != len(args.runs) or len(paces) != len(args.runs):
        p.error("--labels and --seconds-per-step take one value per run")
    if len(set(labels)) != len(labels):
        p.error(f"two runs share a label ({', '.join(labels)}); name them with --labels")
    key, runs, floors = f"{args.probe}_acc", {}, None
    print(f"| run | steps | minutes | held-out MLM | {args.probe} acc | best {args.probe} acc "
          f"(step) |")
    print("|---|---|---|---|---|---|")
    for run, label, pace in zip(args.runs, labels, paces):
        recs = runs[label] = evaluations(run, pace)
        if not recs:
            p.error(f"{run}: no evaluation records in its {METRICS}")
        last = recs[-1]
        scored = [r for r in recs if r.get(key) is not None]
        best = max(scored, key=lambda r: r[key]) if scored else None
        if floors is None:       # the first run's: the runs compared share their pairs
            floors = {f"word {n}": r[f"{args.probe}_{n}_acc"] for n in ("unigram", "trigram")
                      for r in recs[:1] if f"{args.probe}_{n}_acc" in r}
        print(f"| {label} | {last['step']} | {last['minutes']:.1f} | {last['mlm_loss']:.3f} | "
              + (f"{last.get(key, float('nan')):.1f} | {best[key]:.1f} ({best['step']})"
                 if best else "- | -") + " |")
    for name, value in floors.items():
        print(f"{name} on the same pairs: {value:.1f}")
    if args.plot:
        print(f"wrote {plot_pretraining_runs(runs, args.plot, floors, probe=args.probe)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
