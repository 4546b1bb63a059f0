#!/usr/bin/env python
"""Training steps per second of the default run (``python train_mlm.py``: the tiny preset,
128 sequences, vocab 8192, fast CPU paths on; masked-LM on one line per sequence since
issue 41, packed 32-token MLM + NSP before: ``-- --objective mlm+nsp`` times that shape)
for one or more source trees, back to back on one machine.

    python bench/bench_default_run.py --trees /work/wt-base /work/wt-i41-speed
    python bench/bench_default_run.py --trees A B --steps 300 --rounds 3 --json out.json

Each run is ``train_mlm.py`` of a tree in its own process, with ``PYTHONPATH`` set to that
tree, the default settings but for the length (``--max-steps``) and the cadence of logs,
evaluations and checkpoints (one of each, at the end). The trees take turns, round by
round (A B A B ...), so that drifts in the machine's speed reach all of them. The vocab is
learned once, by the first run, and given to every later run with ``--vocab`` (the same
file the default run learns, so the same batches).

What is timed: the train records' ``elapsed_s`` (seconds since the loop began) between
step ``--skip`` and the last step, so start-up (vocab, token store, baselines), the first
steps (allocation, caches) and the final evaluation and checkpoint are left out. Reported,
one JSON line each: every run's steps/s; then per tree the median steps/s over its rounds,
its ratio to the first tree's, whether its loss curve (every logged ``loss``) equals the
first tree's exactly, and the largest relative difference between the two curves. Equal
bits are to be expected only where both trees run the same operations in the same order;
a change that sums a product in other blocks moves the losses by float32 round-off, which
grows over the steps (docs/reliability.md).

Arguments after ``--`` go to train_mlm.py (e.g. ``-- --preset mini``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", nargs="+", type=Path,
                   default=[Path(__file__).resolve().parents[1]],
                   help="source trees (each holds train_mlm.py and minibert/); default: this one")
    p.add_argument("--steps", type=int, default=150, help="optimizer steps a run (default 150)")
    p.add_argument("--skip", type=int, default=10,
                   help="steps left out of the timing at the start (default 10)")
    p.add_argument("--log-every", type=int, default=10, help="steps between train records")
    p.add_argument("--rounds", type=int, default=2, help="runs of each tree (default 2)")
    p.add_argument("--json", type=Path, help="also write the per-tree summary here")
    p.add_argument("extra", nargs="*", help="train_mlm.py options, after --")
    args = p.parse_args(argv)
    if not 0 <= args.skip < args.steps or args.skip % args.log_every or args.steps % args.log_every:
        p.error("--skip and --steps must be multiples of --log-every, with 0 <= skip < steps")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    for tree in args.trees:
        if not (tree / "train_mlm.py").is_file():
            p.error(f"{tree}: no train_mlm.py there")
    return args


def run_once(tree: Path, out: Path, args, vocab: Path | None) -> list[dict]:
    """One run of ``tree``'s train_mlm.py into ``out``; returns its train records.

    Raises:
        RuntimeError: the run failed (its last output lines are in the message).
    """
    n = str(args.steps)
    cmd = [sys.executable, str(tree / "train_mlm.py"), "--output-dir", str(out),
           "--overwrite", "--no-progress", "--max-steps", n, "--log-every",
           str(args.log_every), "--eval-every", n, "--save-every", n, *args.extra]
    if vocab is not None:
        cmd += ["--vocab", str(vocab)]
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise RuntimeError(f"{tree}: train_mlm.py exited {done.returncode}:\n{tail}")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "train"]


def steps_per_s(train: list[dict], skip: int) -> float:
    """Steps between the record of step ``skip`` (the loop's start when 0) and the last
    record, over the seconds between them."""
    last = train[-1]
    start = next((r for r in train if r["step"] == skip), None) if skip else \
        {"step": 0, "elapsed_s": 0.0}
    if start is None:
        raise RuntimeError(f"no train record at step {skip}")
    return (last["step"] - start["step"]) / (last["elapsed_s"] - start["elapsed_s"])


def summarize(trees, rates: dict, losses: dict) -> list[dict]:
    """Per tree: median steps/s, ratio to the first tree, whether its losses equal the
    first tree's, and their largest relative difference from the first tree's."""
    first = str(trees[0])
    base = statistics.median(rates[first])
    return [{"tree": str(t), "median_steps_per_s": round(statistics.median(rates[str(t)]), 4),
             "runs": [round(r, 4) for r in rates[str(t)]],
             "ratio_to_first": round(statistics.median(rates[str(t)]) / base, 4),
             "same_losses_as_first": losses[str(t)] == losses[first],
             "max_rel_loss_diff_to_first": max(
                 (abs(a - b) / abs(b) for a, b in zip(losses[str(t)], losses[first])),
                 default=0.0)} for t in trees]


def main(argv=None) -> int:
    args = parse_args(argv)
    rates = {str(t): [] for t in args.trees}
    losses: dict = {}
    work = Path(tempfile.mkdtemp(prefix="bench_default_run_"))
    vocab = None
    try:
        for round_ in range(args.rounds):
            for i, tree in enumerate(args.trees):
                out = work / f"run{round_}_{i}"
                train = run_once(tree, out, args, vocab)
                if vocab is None and (out / "vocab.txt").is_file():
                    vocab = Path(shutil.copy(out / "vocab.txt", work / "vocab.txt"))
                rate = steps_per_s(train, args.skip)
                rates[str(tree)].append(rate)
                losses.setdefault(str(tree), [r["loss"] for r in train])
                print(json.dumps({"tree": str(tree), "round": round_,
                                  "steps_per_s": round(rate, 4),
                                  "s_per_step": round(1 / rate, 4)}), flush=True)
                shutil.rmtree(out, ignore_errors=True)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = summarize(args.trees, rates, losses)
    for row in rows:
        print(json.dumps(row))
    if args.json:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from minibert.atomic import atomic_write_json
        atomic_write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
