"""Benchmark: the speed of fine-tuning with frozen layers, every setting trained side by
side in one process, one step of each in turn (which one goes first rotates), so all see
the same machine load; accuracy comes from the ``finetune.py`` runs themselves.

Usage::

    python bench/bench_freeze.py --init DIR [--settings 0,e3,e6] [--max-train-examples 2000]

A setting is ``N`` (``--freeze-layers N``) or ``eN`` (``--freeze-embeddings
--freeze-layers N``). Each trains as ``finetune.py`` does (the task's forward,
``minibert.finetuning.job.make_optimizer`` over the trainable parameters, ``minibert.training.train_step``)
on the same batches of the same split (sequence classification, ``--group-by-length``
batches). Reported per setting: trainable parameters, seconds of training steps (batch
building not timed) for the epoch, and the ratio to the first setting. One JSON line per
setting.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minibert.backend import DropoutRNG  # noqa: E402
from minibert.finetuning import iterate_batches  # noqa: E402
from minibert.finetuning.job import make_optimizer, split_paths  # noqa: E402
from minibert.finetuning import FinetuningConfig  # noqa: E402
from minibert.finetuning.tasks import TASKS, FinetuningWorkload, make_task  # noqa: E402
from minibert.optim import linear_schedule_with_warmup  # noqa: E402
from minibert.runs import load_start  # noqa: E402
from minibert.tokenization import BertTokenizer  # noqa: E402
from minibert.training import TrainingConfig, train_step  # noqa: E402


def parse_setting(text: str) -> tuple[bool, int]:
    return (True, int(text[1:])) if text.startswith("e") else (False, int(text))


def main(argv=None) -> int:
    from minibert.fast import set_fast_paths
    set_fast_paths(True)  # what the jobs run
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--init", required=True)
    p.add_argument("--data", default=str(ROOT / "data" / TASKS["sequence-classification"].data_subdir))
    p.add_argument("--settings", default="0,e3,e6")
    p.add_argument("--max-train-examples", type=int, default=2000)
    p.add_argument("--max-seq-length", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--max-steps", type=int, default=None, help="stop after N steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    ft = FinetuningConfig(lr=args.lr, adam_eps=1e-6, correct_bias=True, weight_decay=0.01,
                          batch_size=args.batch_size, seed=args.seed, group_by_length=True,
                          metric="auto", max_seq_length=args.max_seq_length,
                          data=args.data, test="none")
    task = make_task("sequence-classification", ft.to_dict())
    pre = load_start(args.init)
    tok = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    data = task.read(split_paths(ft, task),
                     tok, args.max_seq_length, args.max_train_examples)
    systems = []
    for text in args.settings.split(","):
        emb, layers = parse_setting(text)
        model, _ = task.model_from_start(pre, data.labels, seed=args.seed)
        model.freeze(embeddings=emb, layers=layers)
        opt = make_optimizer(model, ft)
        loop = FinetuningWorkload(ft, None, model, data.train, data.dev, data.labels, pre, np,
                            task=task)
        systems.append(SimpleNamespace(name=text, model=model, opt=opt, loop=loop, secs=0.0,
                                       rng=DropoutRNG("cpu"),
                                       trainable=sum(p.data.size for p in
                                                     model.trainable_parameters())))
    cfg = TrainingConfig(max_steps=1, lr=args.lr, seed=args.seed)
    steps = -(-len(data.train) // args.batch_size)
    if args.max_steps:
        steps = min(steps, args.max_steps)
    limits = contextlib.nullcontext()
    with contextlib.suppress(ImportError):
        from threadpoolctl import threadpool_limits
        limits = threadpool_limits(args.threads)
    with limits:
        batches = iterate_batches(data.train, args.batch_size, 0, seed=args.seed, epoch=0,
                                  group_by_length=True)
        for step, batch in zip(range(steps), batches):
            lr = linear_schedule_with_warmup(step, args.lr, int(0.1 * steps), steps)
            k = step % len(systems)
            for s in systems[k:] + systems[:k]:
                t0 = time.perf_counter()
                loss, *_ = train_step(s.model, s.opt, s.loop, [batch], step, lr, cfg,
                                      device="cpu", dropout_rng=s.rng)
                float(loss)
                s.secs += time.perf_counter() - t0
    for s in systems:
        print(json.dumps({"setting": s.name, "trainable_parameters": int(s.trainable),
                          "steps": steps, "train_rows": len(data.train),
                          "seconds": round(s.secs, 1),
                          "ratio_to_first": round(s.secs / systems[0].secs, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
