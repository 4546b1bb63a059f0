#!/usr/bin/env python
"""Pretrain a BERT with masked-LM and a sentence-level objective (Devlin et al. 2019).

    python train_mlm.py                     # tiny BERT on the embedded English corpus
    python train_mlm.py --objective mlm     # RoBERTa's full-sentences MLM, no NSP
    python train_mlm.py --preset mini --max-steps 20000 --device cuda
    python train_mlm.py --resume runs/pretrain      # continue from the last checkpoint
    python train_mlm.py --init-checkpoint runs/pretrain --corpus more.txt --output-dir runs/more
                                            # a new run (new schedule) from trained weights
    python train_mlm.py --teacher runs/big --student-init every-other-layer --objective mlm
                                            # general distillation (docs/distillation.md)
    mpirun -np 2 python train_mlm.py        # data parallel over 2 processes (docs/distributed.md)

Steps: learn a WordPiece vocab from the corpus (unless --vocab is given), tokenize the
corpus into a cached token store, hold out whole documents for evaluation, then train
with AdamW, warmup + linear decay and global-norm clipping in minibert.training's loop.
Writes to --output-dir (see minibert.runs): vocab.txt, config.json, args.json,
checkpoint.npz (every --save-every steps and at the end), metrics.jsonl ("train" and
"eval" records) and summary.json, each file atomically.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from minibert import backend, distributed
from minibert.atomic import atomic_copy, atomic_write_bytes, atomic_write_json
from minibert.checkpoint import CheckpointError, check_same_config, load_checkpoint
from minibert.cli import (dropout_probability, explicit_options, fail as _fail, float_in,
                          int_at_least,
                          non_negative_float, non_negative_int, positive_float, positive_int,
                          probability)
from minibert.distillation import (PRUNED_SIZES, DistillationModel, DistillationWeights,
                                   activation_importance, every_other_layer_config,
                                   every_other_layer_state, has_mlm_head, load_teacher,
                                   projected_embeddings_state, pruned_config, pruned_state)
from minibert.hf import HFFormatError, load_pretrained_weights
from minibert.modeling import PRESETS, BertConfig, BertForPreTraining
from minibert.objectives import OBJECTIVES, get_objective
from minibert.optim import AdamW
from minibert.pretraining import (CorpusError, VocabInfo, build_or_load_store,
                                  default_max_predictions, iter_documents, iterate_batches,
                                  make_eval_batches, resolve_corpus_files, split_documents,
                                  token_counts, unigram_cross_entropy)
from minibert.runs import (RunDir, RunError, load_start, prepare_run_dir, resume_args,
                           write_args)
from minibert.tokenization import BertTokenizer, train_wordpiece
from minibert.tokenization.trainer import ALGORITHMS
from minibert.training import (TrainingConfig, TrainingError, TrainState, resume_state,
                               train)

DEFAULT_CORPUS = Path(__file__).resolve().parent / "data" / "pretrain" / "en"
DEFAULT_OBJECTIVE = "mlm+nsp"

# Arguments that decide the data stream, the schedule and the model: a resumed run takes
# them from its checkpoint, and refuses a different value given on the command line.
RESUME_FIXED = ("corpus", "vocab", "vocab_size", "vocab_algorithm", "lowercase", "seed",
                "objective", "max_seq_length", "batch_size", "gradient_accumulation_steps",
                "batch_size_ramp",
                "masking", "dupe_factor", "short_seq_prob", "masked_lm_prob",
                "max_predictions_per_seq", "whole_word_mask", "eval_fraction", "max_steps",
                "lr", "warmup_steps", "weight_decay", "correct_bias", "max_grad_norm",
                "label_smoothing", "dtype", "init_checkpoint", "preset", "num_hidden_layers",
                "hidden_size", "num_attention_heads", "intermediate_size", "hidden_act",
                "hidden_dropout_prob", "attention_probs_dropout_prob",
                "max_position_embeddings", "position_embedding_type", "norm_position",
                "teacher", "student_init", "temperature", "alpha_ce", "alpha_mlm", "alpha_cos",
                "alpha_att", "alpha_pooled", "generator_layers", "disc_weight")

# Options that only mean something with --teacher, and those --student-init
# every-other-layer takes from the teacher instead.
DISTILLATION_OPTIONS = ("student_init", "temperature", "alpha_ce", "alpha_mlm", "alpha_cos",
                        "alpha_att", "alpha_pooled")
# Training sequences (the first, in corpus order) that --student-init pruned scores the
# teacher's units on (Minitron, Muralidharan et al. 2024, section 2.2, uses 1,024).
PRUNING_CALIBRATION_SEQUENCES = 256
ARCHITECTURE_OPTIONS = ("preset", "num_hidden_layers", "hidden_size", "num_attention_heads",
                        "intermediate_size", "hidden_act", "max_position_embeddings",
                        "position_embedding_type", "norm_position", "init_checkpoint")


def parse_args(argv=None) -> tuple[argparse.Namespace, set[str]]:
    """The arguments, and the names of those given on the command line."""
    presets = ", ".join(f"{k} ({l} layers x {h} hidden)" for k, (l, h) in PRESETS.items())
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--corpus", nargs="+", default=[str(DEFAULT_CORPUS)],
                   help="text files or directories (their *.txt): one sentence per line, "
                        "a blank line between documents")
    g.add_argument("--vocab", default=None,
                   help="WordPiece vocab.txt to use; if absent one is learned from the corpus")
    g.add_argument("--vocab-size", type=int_at_least(8), default=8192,
                   help="size of a learned vocab")
    g.add_argument("--vocab-algorithm", choices=ALGORITHMS, default=None,
                   help="merge criterion of the vocab trainer (see python -m "
                        "minibert.tokenization train --help); default: the trainer's")
    g.add_argument("--no-lowercase", dest="lowercase", action="store_false",
                   help="keep case (lower-casing and accent stripping are on by default)")
    g.add_argument("--objective", choices=sorted(OBJECTIVES), default=DEFAULT_OBJECTIVE,
                   help="mlm+nsp: BERT's sentence pairs with next-sentence prediction; mlm: "
                        "RoBERTa's full sentences packed across documents, MLM only; "
                        "mlm+sop: ALBERT's sentence-order prediction; electra: mlm's inputs, "
                        "ELECTRA's replaced-token detection (a small generator fills the masks, "
                        "the model learns to spot replaced tokens at every position)")
    g.add_argument("--generator-layers", type=positive_int, default=None,
                   help="--objective electra: encoder layers of the generator, which shares "
                        "the model's embeddings and width (default: half the model's)")
    g.add_argument("--disc-weight", type=float_in(0.0, low_open=True), default=50.0,
                   help="--objective electra: weight of the replaced-token loss against the "
                        "generator's MLM loss (ELECTRA's lambda, 50)")
    g.add_argument("--max-seq-length", type=int_at_least(5), default=32,
                   help="tokens per sequence (short sequences make a tiny model learn to use "
                        "context sooner on a small corpus; BERT used 128, then 512)")
    g.add_argument("--masked-lm-prob", type=float_in(0.0, 1.0, low_open=True), default=0.15,
                   help="share of tokens masked (BERT 0.15; Wettig et al. 2023 find up to "
                        "0.4 works)")
    g.add_argument("--max-predictions-per-seq", type=positive_int, default=None,
                   help="masked positions per sequence, P of every batch (default: "
                        "ceil(max_seq_length * masked_lm_prob))")
    g.add_argument("--short-seq-prob", type=probability, default=0.1,
                   help="probability of a shorter target length (as google-research/bert)")
    g.add_argument("--masking", choices=["dynamic", "static"], default="dynamic",
                   help="fresh masks every epoch, or dupe_factor fixed versions as the reference")
    g.add_argument("--dupe-factor", type=positive_int, default=10,
                   help="distinct pairings (and static maskings) of the corpus before repeating")
    g.add_argument("--whole-word-mask", action="store_true",
                   help="mask all WordPiece pieces of a chosen word together")
    g.add_argument("--eval-fraction", type=float_in(0.0, 1.0, high_open=True), default=0.02,
                   help="share of documents held out for evaluation")
    g.add_argument("--eval-instances", type=positive_int, default=1024,
                   help="held-out sequences evaluated each time")

    g = p.add_argument_group("model")
    g.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help=f"model size (Turc et al. 2019 sizes): {presets}")
    g.add_argument("--num-hidden-layers", type=positive_int, help="override the preset's layers")
    g.add_argument("--hidden-size", type=positive_int, help="override the preset's hidden size")
    g.add_argument("--num-attention-heads", type=positive_int,
                   help="override the preset's heads")
    g.add_argument("--intermediate-size", type=positive_int,
                   help="override the feed-forward width")
    g.add_argument("--hidden-act", choices=["gelu", "gelu_new", "relu"], default="gelu",
                   help="feed-forward activation (gelu = exact erf form)")
    g.add_argument("--hidden-dropout-prob", type=dropout_probability, default=0.1,
                   help="dropout")
    g.add_argument("--attention-probs-dropout-prob", type=dropout_probability, default=0.1,
                   help="dropout on attention probabilities")
    g.add_argument("--max-position-embeddings", type=positive_int, default=512,
                   help="longest sequence the model can take")
    g.add_argument("--position-embedding-type", choices=["absolute", "sinusoidal"],
                   default="absolute", help="learned (BERT) or fixed sinusoidal positions")
    g.add_argument("--norm-position", choices=["post", "pre"], default="post",
                   help="LayerNorm after the residual sum (BERT) or before each sub-layer")

    g = p.add_argument_group("distillation (docs/distillation.md)")
    g.add_argument("--teacher", default=None, metavar="DIR",
                   help="general distillation: learn from this BERT (a Hugging Face BERT "
                        "directory or a train_mlm.py run), run forward only on every batch; "
                        "the student uses its vocab.txt and lower-casing")
    g.add_argument("--student-init", choices=["preset", "every-other-layer",
                                              "projected-embeddings", "pruned"],
                   default="preset",
                   help="preset: the model options above (--preset and sizes, random "
                        "weights, or --init-checkpoint's); every-other-layer: the teacher's "
                        "config and weights with layers 0, 2, 4, ... (DistilBERT); "
                        "projected-embeddings: the model options above with the teacher's "
                        "embeddings projected onto their top --hidden-size principal "
                        "directions (and W_h starting as that projection's transpose); "
                        "pruned: the teacher cut to the sizes above (--num-hidden-layers, "
                        "--hidden-size, --num-attention-heads of the teacher's head size, "
                        "--intermediate-size), keeping the layers, channels, heads and "
                        "neurons that matter most on the first training sequences "
                        "(Minitron)")
    g.add_argument("--temperature", type=positive_float, default=2.0,
                   help="softmax temperature T of the soft targets (loss scaled by T^2)")
    g.add_argument("--alpha-ce", type=non_negative_float, default=5.0,
                   help="weight of the soft-target KL on the masked positions (needs the "
                        "teacher's MLM head; 0 if it has none and this is not given)")
    g.add_argument("--alpha-mlm", type=non_negative_float, default=2.0,
                   help="weight of the student's own MLM (+ NSP/SOP) loss")
    g.add_argument("--alpha-cos", type=non_negative_float, default=1.0,
                   help="weight of the cosine loss on the last hidden states (with a learned "
                        "projection when the widths differ)")
    g.add_argument("--alpha-att", type=non_negative_float, default=0.0,
                   help="weight of MiniLM's last-layer attention transfer (needs the "
                        "teacher's number of heads)")
    g.add_argument("--alpha-pooled", type=non_negative_float, default=0.0,
                   help="weight of the cosine loss between the mean-pooled last hidden "
                        "states (the sentence embedding of a sentence-transformers teacher "
                        "such as all-MiniLM-L6-v2), through the same projection")

    g = p.add_argument_group("training")
    g.add_argument("--max-steps", type=positive_int, default=3000, help="optimizer steps")
    g.add_argument("--batch-size", type=positive_int, default=128,
                   help="sequences per micro-batch (per step: batch size x accumulation)")
    g.add_argument("--gradient-accumulation-steps", type=positive_int, default=1,
                   help="micro-batches whose gradients are summed (each weighted 1/k) per step")
    g.add_argument("--batch-size-ramp", type=float_in(0.0, 1.0, high_open=True), default=0.0,
                   metavar="FRACTION",
                   help="over this fraction of --max-steps the micro-batches per step grow "
                        "linearly from 1 to --gradient-accumulation-steps (Cramming's batch "
                        "ramp; 0: off)")
    g.add_argument("--lr", type=non_negative_float, default=1e-3, help="peak learning rate")
    g.add_argument("--warmup-steps", type=non_negative_int, default=None,
                   help="linear warmup steps (default: 10%% of --max-steps)")
    g.add_argument("--weight-decay", type=non_negative_float, default=0.01,
                   help="decoupled weight decay (weight matrices only, not LayerNorm or biases)")
    g.add_argument("--no-correct-bias", dest="correct_bias", action="store_false",
                   help="Adam without bias correction, as BERT's optimizer; over the first "
                        "~1000 steps that acts as a several times larger learning rate")
    g.add_argument("--max-grad-norm", type=non_negative_float, default=1.0,
                   help="global-norm clipping threshold (0: no clipping)")
    g.add_argument("--max-nonfinite-steps", type=positive_int, default=5,
                   help="stop after this many steps in a row with a non-finite loss or "
                        "gradient norm (each such step is skipped)")
    g.add_argument("--label-smoothing", type=float_in(0.0, 1.0, high_open=True), default=0.0,
                   help="MLM label smoothing")
    g.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed of weights, data and dropout")
    g.add_argument("--device", choices=list(backend.DEVICES), default=None,
                   help="cpu (NumPy) or cuda (CuPy); default: $MINIBERT_DEVICE or cpu")
    g.add_argument("--dtype", choices=["float32", "float64", "float16"], default="float32",
                   help="parameter and activation dtype; float16 is mixed precision: float16 "
                        "compute, float32 master weights, dynamic loss scaling (for GPUs; "
                        "NumPy's float16 is slow)")
    g.add_argument("--tf32", action="store_true",
                   help="let float32 matmuls use TF32 tensor cores (--device cuda, Ampere+)")
    distributed.add_arguments(g)

    g = p.add_argument_group("output")
    g.add_argument("--output-dir", default="runs/pretrain", help="where everything is written")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the run in --output-dir (default: refuse to write over it)")
    g.add_argument("--init-checkpoint", default=None, metavar="DIR_OR_FILE",
                   help="start from the weights (and config and vocab) of a train_mlm.py "
                        "run, a checkpoint or a Hugging Face BERT directory, with a fresh "
                        "optimizer and schedule (google-research/bert's init_checkpoint); "
                        "architecture options are then taken from it")
    g.add_argument("--resume", nargs="?", const="", default=None, metavar="DIR",
                   help="continue the run in DIR (default: --output-dir) from its checkpoint")
    g.add_argument("--log-every", type=positive_int, default=10,
                   help="steps between train records")
    g.add_argument("--log-grad-norms", type=non_negative_int, default=0, metavar="N",
                   help="every N steps, record per-layer gradient norms and update/weight "
                        "ratios in metrics.jsonl (kind grad_flow; plot: python -m "
                        "minibert.gradflow); 0 = off")
    g.add_argument("--eval-every", type=positive_int, default=250,
                   help="steps between evaluations")
    g.add_argument("--save-every", type=positive_int, default=250,
                   help="steps between checkpoints")
    g.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars")
    args = p.parse_args(argv)
    given = explicit_options(p, argv)
    if args.warmup_steps is None:
        args.warmup_steps = max(1, args.max_steps // 10)
    if args.max_predictions_per_seq is None:
        args.max_predictions_per_seq = default_max_predictions(args.max_seq_length,
                                                               args.masked_lm_prob)
    if args.resume:
        args.output_dir = args.resume
    return args, given


def fail(message: str):
    _fail("train_mlm.py", message)


def fixed_batches(args, store, vocab, objective, seed: int, max_instances: int | None):
    """The same batches every time from ``store`` (held-out evaluation, pruning
    calibration): :func:`minibert.pretraining.make_eval_batches` with the run's data
    options (batch size, length, masking).

    Returns:
        list of :class:`~minibert.pretraining.Batch`, each (B, T) with B = args.batch_size
        and T = args.max_seq_length (the last may hold fewer rows), at most
        ``max_instances`` sequences in all (None: the whole store).
    """
    return make_eval_batches(store, vocab, args.batch_size, args.max_seq_length, seed=seed,
                             objective=objective, max_instances=max_instances,
                             short_seq_prob=args.short_seq_prob,
                             masked_lm_prob=args.masked_lm_prob,
                             max_predictions_per_seq=args.max_predictions_per_seq,
                             whole_word_mask=args.whole_word_mask)


def build_config(args, vocab_size: int) -> BertConfig:
    overrides = {k: getattr(args, k) for k in ("num_hidden_layers", "hidden_size",
                 "num_attention_heads", "intermediate_size") if getattr(args, k) is not None}
    if "hidden_size" in overrides:
        overrides.setdefault("num_attention_heads", max(1, overrides["hidden_size"] // 64))
        overrides.setdefault("intermediate_size", 4 * overrides["hidden_size"])
    return BertConfig.from_preset(
        args.preset, vocab_size=vocab_size, hidden_act=args.hidden_act,
        hidden_dropout_prob=args.hidden_dropout_prob,
        attention_probs_dropout_prob=args.attention_probs_dropout_prob,
        max_position_embeddings=args.max_position_embeddings,
        position_embedding_type=args.position_embedding_type,
        norm_position=args.norm_position, **overrides)


def get_tokenizer(args, run, files, objective, resume: bool) -> BertTokenizer:
    """The given vocab (copied into the run directory, so the run is self-contained for
    finetune.py), the run's own vocab.txt (on resume), or a newly learned one."""
    if resume and run.vocab.is_file():
        pass
    elif args.vocab:
        if not Path(args.vocab).is_file():
            raise CorpusError(f"--vocab {args.vocab}: no such file")
        atomic_copy(args.vocab, run.vocab)
    else:
        # read the corpus once first: bad bytes, an empty corpus or too few documents are
        # reported with file and line before any time goes into learning a vocab
        documents = sum(1 for _ in iter_documents(files))
        where = ", ".join(map(str, files))
        if documents == 0:
            raise CorpusError(f"{where}: the corpus is empty (no non-blank line)")
        if documents < objective.min_documents:
            raise CorpusError(f"{where}: {documents} document(s); --objective "
                              f"{objective.name} needs at least {objective.min_documents} "
                              "(separate documents with a blank line)")
        print(f"learning a {args.vocab_size}-token WordPiece vocab from {where}")
        t0 = time.time()
        algorithm = {"algorithm": args.vocab_algorithm} if args.vocab_algorithm else {}
        train_wordpiece([str(f) for f in files], vocab_size=args.vocab_size,
                        lowercase=args.lowercase, output=str(run.vocab),
                        show_progress=args.progress, **algorithm)
        print(f"vocab written to {run.vocab} in {time.time() - t0:.1f} s")
    return BertTokenizer(str(run.vocab), do_lower_case=args.lowercase)


def resolve_teacher(args, given: set[str]):
    """Load ``--teacher`` and take from it what a student shares with its teacher.

    Sets ``args.vocab`` (the teacher's vocab.txt) and ``args.lowercase`` (its
    do_lower_case) and, for a teacher without an MLM head, ``args.alpha_ce`` = 0 unless
    given. Returns (the :class:`~minibert.runs.Pretrained` teacher, the
    :class:`~minibert.distillation.DistillationWeights`).

    Raises:
        RunError: a bad teacher, or options that contradict it (another vocab, another
            lower-casing given, --alpha-ce given for a teacher without MLM head,
            --student-init every-other-layer with architecture options, a sequence
            longer than the teacher's positions). ValueError: every weight 0.
    """
    teacher = load_start(args.teacher, "--teacher")
    lower = bool(teacher.tokenizer_options.get("do_lower_case", True))
    if lower != args.lowercase:
        if "lowercase" in given:
            raise RunError(f"--teacher {args.teacher} reads text with do_lower_case={lower}; "
                           "the student reads it as its teacher does (drop --no-lowercase)")
        args.lowercase = lower
    if args.vocab and Path(args.vocab).read_bytes() != teacher.vocab_file.read_bytes():
        raise RunError(f"the student's vocab {args.vocab} (--vocab or --init-checkpoint's) "
                       f"differs from {teacher.vocab_file}, the vocab of --teacher "
                       f"{args.teacher}: a student shares its teacher's vocab")
    args.vocab = str(teacher.vocab_file)
    if args.max_seq_length > teacher.config.max_position_embeddings:
        raise RunError(f"--max-seq-length {args.max_seq_length} exceeds the teacher's "
                       f"max_position_embeddings {teacher.config.max_position_embeddings}")
    if args.student_init == "every-other-layer":
        clash = [n for n in ARCHITECTURE_OPTIONS if n in given]
        if clash:
            raise RunError("--student-init every-other-layer takes the teacher's architecture "
                           "and weights; drop " + ", ".join("--" + n.replace("_", "-")
                                                            for n in clash))
    if args.student_init in ("projected-embeddings", "pruned") and "init_checkpoint" in given:
        raise RunError(f"--student-init {args.student_init} starts from the teacher's "
                       "weights; drop --init-checkpoint (or use --student-init preset)")
    if args.student_init == "pruned":
        clash = [n for n in ARCHITECTURE_OPTIONS if n in given and n not in PRUNED_SIZES
                 and n not in ("preset", "init_checkpoint")]
        if clash:
            raise RunError("--student-init pruned takes the teacher's architecture but for "
                           "its sizes; drop " + ", ".join("--" + n.replace("_", "-")
                                                          for n in clash))
    if args.alpha_ce > 0 and not has_mlm_head(teacher.state):
        if "alpha_ce" in given:
            raise RunError(f"--alpha-ce {args.alpha_ce:g}: --teacher {args.teacher} has no MLM "
                           "head (cls.predictions.*, e.g. a sentence-embedding model), so "
                           "there are no soft targets; pass --alpha-ce 0 and learn from its "
                           "hidden states (--alpha-cos) and attention (--alpha-att)")
        print(f"--teacher {args.teacher} has no MLM head (cls.predictions.*): soft-target "
              "loss off (--alpha-ce 0)")
        args.alpha_ce = 0.0
    weights = DistillationWeights(args.temperature, args.alpha_ce, args.alpha_mlm,
                                  args.alpha_cos, args.alpha_att, args.alpha_pooled)
    return teacher, weights


def init_student(model, how: str, teacher, calibration=()) -> None:
    """Load the new student's starting weights from the teacher (a
    :class:`~minibert.runs.Pretrained`) as ``--student-init`` says (``preset``: none);
    ``pruned`` scores the teacher's units on the ``calibration`` batches."""
    if how == "every-other-layer":
        report = load_pretrained_weights(model, every_other_layer_state(teacher.state),
                                         teacher.source)
        kept = ", ".join(map(str, range(0, teacher.config.num_hidden_layers, 2)))
        print(f"student: layers {kept} of the teacher and its other weights; new: "
              f"{report['new'] or 'none'}")
    elif how == "projected-embeddings":
        width = model.config.hidden_size
        tables, basis = projected_embeddings_state(teacher.state, width)
        if hasattr(model, "hidden_projection"):
            tables["hidden_projection.weight"] = basis
        model.load_state_dict(tables, strict=False)
        print(f"student: the teacher's embeddings projected onto their top {width} principal "
              f"directions: {', '.join(sorted(tables))}")
    elif how == "pruned":
        importance = activation_importance(model.teacher.bert, calibration)
        state, channels, layers = pruned_state(teacher.state, teacher.config, model.config,
                                               importance)
        if hasattr(model, "hidden_projection"):
            # W_h (Ct, Cs) puts each kept channel back where the teacher has it
            selection = np.zeros(model.hidden_projection.weight.data.shape, np.float32)
            selection[channels, np.arange(len(channels))] = 1.0
            state["hidden_projection.weight"] = selection
        report = load_pretrained_weights(model, state, teacher.source)
        c = model.config
        print(f"student: the teacher pruned to layers {', '.join(map(str, layers))}, "
              f"{c.hidden_size} of {teacher.config.hidden_size} channels, "
              f"{c.num_attention_heads} of {teacher.config.num_attention_heads} heads and "
              f"{c.intermediate_size} of {teacher.config.intermediate_size} neurons per layer "
              f"(scored on {sum(len(b.input_ids) for b in calibration)} training sequences); "
              f"new: {report['new'] or 'none'}")


def student_config(args, teacher, resumed, start) -> BertConfig:
    """The student's architecture: the checkpoint's (resume), --init-checkpoint's, the
    teacher's with every other layer, or the model options with the teacher's vocab size.

    Raises:
        RunError: --alpha-att with another head count than the teacher's.
    """
    if resumed is not None:
        config = resumed["config"]
    elif start is not None:
        config = start.config
    elif args.student_init == "every-other-layer":
        config = every_other_layer_config(
            teacher.config, hidden_dropout_prob=args.hidden_dropout_prob,
            attention_probs_dropout_prob=args.attention_probs_dropout_prob)
    elif args.student_init == "pruned":
        sizes = build_config(args, teacher.config.vocab_size)
        try:
            config = pruned_config(
                teacher.config, **{n: getattr(sizes, n) for n in PRUNED_SIZES},
                hidden_dropout_prob=args.hidden_dropout_prob,
                attention_probs_dropout_prob=args.attention_probs_dropout_prob)
        except ValueError as e:
            raise RunError(f"--student-init pruned: {e}") from None
    else:
        config = build_config(args, teacher.config.vocab_size)
    if config.vocab_size != teacher.config.vocab_size:
        raise RunError(f"the student's vocab_size {config.vocab_size} differs from the "
                       f"teacher's {teacher.config.vocab_size}")
    if (args.student_init == "projected-embeddings"
            and config.hidden_size > teacher.config.hidden_size):
        raise RunError(f"--student-init projected-embeddings: the student's hidden size "
                       f"{config.hidden_size} exceeds the teacher's "
                       f"{teacher.config.hidden_size}; projection only narrows")
    if args.alpha_att > 0 and config.num_attention_heads != teacher.config.num_attention_heads:
        raise RunError(f"--alpha-att {args.alpha_att:g}: attention transfer needs the "
                       f"teacher's {teacher.config.num_attention_heads} heads, the student "
                       f"has {config.num_attention_heads} (--num-attention-heads, or "
                       "--alpha-att 0)")
    return config


class PretrainTask:
    """The pretraining job for :func:`minibert.training.train` (with a
    :class:`~minibert.distillation.DistillationModel`, its terms are summed too)."""

    def __init__(self, args, objective, store, vocab, eval_batches, reference, model, xp):
        self.args, self.objective, self.store, self.vocab = args, objective, store, vocab
        self.reference = reference  # baselines printed beside every evaluation
        self.eval_batches, self.model, self.xp = eval_batches, model, xp
        self.evaluate = self._evaluate if eval_batches else None
        self.data_kw = dict(masking=args.masking, dupe_factor=args.dupe_factor,
                            short_seq_prob=args.short_seq_prob,
                            masked_lm_prob=args.masked_lm_prob,
                            max_predictions_per_seq=args.max_predictions_per_seq,
                            whole_word_mask=args.whole_word_mask)

    def batches(self, epoch: int, start_batch: int):
        return iterate_batches(self.store, self.vocab, self.args.batch_size,
                               self.args.max_seq_length, epoch=epoch, seed=self.args.seed,
                               start_batch=start_batch, objective=self.objective,
                               **self.data_kw)

    def forward(self, model, batch):
        inputs = {k: self.xp.asarray(v) for k, v in batch.model_inputs().items()}
        out = model(**inputs)
        sums = self.objective.stats(out, inputs)
        if isinstance(model, DistillationModel):
            sums.update(model.stats(out, inputs))
        return out.loss, sums

    def summarize(self, totals: dict) -> dict:
        return {**self.objective.summarize(totals), **DistillationModel.summarize(totals)}

    def _evaluate(self, step: int) -> dict:
        self.model.eval()
        sums: dict = {}
        for b in self.eval_batches:   # summed on the device, read once
            for k, v in self.forward(self.model, b)[1].items():
                sums[k] = sums.get(k, 0) + v
        return {**self.summarize({k: float(v) for k, v in sums.items()}), **self.reference}

    def trainer_record(self) -> dict:
        return {"job": "pretrain", "args": vars(self.args),
                "tokenizer": {"do_lower_case": self.args.lowercase}}


def main(argv=None) -> int:
    args, given = parse_args(argv)
    comm = distributed.start(args, fail)
    leader = comm.is_leader
    try:
        device = backend.set_device(args.device)
        if args.tf32:
            backend.set_tf32(True)
    except backend.BackendError as e:
        fail(str(e))
    xp = backend.xp_for(device)
    resume = args.resume is not None
    start = resumed = None
    if not leader:  # rank 0 prepares the run directory, vocab and token store first
        comm.barrier()
    try:
        if resume:  # the run's own arguments, unless given here
            run = (prepare_run_dir(args.output_dir, "pretrain", resume=True) if leader
                   else RunDir(Path(args.output_dir), "pretrain"))
            resumed = load_checkpoint(run.checkpoint)
            resume_args(args, resumed["trainer"].get("args", {}), RESUME_FIXED, given,
                        str(run.checkpoint))
        elif args.init_checkpoint:
            start = load_start(args.init_checkpoint, "--init-checkpoint")
            if start.tokenizer_options.get("do_lower_case", True) != args.lowercase:
                raise RunError(f"--init-checkpoint {args.init_checkpoint} was trained with "
                               f"lowercase={start.tokenizer_options.get('do_lower_case', True)}"
                               f"; this run has lowercase={args.lowercase} (add or drop "
                               "--no-lowercase)")
            if args.vocab and Path(args.vocab).read_bytes() != start.vocab_file.read_bytes():
                raise RunError(f"--vocab {args.vocab} differs from {start.vocab_file}, the "
                               f"vocab the weights of --init-checkpoint were trained with")
            args.vocab = str(start.vocab_file)
        teacher = weights = config = None
        if args.teacher:  # checked before anything is written
            teacher, weights = resolve_teacher(args, given)
            config = student_config(args, teacher, resumed, start)
        elif stray := [n for n in DISTILLATION_OPTIONS if n in given]:
            raise RunError(", ".join("--" + n.replace("_", "-") for n in stray)
                           + ": distillation options, only with --teacher")
        if args.objective == "electra" and args.teacher:
            raise RunError("--teacher works with the BERT objectives, not --objective electra")
        if args.objective != "electra" and (
                stray := [n for n in ("generator_layers", "disc_weight") if n in given]):
            raise RunError(", ".join("--" + n.replace("_", "-") for n in stray)
                           + ": ELECTRA options, only with --objective electra")
        if args.batch_size_ramp > 0 and args.gradient_accumulation_steps < 2:
            raise RunError(f"--batch-size-ramp {args.batch_size_ramp:g} ramps the micro-batches "
                           "per step up to --gradient-accumulation-steps, which is 1: give it "
                           ">= 2 (the full batch is --batch-size x that)")
        if not resume:
            run = (prepare_run_dir(args.output_dir, "pretrain", overwrite=args.overwrite)
                   if leader else RunDir(Path(args.output_dir), "pretrain"))
        objective = get_objective(args.objective)
        files = resolve_corpus_files(args.corpus)
        tokenizer = get_tokenizer(args, run, files, objective, resume or not leader)
        store = build_or_load_store(files, tokenizer, cache_dir=run.path / "cache",
                                    show_progress=args.progress,
                                    min_documents=objective.min_documents)
        train_store, eval_store = split_documents(store, eval_fraction=args.eval_fraction,
                                                  seed=args.seed,
                                                  min_documents=objective.min_documents)
        if config is not None:                             # the student's, see above
            pass
        elif resumed is not None and args.init_checkpoint:  # the architecture it took over
            config = resumed["config"]
        elif start is not None:
            config = start.config
        else:
            config = build_config(args, len(tokenizer))
        if config.vocab_size < len(tokenizer):
            raise RunError(f"the model's vocab_size {config.vocab_size} is smaller than the "
                           f"vocab's {len(tokenizer)} tokens")
        if args.max_seq_length > config.max_position_embeddings:
            raise RunError(f"--max-seq-length {args.max_seq_length} exceeds "
                           f"max_position_embeddings {config.max_position_embeddings}")
    except (CorpusError, RunError, CheckpointError, HFFormatError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"{getattr(e, 'filename', '') or ''}: {e.strerror or e}")
    if leader:
        comm.barrier()
    if args.batch_size < comm.world_size:
        fail(f"--batch-size {args.batch_size} is the global batch, split over "
             f"{comm.world_size} ranks: it must be at least {comm.world_size}")
    if leader and objective.sentence_task == "nsp":
        single = float(np.mean(train_store.sentences_per_document() == 1))
        if single > 0.5:
            # google-research/bert pairs a one-sentence chunk only with a random B, so
            # such documents give NSP nothing but "random next" examples.
            print(f"warning: {single:.0%} of the {train_store.num_documents} training "
                  "documents hold a single sentence, so their NSP pairs are always random "
                  "and NSP is nearly a constant task; the corpus format is one sentence per "
                  "line with a blank line between documents, not between sentences",
                  file=sys.stderr)
    vocab = VocabInfo.from_tokenizer(tokenizer)
    state = TrainState()
    model_kw = dict(seed=args.seed, dtype=np.dtype(args.dtype),
                    label_smoothing=args.label_smoothing,
                    seq_relationship_head=objective.sentence_task is not None)
    try:
        if teacher is not None:
            model = DistillationModel(config, load_teacher(teacher, np.dtype(args.dtype)),
                                      weights, **model_kw)
            if resumed is None:
                calibration = [] if args.student_init != "pruned" else fixed_batches(
                    args, train_store, vocab, objective, args.seed + 2,
                    PRUNING_CALIBRATION_SEQUENCES)
                init_student(model, args.student_init, teacher, calibration)
        else:
            del model_kw["seq_relationship_head"]          # the objective decides
            if objective.name == "electra":
                model_kw.update(generator_layers=args.generator_layers,
                                disc_weight=args.disc_weight)
            model = objective.build_model(config, **model_kw)
        if start is not None:
            report = load_pretrained_weights(model, start.state, start.source)
            print(f"weights from {start.source}; new: {report['new'] or 'none'}; "
                  f"not used: {report['unused'] or 'none'}")
        if resumed is not None:
            check_same_config(resumed["config"], config, str(run.checkpoint))
            model.load_state_dict(resumed["model"])
    except (CheckpointError, HFFormatError, KeyError, ValueError) as e:
        fail(str(e))
    start = teacher = None  # the weights are in the models now
    model.to(device)
    optimizer = AdamW(model.named_parameters(), lr=args.lr, weight_decay=args.weight_decay,
                      correct_bias=args.correct_bias)
    if resumed is not None:
        try:
            state = resume_state(resumed, optimizer)
        except TrainingError as e:
            fail(f"checkpoint {run.checkpoint}: {e}")
        print(f"resuming {run.checkpoint} at step {state.step} (epoch {state.epoch}, batch "
              f"{state.batch_in_epoch})")
        if note := distributed.resume_notice(state.world_size, comm):
            print(note)
        resumed = None
    if leader:
        atomic_write_bytes(run.config, config.to_json().encode())
        write_args(run, vars(args))

    eval_batches = [] if not leader else fixed_batches(args, eval_store, vocab, objective,
                                                       args.seed + 1, args.eval_instances)
    reference = {}
    if eval_batches:  # none when --eval-fraction is 0
        counts = token_counts(train_store, config.vocab_size)
        reference["unigram_baseline"] = unigram_cross_entropy(
            counts, [b.masked_lm_ids for b in eval_batches],
            [b.masked_lm_weights for b in eval_batches])
        if objective.sentence_task:
            # always guessing the commoner label: at short max_seq_length most NSP chunks
            # hold one segment, which the reference always pairs with a random B
            share = float(np.concatenate([b.next_sentence_label for b in eval_batches]).mean())
            reference[f"{objective.sentence_task}_majority"] = max(share, 1.0 - share)
        if args.teacher and model.teacher.has_mlm_head:
            total, count = model.teacher.mlm_loss_sums(eval_batches, xp)
            reference["teacher_mlm_loss"] = total / count if count else float("nan")
    arch = (f"config of {args.init_checkpoint}" if args.init_checkpoint
            else f"every other layer of {args.teacher}"
            if args.teacher and args.student_init == "every-other-layer"
            else f"{args.teacher} pruned to its sizes"
            if args.teacher and args.student_init == "pruned"
            else f"{args.preset} preset")
    print(f"model: {arch}, {model.num_parameters():,} parameters, vocab {config.vocab_size}; "
          f"objective {objective.name}; train documents {train_store.num_documents}, tokens "
          f"{train_store.num_tokens:,}; held-out documents {eval_store.num_documents}, "
          f"{sum(len(b.input_ids) for b in eval_batches)} sequences"
          + "".join(f"; {k.replace('_', ' ')} {v:.3f}" for k, v in reference.items()))
    if args.teacher:
        tc, w = model.teacher.config, model.weights
        print(f"teacher: {args.teacher}, {model.teacher.num_parameters():,} parameters "
              f"({tc.num_hidden_layers} layers x {tc.hidden_size} hidden, {tc.num_attention_heads}"
              f" heads); loss = {w.alpha_mlm:g} x student + {w.alpha_ce:g} x soft-target KL "
              f"(T {w.temperature:g}) + {w.alpha_cos:g} x cosine"
              + (f" through a {config.hidden_size}->{tc.hidden_size} projection"
                 if hasattr(model, "hidden_projection") else "")
              + f" + {w.alpha_pooled:g} x pooled cosine + {w.alpha_att:g} x attention KL")
    if comm.world_size > 1:
        print(distributed.describe(comm, args.batch_size))

    task = PretrainTask(args, objective, train_store, vocab, eval_batches, reference, model, xp)
    cfg = TrainingConfig(max_steps=args.max_steps, lr=args.lr, warmup_steps=args.warmup_steps,
                         max_grad_norm=args.max_grad_norm,
                         gradient_accumulation_steps=args.gradient_accumulation_steps,
                         batch_size_ramp_steps=round(args.batch_size_ramp * args.max_steps),
                         seed=args.seed, log_every=args.log_every, eval_every=args.eval_every,
                         save_every=args.save_every,
                         max_nonfinite_steps=args.max_nonfinite_steps,
                         log_grad_norms=args.log_grad_norms, progress=args.progress,
                         desc="pretrain")
    t0 = time.perf_counter()
    try:
        state, last_eval = train(model, optimizer, task, cfg, state, metrics_path=run.metrics,
                                 checkpoint_path=run.checkpoint, comm=comm, device=device)
    except (TrainingError, CorpusError) as e:
        fail(str(e))
    if not leader:
        return 0
    if last_eval is None and task.evaluate is not None:  # e.g. --resume of a finished run
        last_eval = {"step": state.step, **task.evaluate(state.step)}
    summary = {"objective": objective.name,
               **({"teacher": args.teacher} if args.teacher else {}), "steps": state.step, "epochs_started": state.epoch + 1,
               "seconds_this_run": round(time.perf_counter() - t0, 1),
               "seconds_total": round(state.elapsed_s, 1),
               "parameters": model.num_parameters(), "vocab_size": config.vocab_size,
               **reference,
               **{"eval_" + k: v for k, v in (last_eval or {}).items()
                  if k not in ("kind", "step", "elapsed_s") and k not in reference},
               "checkpoint": str(run.checkpoint)}
    atomic_write_json(run.summary, summary)
    print("summary: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in summary.items()))
    if last_eval and "unigram_baseline" in reference:
        base = reference["unigram_baseline"]
        print(f"held-out MLM loss {last_eval['mlm_loss']:.3f} nats vs unigram baseline "
              f"{base:.3f} ({base - last_eval['mlm_loss']:+.3f} better)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
