#!/usr/bin/env python
"""Fine-tune a BERT for sentence (pair) classification, token classification or extractive
question answering (Devlin et al. 2019, 4.1, 4.2, 5.3).

    python finetune.py --init runs/pretrain                 # our train_mlm.py run, movie reviews
    python finetune.py --init path/to/hf-bert-dir --data ../shared/data/classify/en/sms_spam
    python finetune.py --task token-classification --init DIR      # Brown POS tags
    python finetune.py --task token-classification --init DIR --data data/tag/zh/peoples_daily_ner
    python finetune.py --task question-answering --init DIR        # SQuAD v1.1 sample
    python finetune.py --model runs/finetune --predict "a gripping, beautiful film"
    python finetune.py --model runs/qa --predict "Who wrote it?" "It was written by Ann."
    python finetune.py --model runs/finetune --plot-attention "a gripping, beautiful film"

Tasks (--task): sequence-classification (default), token-classification and
question-answering; their file formats and metrics: minibert/finetuning/job.py.
Splits: --train/--dev/--test, or --data DIR with train/dev/test files (default: the
embedded sample of each task). The label (tag) set comes from all splits (or --labels FILE)
and is saved with the model; a label that dev or test has and train has not is reported,
not fatal. --help describes every option.
Training, checkpoints and what is written: minibert/finetuning/job.py.
"""
from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

from minibert import distillation, distributed
from minibert.cli import (add_options, dropout_probability, explicit_options, fail as _fail,
                          flag, float_in, int_at_least, job_main, positive_float, positive_int,
                          start_job)
from minibert.finetuning import job as finetuning
from minibert.finetuning.tasks import TASKS, FinetuneTask
from minibert.training import TrainingConfig, TrainingError, train

DATA_ROOT = Path(__file__).resolve().parent / "data"

fail = partial(_fail, "finetune.py")  # PROG: error: MESSAGE, exit status 2


def add_data_arguments(p) -> None:
    """The task, its files and how its texts become sequences."""
    g = p.add_argument_group("data")
    g.add_argument("--task", choices=list(TASKS), default="sequence-classification",
                   help="what to fine-tune for: a label per sentence (pair), a tag per word "
                        "(NER, part of speech), or an answer span in a context (SQuAD)")
    g.add_argument("--data", default=None,
                   help="directory with the train, dev and test files (train.tsv ... for "
                        "the classification tasks, train.jsonl ... for QA); default: "
                        + "; ".join(f"{n}: data/{t.data_subdir}" for n, t in TASKS.items()))
    g.add_argument("--train", help="train file (overrides DATA/train.EXT)")
    g.add_argument("--dev", help="dev file (overrides DATA/dev.EXT)")
    g.add_argument("--test", help="test file (overrides DATA/test.EXT); 'none' to skip "
                                  "(question answering: skipped when DATA/test.jsonl is absent)")
    g.add_argument("--labels", metavar="FILE", default=None,
                   help="classification and tagging: the label (tag) set, one per line in "
                        "class-id order; every label of the data must be in it (default: "
                        "the labels of train, dev and test, sorted; a label only dev or "
                        "test has is reported)")
    g.add_argument("--max-seq-length", type=int_at_least(3), default=None,
                   help="tokens per sequence, [CLS]/[SEP] included (default: 128; 384 for "
                        "question-answering). Classification: longest-first truncation; "
                        "tagging: longer sentences are cut into windows at word boundaries "
                        "(with a warning); QA: the context is cut into overlapping windows")
    g.add_argument("--label-all-tokens", action="store_true",
                   help="token-classification: train on every WordPiece of a word (B-X "
                        "becomes I-X on the continuation pieces), not only the first")
    g.add_argument("--doc-stride", type=int_at_least(0), default=128,
                   help="question-answering: tokens two consecutive context windows share")
    g.add_argument("--max-query-length", type=positive_int, default=64,
                   help="question-answering: questions are cut to this many tokens")
    g.add_argument("--n-best-size", type=positive_int, default=20,
                   help="question-answering: start and end candidates per window")
    g.add_argument("--max-answer-length", type=positive_int, default=30,
                   help="question-answering: longest answer, in tokens")


def add_model_arguments(p) -> None:
    """The starting point, the head and what is frozen."""
    g = p.add_argument_group("model")
    g.add_argument("--init", default="runs/pretrain",
                   help="train_mlm.py run dir / checkpoint .npz, finetune.py output dir, or "
                        "Hugging Face BERT dir")
    g.add_argument("--random-init", action="store_true",
                   help="take only the architecture and vocab from --init; fresh weights")
    g.add_argument("--classifier-dropout", type=dropout_probability, default=None,
                   help="dropout before the classifier (default: the model's hidden dropout)")
    g.add_argument("--model", default=None,
                   help="a finetune.py output dir to use for --predict / --plot-attention / "
                        "--export-hf without training (its task and labels come with it)")
    g.add_argument("--pooling", choices=["cls", "mean"], default=None,
                   help="sequence classification: the head reads the pooled [CLS] vector "
                        "(cls) or the mean of the last hidden states over the real tokens "
                        "(mean, no pooler); default: the start's (cls for a pretraining run)")
    g.add_argument("--freeze-embeddings", action="store_true",
                   help="do not train the embeddings (word, position, token type, LayerNorm)")
    g.add_argument("--freeze-layers", type=int_at_least(0), default=0, metavar="N",
                   help="do not train the lowest N encoder layers (0 to num_hidden_layers); "
                        "with --freeze-embeddings too, no backward runs below layer N")


def parse_args(argv=None) -> tuple[argparse.Namespace, set[str]]:
    """The arguments, and the names of those given on the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_data_arguments(p)
    add_model_arguments(p)
    distillation.add_task_arguments(
        p.add_argument_group("task distillation (sequence classification)"))
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=positive_int, default=3, help="passes over the train split")
    g.add_argument("--max-train-examples", type=positive_int, default=None,
                   help="use only the first N train rows, sentences (tagging) or "
                        "questions (QA) (quick runs)")
    g.add_argument("--group-by-length", action="store_true",
                   help="batch train rows of similar length (sorted within shuffled "
                        "mega-batches of up to 50 batches, batch order random per epoch; "
                        "HF Trainer's group_by_length): far less padding, faster epochs")
    add_options(g, max_steps=dict(default=None, help="stop after this many optimizer steps "
                                                     "(default: all epochs)"),
                batch_size=32, gradient_accumulation_steps=1, lr=5e-5)
    g.add_argument("--eval-batch-size", type=positive_int, default=64,
                   help="sequences per eval batch")
    g.add_argument("--warmup-proportion", type=float_in(0.0, 1.0), default=0.1,
                   help="share of the steps with linear warmup")
    g.add_argument("--adam-eps", type=positive_float, default=1e-6, help="AdamW epsilon")
    add_options(g, weight_decay=0.01, correct_bias=True, max_grad_norm=1.0,
                max_nonfinite_steps=5,
                eval_every=dict(default=None, help="evaluate on dev (and keep the best "
                                "model) every N steps instead of once per epoch"),
                seed=0, device=None, tf32=False,
                dtype=dict(default="float32", choices=["float32", "float16"]))
    g.add_argument("--metric", choices=finetuning.METRICS, default="auto",
                   help="dev metric that picks the best checkpoint; auto: entity f1 for O / "
                        "B-X / I-X tags, f1 for question-answering, else accuracy. Also "
                        "macro_f1, mcc (sequence-classification); f1, precision, recall "
                        "(token-classification); exact_match (question-answering)")
    distributed.add_arguments(g)
    g = p.add_argument_group("output")
    add_options(g, output_dir="runs/finetune", resume=None, log_every=10, progress=True,
                overwrite=dict(default=False, help="replace the run in --output-dir and what "
                               "--export-hf DIR holds (default: refuse to write over them)"))
    g.add_argument("--predict", nargs="+", metavar="TEXT",
                   help="sequence-classification: print each label's probability for TEXT "
                        "(or a pair TEXT_A TEXT_B); token-classification: print word/TAG "
                        "for each word of TEXT (each character for a character-level "
                        "tagger such as Chinese NER); question-answering: QUESTION CONTEXT, "
                        "print the answer span and its score")
    g.add_argument("--plot-attention", nargs="+", metavar="TEXT",
                   help="write OUTPUT_DIR/attention.png (layers x heads maps for TEXT "
                        "[TEXT_B]) and OUTPUT_DIR/attention_cls.png (per layer, what [CLS] "
                        "attends to, averaged over heads)")
    g.add_argument("--export-hf", metavar="DIR",
                   help="also write the best model as a Hugging Face directory: a new or "
                        "empty one, or an earlier export of the same model (else --overwrite)")
    args = p.parse_args(argv)
    given = explicit_options(p, argv)
    if args.resume:
        args.output_dir = args.resume
    check_args(p, args, given)
    return args, given


def check_args(p, args, given: set[str]) -> None:
    """Options that only mean something together (argparse's error exit otherwise)."""
    if not args.teacher and (stray := [n for n in distillation.TASK_OPTIONS if n in given]):
        p.error(f"{flag(stray[0])} goes with --teacher")
    if args.teacher and args.task != "sequence-classification":
        p.error(f"--teacher: task distillation is for --task sequence-classification, "
                f"not {args.task}")
    if args.labels and args.task == "question-answering":
        p.error("--labels: question-answering has no label set")
    if args.pooling and args.task != "sequence-classification":
        p.error(f"--pooling: for --task sequence-classification, not {args.task}")
    for name in ("predict", "plot_attention"):
        if getattr(args, name) and len(getattr(args, name)) > 2:
            p.error(f"{flag(name)} takes one text or a pair of texts")
    if args.export_hf and Path(args.export_hf).exists() and not Path(args.export_hf).is_dir():
        p.error(f"--export-hf {args.export_hf}: is a file, not a directory")


def use_model(args, given) -> int:
    """--model DIR: predict, plot or export with a fine-tuned model, no training."""
    if (job := start_job(args, given, "finetune.py")).comm.world_size > 1:
        fail("--model (predict / plot / export) runs in one process; start it without mpirun")
    out = Path(args.output_dir) if args.output_dir != "runs/finetune" else Path(args.model)
    try:
        task, model, tokenizer, pre = finetuning.load_model(args, given)
        finetuning.use_model(args, task, model, tokenizer, pre.labels, pre, job.xp, out)
    except ValueError as e:
        fail(str(e))
    return 0


@job_main("finetune.py")  # a fault ends in one line; the run directory is let go
def main(argv=None) -> int:
    args, given = parse_args(argv)
    if args.model:
        return use_model(args, given)
    job = start_job(args, given, "finetune.py", "finetune",
                    resume_fixed=[k for k in vars(args) if k not in finetuning.RESUME_FREE],
                    resume_defaults=finetuning.RESUME_DEFAULTS,
                    check=lambda _: finetuning.load_init(args))
    comm, run, resumed, (pre, tokenizer) = job.comm, job.run, job.resumed, job.checked
    try:
        task, data, max_len = finetuning.read_data(args, pre, tokenizer, DATA_ROOT)
        train_split, soft = data.train, None
        if args.teacher:
            train_split, soft = distillation.soft_targets(args, tokenizer, data.train,
                                                          data.labels, max_len, job.xp)
        built = finetuning.build_model(args, task, pre, data, resumed, str(run.checkpoint))
    except (ValueError, KeyError) as e:
        fail(str(e))
    model = built.model
    print(built.description)
    if comm.world_size > 1:
        print(distributed.describe(comm, args.batch_size))
    if comm.is_leader:
        finetuning.write_run_files(args, run, pre, data.labels, model)
    per_epoch, total = finetuning.schedule(args, len(train_split))
    opt = finetuning.make_optimizer(model, args)
    best = resumed["trainer"].get("best") if resumed is not None else None
    state = job.train_state(opt, "finetune.py")
    resumed = None
    loop_task = FinetuneTask(args, run, model, train_split, data.dev, data.labels, pre,
                             job.xp, best, task, soft)
    cfg = TrainingConfig(max_steps=total, lr=args.lr,
                         warmup_steps=int(args.warmup_proportion * total),
                         max_grad_norm=args.max_grad_norm,
                         gradient_accumulation_steps=args.gradient_accumulation_steps,
                         seed=args.seed, log_every=args.log_every,
                         eval_every=args.eval_every or per_epoch, save_every=per_epoch,
                         max_nonfinite_steps=args.max_nonfinite_steps, progress=args.progress,
                         desc="fine-tune")
    t0, step0 = time.perf_counter(), state.step
    try:
        state, _ = train(model, opt, loop_task, cfg, state, metrics_path=run.metrics,
                         checkpoint_path=run.checkpoint, comm=comm, device=job.device)
    except TrainingError as e:
        fail(str(e))
    if not comm.is_leader:
        return 0
    timing = {"seconds": time.perf_counter() - t0, "steps": state.step - step0,
              "per_epoch": per_epoch}
    if not run.best_model.exists():  # e.g. --resume of a run whose best was lost
        loop_task.evaluate(state.step)
    model = finetuning.write_results(args, run, task, data, pre, loop_task, state, timing,
                                     built, job.xp)
    try:
        finetuning.use_model(args, task, model, tokenizer, data.labels, pre, job.xp, run.path)
    except ValueError as e:
        fail(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
