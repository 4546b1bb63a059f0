"""The pretraining job (``train_mlm.py``): from its parsed options to a model, its data and
the :class:`PretrainingWorkload` that :func:`minibert.training.train` runs, and the summary.

The script is the table of contents; each step is one function here:

1. :func:`check_options` (before anything is written): the starting point
   (``--init-checkpoint``), the teacher and the student's architecture (``--teacher``,
   :mod:`minibert.distillation`), options that only mean something with others;
2. :func:`prepare_data`: the corpus (less the documents ``--exclude-documents`` lists),
   the vocab (given, the run's own, or learned), the token store, the held-out documents;
3. :func:`model_config` and :func:`build_pretraining_model`: the architecture and the model (the
   objective's, or a distillation student), its starting weights;
4. :class:`PretrainingWorkload`: batches, forward and held-out evaluation for the loop, with the
   baselines of :func:`reference_losses` beside every evaluation;
5. :func:`write_summary`: ``summary.json``.

Shape legend: B = sequences per batch, T = ``--max-seq-length``, P = masked positions per
sequence (``--max-predictions-per-seq``).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import distillation, distributed
from ..averaging import WeightAverage, averaged
from ..backend import resolve_dtype
from ..albert import AlbertConfig
from ..atomic import WriteError, atomic_copy, atomic_write_bytes, atomic_write_json
from ..checkpoint import check_same_config
from ..cli import fail, fast_paths_line, flag, job_main, leader_first, start_job
from ..graphs import status_line, step_function
from ..distilbert import DistilBertConfig, distilbert_config_from_bert
from ..hf import load_pretrained_weights
from ..modeling import BertConfig, ModelConfig
from ..objectives import get_objective
from ..provenance import check_same_data, data_fingerprint, file_fingerprint
from ..optim import AdamW
from ..runs import HF_MODEL_FILES, STABLE_CHECKPOINT, RunError, load_start, write_args
from ..tokenization import BertTokenizer, train_wordpiece
from .config import PretrainingConfig
from .batches import iterate_batches, make_eval_batches
from .corpus import (CorpusError, TokenStore, build_or_load_store, iter_documents,
                     resolve_corpus_files, split_documents, token_counts,
                     unigram_cross_entropy)
from .exclusion import DocumentExclusion
from .extension import check_extension, decay_steps, extend_run, pinned_schedule
from .masking import VocabInfo, check_replacement
from .samples import MaskSamples, pick_samples
from .schedule import BatchSteps, masked_lm_prob_at
from .tsv_text import TSV_SUFFIX
from ..training import TrainingConfig, TrainingError, train
from ..evaluation.blimp import BLIMP_DEV
from ..evaluation.minimal_pairs import (PairsProbe, first_per_paradigm, probe_floors,
                                          read_pairs)

# Training sequences (the first, in corpus order) that --student-init pruned scores the
# teacher's units on (Minitron, Muralidharan et al. 2024, section 2.2, uses 1,024).
PRUNING_CALIBRATION_SEQUENCES = 256
ELECTRA_OPTIONS = ("generator_layers", "disc_weight")
# Options of ALBERT's architecture (Lan et al. 2020), only with --model albert.
ALBERT_OPTIONS = ("embedding_size", "num_hidden_groups", "inner_group_num")
# Arguments a resumed run may change; every other one decides the data stream, the
# schedule or the model, so --resume takes it from the checkpoint and refuses a new value.
# --max-steps may grow where the schedule allows it (extension.check_extension).
RESUME_FREE = ("output_dir", "overwrite", "resume", "device", "tf32", "fast_cpu",
               "cuda_graphs", "distributed",
               "cuda_aware_mpi", "progress", "log_every", "log_grad_norms", "eval_every",
               "eval_instances", "eval_samples", "eval_pairs", "eval_pairs_per_paradigm",
               "eval_blimp_per_paradigm",
               "save_every", "max_nonfinite_steps", "allow_data_change", "export_hf",
               "max_steps", "report_to")
# The value of an argument added later, for checkpoints written before it existed.
RESUME_DEFAULTS = {"exclude_documents": ["none"],   # older runs left nothing out
                   "lr_scheduler_type": "linear", "decay_ratio": 0.1, "ema_decay": 0.0,
                   # older runs masked 80/10/10 at a constant rate, packed sequences
                   "mask_replace_prob": 0.8, "random_replace_prob": 0.1,
                   "masked_lm_prob_end": None, "line_by_line": False}


@dataclass
class Start:
    """What :func:`check_options` resolved: the ``--init-checkpoint`` start (a
    :class:`~minibert.runs.Pretrained`, or None), the ``--teacher`` (Pretrained or None),
    the :class:`~minibert.distillation.DistillationWeights` and the student's config
    (:class:`~minibert.modeling.BertConfig` or :class:`~minibert.albert.AlbertConfig`;
    None unless distilling); for a resumed run extended past the start of its decay
    phase, the stable-phase checkpoint it goes back to (``stable``,
    :func:`~.extension.check_extension`)."""

    init: Any = None
    teacher: Any = None
    weights: Any = None
    config: ModelConfig | None = None
    stable: dict | None = None


def check_options(cfg: PretrainingConfig, given: set[str], resumed: dict | None) -> Start:
    """Check the options that depend on each other and on the starting points, before
    anything is written; sets ``cfg.vocab`` to the vocab the weights were trained with.

    Raises:
        RunError: a bad ``--init-checkpoint`` or ``--teacher``, one whose vocab or
            lower-casing contradicts the options, distillation or ELECTRA options without
            ``--teacher`` / ``--objective electra``, ``--batch-size-ramp`` without
            accumulation; a start of the other model family than ``--model``, options
            that do not fit ``--model`` (:func:`check_model_options`). CheckpointError,
            HFFormatError: unreadable weights. ValueError: model sizes that do not fit
            together (the config's message, naming the field). DataChangedError: a
            resumed run whose corpus or vocab changed since its checkpoint
            (:func:`check_resumed_data`); a resumed run's ``--max-steps`` that its
            schedule cannot reach (:func:`~.extension.check_extension`).
    """
    check_model_options(cfg, given)
    if cfg.export_hf and cfg.vocab_algorithm == "bpe":
        raise RunError(f"--export-hf {cfg.export_hf}: a Hugging Face BERT / ELECTRA directory "
                       "needs a WordPiece vocabulary, not --vocab-algorithm bpe")
    if resumed is not None:
        check_resumed_data(cfg, resumed)
    start = Start()
    if resumed is not None:
        start.stable = check_extension(cfg, resumed,
                                       Path(cfg.output_dir) / STABLE_CHECKPOINT)
    if resumed is None and cfg.init_checkpoint:
        start.init = _load_init_checkpoint(cfg)
    if cfg.teacher:
        _add_teacher(cfg, given, resumed, start)
    elif stray := [n for n in distillation.OPTIONS if n in given]:
        raise RunError(", ".join(map(flag, stray)) + ": distillation options, only with --teacher")
    _check_objective_options(cfg, given)
    if resumed is None and start.init is None and start.config is None:
        model_config(cfg, vocab_size=1)   # sizes that do not fit fail before any write
    return start


def _load_init_checkpoint(cfg: PretrainingConfig):
    """Load ``--init-checkpoint`` for a fresh run (an ELECTRA discriminator read as the
    ``electra`` objective's BERT-shaped model) and check it against the options; sets
    ``cfg.vocab`` to the vocab its weights were trained with.

    Raises:
        RunError: an ELECTRA that the objective cannot continue, a start of another model
            family than ``--model``, another lower-casing or another ``--vocab``.
    """
    init = load_start(cfg.init_checkpoint, "--init-checkpoint")
    if init.config.model_type == "electra" and cfg.objective == "electra":
        from ..objectives.electra import from_electra   # an ELECTRA discriminator
        try:
            init.config, init.state = from_electra(init.config, init.state)
        except ValueError as e:
            raise RunError(f"--init-checkpoint {cfg.init_checkpoint}: {e}") from None
    check_model_type(init.config, cfg.model, f"--init-checkpoint {cfg.init_checkpoint}")
    lower = init.tokenizer_options.get("do_lower_case", True)
    if lower != cfg.lowercase:
        raise RunError(f"--init-checkpoint {cfg.init_checkpoint} was trained with "
                       f"lowercase={lower}; this run has lowercase={cfg.lowercase} (add "
                       "or drop --no-lowercase)")
    if cfg.vocab and Path(cfg.vocab).read_bytes() != init.vocab_file.read_bytes():
        raise RunError(f"--vocab {cfg.vocab} differs from {init.vocab_file}, the "
                       f"vocab the weights of --init-checkpoint were trained with")
    cfg.vocab = str(init.vocab_file)
    return init


def _add_teacher(cfg: PretrainingConfig, given: set[str], resumed: dict | None,
                start: Start) -> None:
    """Resolve ``--teacher`` (:func:`minibert.distillation.resolve_teacher`, whose errors
    it raises) into ``start.teacher``, ``start.weights`` and the student's
    ``start.config`` (sizes fixed by a resumed run or ``start.init``); takes the
    teacher's vocab, lower-casing and ``alpha_ce`` into ``cfg``."""
    options = distillation.DistillationOptions.of(cfg, given)
    found = distillation.resolve_teacher(options, vocab=cfg.vocab, lowercase=cfg.lowercase,
                                         max_seq_length=cfg.max_seq_length)
    cfg.vocab, cfg.lowercase, cfg.alpha_ce = (found.vocab, found.lowercase,
                                                 found.weights.alpha_ce)
    start.teacher, start.weights = found.teacher, found.weights
    fixed = (resumed["config"] if resumed is not None
             else start.init.config if start.init is not None else None)
    start.config = distillation.student_config(
        options, found.teacher.config,
        model_config(cfg, found.teacher.config.vocab_size), fixed=fixed)
    if cfg.model == "distilbert" and not isinstance(start.config, DistilBertConfig):
        # every other layer of a BERT teacher, as a DistilBERT (Sanh et al. 2019)
        start.config = distilbert_config_from_bert(start.config)


def _check_objective_options(cfg: PretrainingConfig, given: set[str]) -> None:
    """Refuse options that do not fit ``--objective`` or the batch schedule.

    Raises:
        RunError: ``--teacher`` with ``--objective electra``, ELECTRA options with
            another objective, a replacement rule over 1 (``--mask-replace-prob`` +
            ``--random-replace-prob``), ``--line-by-line`` with a sentence-pair objective,
            ``--batch-size-ramp`` without gradient accumulation.
    """
    if cfg.objective == "electra" and cfg.teacher:
        raise RunError("--teacher works with the BERT objectives, not --objective electra")
    if cfg.objective != "electra" and (stray := [n for n in ELECTRA_OPTIONS if n in given]):
        raise RunError(", ".join(map(flag, stray)) + ": ELECTRA options, only with --objective electra")
    try:      # after --resume took the run's own values of the options not given
        check_replacement(cfg.mask_replace_prob, cfg.random_replace_prob)
    except ValueError:
        raise RunError(f"--mask-replace-prob {cfg.mask_replace_prob:g} + --random-replace-prob "
                       f"{cfg.random_replace_prob:g} is over 1 (the rest of the chosen tokens "
                       "stay themselves)") from None
    if cfg.line_by_line and get_objective(cfg.objective).sentence_task is not None:
        raise RunError(f"--line-by-line gives one line per sequence; --objective "
                       f"{cfg.objective} needs sentence pairs: use --objective mlm or electra")
    if cfg.batch_size_ramp > 0 and cfg.gradient_accumulation_steps < 2:
        raise RunError(f"--batch-size-ramp {cfg.batch_size_ramp:g} ramps the micro-batches "
                       "per step up to --gradient-accumulation-steps, which is 1: give it "
                       ">= 2 (the full batch is --batch-size x that)")


def check_resumed_data(cfg: PretrainingConfig, resumed: dict) -> None:
    """Refuse to resume on a corpus or vocab other than the one the checkpoint records
    (:func:`minibert.provenance.check_same_data`), unless ``--allow-data-change``; the run's
    vocab is its own ``vocab.txt``, copied again from ``--vocab`` first when damaged or
    missing (:func:`restore_run_vocab`). A checkpoint written before the record is not
    checked.

    Raises:
        DataChangedError: naming what changed. CorpusError: corpus files missing.
    """
    run_dir = Path(cfg.output_dir)
    restore_run_vocab(cfg, resumed, run_dir / "vocab.txt")
    check_same_data(resumed["trainer"].get("data"),
                    data_fingerprint(resolve_corpus_files(cfg.corpus), run_dir / "vocab.txt"),
                    cfg.allow_data_change, str(run_dir / "checkpoint.npz"))


def restore_run_vocab(cfg: PretrainingConfig, resumed: dict, own: Path) -> None:
    """Rebuild a resumed run's own ``vocab.txt`` (``own``, a copy of ``--vocab``) when it
    is missing or differs from the vocab its checkpoint records while the ``--vocab`` file
    still matches that record: the run's copy is derived, so it is copied again (a
    ``note:`` line on stderr says so). Otherwise nothing changes, and
    :func:`check_resumed_data` refuses a changed vocab.

    Raises:
        WriteError: the copy cannot be written.
    """
    recorded = (resumed["trainer"].get("data") or {}).get("vocab")
    src = Path(cfg.vocab) if cfg.vocab else None
    if not recorded or src is None or not src.is_file():
        return
    if own.is_file() and (own.samefile(src) or file_fingerprint(own) == recorded):
        return
    if file_fingerprint(src) != recorded:
        return
    what = "differs from the vocab of its checkpoint" if own.exists() else "is missing"
    print(f"note: {own} {what}; copied again from --vocab {src}", file=sys.stderr)
    atomic_copy(src, own)


def check_model_options(cfg: PretrainingConfig, given: set[str]) -> None:
    """Refuse options that ``--model`` does not take: ALBERT's architecture options
    (:data:`ALBERT_OPTIONS`) for BERT; for ALBERT, pre-LN, ``--objective electra`` (whose
    generator and discriminator are BERTs) and a student started from the teacher's BERT
    weights (``--student-init`` other than preset).

    Raises:
        RunError: naming the options.
    """
    if cfg.model != "albert":
        if stray := [n for n in ALBERT_OPTIONS if n in given]:
            raise RunError(", ".join(map(flag, stray)) + ": ALBERT options, only with "
                           "--model albert")
        if cfg.model == "distilbert":
            check_distilbert_options(cfg)
        return
    if cfg.norm_position != "post":
        raise RunError(f"--norm-position {cfg.norm_position}: ALBERT puts LayerNorm after "
                       "the residual sum only (post); drop it or use --model bert")
    if cfg.objective == "electra":
        raise RunError("--objective electra trains a BERT generator and discriminator; "
                       "not with --model albert")
    if cfg.teacher and cfg.student_init != "preset":
        raise RunError(f"--student-init {cfg.student_init} builds the student from the "
                       "teacher's BERT weights; an ALBERT student (--model albert) starts "
                       "from --student-init preset")


def check_distilbert_options(cfg: PretrainingConfig) -> None:
    """Refuse what a DistilBERT (Sanh et al. 2019) cannot train: a sentence-level or
    ELECTRA objective (it has no pooler, no token types; ``--objective mlm``), pre-LN,
    and a student built from the teacher's pruned or projected BERT weights
    (``--student-init`` other than preset and every-other-layer, which maps the BERT's
    layers to DistilBERT's names: :func:`~minibert.distilbert.distilbert_state_from_bert`).

    Raises:
        RunError: naming the option.
    """
    if cfg.objective != "mlm":
        raise RunError(f"--objective {cfg.objective}: a DistilBERT trains masked-LM only "
                       "(no sentence head, no token types); use --objective mlm")
    if cfg.norm_position != "post":
        raise RunError(f"--norm-position {cfg.norm_position}: DistilBERT is post-LN; drop "
                       "it or use --model bert")
    if cfg.teacher and cfg.student_init not in ("preset", "every-other-layer"):
        raise RunError(f"--student-init {cfg.student_init} builds the student from the "
                       "teacher's BERT weights; a DistilBERT student (--model distilbert) "
                       "starts from --student-init preset or every-other-layer")


def check_model_type(config: ModelConfig, model: str, source: str) -> None:
    """Raise RunError when the model at ``source`` (an option and its path; ``config``
    its config) is not of the family ``model`` ("bert" or "albert"), naming both."""
    if config.model_type != model:
        fix = (f"give --model {config.model_type}"
               if config.model_type in PretrainingConfig.CHECKS["model"] else
               f"train_mlm.py trains {' or '.join(PretrainingConfig.CHECKS['model'])} models; "
               "an ELECTRA discriminator continues with --objective electra, and is a start "
               "for finetune.py")
        raise RunError(f"{source}: holds a model of model_type {config.model_type!r}, this "
                       f"run trains --model {model} ({fix})")


def model_config(cfg: PretrainingConfig, vocab_size: int) -> ModelConfig:
    """The architecture the model options ask for: ``--model``'s preset table
    (:data:`~minibert.modeling.PRESETS`, :data:`~minibert.albert.ALBERT_PRESETS`) at
    ``--preset``, with ``--num-hidden-layers``, ``--hidden-size`` (then by default
    hidden/64 heads, 4 x hidden feed-forward and, for ALBERT, embedding width
    min(128, hidden/2) as the presets), ``--num-attention-heads``, ``--intermediate-size``,
    ALBERT's ``--embedding-size``, ``--num-hidden-groups``, ``--inner-group-num`` and the
    other model options.

    Returns:
        a BertConfig (``--model bert``) or an AlbertConfig (``--model albert``).
    Raises:
        ValueError: sizes that do not fit together (the config's message names the field).
    """
    overrides = {k: getattr(cfg, k) for k in ("num_hidden_layers", "hidden_size",
                 "num_attention_heads", "intermediate_size") if getattr(cfg, k) is not None}
    if "hidden_size" in overrides:
        overrides.setdefault("num_attention_heads", max(1, overrides["hidden_size"] // 64))
        overrides.setdefault("intermediate_size", 4 * overrides["hidden_size"])
    common = dict(vocab_size=vocab_size, hidden_act=cfg.hidden_act,
                  hidden_dropout_prob=cfg.hidden_dropout_prob,
                  attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
                  max_position_embeddings=cfg.max_position_embeddings,
                  position_embedding_type=cfg.position_embedding_type, **overrides)
    if cfg.model == "albert":
        albert = {k: getattr(cfg, k) for k in ALBERT_OPTIONS if getattr(cfg, k) is not None}
        if "hidden_size" in overrides:
            albert.setdefault("embedding_size", max(1, min(128, overrides["hidden_size"] // 2)))
        return AlbertConfig.from_preset(cfg.preset, **common, **albert)
    if cfg.model == "distilbert":
        b = BertConfig.from_preset(cfg.preset, **common)      # the preset's sizes, checked
        return DistilBertConfig(
            vocab_size=b.vocab_size, max_position_embeddings=b.max_position_embeddings,
            sinusoidal_pos_embds=b.position_embedding_type == "sinusoidal",
            n_layers=b.num_hidden_layers, n_heads=b.num_attention_heads, dim=b.hidden_size,
            hidden_dim=b.intermediate_size, dropout=b.hidden_dropout_prob,
            attention_dropout=b.attention_probs_dropout_prob, activation=b.hidden_act,
            initializer_range=b.initializer_range)
    return BertConfig.from_preset(cfg.preset, norm_position=cfg.norm_position, **common)


def prepare_tokenizer(cfg: PretrainingConfig, run, files, objective, reuse: bool,
                      exclude: DocumentExclusion) -> BertTokenizer:
    """The run's tokenizer: its own vocab.txt when ``reuse`` (a resumed run, or a rank
    other than 0, which reads what rank 0 wrote), else ``--vocab`` copied into the run
    directory (so the run is self-contained for finetune.py), else a WordPiece vocab
    learned from the corpus files (a TSV's text columns), less the documents ``exclude``
    lists.

    Raises:
        CorpusError: ``--vocab`` missing; an empty corpus, or fewer documents than the
            objective needs (checked before any time goes into learning a vocab).
    """
    if reuse and run.vocab.is_file():
        pass
    elif cfg.vocab:
        if not Path(cfg.vocab).is_file():
            raise CorpusError(f"--vocab {cfg.vocab}: no such file")
        atomic_copy(cfg.vocab, run.vocab)
    else:
        documents = sum(1 for _ in iter_documents(files, exclude=exclude))
        where = ", ".join(map(str, files))
        if documents == 0:
            raise CorpusError(f"{where}: the corpus is empty (no non-blank line)")
        if documents < objective.min_documents:
            raise CorpusError(f"{where}: {documents} document(s); --objective "
                              f"{objective.name} needs at least {objective.min_documents} "
                              "(separate documents with a blank line)")
        print(f"learning a {cfg.vocab_size}-token WordPiece vocab from {where}")
        t0 = time.time()
        algorithm = {"algorithm": cfg.vocab_algorithm} if cfg.vocab_algorithm else {}
        text = ((s for doc in iter_documents(files, exclude=exclude) for s in doc)
                if exclude.listed or any(f.suffix.lower() == TSV_SUFFIX for f in files)
                else [str(f) for f in files])          # a TSV's text, not its labels
        train_wordpiece(text, vocab_size=cfg.vocab_size,
                        lowercase=cfg.lowercase, output=str(run.vocab),
                        show_progress=cfg.progress, **algorithm)
        print(f"vocab written to {run.vocab} in {time.time() - t0:.1f} s")
    return BertTokenizer(str(run.vocab), do_lower_case=cfg.lowercase)


@dataclass
class PretrainData:
    """The objective, tokenizer, :class:`~.masking.VocabInfo`, the training and held-out
    :class:`~.corpus.TokenStore` of a run (:func:`prepare_data`), the fingerprint of the
    corpus, vocab and left-out documents they come from
    (:func:`minibert.provenance.data_fingerprint`), which every checkpoint records, the
    minimal pairs it is evaluated on (``{"pairs": our pairs, "blimp": BLiMP dev}``, each a
    :class:`~minibert.evaluation.minimal_pairs.PairsProbe`, those asked for only) and the
    documents left out of the corpus (:class:`~.exclusion.DocumentExclusion`)."""

    objective: Any
    tokenizer: BertTokenizer
    vocab: VocabInfo
    train: TokenStore
    held_out: TokenStore
    fingerprint: dict
    excluded: DocumentExclusion
    pairs: dict[str, PairsProbe] = field(default_factory=dict)


def prepare_data(cfg: PretrainingConfig, run, reuse_vocab: bool,
                 resumed: dict | None = None) -> PretrainData:
    """Corpus files less the documents of ``--exclude-documents``
    (:class:`~.exclusion.DocumentExclusion`), tokenizer (:func:`prepare_tokenizer`), the
    token store cached in ``RUN/cache``, the held-out documents (``--eval-fraction``) and
    the minimal pairs (:func:`pairs_probes`). A ``resumed`` run must leave out the same
    documents as its checkpoint records (:func:`minibert.provenance.check_same_data`).

    Raises:
        CorpusError: unreadable, empty or too small corpus; a bad ``--vocab`` or
            ``--exclude-documents`` file.
        PairsError: an unreadable ``--eval-pairs`` file.
        DataChangedError: other documents left out than the resumed run's.
    """
    objective = get_objective(cfg.objective)
    files = resolve_corpus_files(cfg.corpus)
    exclude = DocumentExclusion.read(cfg.exclude_documents)
    tokenizer = prepare_tokenizer(cfg, run, files, objective, reuse_vocab, exclude)
    store = build_or_load_store(files, tokenizer, cache_dir=run.path / "cache",
                                show_progress=cfg.progress,
                                min_documents=objective.min_documents, exclude=exclude)
    fingerprint = data_fingerprint(files, run.vocab, exclude.left_out)
    if resumed is not None:
        check_same_data(resumed["trainer"].get("data"), fingerprint, cfg.allow_data_change,
                        str(run.checkpoint), keys=("excluded",))
    train, held_out = split_documents(store, eval_fraction=cfg.eval_fraction, seed=cfg.seed,
                                      min_documents=objective.min_documents)
    return PretrainData(objective, tokenizer, VocabInfo.from_tokenizer(tokenizer), train,
                        held_out, fingerprint, exclude, pairs_probes(cfg, tokenizer))


def check_corpus_shape(data: PretrainData) -> None:
    """Warn on stderr when most training documents hold a single sentence under NSP:
    google-research/bert pairs a one-sentence chunk only with a random B, so such
    documents give NSP nothing but "random next" examples."""
    if data.objective.sentence_task != "nsp":
        return
    single = float(np.mean(data.train.sentences_per_document() == 1))
    if single > 0.5:
        print(f"warning: {single:.0%} of the {data.train.num_documents} training "
              "documents hold a single sentence, so their NSP pairs are always random "
              "and NSP is nearly a constant task; the corpus format is one sentence per "
              "line with a blank line between documents, not between sentences",
              file=sys.stderr)


def run_config(cfg: PretrainingConfig, start: Start, resumed: dict | None,
               vocab_size: int) -> ModelConfig:
    """The model's architecture: the student's (distillation), the resumed run's when it
    took one over from ``--init-checkpoint``, the start's, else :func:`model_config`.

    Raises:
        RunError: a vocab larger than the model's embeddings, or ``--max-seq-length``
            beyond its positions.
    """
    if start.config is not None:
        config = start.config
    elif resumed is not None and cfg.init_checkpoint:
        config = resumed["config"]
    elif start.init is not None:
        config = start.init.config
    else:
        config = model_config(cfg, vocab_size)
    if config.vocab_size < vocab_size:
        raise RunError(f"the model's vocab_size {config.vocab_size} is smaller than the "
                       f"vocab's {vocab_size} tokens")
    if cfg.max_seq_length > config.max_position_embeddings:
        raise RunError(f"--max-seq-length {cfg.max_seq_length} exceeds "
                       f"max_position_embeddings {config.max_position_embeddings}")
    return config


def fixed_batches(cfg: PretrainingConfig, store: TokenStore, vocab: VocabInfo, objective,
                  seed: int, max_instances: int | None):
    """The same batches every time from ``store`` (held-out evaluation, pruning
    calibration): :func:`~.batches.make_eval_batches` with the run's data options, masked
    at a fixed rate: ``--masked-lm-prob-end`` when the run has a rate schedule (the rate
    it ends at, as GPT-BERT validates), else ``--masked-lm-prob``.

    Returns:
        list of :class:`~.batches.PretrainingBatch`, each (B, T) with B = ``cfg.batch_size`` and
        T = ``cfg.max_seq_length`` (the last may hold fewer rows; ``--line-by-line``: T the
        batch's longest line), at most ``max_instances`` sequences in all (None: the whole
        store).
    """
    rate = cfg.masked_lm_prob if cfg.masked_lm_prob_end is None else cfg.masked_lm_prob_end
    return make_eval_batches(store, vocab, cfg.batch_size, cfg.max_seq_length, seed=seed,
                             objective=objective, max_instances=max_instances,
                             short_seq_prob=cfg.short_seq_prob, masked_lm_prob=rate,
                             max_predictions_per_seq=cfg.max_predictions_per_seq,
                             whole_word_mask=cfg.whole_word_mask, max_ngram=cfg.max_ngram,
                             mask_replace_prob=cfg.mask_replace_prob,
                             random_replace_prob=cfg.random_replace_prob,
                             line_by_line=cfg.line_by_line)


def build_pretraining_model(cfg: PretrainingConfig, config: ModelConfig, data: PretrainData,
                            start: Start, resumed: dict | None,
                            checkpoint: str = "checkpoint"):
    """The model the run trains, with its starting weights: a
    :class:`~minibert.distillation.DistillationModel` (with ``--teacher``; a new student
    initialised as ``--student-init`` says) or the objective's model; then
    ``--init-checkpoint``'s weights, then the resumed ``checkpoint``'s (named in errors).

    Raises:
        CheckpointError: the resumed checkpoint's config differs. HFFormatError, KeyError,
            ValueError: weights that do not fit the model.
    """
    model_kw = dict(seed=cfg.seed, dtype=resolve_dtype(cfg.dtype),
                    label_smoothing=cfg.label_smoothing)
    objective = data.objective
    if start.teacher is not None:
        model = distillation.student_class(config)(
            config, distillation.load_teacher(start.teacher, resolve_dtype(cfg.dtype)),
            start.weights, seq_relationship_head=objective.sentence_task is not None,
            **model_kw)
        if resumed is None:
            calibration = [] if cfg.student_init != "pruned" else fixed_batches(
                cfg, data.train, data.vocab, objective, cfg.seed + 2,
                PRUNING_CALIBRATION_SEQUENCES)
            distillation.init_student(model, cfg.student_init, start.teacher, calibration)
    else:
        if objective.name == "electra":
            model_kw.update(generator_layers=cfg.generator_layers,
                            disc_weight=cfg.disc_weight)
        model = objective.build_model(config, **model_kw)
    if start.init is not None:
        report = load_pretrained_weights(model, start.init.state, start.init.source)
        print(f"weights from {start.init.source}; new: {report['new'] or 'none'}; "
              f"not used: {report['unused'] or 'none'}")
    if resumed is not None:
        check_same_config(resumed["config"], config, checkpoint)
        model.load_state_dict(resumed.get("train") or resumed["model"])   # the raw weights
    return model


def reference_losses(cfg: PretrainingConfig, data: PretrainData, eval_batches, model,
                     xp) -> dict[str, float]:
    """Baselines printed beside every evaluation (nats per masked token; accuracies):
    the unigram baseline (every masked token predicted from training-token frequencies),
    the majority share of the sentence task's labels, the minimal-pair macro accuracy
    (percent) of an add-0.1 word unigram and a Kneser-Ney word trigram counted on the
    training corpus (``pairs_unigram_acc``, ``pairs_trigram_acc``, ``blimp_unigram_acc``,
    ``blimp_trigram_acc``, beside the model's ``pairs_acc`` and ``blimp_acc``) and, with a
    teacher that has an MLM head, the teacher's held-out MLM loss. Empty without held-out
    batches."""
    if not eval_batches:
        return {}
    counts = token_counts(data.train, model.config.vocab_size)
    reference = {"unigram_baseline": unigram_cross_entropy(
        counts, [b.masked_lm_ids for b in eval_batches],
        [b.masked_lm_weights for b in eval_batches])}
    if task := data.objective.sentence_task:
        # always guessing the commoner label: at short max_seq_length most NSP chunks hold
        # one segment, which the reference always pairs with a random B
        share = float(np.concatenate([b.next_sentence_label for b in eval_batches]).mean())
        reference[f"{task}_majority"] = max(share, 1.0 - share)
    if data.pairs:
        files = resolve_corpus_files(cfg.corpus)
        reference.update(probe_floors(data.pairs, (
            s for doc in iter_documents(files, exclude=data.excluded) for s in doc)))
    if cfg.teacher and model.teacher.has_mlm_head:
        total, count = model.teacher.mlm_loss_sums(eval_batches, xp)
        reference["teacher_mlm_loss"] = total / count if count else float("nan")
    return reference


def masking_note(cfg: PretrainingConfig) -> str:
    """The log's words for masking options away from their defaults ('' with none):
    line-by-line sequences, the rate schedule, the replacement rule."""
    parts = (["one line per sequence"] if cfg.line_by_line else []) + (
        [f"masking rate {cfg.masked_lm_prob:g} -> {cfg.masked_lm_prob_end:g}"]
        if cfg.masked_lm_prob_end is not None else [])
    if (cfg.mask_replace_prob, cfg.random_replace_prob) != (0.8, 0.1):
        keep = max(0.0, 1.0 - cfg.mask_replace_prob - cfg.random_replace_prob)
        parts.append(f"chosen tokens {cfg.mask_replace_prob:.0%} [MASK] / "
                     f"{cfg.random_replace_prob:.0%} random / {keep:.0%} kept")
    return "".join(f", {p}" for p in parts)


def describe(cfg: PretrainingConfig, model, data: PretrainData, eval_batches,
             reference: dict) -> str:
    """The log lines that say what is trained on what (model, data, baselines, teacher)."""
    config = model.config
    arch = (f"config of {cfg.init_checkpoint}" if cfg.init_checkpoint
            else f"every other layer of {cfg.teacher}"
            if cfg.teacher and cfg.student_init == "every-other-layer"
            else f"{cfg.teacher} pruned to its sizes"
            if cfg.teacher and cfg.student_init == "pruned"
            else f"{cfg.preset} {cfg.model.upper()} preset")
    line = (f"model: {arch}, {model.num_parameters():,} parameters, vocab "
            f"{config.vocab_size}; objective {data.objective.name}{masking_note(cfg)}; "
            f"train documents {data.train.num_documents}, tokens {data.train.num_tokens:,}; "
            f"held-out documents {data.held_out.num_documents}, "
            f"{sum(len(b.input_ids) for b in eval_batches)} "
            "sequences" + "".join(f"; {k.replace('_', ' ')} {v:.3f}"
                                  for k, v in reference.items()))
    if left := data.excluded.describe():
        line += "\n" + left
    if cfg.teacher:
        line += "\n" + distillation.describe_teacher(model, cfg.teacher)
    return line


class PretrainingWorkload:
    """The pretraining job for :func:`minibert.training.train`: batches of the training
    store, the objective's forward statistics (with a distillation model, its terms too)
    and, when there are held-out batches, an evaluation on them with the ``reference``
    baselines beside it. ``start``: the :class:`~minibert.training.TrainState` the run
    starts from (None: a fresh run), where a masking-rate schedule
    (``--masked-lm-prob-end``) counts the steps of the batches from; with a schedule the
    train records carry the window's mean ``masked_lm_prob``. ``pinned``: the schedule
    values the run's first ``--max-steps`` fixed (:func:`~.extension.pinned_schedule`;
    None: a new run's), kept in its trainer record."""

    # batches made this many ahead on a background thread (minibert.training.step_batches):
    # they read the token store, their own generators and self.steps, nothing the step writes
    prefetch_batches = 2

    def __init__(self, cfg, data: PretrainData, eval_batches, reference: dict, model, xp,
                 start=None, pinned: dict | None = None):
        self.cfg, self.objective, self.store, self.vocab = (cfg, data.objective, data.train,
                                                             data.vocab)
        self.data_fingerprint = data.fingerprint
        self.excluded = data.excluded
        self.reference = reference
        self.eval_batches, self.model, self.xp = eval_batches, model, xp
        self.evaluate = self._evaluate if eval_batches else None
        # schedule values kept across an extension (trainer record)
        self.pinned = pinned_schedule(cfg, None) if pinned is None else dict(pinned)
        picked = (pick_samples(data.held_out, data.tokenizer, cfg.eval_samples, cfg.seed + 3)
                  if eval_batches and cfg.eval_samples else [])
        self.mlm = getattr(model, "generator", model)   # ELECTRA: its generator fills masks
        self.samples = MaskSamples(self.mlm, data.tokenizer, picked) if picked else None
        self.pairs = data.pairs if eval_batches else {}
        self.data_kw = dict(masking=cfg.masking, dupe_factor=cfg.dupe_factor,
                            short_seq_prob=cfg.short_seq_prob,
                            masked_lm_prob=cfg.masked_lm_prob,
                            max_predictions_per_seq=cfg.max_predictions_per_seq,
                            whole_word_mask=cfg.whole_word_mask,
                            max_ngram=cfg.max_ngram,
                            mask_replace_prob=cfg.mask_replace_prob,
                            random_replace_prob=cfg.random_replace_prob)
        if cfg.line_by_line:   # every line once per epoch: the short last batch too
            self.data_kw.update(line_by_line=True, drop_last=False)
        # --masked-lm-prob-end: the step of each batch, from the run's position on
        self.steps = None if cfg.masked_lm_prob_end is None else BatchSteps(
            *((start.step, start.epoch, start.batch_in_epoch) if start else (0, 0, 0)),
            cfg.gradient_accumulation_steps, self.pinned["batch_size_ramp_steps"])

    def batches(self, epoch: int, start_batch: int):
        """The batches of ``epoch`` from ``start_batch`` on (:func:`~.batches.iterate_batches`
        with the run's options); with a rate schedule, each masked at the rate of the step
        it belongs to (:mod:`.schedule`)."""
        if self.steps is None:
            return iterate_batches(self.store, self.vocab, self.cfg.batch_size,
                                   self.cfg.max_seq_length, epoch=epoch, seed=self.cfg.seed,
                                   start_batch=start_batch, objective=self.objective,
                                   **self.data_kw)
        return self._scheduled_batches(epoch, start_batch)

    def _scheduled_batches(self, epoch: int, start_batch: int):
        cfg, steps, horizon = self.cfg, self.steps, self.pinned["masked_lm_prob_steps"]
        steps.start_epoch(epoch, start_batch)
        yield from iterate_batches(
            self.store, self.vocab, cfg.batch_size, cfg.max_seq_length, epoch=epoch,
            seed=cfg.seed, start_batch=start_batch, objective=self.objective, **self.data_kw,
            batch_masked_lm_prob=lambda k: masked_lm_prob_at(
                steps.next_batch(), cfg.masked_lm_prob, cfg.masked_lm_prob_end, horizon))
        steps.end_epoch()

    def forward(self, model, batch):
        inputs = {k: self.xp.asarray(v) for k, v in batch.model_inputs().items()}
        kwargs = dict(inputs)
        if "next_sentence_label" in kwargs:  # under the keyword the model's forward takes
            kwargs[model.sentence_label] = kwargs.pop("next_sentence_label")  # (ALBERT's)
        out = model(**kwargs)
        sums = self.objective.stats(out, inputs)
        if isinstance(model, distillation.DistillationModel):
            sums.update(model.stats(out, inputs))
        if batch.masked_lm_prob is not None:   # a rate schedule's batch: its rate, averaged
            sums.update(masked_lm_prob_sum=self.xp.asarray(batch.masked_lm_prob),
                        masked_lm_prob_count=self.xp.asarray(1.0))
        return out.loss, sums

    def summarize(self, totals: dict) -> dict:
        rate = ({"masked_lm_prob": totals["masked_lm_prob_sum"] / totals["masked_lm_prob_count"]}
                if totals.get("masked_lm_prob_count") else {})
        return {**self.objective.summarize(totals),
                **distillation.DistillationModel.summarize(totals), **rate}

    def _evaluate(self, step: int) -> dict:
        self.model.eval()
        sums: dict = {}
        for b in self.eval_batches:   # summed on the device, read once
            for k, v in self.forward(self.model, b)[1].items():
                sums[k] = sums.get(k, 0) + v
        grammar = {f"{name}_acc": probe(self.mlm) for name, probe in self.pairs.items()}
        return {**self.summarize({k: float(v) for k, v in sums.items()}), **grammar,
                **self.reference}

    def trainer_record(self) -> dict:
        return {"job": "pretrain", "args": self.cfg.to_dict(),
                "tokenizer": {"do_lower_case": self.cfg.lowercase},
                "data": self.data_fingerprint, **self.pinned}


def pairs_probes(cfg: PretrainingConfig, tokenizer) -> dict[str, PairsProbe]:
    """The minimal pairs scored at each evaluation: ``"pairs"``, the first
    ``--eval-pairs-per-paradigm`` of each paradigm of ``--eval-pairs``, and ``"blimp"``,
    the first ``--eval-blimp-per-paradigm`` of each paradigm of BLiMP's development set
    (:data:`~minibert.evaluation.blimp.BLIMP_DEV`); one is left out when its count is 0
    or none of its pairs survives the vocabulary.

    Raises:
        PairsError: an unreadable pairs file (the message names file, line and field).
    """
    probes = {}
    for name, path, n in (("pairs", cfg.eval_pairs, cfg.eval_pairs_per_paradigm),
                          ("blimp", BLIMP_DEV, cfg.eval_blimp_per_paradigm)):
        if n:
            probe = PairsProbe(first_per_paradigm(read_pairs(path), n), tokenizer,
                               max_length=cfg.max_position_embeddings)
            if probe.pairs:
                probes[name] = probe
    return probes


def write_summary(cfg: PretrainingConfig, run, workload: PretrainingWorkload, state,
                  last_eval: dict | None, seconds: float) -> dict:
    """Write ``summary.json`` (steps, time, size, baselines and the last evaluation's
    metrics as ``eval_*``), print it and the held-out MLM loss against the unigram
    baseline, and return it. A finished run resumed again is evaluated here once."""
    if last_eval is None and workload.evaluate is not None:
        last_eval = {"step": state.step, **workload.evaluate(state.step)}
    reference, model = workload.reference, workload.model
    summary = {"objective": workload.objective.name,
               **({"teacher": cfg.teacher} if cfg.teacher else {}), "steps": state.step,
               "epochs_started": state.epoch + 1, "seconds_this_run": round(seconds, 1),
               "seconds_total": round(state.elapsed_s, 1),
               "parameters": model.num_parameters(), "vocab_size": model.config.vocab_size,
               **reference,
               **{"eval_" + k: v for k, v in (last_eval or {}).items()
                  if k not in ("kind", "step", "elapsed_s") and k not in reference},
               "checkpoint": str(run.checkpoint)}
    if workload.excluded.files:
        summary["excluded_documents"] = workload.excluded.record()
    atomic_write_json(run.summary, summary)
    print("summary: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in summary.items() if k != "excluded_documents"))
    if last_eval and "unigram_baseline" in reference:
        base = reference["unigram_baseline"]
        print(f"held-out MLM loss {last_eval['mlm_loss']:.3f} nats vs unigram baseline "
              f"{base:.3f} ({base - last_eval['mlm_loss']:+.3f} better)")
    return summary


@job_main("train_mlm.py")  # a fault ends in one line; the run directory is let go
def run_pretraining(cfg: PretrainingConfig, given: set[str] | None = None,
                    prog: str = "train_mlm.py") -> dict | None:
    """Run a pretraining job: what ``train_mlm.py`` does with its options, from Python::

        run_pretraining(PretrainingConfig(max_steps=100, output_dir="runs/x"))

    Args:
        cfg: the options (filled in place by :meth:`PretrainingConfig.with_defaults` and,
            with ``resume``, by the run's own; written to ``args.json``).
        given: the options chosen explicitly (the command line's); a resumed run takes the
            others from its checkpoint. Default: the fields that differ from the defaults.
        prog: the name in error lines.
    Returns:
        ``summary.json``'s dict on rank 0, None on the other ranks.
    Raises:
        SystemExit: bad options or input end the job as the script does, with one
            ``PROG: error: ...`` line on stderr (status 2): the ranges and choices of
            :attr:`PretrainingConfig.CHECKS`, the combinations of :func:`check_options`,
            the corpus, vocab and starting points; a fault (memory, a failed write, Ctrl-C)
            ends as :func:`minibert.cli.job_main` says.
    """
    given = cfg.prepare(given, prog)
    job = start_job(cfg, given, prog, "pretrain",
                    resume_fixed=[k for k in cfg.to_dict() if k not in RESUME_FREE],
                    resume_defaults=RESUME_DEFAULTS,
                    check=lambda resumed: check_options(cfg, given, resumed))
    print(fast_paths_line(cfg.fast_cpu, cfg.device))
    print(status_line(cfg.cuda_graphs, cfg.device, job.comm.world_size))
    if job.resumed is not None:
        job.resumed = extend_run(cfg, job.run, job.resumed, job.checked.stable,
                                 job.comm.is_leader)
    pinned = pinned_schedule(cfg, job.resumed)
    schedule = training_config(cfg, pinned["batch_size_ramp_steps"])
    model, data, config = _prepare(cfg, job, prog)
    optimizer = AdamW(model.named_parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                      correct_bias=cfg.correct_bias)
    ema = WeightAverage(optimizer, cfg.ema_decay) if cfg.ema_decay else None
    state = job.train_state(optimizer, prog, ema)
    comm = job.comm
    workload = _workload(cfg, job, data, config, model, state, pinned)
    t0 = time.perf_counter()
    try:
        state, last_eval = train(model, optimizer, workload, schedule, state,
                                 metrics_path=job.run.metrics,
                                 checkpoint_path=job.run.checkpoint, comm=comm,
                                 device=job.device, ema=ema,
                                 stable_checkpoint_path=job.run.stable_checkpoint,
                                 make_step=step_function)
    except (TrainingError, CorpusError) as e:
        fail(prog, str(e))
    if not comm.is_leader:
        return None
    with averaged(ema):          # the run's result is its weight average, when it keeps one
        summary = write_summary(cfg, job.run, workload, state, last_eval,
                                time.perf_counter() - t0)
        if cfg.export_hf:
            export_hf(cfg, model, job.run.vocab)
    return summary


def export_hf(cfg: PretrainingConfig, model, vocab_file) -> Path:
    """``--export-hf``: the trained model as a Hugging Face directory
    (:func:`minibert.hf.save_hf_directory`); for ``--objective electra`` the discriminator
    (:meth:`minibert.objectives.electra.ElectraForPreTraining.to_electra`: transformers'
    ``ElectraForPreTraining``) and, in ``DIR/generator``, the generator
    (:meth:`~minibert.objectives.electra.ElectraForPreTraining.generator_to_electra`:
    ``ElectraForMaskedLM``; left out with a ``note:`` line when its activation is not
    GELU). Files of an earlier export's generator there are removed first.

    A model a Hugging Face directory cannot express (pre-LN, sinusoidal positions) or a
    failed write ends the job with ``train_mlm.py: error: --export-hf DIR: ...``.
    """
    from ..hf import HFFormatError, save_hf_directory
    tok = {"do_lower_case": cfg.lowercase}
    gen_dir = Path(cfg.export_hf) / "generator"
    try:
        exported = model.to_electra() if hasattr(model, "to_electra") else model
        d = save_hf_directory(exported, cfg.export_hf, vocab_file, tokenizer_options=tok)
        for name in HF_MODEL_FILES if gen_dir.is_dir() else ():
            (gen_dir / name).unlink(missing_ok=True)
        if hasattr(model, "generator_to_electra"):
            try:
                generator = model.generator_to_electra()
            except ValueError as e:
                print(f"note: the generator is not exported: {e}")
            else:
                save_hf_directory(generator, gen_dir, vocab_file, tokenizer_options=tok)
                print(f"wrote Hugging Face directory {gen_dir} (the generator)")
    except (HFFormatError, ValueError, OSError) as e:
        fail("train_mlm.py", f"--export-hf {cfg.export_hf}: {e}")
    print(f"wrote Hugging Face directory {d}")
    return d


def _workload(cfg: PretrainingConfig, job, data, config, model, state,
              pinned: dict) -> PretrainingWorkload:
    """:func:`run_pretraining`'s :class:`PretrainingWorkload`, from the run's ``state``
    on; the leader first writes config.json and args.json and picks the held-out batches.
    Prints what the run trains (:func:`describe`)."""
    comm = job.comm
    if comm.is_leader:
        atomic_write_bytes(job.run.config, config.to_json().encode())
        write_args(job.run, cfg.to_dict())
    eval_batches = [] if not comm.is_leader else fixed_batches(
        cfg, data.held_out, data.vocab, data.objective, cfg.seed + 1, cfg.eval_instances)
    reference = reference_losses(cfg, data, eval_batches, model, job.xp)
    print(describe(cfg, model, data, eval_batches, reference))
    if comm.world_size > 1:
        print(distributed.describe(comm, cfg.batch_size))
    return PretrainingWorkload(cfg, data, eval_batches, reference, model, job.xp, state,
                               pinned)


def _prepare(cfg: PretrainingConfig, job, prog: str):
    """:func:`run_pretraining`'s data and model, on the job's device: (model, data,
    config); bad input ends the job with ``PROG: error: ...``."""
    comm, run, resumed, start = job.comm, job.run, job.resumed, job.checked
    try:
        with leader_first(comm):  # rank 0 writes the vocab and the token store first
            data = prepare_data(cfg, run, reuse_vocab=resumed is not None
                                or not comm.is_leader, resumed=resumed)
        config = run_config(cfg, start, resumed, len(data.tokenizer))
        if comm.is_leader:
            check_corpus_shape(data)
        model = build_pretraining_model(cfg, config, data, start, resumed, str(run.checkpoint))
    except (ValueError, KeyError) as e:
        fail(prog, str(e))
    except WriteError:
        raise                         # a failed write: job_main's line, with the checkpoint
    except OSError as e:              # an unreadable input
        fail(prog, f"{getattr(e, 'filename', '') or ''}: {e.strerror or e}")
    job.checked = None  # the weights are in the model now
    model.to(job.device)
    return model, data, config


def training_config(cfg: PretrainingConfig, ramp_steps: int | None = None) -> TrainingConfig:
    """The loop's :class:`~minibert.training.TrainingConfig` of a pretraining run;
    ``ramp_steps``: the batch-size ramp's steps when pinned by the run
    (:func:`~.extension.pinned_schedule`), default --batch-size-ramp x --max-steps."""
    ramp = round(cfg.batch_size_ramp * cfg.max_steps) if ramp_steps is None else ramp_steps
    return TrainingConfig(max_steps=cfg.max_steps, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                          lr_scheduler_type=cfg.lr_scheduler_type,
                          decay_steps=decay_steps(cfg.decay_ratio, cfg.max_steps),
                          max_grad_norm=cfg.max_grad_norm,
                          gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                          batch_size_ramp_steps=ramp,
                          seed=cfg.seed, log_every=cfg.log_every, eval_every=cfg.eval_every,
                          save_every=cfg.save_every,
                          max_nonfinite_steps=cfg.max_nonfinite_steps,
                          log_grad_norms=cfg.log_grad_norms, progress=cfg.progress,
                          desc="pretrain", report_to=cfg.report_to,
                          cuda_graphs=cfg.cuda_graphs)
