"""Helpers the test modules share (not tests themselves)."""
import contextlib
import importlib.util
import os
from pathlib import Path

from minibert import BertForPreTraining, fast_cpu
from minibert.hf import save_hf_directory
from minibert.runs import METRICS, MetricsLog, load_start

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str):
    """The module bench/NAME.py (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hf_copy(run, directory: Path) -> Path:
    """A pretraining run (or checkpoint) written as a Hugging Face directory, for the
    paths that take one (transformers peers, ``--init`` of an HF directory)."""
    pre = load_start(run)
    model = BertForPreTraining(pre.config)
    model.load_state_dict(pre.state)
    return save_hf_directory(model, directory, pre.vocab_file)


@contextlib.contextmanager
def cpu_blocking(block: int | None, threads: int):
    """Within the block: element-wise CPU work in blocks of ``block`` elements (None: the
    default) over ``threads`` threads (``OMP_NUM_THREADS``); both restored afterwards."""
    old_block, old_threads = fast_cpu._CACHE_BLOCK, os.environ.get("OMP_NUM_THREADS")
    fast_cpu._CACHE_BLOCK = block or old_block
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        fast_cpu._CACHE_BLOCK = old_block
        if old_threads is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = old_threads


def tiny_pretrain_argv(corpus, vocab, out, *extra) -> list[str]:
    """train_mlm.py's options for a run of a few seconds: a 1-layer, 16-wide model on
    ``corpus`` with the given ``vocab``, 8 steps of 4 sequences of 16 tokens, a train
    record every step and a checkpoint every 4 steps, no progress bar."""
    return ["--corpus", str(corpus), "--vocab", str(vocab), "--output-dir", str(out),
            "--hidden-size", "16", "--num-hidden-layers", "1", "--num-attention-heads", "2",
            "--intermediate-size", "32", "--max-seq-length", "16", "--batch-size", "4",
            "--max-steps", "8", "--log-every", "1", "--eval-every", "100",
            "--save-every", "4", "--eval-fraction", "0.1", "--eval-instances", "4",
            "--no-progress", *map(str, extra)]


def snapshot(directory: Path) -> dict:
    """Every file under ``directory``: relative path -> (size, mtime in ns, SHA-256), to
    show that a job changed nothing there."""
    import hashlib
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns,
                                             hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(Path(directory).rglob("*")) if p.is_file()}


def records(out, kind: str = "train") -> list[dict]:
    """The ``kind`` records ("train", "eval", ...) of the run directory ``out``'s
    metrics.jsonl, in file order."""
    return [r for r in MetricsLog.read(Path(out) / METRICS) if r["kind"] == kind]
