"""A data-parallel training run of a small classifier, started by tests/test_distributed.py
with or without ``mpirun``. Not a test module itself (pytest collects ``test_*.py`` only).

    python tests/mpi_worker.py train OUT_DIR DTYPE STEPS BATCH [DROPOUT]
        trains with minibert.training.train on the global batch BATCH; after every step the
        ranks compare their parameters bit for bit; rank 0 writes OUT_DIR/params.npy, its
        metrics.jsonl and OUT_DIR/ranks.json (the max difference seen between ranks).
    python tests/mpi_worker.py raise OUT_DIR      rank 1 raises in its second forward
    python tests/mpi_worker.py kill OUT_DIR       rank 1 SIGKILLs itself in its second forward
"""
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

from minibert import BertConfig, distributed
from minibert.heads import BertForSequenceClassification
from minibert.optim import AdamW
from minibert.training import TrainingConfig, TrainState, train

sys.path.insert(0, str(Path(sys.argv[0]).resolve().parent))   # tests/, also when exec'd
from helpers import Rows, ToyTask  # noqa: E402


class RowsTask(ToyTask):
    """helpers.ToyTask over 22 rows with padding at the end of some, ``size`` per
    (global) batch, the last batch of an epoch smaller; optionally rank 1 fails on purpose."""

    def __init__(self, size: int, rows: int = 22, fail_on_call: int = 0, fail_how: str = ""):
        rng = np.random.default_rng(0)
        lengths = rng.integers(3, 7, rows)
        mask = (np.arange(6)[None, :] < lengths[:, None]).astype(np.int64)
        super().__init__(Rows(rng.integers(1, 20, (rows, 6)) * mask, mask,
                              rng.integers(0, 3, rows)), size)
        self.fail_on_call, self.fail_how = fail_on_call, fail_how

    def forward(self, model, batch):
        self.calls += 1
        if self.calls == self.fail_on_call and distributed.current().rank == 1:
            if self.fail_how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("rank 1 fails on purpose")
        out = model(batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels)
        return out.loss, {"correct": (out.logits.argmax(-1) == batch.labels).sum(),
                          "count": len(batch.labels)}

    def summarize(self, totals):
        return {"accuracy": totals.get("correct", 0.0) / max(totals.get("count", 0.0), 1.0),
                "count": totals.get("count", 0.0)}


def make_model(dtype, dropout: float):
    config = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=8,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        num_labels=3)
    return BertForSequenceClassification(config, seed=1, dtype=dtype)


def main(argv):
    mode, out = argv[0], Path(argv[1])
    comm = distributed.init_distributed("auto")
    if mode == "train":
        dtype, steps, size = np.dtype(argv[2]), int(argv[3]), int(argv[4])
        dropout = float(argv[5]) if len(argv) > 5 else 0.0
        task = RowsTask(size)
    else:
        dtype, steps, size, dropout = np.dtype(np.float64), 4, 8, 0.0
        task = RowsTask(size, fail_on_call=2, fail_how=mode)
    model = make_model(dtype, dropout)
    if comm.rank == 1:  # a different start on rank 1: the broadcast from rank 0 must fix it
        model.classifier.weight.data += 1.0
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.01, correct_bias=True)
    state, worst = TrainState(), 0.0
    for step in range(1, steps + 1):  # one step per call, so ranks compare after each step
        cfg = TrainingConfig(max_steps=step, lr=1e-2, warmup_steps=1, log_every=1,
                             progress=False, seed=3)
        state, _ = train(model, opt, task, cfg, state, metrics_path=out / "metrics.jsonl",
                         checkpoint_path=out / "checkpoint.npz", comm=comm)
        if comm.world_size > 1:
            mine = opt.flat.data.astype(np.float64)
            lowest, highest = mine.copy(), mine.copy()
            comm.comm.Allreduce(comm.MPI.IN_PLACE, lowest, op=comm.MPI.MIN)
            comm.comm.Allreduce(comm.MPI.IN_PLACE, highest, op=comm.MPI.MAX)
            worst = max(worst, float(np.max(highest - lowest)))
    if comm.is_leader:
        np.save(out / "params.npy", opt.flat.data.astype(np.float64))
        (out / "ranks.json").write_text(json.dumps({"world_size": comm.world_size,
                                                    "max_rank_difference": worst}))


if __name__ == "__main__":
    main(sys.argv[1:])
