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
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

SYSTEMS = ("bert", "albert", "albert-E=H")


def config_for(system: str, preset: str, vocab_size: int):
    """The config of ``system`` at ``preset`` (see the module docstring)."""
    from minibert import AlbertConfig, BertConfig
    if system == "bert":
        return BertConfig.from_preset(preset, vocab_size=vocab_size)
    config = AlbertConfig.from_preset(preset, vocab_size=vocab_size)
    if system == "albert-E=H":
        config = AlbertConfig.from_preset(preset, vocab_size=vocab_size,
                                          embedding_size=config.hidden_size)
    return config


def one(system: str, preset: str, B: int, T: int, V: int, warmup: int, steps: int) -> dict:
    """Build and step one system in this process: its figures."""
    from bench_memory import rss_mib
    from bench_train_step import FixedBatchTask, make_batch
    from minibert import backend
    from minibert.auto import model_class
    from minibert.modeling import BertForPreTraining
    from minibert.optim import AdamW
    from minibert.training import TrainingConfig, train_step
    backend.set_device("cpu")
    config = config_for(system, preset, V)
    model = model_class(config, BertForPreTraining)(config)
    _, batch = make_batch(np.random.default_rng(0), B, T, V)
    if system != "bert":             # ALBERT's sentence head is sentence-order prediction
        batch["sentence_order_label"] = batch.pop("next_sentence_label")
    opt = AdamW(model.named_parameters(), lr=1e-4)
    task = FixedBatchTask(batch)
    cfg = TrainingConfig(max_steps=1, lr=1e-4, max_grad_norm=1.0)
    setup = rss_mib()
    times, loss = [], None
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss, *_ = train_step(model, opt, task, [None], i, 1e-4, cfg, device="cpu")
        loss = float(loss)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024       # KiB -> MiB
    return {"system": system, "preset": preset, "parameters": model.num_parameters(),
            "embedding_size": getattr(config, "embedding_size", config.hidden_size),
            "hidden_size": config.hidden_size, "layers": config.num_hidden_layers,
            "step_s": statistics.median(times), "tokens_per_s": B * T / statistics.median(times),
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
    sizes = (args.batch_size, args.seq_len, args.vocab_size, args.warmup, args.steps)
    if args.one:  # a child process: one system, one preset
        print(json.dumps(one(args.one, args.presets[0], *sizes)))
        return 0
    for preset in args.presets:
        for r in range(args.rounds):
            rows = {}
            for system in SYSTEMS:
                out = subprocess.run(
                    [sys.executable, __file__, "--one", system, "--presets", preset,
                     "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
                     "--vocab-size", str(args.vocab_size), "--warmup", str(args.warmup),
                     "--steps", str(args.steps)],
                    check=True, capture_output=True, text=True).stdout
                rows[system] = json.loads(out.strip().splitlines()[-1])
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
