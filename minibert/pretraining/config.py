"""The options of a pretraining run as one dataclass, :class:`PretrainingConfig`: what
``train_mlm.py`` parses from its command line, and what a Python caller builds instead::

    from minibert.pretraining import PretrainingConfig, run_pretraining
    run_pretraining(PretrainingConfig(max_steps=100, output_dir="runs/x"))

Each field is an option of ``train_mlm.py`` under its argparse destination
(``--max-seq-length`` -> ``max_seq_length``) with the same default; ``train_mlm.py --help``
says more about each. ``args.json`` in a run directory and a checkpoint's ``args`` record
are :meth:`~minibert.cli.JobOptions.to_dict` of it, and
:meth:`~minibert.cli.JobOptions.from_dict` reads them back.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from ..reporting import report_to_choice
from ..cli import (JobOptions, dropout_probability, float_in, int_at_least, non_negative_float,
                   non_negative_int, positive_float, positive_int, probability)
from .masking import default_max_predictions

DATA = Path(__file__).resolve().parents[2] / "data"   # the repository's shipped data
DEFAULT_CORPUS = DATA / "pretrain" / "en"
DEFAULT_PAIRS = DATA / "minimal_pairs" / "en" / "pairs.jsonl"
# The Brown documents of the POS dev and test splits (data/README.md): not pretrained on.
DEFAULT_EXCLUDE = DATA / "tag" / "en" / "brown_pos" / "pretrain_exclude.tsv"
# --model's recipe: the defaults of the options left at None (with_defaults).
# BERT: masked-LM on one corpus line per sequence, no sentence task (docs/grammar.md,
# sixth round: at equal wall time it beat packed MLM + NSP on the minimal pairs, POS and
# held-out MLM on whole sentences, not on two-segment sequences; BabyBERTa, Huebner et al.
# 2021, one utterance per input). The line-by-line format goes with the recipe's
# objective only (a named --objective packs its sequences).
# ALBERT: sentence-order prediction, n-grams of up to 3 words and gelu_new (section 4.1).
MODEL_DEFAULTS = {"bert": {"objective": "mlm", "line_by_line": True, "hidden_act": "gelu",
                           "max_ngram": 1},
                  "albert": {"objective": "mlm+sop", "hidden_act": "gelu_new", "max_ngram": 3},
                  # DistilBERT (Sanh et al. 2019): MLM only, no token types, no pooler
                  "distilbert": {"objective": "mlm", "hidden_act": "gelu", "max_ngram": 1}}


@dataclass
class PretrainingConfig(JobOptions):
    """``train_mlm.py``'s options. Fields left at None take a value derived from the others
    in :meth:`with_defaults` (which :func:`~minibert.pretraining.run_pretraining` calls).
    Units: sequences, tokens and steps; rates per step; probabilities in [0, 1]."""

    # -- data ----------------------------------------------------------------------------
    corpus: list[str] = field(default_factory=lambda: [str(DEFAULT_CORPUS)])  # files / dirs
    exclude_documents: list[str] = field(default_factory=lambda: [str(DEFAULT_EXCLUDE)])
    vocab: str | None = None            # a vocab.txt; None: learn one from the corpus
    vocab_size: int = 8192              # tokens of a learned vocab, >= 8
    vocab_algorithm: str | None = None  # the vocab trainer's merge criterion; None: its own
    lowercase: bool = True              # lower-case and strip accents
    objective: str | None = None        # mlm+nsp, mlm, mlm+sop, electra; None: --model's
    generator_layers: int | None = None  # electra: generator layers, >= 1 (None: half)
    disc_weight: float = 50.0           # electra: replaced-token loss weight, > 0
    max_seq_length: int = 32            # tokens per sequence, >= 5
    masked_lm_prob: float = 0.15        # share of tokens masked, in (0, 1] (the start rate)
    masked_lm_prob_end: float | None = None  # the rate at max_steps, in (0, 1]; None: constant
    mask_replace_prob: float = 0.8      # share of the chosen tokens replaced by [MASK]
    random_replace_prob: float = 0.1    # ... by a random token (the rest stay); sum <= 1
    max_predictions_per_seq: int | None = None  # P, >= 1; None: ceil(T * the larger rate)
    short_seq_prob: float = 0.1         # probability of a shorter target length
    masking: str = "dynamic"            # "dynamic" (fresh each epoch) or "static"
    dupe_factor: int = 10               # distinct pairings / maskings before repeating, >= 1
    whole_word_mask: bool = False       # mask every piece of a chosen word
    max_ngram: int | None = None        # longest masked span in words, >= 1; None: --model's
    line_by_line: bool | None = None    # one corpus line per sequence (mlm, electra);
    #                                       None: the recipe's with its objective, else off
    eval_fraction: float = 0.02         # share of documents held out, in [0, 1)
    eval_instances: int = 1024          # held-out sequences per evaluation, >= 1
    eval_samples: int = 3               # sentences whose masked word is shown, >= 0
    eval_pairs: str = str(DEFAULT_PAIRS)  # BLiMP-format minimal pairs scored each evaluation
    eval_pairs_per_paradigm: int = 25   # pairs per paradigm, >= 0 (0: none)
    eval_blimp_per_paradigm: int = 5    # BLiMP dev pairs per paradigm, >= 0 (0: none)
    allow_data_change: bool = False     # resume although the corpus or vocab changed
    # -- model ---------------------------------------------------------------------------
    model: str = "bert"                 # "bert" or "albert"
    preset: str = "tiny"                # a key of minibert.modeling.PRESETS
    num_hidden_layers: int | None = None   # overrides of the preset, each >= 1
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    intermediate_size: int | None = None
    embedding_size: int | None = None      # albert: embedding width E <= hidden size
    num_hidden_groups: int | None = None   # albert: layer groups with their own weights
    inner_group_num: int | None = None     # albert: layers per group
    hidden_act: str | None = None          # gelu, gelu_new, relu; None: --model's
    hidden_dropout_prob: float = 0.1       # in [0, 1)
    attention_probs_dropout_prob: float = 0.1  # in [0, 1)
    max_position_embeddings: int = 512     # longest sequence the model takes, >= 1
    position_embedding_type: str = "absolute"  # "absolute" (learned) or "sinusoidal"
    norm_position: str = "post"            # LayerNorm "post" (BERT) or "pre"
    # -- distillation (docs/distillation.md) ---------------------------------------------
    teacher: str | None = None          # the teacher's directory; None: no distillation
    student_init: str = "preset"        # one of minibert.distillation.STUDENT_INITS
    temperature: float = 2.0            # soft-target temperature T, > 0
    alpha_ce: float = 5.0               # loss weights, each >= 0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    alpha_att: float = 0.0
    alpha_pooled: float = 0.0
    # -- training ------------------------------------------------------------------------
    max_steps: int = 4350               # optimizer steps, >= 1
    batch_size: int = 128               # sequences per micro-batch (global), >= 1
    gradient_accumulation_steps: int = 1  # micro-batches per step, >= 1
    batch_size_ramp: float = 0.0        # share of max_steps the micro-batches ramp over
    lr: float = 2e-3                    # peak learning rate, >= 0
    weight_decay: float = 0.01          # decoupled weight decay, >= 0
    correct_bias: bool = True           # Adam's bias correction
    max_grad_norm: float = 1.0          # global-norm clip, >= 0 (0: none)
    max_nonfinite_steps: int = 5        # non-finite steps in a row before stopping, >= 1
    warmup_steps: int | None = None     # linear warmup, >= 0; None: 10% of max_steps
    lr_scheduler_type: str = "linear"   # "linear" or "warmup_stable_decay" (extensible)
    decay_ratio: float = 0.1            # warmup_stable_decay: share of max_steps decayed
    ema_decay: float = 0.0              # EMA of the weights, in [0, 1) (0: off)
    label_smoothing: float = 0.0        # MLM label smoothing, in [0, 1)
    seed: int = 0                       # weights, data order and dropout, >= 0
    device: str | None = None           # "cpu" or "cuda"; None: $MINIBERT_DEVICE or cpu
    tf32: bool = False                  # TF32 matmuls on the GPU
    cuda_graphs: bool = False           # steps replayed from CUDA graphs (minibert.graphs)
    dtype: str = "float32"              # float32, float64, float16 or bfloat16 (mixed precision)
    fast_cpu: bool = True               # the CPU fast paths (minibert.fast.set_fast_paths)
    distributed: str = "auto"           # auto, none, mpi, nccl
    cuda_aware_mpi: bool = False        # hand device buffers to MPI
    # -- output --------------------------------------------------------------------------
    output_dir: str = "runs/pretrain"   # the run directory
    overwrite: bool = False             # replace the run in output_dir
    resume: str | None = None           # continue the run in this directory ("": output_dir)
    log_every: int = 10                 # steps between train records, >= 1
    eval_every: int = 250               # steps between evaluations, >= 1
    progress: bool = True               # progress bars
    init_checkpoint: str | None = None  # start from these weights (fresh optimizer)
    export_hf: str | None = None        # also write the final model as a HF directory
    log_grad_norms: int = 0             # steps between gradient-norm records, >= 0 (0: off)
    save_every: int = 250               # steps between checkpoints, >= 1
    report_to: str = "none"             # "tensorboard": event files beside metrics.jsonl

    CHECKS = {
        "vocab_size": int_at_least(8), "vocab_algorithm": ("wordpiece", "wordpiece-ratio", "bpe"),
        "objective": ("electra", "mlm", "mlm+nsp", "mlm+sop"), "generator_layers": positive_int,
        "disc_weight": float_in(0.0, low_open=True), "max_seq_length": int_at_least(5),
        "masked_lm_prob": float_in(0.0, 1.0, low_open=True),
        "masked_lm_prob_end": float_in(0.0, 1.0, low_open=True),
        "mask_replace_prob": probability, "random_replace_prob": probability,
        "max_predictions_per_seq": positive_int, "short_seq_prob": probability,
        "masking": ("dynamic", "static"), "dupe_factor": positive_int, "max_ngram": positive_int,
        "eval_fraction": float_in(0.0, 1.0, high_open=True), "eval_instances": positive_int,
        "eval_samples": non_negative_int, "eval_pairs_per_paradigm": non_negative_int,
        "eval_blimp_per_paradigm": non_negative_int,
        "model": ("bert", "albert", "distilbert"), "preset": ("base", "medium", "mini", "small", "tiny"),
        "num_hidden_layers": positive_int, "hidden_size": positive_int,
        "num_attention_heads": positive_int, "intermediate_size": positive_int,
        "embedding_size": positive_int, "num_hidden_groups": positive_int,
        "inner_group_num": positive_int, "hidden_act": ("gelu", "gelu_new", "relu"),
        "hidden_dropout_prob": dropout_probability,
        "attention_probs_dropout_prob": dropout_probability,
        "max_position_embeddings": positive_int,
        "position_embedding_type": ("absolute", "sinusoidal"), "norm_position": ("post", "pre"),
        "student_init": ("preset", "every-other-layer", "projected-embeddings", "pruned"),
        "temperature": positive_float, "alpha_ce": non_negative_float,
        "alpha_mlm": non_negative_float, "alpha_cos": non_negative_float,
        "alpha_att": non_negative_float, "alpha_pooled": non_negative_float,
        "max_steps": positive_int, "batch_size": positive_int,
        "gradient_accumulation_steps": positive_int,
        "batch_size_ramp": float_in(0.0, 1.0, high_open=True), "lr": non_negative_float,
        "weight_decay": non_negative_float, "max_grad_norm": non_negative_float,
        "max_nonfinite_steps": positive_int, "warmup_steps": non_negative_int,
        "lr_scheduler_type": ("linear", "warmup_stable_decay"),
        "decay_ratio": float_in(0.0, 1.0, low_open=True, high_open=True),
        "ema_decay": float_in(0.0, 1.0, high_open=True),
        "label_smoothing": float_in(0.0, 1.0, high_open=True), "seed": non_negative_int,
        "device": ("cpu", "cuda"), "dtype": ("float32", "float64", "float16", "bfloat16"),
        "distributed": ("auto", "none", "mpi", "nccl"), "log_every": positive_int,
        "eval_every": positive_int, "log_grad_norms": non_negative_int,
        "save_every": positive_int, "report_to": report_to_choice}

    def with_defaults(self) -> "PretrainingConfig":
        """Fill, in place, what was left at None with its derived value and return self:
        ``objective``, ``hidden_act``, ``max_ngram`` from ``model``'s recipe
        (:data:`MODEL_DEFAULTS`), ``line_by_line`` from it too when ``objective`` was
        left to it (else off), ``warmup_steps`` = max(1, max_steps // 10),
        ``max_predictions_per_seq`` = ceil(max_seq_length * p), p the larger of
        ``masked_lm_prob`` and ``masked_lm_prob_end``; with
        ``resume`` set, ``output_dir`` becomes it. A resumed run then takes its own values
        over these (they were not given). Idempotent."""
        recipe = MODEL_DEFAULTS.get(self.model, {})
        if self.line_by_line is None:     # the recipe's format only with its own objective
            self.line_by_line = self.objective is None and recipe.get("line_by_line", False)
        for name, value in recipe.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.warmup_steps is None:
            self.warmup_steps = max(1, self.max_steps // 10)
        if self.max_predictions_per_seq is None:
            self.max_predictions_per_seq = default_max_predictions(
                self.max_seq_length, max(self.masked_lm_prob, self.masked_lm_prob_end or 0.0))
        if self.resume:
            self.output_dir = self.resume
        return self


def add_masking_arguments(g) -> None:
    """``train_mlm.py``'s options of the replacement rule, the masking-rate schedule and
    line-by-line sequences (their defaults are :class:`PretrainingConfig`'s)."""
    g.add_argument("--masked-lm-prob-end", type=float_in(0.0, 1.0, low_open=True), default=None,
                   help="masking rate at --max-steps: the rate moves linearly from "
                        "--masked-lm-prob to it over the run (GPT-BERT: 0.3 to 0.15); "
                        "held-out batches use it (default: a constant rate); a run "
                        "extended with --resume --max-steps keeps it from its first "
                        "--max-steps on")
    g.add_argument("--mask-replace-prob", type=probability, default=0.8,
                   help="share of the chosen tokens replaced by [MASK] (BabyBERTa: 1)")
    g.add_argument("--random-replace-prob", type=probability, default=0.1,
                   help="share replaced by a random token; the rest stay themselves "
                        "(sum <= 1; BERT 0.8/0.1, 90/10/0 is 0.9/0.1)")
    g.add_argument("--line-by-line", action=argparse.BooleanOptionalAction, default=None,
                   help="one corpus line per sequence, cut to --max-seq-length, batches "
                        "of similar length padded to their longest (--objective mlm or "
                        "electra; HF run_mlm.py's --line_by_line); default: on with the "
                        "default --objective of --model bert, off with a named one; "
                        "--no-line-by-line packs whole sentences (RoBERTa)")


__all__ = ["DEFAULT_CORPUS", "DEFAULT_EXCLUDE", "DEFAULT_PAIRS", "MODEL_DEFAULTS",
           "PretrainingConfig", "add_masking_arguments"]
