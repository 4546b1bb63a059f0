#!/usr/bin/env python
"""Peak resident memory of a pretraining step: minibert against PyTorch doing the same
work (issue 11: "Peak RSS of a pretraining step <= PyTorch's for the same config").

    python bench/bench_memory.py                      # mini, batch 32 x 128, vocab 30522
    python bench/bench_memory.py --presets tiny mini small --steps 3

Each system runs in a fresh Python process (so neither sees the other's allocations or
libraries): it builds the model of the preset, the optimizer and the batch of
bench_train_step.py (float32, dropout on, 15% masked, AdamW + clipping), records its
resident set after that set-up, runs --steps full training steps, and reports the peak
resident set of the process (``getrusage(RUSAGE_SELF).ru_maxrss``, which includes the
libraries each system loads: NumPy/BLAS against torch) and the peak minus the set-up
figure (what the steps themselves add: activations, gradients, optimizer state, scratch).
The peer is bench_train_step.py's equal-work PyTorch step (transformers' modules, the MLM
head on the masked rows only). One JSON line per preset and system, then the ratios.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_train_step import run_child  # noqa: E402


def rss_mib() -> float:
    """The current resident set of this process in MiB (from /proc/self/statm)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2 ** 20


def one(system: str, preset: str, B: int, T: int, V: int, steps: int) -> dict:
    """Build and step one system in this process; its memory figures in MiB."""
    from bench_train_step import make_batch, minibert_step_fn, torch_step_fn
    from minibert import BertConfig
    if system == "pytorch":
        import torch
        torch.manual_seed(0)
    config = BertConfig.from_preset(preset, vocab_size=V)
    hf_batch, our_batch = make_batch(np.random.default_rng(0), B, T, V)
    step = (minibert_step_fn(config, our_batch, "cpu") if system == "minibert"
            else torch_step_fn(config, hf_batch, "cpu", equal_work=True))
    setup = rss_mib()
    losses = [step() for _ in range(steps)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024       # KiB -> MiB
    return {"preset": preset, "system": system, "batch": [B, T], "vocab_size": V,
            "steps": steps, "rss_after_setup_mib": round(setup, 1),
            "peak_rss_mib": round(peak, 1), "peak_minus_setup_mib": round(peak - setup, 1),
            "final_loss": round(losses[-1], 4)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["mini"])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--one", choices=["minibert", "pytorch"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:  # a child process: one system, one preset
        print(json.dumps(one(args.one, args.presets[0], args.batch_size, args.seq_len,
                             args.vocab_size, args.steps)))
        return 0
    for preset in args.presets:
        rows = {}
        for system in ("minibert", "pytorch"):
            rows[system] = run_child(__file__, system, preset, batch_size=args.batch_size,
                                     seq_len=args.seq_len, vocab_size=args.vocab_size,
                                     steps=args.steps)
            print(json.dumps(rows[system]))
        m, t = rows["minibert"], rows["pytorch"]
        print(json.dumps({"preset": preset,
                          "peak_rss_ratio": round(m["peak_rss_mib"] / t["peak_rss_mib"], 3),
                          "step_added_ratio": round(m["peak_minus_setup_mib"]
                                                    / max(t["peak_minus_setup_mib"], 1e-9), 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
