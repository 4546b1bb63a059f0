"""TEMPORARY home (lead's WIP; moves into the distillation package at the merge):
what the jobs need from distillation: its options, the teacher line of the log, and the
soft targets of task distillation."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .cli import add_options, non_negative_float, float_in
from .finetuning.data import DatasetError
from .runs import RunError, load_start

# Options that only mean something with train_mlm.py --teacher, and with finetune.py --teacher.
OPTIONS = ("student_init", "temperature", "alpha_ce", "alpha_mlm", "alpha_cos", "alpha_att",
           "alpha_pooled")
TASK_OPTIONS = ("distill_alpha", "temperature", "transfer_data")


def add_arguments(g) -> None:
    """General distillation's options (train_mlm.py): ``--teacher``, ``--student-init``,
    ``--temperature`` and the loss weights ``--alpha-*``."""
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
    add_options(g, temperature=2.0)
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



def add_task_arguments(g) -> None:
    """Task distillation's options (finetune.py): ``--teacher``, ``--distill-alpha``,
    ``--temperature``, ``--transfer-data``."""
    g.add_argument("--teacher", metavar="DIR", default=None,
                   help="a fine-tuned sequence classifier (finetune.py output or Hugging "
                        "Face directory) with the same labels: the student also learns from "
                        "its soft labels (Hinton et al. 2015)")
    g.add_argument("--distill-alpha", type=float_in(0.0, 1.0), default=0.5,
                   help="weight of the soft-label loss; 1 - it weighs the gold-label loss")
    add_options(g, temperature=2.0)
    g.add_argument("--transfer-data", metavar="FILE", default=None,
                   help="unlabelled in-domain text, one 'sentence' or 'sentence_a<TAB>"
                        "sentence_b' per line, added to the train rows with the teacher's "
                        "soft labels only (the transfer set of Turc et al. 2019)")


def describe_teacher(model, source: str) -> str:
    """The log line of a :class:`~minibert.distillation.DistillationModel`'s teacher and
    loss."""
    tc, w = model.teacher.config, model.weights
    return (f"teacher: {source}, {model.teacher.num_parameters():,} parameters "
            f"({tc.num_hidden_layers} layers x {tc.hidden_size} hidden, "
            f"{tc.num_attention_heads} heads); loss = {w.alpha_mlm:g} x student + "
            f"{w.alpha_ce:g} x soft-target KL (T {w.temperature:g}) + {w.alpha_cos:g} x cosine"
            + (f" through a {model.config.hidden_size}->{tc.hidden_size} projection"
               if hasattr(model, "hidden_projection") else "")
            + f" + {w.alpha_pooled:g} x pooled cosine + {w.alpha_att:g} x attention KL")


def soft_targets(args, tokenizer, train_split, labels, max_len, xp):
    """Task distillation's start (``finetune.py --teacher``): the teacher labels every
    train row once, before training.

    Args:
        args: finetune.py's options (``teacher``, ``transfer_data``, ``distill_alpha``,
            ``temperature``, ``eval_batch_size``).
        train_split: the encoded train split; labels: the class names, in the model's
            order; max_len: tokens per row; xp: the array module of the device.
    Returns:
        (the train split with the ``--transfer-data`` rows added, the
        :class:`~minibert.finetuning.distill.SoftTargets` of every row: (N, K) logits).
    Raises:
        ValueError: a teacher that cannot be loaded or has other labels (the message
            names ``--teacher``). DatasetError: a bad ``--transfer-data`` file.
    """
    from .finetuning.distill import SoftTargets, read_transfer, teacher_logits, with_transfer_rows
    try:
        teacher = load_start(args.teacher)
    except ValueError as e:
        raise ValueError(f"--teacher {args.teacher}: {e}") from None
    try:
        if args.transfer_data:
            rows = read_transfer(args.transfer_data)
            train_split = with_transfer_rows(train_split, tokenizer, rows, max_len)
        logits = teacher_logits(teacher, train_split.examples, labels, max_len,
                                args.eval_batch_size, xp)
    except DatasetError as e:
        raise DatasetError(f"--transfer-data {e}") from None
    gold = np.asarray(train_split.labels) >= 0
    agree = float((logits[gold].argmax(-1) == np.asarray(train_split.labels)[gold]).mean())
    print(f"teacher {teacher.source}: soft labels for {len(train_split)} train rows "
          f"({int((~gold).sum())} from --transfer-data), its train accuracy {agree:.4f}; "
          f"loss = {1 - args.distill_alpha:g} * CE + {args.distill_alpha:g} * "
          f"{args.temperature:g}^2 * KL at T = {args.temperature:g}")
    return train_split, SoftTargets(logits, args.distill_alpha, args.temperature)



# ---- TEMPORARY copies of train_mlm.py's functions until the distillation package lands
from .distillation import (DistillationWeights, every_other_layer_config,  # noqa: E402
                           every_other_layer_state, has_mlm_head, projected_embeddings_state)
from .hf import load_pretrained_weights  # noqa: E402
from .pruning import PRUNED_SIZES, activation_importance, pruned_config, pruned_state  # noqa
ARCHITECTURE_OPTIONS = ("preset", "num_hidden_layers", "hidden_size", "num_attention_heads",
                        "intermediate_size", "hidden_act", "max_position_embeddings",
                        "position_embedding_type", "norm_position", "init_checkpoint")
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


def student_config(args, teacher, resumed, start, sizes):
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
        try:
            config = pruned_config(
                teacher.config, **{n: getattr(sizes, n) for n in PRUNED_SIZES},
                hidden_dropout_prob=args.hidden_dropout_prob,
                attention_probs_dropout_prob=args.attention_probs_dropout_prob)
        except ValueError as e:
            raise RunError(f"--student-init pruned: {e}") from None
    else:
        config = sizes
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


