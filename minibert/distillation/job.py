"""The start of a general-distillation run (``train_mlm.py --teacher``): its command-line
options (:func:`add_arguments`, read into :class:`DistillationOptions`), the teacher they
name and what the student takes from it (:func:`resolve_teacher`), the student's
architecture (:func:`student_config`), its starting weights (:func:`init_student`) and
the log line of the teacher (:func:`describe_teacher`).

The errors are :class:`~minibert.runs.RunError` and name the command-line options
(``--teacher``, ``--student-init`` ...), since these functions decide what a run's options
may combine; the functions print what they take over, as the job's log.

Shape legend: Ct / Cs = teacher / student hidden size.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Sequence

import numpy as np

from ..cli import add_options, flag, non_negative_float
from ..distilbert import DistilBertConfig, distilbert_state_from_bert
from ..hf import load_pretrained_weights
from ..modeling import BertConfig
from ..runs import Pretrained, RunError, load_start
from .model import DistillationModel, DistillationWeights
from .pruning import PRUNED_SIZES, activation_importance, pruned_config, pruned_state
from .students import every_other_layer_config, every_other_layer_state, projected_embeddings_state
from .teacher import has_mlm_head

__all__ = ["ARCHITECTURE_OPTIONS", "OPTIONS", "STUDENT_INITS", "DistillationOptions",
           "ResolvedTeacher", "add_arguments", "describe_teacher", "init_student",
           "resolve_teacher", "student_config"]

# How a new student starts: --student-init's choices.
STUDENT_INITS = ("preset", "every-other-layer", "projected-embeddings", "pruned")
# The options (argparse destinations) that choose a model's architecture: every-other-layer
# takes it all from the teacher, pruned all but the PRUNED_SIZES.
ARCHITECTURE_OPTIONS = ("preset", "num_hidden_layers", "hidden_size", "num_attention_heads",
                        "intermediate_size", "hidden_act", "max_position_embeddings",
                        "position_embedding_type", "norm_position", "init_checkpoint")


# Options that only mean something with --teacher.
OPTIONS = ("student_init", "temperature", "alpha_ce", "alpha_mlm", "alpha_cos", "alpha_att",
           "alpha_pooled")


def _flags(names) -> str:
    """``["init_checkpoint", "hidden_act"]`` -> ``"--init-checkpoint, --hidden-act"``."""
    return ", ".join(map(flag, names))


def add_arguments(g) -> None:
    """General distillation's options (train_mlm.py): ``--teacher``, ``--student-init``,
    ``--temperature`` and the loss weights ``--alpha-*``."""
    g.add_argument("--teacher", default=None, metavar="DIR",
                   help="general distillation: learn from this BERT (a Hugging Face BERT "
                        "directory or a train_mlm.py run), run forward only on every batch; "
                        "the student uses its vocab.txt and lower-casing")
    g.add_argument("--student-init", choices=STUDENT_INITS,
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




@dataclass(frozen=True)
class DistillationOptions:
    """What a general-distillation run asks for: ``train_mlm.py``'s distillation options,
    under their argparse destinations (docs/distillation.md).

    Attributes:
        teacher: the teacher's directory (``--teacher``): a Hugging Face BERT directory or
            a minibert run, as :func:`minibert.runs.load_start` reads.
        student_init: how a new student starts (``--student-init``), one of
            :data:`STUDENT_INITS`.
        temperature, alpha_ce, alpha_mlm, alpha_cos, alpha_att, alpha_pooled: the loss, as
            :class:`~.model.DistillationWeights` (``--temperature``, ``--alpha-*``).
        given: the destinations of the options given explicitly on the command line
            (:func:`minibert.cli.explicit_options`), those of the other option groups
            included: an explicit ``lowercase``, ``alpha_ce`` or architecture option that
            contradicts the teacher is an error where a default gives way.
    Raises:
        ValueError: an unknown ``student_init``.
    """

    teacher: str
    student_init: str = "preset"
    temperature: float = 2.0
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    alpha_att: float = 0.0
    alpha_pooled: float = 0.0
    given: frozenset[str] = frozenset()

    def __post_init__(self):
        if self.student_init not in STUDENT_INITS:
            raise ValueError(f"student_init must be one of {', '.join(STUDENT_INITS)}, "
                             f"got {self.student_init!r}")
        object.__setattr__(self, "given", frozenset(self.given))

    @classmethod
    def of(cls, values, given: Collection[str] = ()) -> "DistillationOptions":
        """The options read from the attributes of the same names of ``values`` (e.g. a
        :class:`~minibert.pretraining.PretrainingConfig`), with ``given`` the explicit ones."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "given"]
        return cls(**{n: getattr(values, n) for n in names}, given=frozenset(given))

    def weights(self) -> DistillationWeights:
        """The loss weights (raises ValueError as :class:`~.model.DistillationWeights`)."""
        return DistillationWeights(self.temperature, self.alpha_ce, self.alpha_mlm,
                                   self.alpha_cos, self.alpha_att, self.alpha_pooled)


@dataclass
class ResolvedTeacher:
    """What :func:`resolve_teacher` found: the ``teacher`` (a loaded
    :class:`~minibert.runs.Pretrained`), the loss ``weights`` (``alpha_ce`` 0 for a teacher
    without MLM head when it was not given), and what the student shares with its teacher:
    the ``vocab`` file (the teacher's vocab.txt) and ``lowercase`` (its do_lower_case)."""

    teacher: Pretrained
    weights: DistillationWeights
    vocab: str
    lowercase: bool


def resolve_teacher(options: DistillationOptions, *, vocab: str | None, lowercase: bool,
                    max_seq_length: int) -> ResolvedTeacher:
    """Load ``options.teacher`` and check the student's options against it.

    Args:
        options: :class:`DistillationOptions`.
        vocab: the student's vocab file (``--vocab`` or ``--init-checkpoint``'s), or None.
        lowercase: the student's lower-casing (``--lowercase``), taken from the teacher
            unless ``"lowercase"`` is in ``options.given``.
        max_seq_length: the student's sequence length in tokens (``--max-seq-length``).
    Returns:
        :class:`ResolvedTeacher`. Prints a line when ``alpha_ce`` is turned off.
    Raises:
        RunError: a bad teacher (not a BERT), or options that contradict it (another vocab, another
            lower-casing given, ``alpha_ce`` given for a teacher without MLM head,
            every-other-layer with architecture options, projected-embeddings or pruned
            with ``--init-checkpoint``, pruned with architecture options other than the
            sizes, a sequence longer than the teacher's positions). ValueError: every loss
            weight 0.
    """
    teacher = load_start(options.teacher, "--teacher")
    lower = _check_teacher(teacher, options, vocab=vocab, lowercase=lowercase,
                           max_seq_length=max_seq_length)
    _check_student_init(options.student_init, options.given)
    if options.alpha_ce > 0 and not has_mlm_head(teacher.state):
        options = _without_soft_targets(options)
    return ResolvedTeacher(teacher, options.weights(), str(teacher.vocab_file), lower)


def _check_teacher(teacher, options: DistillationOptions, *, vocab: str | None,
                   lowercase: bool, max_seq_length: int) -> bool:
    """Check the loaded ``--teacher`` (a :func:`load_start` result) against the student's
    reading of the text (:func:`resolve_teacher`'s arguments) and return the teacher's
    lower-casing.

    Raises:
        RunError: a model family that cannot teach (not a BERT, or a DistilBERT or an
            ELECTRA without ``--student-init preset``), another lower-casing given, another vocab, or a
            sequence longer than the teacher's positions.
    """
    source = options.teacher
    # a teacher is a BERT; a DistilBERT or an ELECTRA (soft targets from a generator, hidden
    # states from either) teaches a student of its own sizes, not a copy of its weights
    kind = teacher.config.model_type
    if kind not in ("bert", "distilbert", "electra"):
        raise RunError(f"--teacher {source}: holds a model of model_type {kind!r}; a teacher "
                       "is a BERT (the student may be an ALBERT: --model albert), or a "
                       "DistilBERT or an ELECTRA with --student-init preset")
    if kind != "bert" and options.student_init != "preset":
        raise RunError(f"--teacher {source}: a model of model_type {kind!r} teaches a student "
                       f"of its own sizes only (--student-init preset); --student-init "
                       f"{options.student_init} reads BERT's layer names")
    lower = bool(teacher.tokenizer_options.get("do_lower_case", True))
    if lower != lowercase and "lowercase" in options.given:
        raise RunError(f"--teacher {source} reads text with do_lower_case={lower}; "
                       "the student reads it as its teacher does (drop --no-lowercase)")
    if vocab and Path(vocab).read_bytes() != teacher.vocab_file.read_bytes():
        raise RunError(f"the student's vocab {vocab} (--vocab or --init-checkpoint's) "
                       f"differs from {teacher.vocab_file}, the vocab of --teacher "
                       f"{source}: a student shares its teacher's vocab")
    if max_seq_length > teacher.config.max_position_embeddings:
        raise RunError(f"--max-seq-length {max_seq_length} exceeds the teacher's "
                       f"max_position_embeddings {teacher.config.max_position_embeddings}")
    return lower


def _check_student_init(how: str, given) -> None:
    """Refuse options that contradict ``--student-init`` ``how`` (names in ``given``,
    the options given explicitly).

    Raises:
        RunError: every-other-layer with architecture options, projected-embeddings or
            pruned with ``--init-checkpoint``, pruned with architecture options other
            than the sizes.
    """
    if how == "every-other-layer" and (clash := [n for n in ARCHITECTURE_OPTIONS
                                                 if n in given]):
        raise RunError("--student-init every-other-layer takes the teacher's architecture "
                       "and weights; drop " + _flags(clash))
    if how in ("projected-embeddings", "pruned") and "init_checkpoint" in given:
        raise RunError(f"--student-init {how} starts from the teacher's "
                       "weights; drop --init-checkpoint (or use --student-init preset)")
    if how == "pruned" and (clash := [n for n in ARCHITECTURE_OPTIONS if n in given
                                      and n not in PRUNED_SIZES
                                      and n not in ("preset", "init_checkpoint")]):
        raise RunError("--student-init pruned takes the teacher's architecture but for "
                       "its sizes; drop " + _flags(clash))


def _without_soft_targets(options: DistillationOptions) -> DistillationOptions:
    """``options`` with ``alpha_ce`` 0, for a teacher without an MLM head (no soft
    targets), printing a line that says so.

    Raises:
        RunError: ``--alpha-ce`` given explicitly.
    """
    source = options.teacher
    if "alpha_ce" in options.given:
        raise RunError(f"--alpha-ce {options.alpha_ce:g}: --teacher {source} has no MLM "
                       "head (cls.predictions.*, e.g. a sentence-embedding model), so "
                       "there are no soft targets; pass --alpha-ce 0 and learn from its "
                       "hidden states (--alpha-cos) and attention (--alpha-att)")
    print(f"--teacher {source} has no MLM head (cls.predictions.*): soft-target "
          "loss off (--alpha-ce 0)")
    return dataclasses.replace(options, alpha_ce=0.0)


def student_config(options: DistillationOptions, teacher: BertConfig, sizes: BertConfig, *,
                   fixed: BertConfig | None = None) -> BertConfig:
    """The student's architecture, checked against its teacher's.

    Args:
        options: :class:`DistillationOptions` (``student_init``, ``alpha_att``).
        teacher: the teacher's config.
        sizes: the architecture the model options ask for, with the teacher's vocab size
            (train_mlm.py's ``build_config(args, teacher.vocab_size)``): the student's
            for ``preset`` and ``projected-embeddings``; its four sizes
            (:data:`~.pruning.PRUNED_SIZES`) for ``pruned``; its two dropout
            probabilities for ``every-other-layer`` and ``pruned``.
        fixed: the architecture a checkpoint already fixes (a resumed run's, or
            ``--init-checkpoint``'s), taken as it is; None for a new student.
    Returns:
        ``fixed``; else the teacher's config with every other layer, the teacher pruned
        to ``sizes`` (:func:`~.pruning.pruned_config`), or ``sizes``.
    Raises:
        RunError: sizes pruning cannot give, another vocab size than the teacher's, a
            projected-embeddings student wider than the teacher, ``alpha_att`` > 0 with
            another head count than the teacher's.
    """
    how = options.student_init
    dropout = dict(hidden_dropout_prob=sizes.hidden_dropout_prob,
                   attention_probs_dropout_prob=sizes.attention_probs_dropout_prob)
    if fixed is not None:
        config = fixed
    elif how == "every-other-layer":
        config = every_other_layer_config(teacher, **dropout)
    elif how == "pruned":
        try:
            config = pruned_config(teacher, **{n: getattr(sizes, n) for n in PRUNED_SIZES},
                                   **dropout)
        except ValueError as e:
            raise RunError(f"--student-init pruned: {e}") from None
    else:
        config = sizes
    if config.vocab_size != teacher.vocab_size:
        raise RunError(f"the student's vocab_size {config.vocab_size} differs from the "
                       f"teacher's {teacher.vocab_size}")
    if how == "projected-embeddings" and config.hidden_size > teacher.hidden_size:
        raise RunError(f"--student-init projected-embeddings: the student's hidden size "
                       f"{config.hidden_size} exceeds the teacher's "
                       f"{teacher.hidden_size}; projection only narrows")
    if options.alpha_att > 0 and config.num_attention_heads != teacher.num_attention_heads:
        raise RunError(f"--alpha-att {options.alpha_att:g}: attention transfer needs the "
                       f"teacher's {teacher.num_attention_heads} heads, the student "
                       f"has {config.num_attention_heads} (--num-attention-heads, or "
                       "--alpha-att 0)")
    return config


def init_student(model: DistillationModel, how: str, teacher: Pretrained,
                 calibration: Sequence = ()) -> None:
    """Load a new student's starting weights from its teacher, and print what it took.

    Args:
        model: the student, built with the config of :func:`student_config` and the
            :class:`~.teacher.Teacher` of ``teacher``.
        how: one of :data:`STUDENT_INITS`: ``preset`` loads nothing (random weights);
            ``every-other-layer`` the teacher's layers 0, 2, 4, ... and its other tensors;
            ``projected-embeddings`` the teacher's embeddings on their top Cs principal
            directions (and W_h = that basis); ``pruned`` the teacher cut to the student's
            sizes (and W_h the selection (Ct, Cs) that puts each kept channel back).
        teacher: the teacher's :class:`~minibert.runs.Pretrained` (weights, config, source).
        calibration: for ``pruned``, the batches the teacher's units are scored on
            (:func:`~.pruning.activation_importance`; objects with ``input_ids``,
            ``token_type_ids``, ``attention_mask`` (B, T) host arrays).
    Raises:
        HFFormatError, KeyError, ValueError: weights that do not fit the student.
    """
    if how == "every-other-layer":
        state = every_other_layer_state(teacher.state)
        if isinstance(model.config, DistilBertConfig):    # the paper's student: BERT's
            state = distilbert_state_from_bert(state)      # layers under DistilBERT's names
        report = load_pretrained_weights(model, state,
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
        c, t = model.config, teacher.config
        print(f"student: the teacher pruned to layers {', '.join(map(str, layers))}, "
              f"{c.hidden_size} of {t.hidden_size} channels, "
              f"{c.num_attention_heads} of {t.num_attention_heads} heads and "
              f"{c.intermediate_size} of {t.intermediate_size} neurons per layer "
              f"(scored on {sum(len(b.input_ids) for b in calibration)} training sequences); "
              f"new: {report['new'] or 'none'}")


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
