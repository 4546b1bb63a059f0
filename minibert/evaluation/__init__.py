"""What a start is worth without pretraining it further: the evaluation harness of
``evaluate.py`` (:mod:`.harness`: label budgets, seeds, each start at its own best
learning rate, floors) and the linear probes it fits on frozen features and bags of words
(:mod:`.probe`)."""
from .config import EvaluationConfig


def __getattr__(name: str):
    """``run_evaluation`` (the harness module, loaded on first use)."""
    if name == "run_evaluation":
        from .harness import run_evaluation
        return run_evaluation
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["EvaluationConfig", "run_evaluation"]
