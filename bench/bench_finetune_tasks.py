"""Benchmark: transformers fine-tuned for token classification or extractive question
answering with ``finetune.py``'s recipe, the peer of a ``finetune.py --task ...`` run.

Usage::

    python bench/bench_finetune_tasks.py --task token-classification --init DIR \\
        --epochs 3 --batch-size 16 --lr 1e-4 --group-by-length
    python bench/bench_finetune_tasks.py --task question-answering --init DIR \\
        --max-seq-length 256 --doc-stride 64 --epochs 2 --batch-size 16 --lr 1e-4 --group-by-length

and the minibert side with the same options::

    python finetune.py --task token-classification --init DIR --epochs 3 --batch-size 16 \\
        --lr 1e-4 --group-by-length --output-dir runs/pos

The same as ``finetune.py``, so that only the implementation differs: the data (the
task's ``read`` from :mod:`minibert.finetuning.tasks`: our tokenizer, word-piece label
alignment or QA windows, ``--max-train-examples``), the batches (``iterate_batches`` with
the same seed, epoch permutation and ``--group-by-length`` grouping, dynamic padding), the
number of steps, warmup + linear decay (``minibert.optim.linear_schedule_with_warmup``),
the new head's initial weights (copied from minibert's ``model_from_start`` for that seed),
torch's bias-corrected AdamW with the same lr / eps / weight decay (not on biases and
LayerNorm), global-norm clipping, HF's losses (which minibert's heads reproduce), dev
evaluation after every epoch and test evaluation of the best dev epoch's weights, with
minibert's decoding / answer extraction and metric code (through a small adapter that
gives the torch model minibert's call signature). Only the dropout masks differ.

Reported (one JSON line): seconds of training steps per epoch (batch building and
evaluation not timed), the mean training loss of each epoch, dev metrics per epoch, the
best dev epoch and its dev / test metrics. ``torch.set_num_threads(--threads)``; CPU only.
transformers and torch are used in bench/ only.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_finetune import add_recipe_arguments  # noqa: E402
from minibert.finetuning import iterate_batches  # noqa: E402
from minibert.finetuning.job import split_paths  # noqa: E402
from minibert.finetuning.tasks import TASKS, make_task  # noqa: E402
from minibert.optim import decays, linear_schedule_with_warmup  # noqa: E402
from minibert.runs import load_start  # noqa: E402
from minibert.tokenization import BertTokenizer  # noqa: E402

HEADS = {"sequence-classification": ("BertForSequenceClassification", "classifier"),
         "token-classification": ("BertForTokenClassification", "classifier"),
         "question-answering": ("BertForQuestionAnswering", "qa_outputs")}


class TorchAsMinibert:
    """A transformers model called as a minibert model for evaluation:
    ``model(input_ids, token_type_ids, attention_mask)`` on NumPy arrays, returning NumPy
    ``logits`` / ``start_logits`` / ``end_logits`` (no gradients), ``training``,
    ``eval()``, ``train(mode)``, ``config`` (minibert's)."""

    def __init__(self, model, torch, config):
        self.model, self.torch, self.config = model, torch, config

    @property
    def training(self) -> bool:
        return self.model.training

    def eval(self):
        self.model.eval()

    def train(self, mode: bool = True):
        self.model.train(mode)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None):
        t = self.torch.from_numpy
        with self.torch.no_grad():
            out = self.model(input_ids=t(input_ids), token_type_ids=t(token_type_ids),
                             attention_mask=t(attention_mask))
        return SimpleNamespace(**{k: getattr(out, k).numpy() for k in
                                  ("logits", "start_logits", "end_logits")
                                  if getattr(out, k, None) is not None})


def torch_inputs(torch, batch, task_name: str) -> dict:
    t = torch.from_numpy
    d = dict(input_ids=t(batch.input_ids), token_type_ids=t(batch.token_type_ids),
             attention_mask=t(batch.attention_mask))
    if task_name == "question-answering":
        d.update(start_positions=t(batch.labels[:, 0].copy()),
                 end_positions=t(batch.labels[:, 1].copy()))
    else:
        d["labels"] = t(batch.labels)
    return d


def run(args) -> dict:
    import torch

    from minibert.fast import set_fast_paths
    set_fast_paths(True)  # what the jobs run
    import transformers
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    task = make_task(args.task, vars(args))
    if args.data is None:
        args.data = str(ROOT / "data" / task.data_subdir)
    if args.max_seq_length is None:
        args.max_seq_length = task.default_max_seq_length
    pre = load_start(args.init)
    tok = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    max_len = min(args.max_seq_length, pre.config.max_position_embeddings)
    data = task.read(split_paths(args, task), tok, max_len, args.max_train_examples)
    task.resolve_metric(args.metric, data.labels)
    arch, head = HEADS[args.task]
    kw = {"num_labels": len(data.labels)} if data.labels else {}
    hf = getattr(transformers, arch).from_pretrained(args.init, attn_implementation="eager",
                                                     **kw)
    ours, _ = task.model_from_start(pre, data.labels, seed=args.seed)        # the same new head
    with torch.no_grad():
        for name in ("weight", "bias"):
            getattr(getattr(hf, head), name).copy_(
                torch.from_numpy(getattr(getattr(ours, head), name).data))
    params = list(hf.parameters())
    opt = torch.optim.AdamW(
        [{"params": [p for p in params if decays(p)], "weight_decay": args.weight_decay},
         {"params": [p for p in params if not decays(p)], "weight_decay": 0.0}],
        lr=args.lr, eps=args.adam_eps)
    model = TorchAsMinibert(hf, torch, ours.config)
    steps_per_epoch = -(-len(data.train) // args.batch_size)
    total = steps_per_epoch * args.epochs
    warmup = int(args.warmup_proportion * total)
    step, best = 0, None
    epochs = []
    for epoch in range(args.epochs):
        hf.train()
        secs, losses = 0.0, []
        for b in iterate_batches(data.train, args.batch_size, 0, seed=args.seed, epoch=epoch,
                                 group_by_length=args.group_by_length):
            lr = linear_schedule_with_warmup(step, args.lr, warmup, total)
            t0 = time.perf_counter()
            for g in opt.param_groups:
                g["lr"] = lr
            out = hf(**torch_inputs(torch, b, args.task))
            opt.zero_grad()
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), args.max_grad_norm)
            opt.step()
            losses.append(out.loss.item())
            secs += time.perf_counter() - t0
            step += 1
        dev, _ = task.evaluate(model, data.dev, 64, np)
        epochs.append({"epoch": epoch + 1, "train_seconds": round(secs, 1),
                       "train_loss": round(float(np.mean(losses)), 4),
                       "dev": {k: v for k, v in dev.items() if isinstance(v, float)}})
        print(json.dumps({"progress": epochs[-1]}), file=sys.stderr, flush=True)
        if best is None or dev[task.metric] > best["dev"][task.metric]:
            best = {"epoch": epoch + 1, "dev": dev, "state": copy.deepcopy(hf.state_dict())}
    hf.load_state_dict(best["state"])
    test = task.evaluate(model, data.test, 64, np)[0] if data.test is not None else None
    return {"name": "transformers", "system": f"transformers {transformers.__version__} / "
                                              f"torch {torch.__version__}",
            "task": args.task, "init": args.init, "data": args.data, "epochs": args.epochs,
            "batch_size": args.batch_size, "lr": args.lr, "max_seq_length": max_len,
            "group_by_length": args.group_by_length, "threads": args.threads,
            "train_rows": len(data.train), "steps": step, "metric": task.metric,
            "train_seconds_per_epoch": [e["train_seconds"] for e in epochs],
            "per_epoch": epochs, "best_epoch": best["epoch"], "dev": best["dev"],
            "test": test, "baseline": data.baseline}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=list(TASKS), default="token-classification")
    p.add_argument("--init", required=True, help="Hugging Face BERT directory")
    p.add_argument("--data", default=None, help="as finetune.py (default: the task's sample)")
    p.add_argument("--train", default=None)
    p.add_argument("--dev", default=None)
    p.add_argument("--test", default=None)
    p.add_argument("--max-seq-length", type=int, default=None)
    p.add_argument("--label-all-tokens", action="store_true")
    p.add_argument("--doc-stride", type=int, default=128)
    p.add_argument("--max-query-length", type=int, default=64)
    p.add_argument("--n-best-size", type=int, default=20)
    p.add_argument("--max-answer-length", type=int, default=30)
    p.add_argument("--metric", default="auto")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--group-by-length", action="store_true")
    add_recipe_arguments(p)
    args = p.parse_args(argv)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
