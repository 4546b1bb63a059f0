#!/usr/bin/env python
"""Data-parallel scaling on one machine: one process with T BLAS threads against
``mpirun -np 2`` with T/2 threads per rank, on the same global batch, through
minibert.training's step; plus the all-reduce's share of the step and its cost per MB.

    python bench/bench_distributed.py                   # tiny and mini, 2 threads in all
    python bench/bench_distributed.py --presets mini --steps 10 --json out.json

Each configuration runs in fresh processes (BLAS reads its thread count at start-up):
``OMP_NUM_THREADS=T python this --worker`` and ``mpirun -np 2 -x OMP_NUM_THREADS=T/2 python
this --worker``. Batch 32 x 128 tokens, vocab 30522, float32, dropout on, clipping and
AdamW, as bench_train_step.py. Reported: median step time over --steps timed steps after 2
untimed, global tokens/s (B*T / step), the all-reduce's time per step (rank 0's wall time in
the gradient and loss all-reduces, waiting for the slower rank included) and bytes per step,
and a sweep of all-reduce times per MB between 2 ranks, over shared memory (Open MPI's
default on one machine) and over TCP loopback (``--mca btl tcp,self``, as between machines).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from minibert.distributed import OPEN_MPI_AS_ROOT

HERE = Path(__file__).resolve().parent
MPI_ENV = {**OPEN_MPI_AS_ROOT, "OMPI_MCA_rmaps_base_oversubscribe": "1"}


class TimedComm:
    """A communicator that adds the wall time of its all-reduces to ``seconds``."""

    def __init__(self, comm):
        self.comm, self.seconds = comm, 0.0

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def allreduce_(self, buf):
        t0 = time.perf_counter()
        self.comm.allreduce_(buf)
        self.seconds += time.perf_counter() - t0
        return buf


def worker(preset: str, steps: int, batch_size: int, seq_len: int, vocab: int) -> dict:
    sys.path.insert(0, str(HERE))
    from bench_train_step import make_batch
    from minibert import BertConfig, distributed
    from minibert.modeling import BertForPreTraining
    from minibert.optim import AdamW
    from minibert.pretraining.batches import PretrainingBatch
    from minibert.training import TrainingConfig, train_step

    from minibert.fast import set_fast_paths
    set_fast_paths(True)  # what the jobs run
    comm = TimedComm(distributed.init_distributed("auto"))
    config = BertConfig.from_preset(preset, vocab_size=vocab)
    _, b = make_batch(np.random.default_rng(0), batch_size, seq_len, vocab)
    batch = PretrainingBatch(b["input_ids"], b["token_type_ids"], b["attention_mask"],
                  b["masked_lm_positions"], b["masked_lm_ids"], b["masked_lm_weights"],
                  b["next_sentence_label"])

    class Task:
        evaluate = None

        def forward(self, model, shard):
            return model(**shard.model_inputs()).loss, {}

    model = BertForPreTraining(config)
    opt = AdamW(model.named_parameters(), lr=1e-4)
    comm.broadcast_(opt.flat.data)
    cfg = TrainingConfig(max_steps=1, lr=1e-4, max_grad_norm=1.0)
    times, comm_times = [], []
    for i in range(steps + 2):
        comm.barrier()
        before = comm.seconds
        t0 = time.perf_counter()
        loss, *_ = train_step(model, opt, Task(), [batch], i, 1e-4, cfg, comm=comm)
        float(loss)
        if i >= 2:
            times.append(time.perf_counter() - t0)
            comm_times.append(comm.seconds - before)
    step = statistics.median(times)
    return {"preset": preset, "ranks": comm.world_size,
            "threads_per_rank": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
            "s_per_step": round(step, 4), "tokens_per_s": round(batch_size * seq_len / step, 1),
            "allreduce_s_per_step": round(statistics.median(comm_times), 5),
            "allreduce_share": round(statistics.median(comm_times) / step, 4),
            "gradient_bytes": int(opt.flat.grad.nbytes), "parameters": int(opt.flat.grad.size)}


def sweep(sizes_mb, repeats: int = 10) -> list[dict]:
    from minibert import distributed
    comm = distributed.init_distributed("auto")
    rows = []
    for mb in sizes_mb:
        buf = np.ones(int(mb * 2**20) // 4, dtype=np.float32)
        comm.allreduce_(buf)
        ts = []
        for _ in range(repeats):
            comm.barrier()
            t0 = time.perf_counter()
            comm.allreduce_(buf)
            ts.append(time.perf_counter() - t0)
        med = statistics.median(ts)
        rows.append({"MB": mb, "s": round(med, 6), "ms_per_MB": round(1e3 * med / mb, 3),
                     "algbw_GB_per_s": round(mb * 2**20 / med / 1e9, 3)})
    return rows


def run(cmd, env) -> dict:
    out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["tiny", "mini"])
    p.add_argument("--threads", type=int, default=2, help="BLAS threads in all (split over ranks)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--sweep", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.batch_size, args.seq_len,
                                args.vocab_size)))
        return
    if args.sweep:
        rows = sweep([0.25, 1, 4, 16, 64])
        from minibert import distributed
        if distributed.current().is_leader:
            print(json.dumps(rows))
        return
    mpirun = shutil.which("mpirun")
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--seq-len",
              str(args.seq_len), "--vocab-size", str(args.vocab_size)]
    half = str(max(1, args.threads // 2))
    results = {"runs": [], "allreduce_sweep": {}}
    for preset in args.presets:
        one = run([*me, "--worker", preset, *common], {"OMP_NUM_THREADS": str(args.threads)})
        two = run([mpirun, "-np", "2", "-x", f"OMP_NUM_THREADS={half}", *me, "--worker", preset,
                   *common], MPI_ENV)
        results["runs"] += [one, two]
        print(f"{preset:>5}: 1 process x {args.threads} threads {one['tokens_per_s']:>7.0f} tok/s"
              f" ({one['s_per_step']:.3f} s/step) | 2 ranks x {half} thread(s) "
              f"{two['tokens_per_s']:>7.0f} tok/s ({two['s_per_step']:.3f} s/step, "
              f"{two['tokens_per_s'] / one['tokens_per_s']:.2f}x) | all-reduce "
              f"{1e3 * two['allreduce_s_per_step']:.1f} ms/step = "
              f"{100 * two['allreduce_share']:.1f}% of the step, "
              f"{two['gradient_bytes'] / 2**20:.1f} MB of gradients")
    for transport, mca in (("shared memory", "vader,self"), ("TCP loopback", "tcp,self")):
        rows = run([mpirun, "-np", "2", "--mca", "btl", mca, "-x", "OMP_NUM_THREADS=1", *me,
                    "--sweep"], MPI_ENV)
        results["allreduce_sweep"][transport] = rows
        for r in rows:
            print(f"all-reduce of {r['MB']:>5} MB float32 over 2 ranks ({transport}): "
                  f"{1e3 * r['s']:7.2f} ms = {r['ms_per_MB']:.3f} ms/MB")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
