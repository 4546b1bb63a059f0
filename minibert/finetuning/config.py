"""The options of a fine-tuning run as one dataclass, :class:`FinetuningConfig`: what
``finetune.py`` parses from its command line, and what a Python caller builds instead::

    from minibert.finetuning import FinetuningConfig, run_finetuning
    run_finetuning(FinetuningConfig(init="runs/pretrain", output_dir="runs/ft"))

Each field is an option of ``finetune.py`` under its argparse destination with the same
default; ``finetune.py --help`` says more about each. ``args.json`` of a fine-tuning run and
its checkpoints' ``args`` record are :meth:`~minibert.cli.JobOptions.to_dict` of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..reporting import report_to_choice
from ..cli import (JobOptions, dropout_probability, flag, float_in, int_at_least,
                   non_negative_float, positive_float, positive_int)

DATA_ROOT = Path(__file__).resolve().parents[2] / "data"   # the repository's shipped data
DEFAULT_INIT = "runs/pretrain"
TASK_NAMES = ("sequence-classification", "token-classification", "question-answering")
METRICS = ("auto", "accuracy", "macro_f1", "mcc", "f1", "precision", "recall", "exact_match")


@dataclass
class FinetuningConfig(JobOptions):
    """``finetune.py``'s options. ``data`` and ``max_seq_length`` left at None take the
    task's sample under the repository's ``data/`` and its default length when the data is
    read. Units: rows (sentences, questions), tokens and steps."""

    # -- data ----------------------------------------------------------------------------
    task: str = "sequence-classification"   # one of TASK_NAMES
    data: str | None = None            # directory of the train/dev/test files
    train: str | None = None           # a split file instead of DATA/train.EXT
    dev: str | None = None
    test: str | None = None            # "none": no test split
    labels: str | None = None          # the label (tag) set, one per line
    max_seq_length: int | None = None  # tokens per sequence, >= 3 (None: 128; QA 384;
    #                                    at most the tokenizer's model_max_length)
    label_all_tokens: bool = False     # tagging: train on every piece of a word
    doc_stride: int = 128              # QA: tokens two context windows share, >= 0
    max_query_length: int = 64         # QA: tokens of a question, >= 1
    n_best_size: int = 20              # QA: start / end candidates per window, >= 1
    max_answer_length: int = 30        # QA: tokens of an answer, >= 1
    # -- model ---------------------------------------------------------------------------
    init: str = DEFAULT_INIT           # the start: a run, a checkpoint, a HF directory
    random_init: bool = False          # the start's architecture and vocab, fresh weights
    classifier_dropout: float | None = None  # in [0, 1); None: the hidden dropout
    model: str | None = None           # a fine-tuned model to predict / plot / export with
    pooling: str | None = None         # sequence classification: "cls" or "mean"
    freeze_embeddings: bool = False    # do not train the embeddings
    freeze_layers: int = 0             # do not train the lowest N encoder layers, >= 0
    # -- task distillation (sequence classification) -------------------------------------
    teacher: str | None = None         # a fine-tuned classifier with the same labels
    distill_alpha: float = 0.5         # weight of the soft-label loss, in [0, 1]
    temperature: float = 2.0           # softmax temperature, > 0
    transfer_data: str | None = None   # unlabelled rows the teacher labels
    # -- training ------------------------------------------------------------------------
    epochs: int = 3                    # passes over the train split, >= 1
    max_train_examples: int | None = None  # the first N train rows only, >= 1
    group_by_length: bool = False      # batch rows of similar length
    max_steps: int | None = None       # stop after this many steps, >= 1 (None: all epochs)
    batch_size: int = 32               # rows per micro-batch (global), >= 1
    gradient_accumulation_steps: int = 1  # >= 1
    lr: float = 5e-5                   # peak learning rate, >= 0
    eval_batch_size: int = 64          # rows per evaluation batch, >= 1
    warmup_proportion: float = 0.1     # share of the steps with linear warmup, in [0, 1]
    adam_eps: float = 1e-6             # AdamW epsilon, > 0
    weight_decay: float = 0.01         # >= 0
    correct_bias: bool = True          # Adam's bias correction
    max_grad_norm: float = 1.0         # global-norm clip, >= 0 (0: none)
    max_nonfinite_steps: int = 5       # >= 1
    eval_every: int | None = None      # steps between dev evaluations (None: each epoch)
    seed: int = 0                      # >= 0
    device: str | None = None          # "cpu" or "cuda"; None: $MINIBERT_DEVICE or cpu
    tf32: bool = False
    cuda_graphs: bool = False          # steps replayed from CUDA graphs (minibert.graphs)
    dtype: str = "float32"             # float32, float16 or bfloat16 (mixed precision)
    fast_cpu: bool = True              # the CPU fast paths (minibert.fast.set_fast_paths)
    metric: str = "auto"               # the dev metric that picks the best model (METRICS)
    distributed: str = "auto"          # auto, none, mpi, nccl
    cuda_aware_mpi: bool = False
    # -- output --------------------------------------------------------------------------
    output_dir: str = "runs/finetune"  # the run directory
    resume: str | None = None          # continue the run in this directory ("": output_dir)
    log_every: int = 10                # steps between train records, >= 1
    report_to: str = "none"            # "tensorboard": event files beside metrics.jsonl
    progress: bool = True
    overwrite: bool = False            # replace the run (and what export_hf holds)
    predict: list[str] | None = None   # one text or a pair (QA: QUESTION CONTEXT)
    plot_attention: list[str] | None = None  # one text or a pair
    explain_dev: int = 0               # explain/dev-N.html pages for the first N dev rows
    export_hf: str | None = None       # also write the best model as a HF directory
    export_dtype: str = "float32"      # the weights' type in the export_hf directory

    CHECKS = {
        "task": TASK_NAMES, "max_seq_length": int_at_least(3), "doc_stride": int_at_least(0),
        "max_query_length": positive_int, "n_best_size": positive_int,
        "max_answer_length": positive_int, "classifier_dropout": dropout_probability,
        "pooling": ("cls", "mean"), "freeze_layers": int_at_least(0),
        "distill_alpha": float_in(0.0, 1.0), "temperature": positive_float,
        "epochs": positive_int, "max_train_examples": positive_int, "max_steps": positive_int,
        "batch_size": positive_int, "gradient_accumulation_steps": positive_int,
        "lr": non_negative_float, "eval_batch_size": positive_int,
        "warmup_proportion": float_in(0.0, 1.0), "adam_eps": positive_float,
        "weight_decay": non_negative_float, "max_grad_norm": non_negative_float,
        "max_nonfinite_steps": positive_int, "eval_every": positive_int,
        "seed": int_at_least(0), "device": ("cpu", "cuda"),
        "dtype": ("float32", "float16", "bfloat16"),
        "metric": METRICS, "distributed": ("auto", "none", "mpi", "nccl"),
        "log_every": positive_int, "export_dtype": ("float32", "float16", "bfloat16"),
        "explain_dev": int_at_least(0), "report_to": report_to_choice}

    def with_defaults(self) -> "FinetuningConfig":
        """With ``resume`` set, ``output_dir`` becomes it; returns self."""
        if self.resume:
            self.output_dir = self.resume
        return self

    def check_combinations(self, given: set[str]) -> None:
        """Options that only mean something together (``given``: those chosen explicitly).

        Raises:
            ValueError: the message finetune.py prints after ``error:``.
        """
        from ..distillation.task import TASK_OPTIONS
        if not self.teacher and (stray := [n for n in TASK_OPTIONS if n in given]):
            raise ValueError(f"{flag(stray[0])} goes with --teacher")
        if self.teacher and self.task != "sequence-classification":
            raise ValueError(f"--teacher: task distillation is for --task "
                             f"sequence-classification, not {self.task}")
        if self.labels and self.task == "question-answering":
            raise ValueError("--labels: question-answering has no label set")
        if self.pooling and self.task != "sequence-classification":
            raise ValueError(f"--pooling: for --task sequence-classification, not {self.task}")
        for name in ("predict", "plot_attention"):
            if getattr(self, name) and len(getattr(self, name)) > 2:
                raise ValueError(f"{flag(name)} takes one text or a pair of texts")
        if self.explain_dev and (self.task != "sequence-classification" or self.model):
            raise ValueError("--explain-dev: pages of dev rows after training a --task "
                             "sequence-classification model (for a saved model: python -m "
                             "minibert explain)")
        if "export_dtype" in given and not self.export_hf:
            raise ValueError("--export-dtype goes with --export-hf")
        if self.export_hf and Path(self.export_hf).exists() and not Path(self.export_hf).is_dir():
            raise ValueError(f"--export-hf {self.export_hf}: is a file, not a directory")


__all__ = ["DATA_ROOT", "DEFAULT_INIT", "METRICS", "TASK_NAMES", "FinetuningConfig"]
