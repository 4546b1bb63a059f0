"""Helpers the test modules share (not tests themselves)."""
import importlib.util
from pathlib import Path

from minibert import BertForPreTraining
from minibert.hf import save_hf_directory
from minibert.runs import load_start

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
