#!/usr/bin/env python
"""What ALBERT's parameter sharing and factorised embeddings buy and cost against BERT of
the same width (issue 28): parameters, seconds per pretraining step and peak memory.

    python bench/bench_albert.py                          # the default run's shape, tiny
    python bench/bench_albert.py --presets tiny mini --rounds 2

Systems, each at a --presets size (BERT's table for BERT, ALBERT's for ALBERT: same layers,
hidden width and heads):
  bert          BertForPreTraining, MLM + NSP (train_mlm.py's default)
  albert        AlbertForPreTraining at its preset embedding width E (tiny: 64), MLM + SOP
  albert-E=H    the same with E = hidden size: sharing alone, no factorisation

Each system steps in a fresh Python process (forward, backward, clipping, AdamW: the step of
minibert.training that every job runs) on one fixed batch of the default pretraining shape
(--batch-size 128 x --seq-len 32, vocab --vocab-size 8192, 15% masked), float32, dropout on,
on the CPU. It times --steps steps after --warmup untimed ones and reports the median
seconds per step, and its peak resident set minus its resident set after set-up (what the
steps add: activations, gradients, optimizer state, scratch; ``ru_maxrss``). The processes
take turns, --rounds rounds, so a drift in the machine's speed reaches every system; each
round prints the ALBERT / BERT ratios of that round.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_train_step import run_child  # noqa: E402

SYSTEMS = ("bert", "albert", "albert-E=H")


def config_for(system: str, preset: str, vocab_size: int):
    """The config of ``system`` at ``preset`` (see the module docstring)."""
    from minibert import AlbertConfig, BertConfig
    if system == "bert":
        return BertConfig.from_preset(preset, vocab_size=vocab_size)
    config = AlbertConfig.from_preset(preset, vocab_size=vocab_size)
    if system == "albert-E=H":
        config = dataclasses.replace(config, embedding_size=config.hidden_size)
    return config


def one(system: str, preset: str, B: int, T: int, V: int, warmup: int, steps: int) -> dict:
    """Build and step one system in this process (bench_train_step's minibert step on its
    batch): its figures."""
    from bench_memory import rss_mib
    from bench_train_step import make_batch, minibert_step_fn
    config = config_for(system, preset, V)
    _, batch = make_batch(np.random.default_rng(0), B, T, V)
    step = minibert_step_fn(config, batch, "cpu")
    setup = rss_mib()
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024       # KiB -> MiB
    median = statistics.median(times)
    return {"system": system, "preset": preset, "parameters": step.model.num_parameters(),
            "embedding_size": getattr(config, "embedding_size", config.hidden_size),
            "hidden_size": config.hidden_size, "layers": config.num_hidden_layers,
            "step_s": median, "tokens_per_s": B * T / median,
            "step_added_mib": round(peak - setup, 1), "peak_rss_mib": round(peak, 1),
            "loss": round(loss, 4)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["tiny"])
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        p.error("--steps and --rounds must be >= 1, --warmup >= 0")
    sizes = (args.batch_size, args.seq_len, args.vocab_size, args.warmup, args.steps)
    if args.one:  # a child process: one system, one preset
        print(json.dumps(one(args.one, args.presets[0], *sizes)))
        return 0
    for preset in args.presets:
        for r in range(args.rounds):
            rows = {}
            for system in SYSTEMS:
                rows[system] = run_child(
                    __file__, system, preset, batch_size=args.batch_size,
                    seq_len=args.seq_len, vocab_size=args.vocab_size, warmup=args.warmup,
                    steps=args.steps)
                print(json.dumps(dict(rows[system], round=r + 1)))
            b = rows["bert"]
            print(json.dumps({"preset": preset, "round": r + 1, "vs": "bert", **{
                s: {"parameters": round(rows[s]["parameters"] / b["parameters"], 3),
                    "step_s": round(rows[s]["step_s"] / b["step_s"], 3),
                    "step_added_mib": round(rows[s]["step_added_mib"]
                                            / max(b["step_added_mib"], 1e-9), 3)}
                for s in SYSTEMS[1:]}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
