"""The options of the pretraining job (``train_mlm.py``) and the job run on them.

The script is wiring only: ``train_mlm.py`` calls :func:`main`, and so does anything in
the package that runs the job in its own process (:mod:`minibert.selftest`), without
importing a script. :func:`parse_args` turns a command line into a
:class:`~minibert.pretraining.PretrainingConfig`; the ``add_*_arguments`` functions add
the option groups.
"""
from __future__ import annotations

import argparse

from .. import distillation, distributed
from ..albert import ALBERT_PRESETS
from ..cli import (add_options, dropout_probability, explicit_options, float_in,
                   int_at_least, non_negative_int, positive_int, probability)
from ..modeling import PRESETS
from ..objectives import OBJECTIVES
from ..tokenization.trainer import ALGORITHMS
from .config import (DEFAULT_CORPUS, DEFAULT_EXCLUDE, DEFAULT_PAIRS, PretrainingConfig,
                     add_masking_arguments)
from .extension import add_schedule_arguments

DESCRIPTION = ("Pretrain a BERT with masked-LM and, if asked, a sentence-level objective "
               "(Devlin et al. 2019).")
"""The first line of ``train_mlm.py --help``."""


def add_data_arguments(p) -> None:
    """The corpus and vocab, then the objective and how sequences are cut and masked."""
    g = p.add_argument_group("data")
    g.add_argument("--corpus", nargs="+", default=[str(DEFAULT_CORPUS)],
                   help="text files or directories (their *.txt): one sentence per line, "
                        "a blank line between documents; or finetune.py .tsv files (one "
                        "document a row; labels are not read)")
    g.add_argument("--exclude-documents", nargs="+", metavar="FILE",
                   default=[str(DEFAULT_EXCLUDE)],
                   help="leave out of the corpus (training, held-out split and a learned "
                        "vocab) the documents these lists name (one 'SHA256<TAB>NAME' per "
                        "line, the digest of the document's lines; see "
                        "minibert/pretraining/exclusion.py); the default lists the Brown "
                        "documents of the POS dev and test splits, so a tagger evaluated "
                        "on them was never pretrained on their sentences; 'none': leave "
                        "nothing out")
    g.add_argument("--vocab", default=None,
                   help="WordPiece vocab.txt to use; if absent one is learned from the corpus")
    g.add_argument("--vocab-size", type=int_at_least(8), default=8192,
                   help="size of a learned vocab")
    g.add_argument("--vocab-algorithm", choices=ALGORITHMS, default=None,
                   help="merge criterion of the vocab trainer (see python -m "
                        "minibert.tokenization train --help); default: the trainer's")
    g.add_argument("--no-lowercase", dest="lowercase", action="store_false",
                   help="keep case (lower-casing and accent stripping are on by default)")
    add_sequence_arguments(g)


def add_sequence_arguments(g) -> None:
    """The data group's second half: the objective, and how sequences are cut and masked."""
    g.add_argument("--objective", choices=sorted(OBJECTIVES), default=None,
                   help="default: mlm on one line per sequence for --model bert (--line-by-line), "
                        "mlm+sop for albert. mlm+nsp: BERT's sentence pairs with "
                        "next-sentence prediction; mlm: "
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
                        "0.4 works); the start rate with --masked-lm-prob-end")
    add_masking_arguments(g)
    g.add_argument("--max-predictions-per-seq", type=positive_int, default=None,
                   help="masked positions per sequence, P of every batch (default: "
                        "ceil(max_seq_length * the larger masking rate))")
    g.add_argument("--short-seq-prob", type=probability, default=0.1,
                   help="probability of a shorter target length (as google-research/bert)")
    g.add_argument("--masking", choices=["dynamic", "static"], default="dynamic",
                   help="fresh masks every epoch, or dupe_factor fixed versions as the reference")
    g.add_argument("--dupe-factor", type=positive_int, default=10,
                   help="distinct pairings (and static maskings) of the corpus before repeating")
    g.add_argument("--whole-word-mask", action="store_true",
                   help="mask all WordPiece pieces of a chosen word together")
    g.add_argument("--max-ngram", type=positive_int, default=None, metavar="N",
                   help="ALBERT's n-gram masking: mask spans of up to N whole words, a span "
                        "of n words drawn with probability proportional to 1/n (1: off; "
                        "default 3 for --model albert, 1 for bert)")
    g.add_argument("--allow-data-change", action="store_true",
                   help="with --resume: continue although the corpus or vocab changed since "
                        "the checkpoint (refused by default; the change is printed)")


def add_eval_arguments(p) -> None:
    """What is held out and measured at each evaluation."""
    g = p.add_argument_group("evaluation")
    g.add_argument("--eval-fraction", type=float_in(0.0, 1.0, high_open=True), default=0.02,
                   help="share of documents held out for evaluation")
    g.add_argument("--eval-instances", type=positive_int, default=1024,
                   help="held-out sequences evaluated each time")
    g.add_argument("--eval-samples", type=non_negative_int, default=3,
                   help="held-out sentences whose masked word the model guesses at each "
                        "evaluation, shown in the log and metrics.jsonl (0: none)")
    g.add_argument("--eval-pairs", default=str(DEFAULT_PAIRS),
                   help="BLiMP-format minimal pairs scored at each evaluation (pairs_acc, "
                        "macro %% over paradigms, beside the word-trigram floor on the corpus)")
    g.add_argument("--eval-pairs-per-paradigm", type=non_negative_int, default=25,
                   help="the first N pairs of each paradigm of --eval-pairs (0: no pairs)")
    g.add_argument("--eval-blimp-per-paradigm", type=non_negative_int, default=5,
                   help="the first N pairs of each of BLiMP's 67 paradigms in its development "
                        "set (data/minimal_pairs/blimp/dev.jsonl), scored at each evaluation "
                        "(blimp_acc, beside the unigram and trigram floors; 0: none)")


def add_model_arguments(p) -> None:
    """The architecture: a preset, sizes that override it, activation, dropout, positions."""
    presets = ", ".join(f"{k} ({l} layers x {h} hidden)" for k, (l, h) in PRESETS.items())
    albert = ", ".join(f"{k} (E {e})" for k, (_, _, e) in ALBERT_PRESETS.items())
    g = p.add_argument_group("model")
    g.add_argument("--model", choices=["bert", "albert", "distilbert"], default="bert",
                   help="bert, or albert (Lan et al. 2020: one layer group shared by every "
                        "depth, embeddings of width E mapped up to the hidden size), or "
                        "distilbert (Sanh et al. 2019: no token types or pooler; --objective "
                        "mlm; as a student, --teacher with --student-init preset)")
    g.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help=f"model size (Turc et al. 2019 sizes): {presets}; ALBERT's presets "
                        f"have the same depths and widths and embedding width {albert}")
    g.add_argument("--num-hidden-layers", type=positive_int, help="override the preset's layers")
    g.add_argument("--hidden-size", type=positive_int, help="override the preset's hidden size")
    g.add_argument("--num-attention-heads", type=positive_int,
                   help="override the preset's heads")
    g.add_argument("--intermediate-size", type=positive_int,
                   help="override the feed-forward width")
    g.add_argument("--embedding-size", type=positive_int,
                   help="--model albert: width E of the embedding tables, at most the hidden "
                        "size (default: the preset's; min(128, hidden/2) with --hidden-size)")
    g.add_argument("--num-hidden-groups", type=positive_int,
                   help="--model albert: layer groups with their own weights (default 1: "
                        "every depth applies the same layer)")
    g.add_argument("--inner-group-num", type=positive_int,
                   help="--model albert: layers in each group (default 1)")
    g.add_argument("--hidden-act", choices=["gelu", "gelu_new", "relu"], default=None,
                   help="feed-forward activation (gelu = exact erf form; default gelu for "
                        "--model bert, gelu_new for albert)")
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


def parse_args(argv=None) -> tuple[PretrainingConfig, set[str]]:
    """The options as a :class:`~minibert.pretraining.PretrainingConfig` (derived defaults
    filled in), and the names of those given on the command line."""
    p = argparse.ArgumentParser(description=DESCRIPTION,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_data_arguments(p)
    add_eval_arguments(p)
    add_model_arguments(p)
    distillation.add_arguments(p.add_argument_group("distillation (docs/distillation.md)"))
    g = p.add_argument_group("training")
    add_options(g, max_steps=4350, batch_size=128, gradient_accumulation_steps=1)
    g.add_argument("--batch-size-ramp", type=float_in(0.0, 1.0, high_open=True), default=0.0,
                   metavar="FRACTION",
                   help="over this fraction of --max-steps the micro-batches per step grow "
                        "linearly from 1 to --gradient-accumulation-steps (Cramming's batch "
                        "ramp; 0: off)")
    add_options(g, lr=dict(default=2e-3, help=(
        "peak learning rate (2e-3: the tiny preset's best at 3,000 packed steps, docs/grammar.md; "
        "figures measured before 2026-11-26 used the earlier default, 1e-3)")))
    add_options(g, weight_decay=0.01, correct_bias=True, max_grad_norm=1.0,
                max_nonfinite_steps=5)
    g.add_argument("--warmup-steps", type=non_negative_int, default=None,
                   help="linear warmup steps (default: 10%% of --max-steps)")
    add_schedule_arguments(g)
    g.add_argument("--label-smoothing", type=float_in(0.0, 1.0, high_open=True), default=0.0,
                   help="MLM label smoothing")
    add_options(g, seed=0, device=None, tf32=False, fast_cpu=True, cuda_graphs=False,
                dtype=dict(default="float32",
                           choices=["float32", "float64", "float16", "bfloat16"]))
    distributed.add_arguments(g)
    g = p.add_argument_group("output")
    add_options(g, output_dir="runs/pretrain", overwrite=False, resume=None, log_every=10,
                report_to="none",
                eval_every=250, progress=True)
    g.add_argument("--init-checkpoint", default=None, metavar="DIR_OR_FILE",
                   help="start from the weights (and config and vocab) of a train_mlm.py "
                        "run, a checkpoint or a Hugging Face BERT directory, with a fresh "
                        "optimizer and schedule (google-research/bert's init_checkpoint); "
                        "architecture options are then taken from it")
    g.add_argument("--log-grad-norms", type=non_negative_int, default=0, metavar="N",
                   help="every N steps, record per-layer gradient norms and update/weight "
                        "ratios in metrics.jsonl (kind grad_flow; plot: python -m "
                        "minibert.gradflow); 0 = off")
    g.add_argument("--export-hf", metavar="DIR", default=None,
                   help="at the end, also write the model as a Hugging Face directory "
                        "(--objective electra: the discriminator, as transformers' "
                        "ElectraForPreTraining)")
    g.add_argument("--save-every", type=positive_int, default=250,
                   help="steps between checkpoints")
    cfg = PretrainingConfig(**vars(p.parse_args(argv)))
    return cfg.with_defaults(), explicit_options(p, argv)


def main(argv=None) -> int:
    """Run the pretraining job on the options ``argv`` (default: ``sys.argv[1:]``).

    Returns:
        0 when the run ends. A bad option, input or run directory ends the process with an
        ``error:`` line instead (``SystemExit`` with status 2 or 1); a Ctrl-C with status
        130.
    """
    from .job import run_pretraining       # the loop and its imports, on first use
    cfg, given = parse_args(argv)
    run_pretraining(cfg, given)
    return 0
