#!/usr/bin/env python
"""Pretraining runs side by side: held-out MLM loss and minimal-pair accuracy at each
evaluation, from each run's metrics.jsonl, as a table and a plot against training minutes.

    python bench/compare_pretraining.py runs/pretrain runs/vocab4096 --plot docs/pairs_vs_minutes.png
    python bench/compare_pretraining.py runs/a runs/b --seconds-per-step 0.287 0.301

Minutes are the run's own wall clock at each evaluation (``elapsed_s``) unless
--seconds-per-step gives each run a pace measured on a quiet machine (a run timed while
the machine was shared reads slower than it is): minutes = step x pace / 60. Each row: the
last evaluation's step, minutes, held-out MLM loss (nats, on the run's own held-out
sequences) and minimal-pair macro accuracy (``pairs_acc``, the ``--eval-pairs`` sample),
and the best pair accuracy of any evaluation with its step. The trigram floor printed and
drawn is the first run's (``pairs_trigram_acc``): the runs compared share their pairs.
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
    p.add_argument("--plot", type=Path, help="write the two-panel PNG here")
    args = p.parse_args(argv)
    labels = args.labels or [r.name for r in args.runs]
    paces = args.seconds_per_step or [None] * len(args.runs)
    if len(labels) != len(args.runs) or len(paces) != len(args.runs):
        p.error("--labels and --seconds-per-step take one value per run")
    if len(set(labels)) != len(labels):
        p.error(f"two runs share a label ({', '.join(labels)}); name them with --labels")
    runs, floor = {}, None
    print("| run | steps | minutes | held-out MLM | pairs acc | best pairs acc (step) |")
    print("|---|---|---|---|---|---|")
    for run, label, pace in zip(args.runs, labels, paces):
        recs = runs[label] = evaluations(run, pace)
        if not recs:
            p.error(f"{run}: no evaluation records in its {METRICS}")
        last = recs[-1]
        scored = [r for r in recs if r.get("pairs_acc") is not None]
        best = max(scored, key=lambda r: r["pairs_acc"]) if scored else None
        if floor is None:        # the first run's: the runs compared share their pairs
            floor = next((r["pairs_trigram_acc"] for r in recs if "pairs_trigram_acc" in r),
                         None)
        print(f"| {label} | {last['step']} | {last['minutes']:.1f} | {last['mlm_loss']:.3f} | "
              + (f"{last.get('pairs_acc', float('nan')):.1f} | {best['pairs_acc']:.1f} "
                 f"({best['step']})" if best else "- | -") + " |")
    if floor is not None:
        print(f"word trigram on the same pairs: {floor:.1f}")
    if args.plot:
        print(f"wrote {plot_pretraining_runs(runs, args.plot, floor)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
