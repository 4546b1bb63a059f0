"""The options of the evaluation harness as one dataclass, :class:`EvaluationConfig`: what
``evaluate.py`` parses from its command line, and what a Python caller builds instead::

    from minibert.evaluation import EvaluationConfig, run_evaluation
    run_evaluation(EvaluationConfig(starts=["runs/pretrain", "random:runs/pretrain"]))

Each field is an option of ``evaluate.py`` under its argparse destination with the same
default; ``evaluate.py --help`` says more about each.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..cli import JobOptions, float_in, int_at_least, positive_int

ROOT = Path(__file__).resolve().parents[2]          # the repository: data/, finetune.py
FINETUNE_SCRIPT = ROOT / "finetune.py"
_DATA = ROOT / "data" / "classify"
# The shipped tasks: name -> directory of train / dev / test files.
TASKS = {"movie_reviews": _DATA / "en" / "movie_reviews", "sms_spam": _DATA / "en" / "sms_spam",
         "trec_questions": _DATA / "en" / "trec_questions",
         "product_reviews": _DATA / "zh" / "product_reviews",
         "brown_pos": ROOT / "data" / "tag" / "en" / "brown_pos",
         "peoples_daily_ner": ROOT / "data" / "tag" / "zh" / "peoples_daily_ner",
         "squad_v1": ROOT / "data" / "qa" / "en" / "squad_v1"}
ENGLISH = ("movie_reviews", "sms_spam", "trec_questions", "brown_pos", "squad_v1")
CHINESE = ("product_reviews", "peoples_daily_ner")


def budget(text: str) -> int | None:
    """argparse type: a label budget, an integer >= 2 or ``all`` (None)."""
    if text == "all":
        return None
    return int_at_least(2)(text)


@dataclass
class EvaluationConfig(JobOptions):
    """``evaluate.py``'s options (label budgets in train rows, sentences or questions)."""

    starts: list[str] = field(default_factory=list)  # runs, checkpoints, HF dirs, random:START
    tasks: list[str] | None = None       # names of TASKS / task_dir; None: by the vocab
    task_dir: list[str] = field(default_factory=list)  # more tasks, each "NAME=DIR"
    budgets: list[int | None] = field(default_factory=lambda: [500, 2000, None])  # None: all
    seeds: int = 3                       # seeds 0 .. N-1, >= 1
    epochs: int = 3                      # fine-tuning epochs, >= 1
    lr: list[float] = field(default_factory=lambda: [5e-5])  # fine-tuning rates, each > 0
    batch_size: int = 32                 # >= 1
    max_seq_length: int = 128            # >= 3
    pooling: str = "cls"                 # what the classifier reads: "cls" or "mean"
    finetune: bool = True                # fine-tune (False: the floors only)
    probe: bool = True                   # probes on frozen states
    output_dir: str = "runs/evaluate"
    device: str | None = None            # "cpu" or "cuda"; None: $MINIBERT_DEVICE or cpu
    fast_cpu: bool = True                # the CPU fast paths (also for the fine-tuning runs)
    overwrite: bool = False              # start afresh over a run with other settings

    CHECKS = {"budgets": budget, "seeds": positive_int, "epochs": positive_int,
              "lr": float_in(0.0, low_open=True), "batch_size": positive_int,
              "max_seq_length": int_at_least(3), "pooling": ("cls", "mean"),
              "device": ("cpu", "cuda")}

    def with_defaults(self) -> "EvaluationConfig":
        """A rate named twice runs once (``lr`` without repeats); returns self."""
        self.lr = list(dict.fromkeys(self.lr))
        return self

    def check_combinations(self, given: set[str]) -> None:
        """Raises ValueError as :meth:`task_dirs` does."""
        self.task_dirs()

    def task_dirs(self) -> dict[str, Path]:
        """The tasks by name: :data:`TASKS` and the ``task_dir`` ones (which may replace a
        shipped task's directory).

        Raises:
            ValueError: a ``task_dir`` item that is not NAME=DIR, a name in ``tasks`` that
                is neither; no ``starts``.
        """
        if not self.starts:
            raise ValueError("no START given")
        dirs = dict(TASKS)
        for item in self.task_dir:
            name, sep, d = item.partition("=")
            if not sep or not name or not d:
                raise ValueError(f"--task-dir: expected NAME=DIR, got {item!r}")
            dirs[name] = Path(d)
        for t in self.tasks or ():
            if t not in dirs:
                raise ValueError(f"--tasks: unknown task {t!r} (expected one of "
                                 f"{', '.join(dirs)}, or add it with --task-dir {t}=DIR)")
        return dirs


__all__ = ["CHINESE", "ENGLISH", "FINETUNE_SCRIPT", "TASKS", "EvaluationConfig", "budget"]
