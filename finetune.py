#!/usr/bin/env python
"""Fine-tune a BERT for sentence or sentence-pair classification (Devlin et al. 2019, 4.1).

    python finetune.py --init runs/pretrain                 # our train_mlm.py run, movie reviews
    python finetune.py --init path/to/hf-bert-dir --data ../shared/data/classify/en/sms_spam
    python finetune.py --model runs/finetune --predict "a gripping, beautiful film"
    python finetune.py --model runs/finetune --plot-attention "a gripping, beautiful film"

Data: TSV with a header, ``label<TAB>sentence`` or ``label<TAB>sentence_a<TAB>sentence_b``
(--train/--dev/--test, or --data DIR with train.tsv, dev.tsv, test.tsv; default the
embedded movie reviews). The label set comes from the train split and is saved with the
model. Start: --init a train_mlm.py run directory or checkpoint, a finetune.py output, or
a Hugging Face BERT directory (the classification head is new unless present).
Training: minibert.training's loop (AdamW with warmup and linear decay, global-norm
clipping, gradient accumulation), dynamic padding per batch (--group-by-length: batches of
rows of similar length, as HF's Trainer; train records then show little padding, see
``padding_fraction``); dev metrics (accuracy,
macro-F1, Matthews correlation) after every epoch; the best dev model is kept in
OUTPUT_DIR/best_model.npz and the resumable state in OUTPUT_DIR/checkpoint.npz (--resume);
then test metrics and predictions. Writes to --output-dir (see minibert.runs):
checkpoint.npz, best_model.npz, vocab.txt, labels.json, config.json, args.json,
metrics.jsonl, summary.json, predictions_{dev,test}.tsv, training_curves.png.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from minibert import backend, distributed
from minibert.atomic import atomic_copy, atomic_write_bytes, atomic_write_json
from minibert.backend import to_numpy
from minibert.checkpoint import (CheckpointError, check_same_config, load_checkpoint,
                                 save_checkpoint)
from minibert.cli import (dropout_probability, explicit_options, fail as _fail, float_in,
                          int_at_least,
                          non_negative_float, positive_float, positive_int)
from minibert.finetuning import (DatasetError, build_classifier, encode_split, evaluate,
                                 iterate_batches, label_list, read_tsv, softmax_np)
from minibert.hf import HFFormatError, save_hf_directory
from minibert.optim import AdamW
from minibert.runs import (MetricsLog, RunDir, RunError, load_start, prepare_run_dir, resume_args,
                           write_args)
from minibert.tokenization import BertTokenizer
from minibert.training import (TrainingConfig, TrainingError, TrainState, resume_state,
                               train)

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "classify" / "en" / "movie_reviews"


def parse_args(argv=None) -> tuple[argparse.Namespace, set[str]]:
    """The arguments, and the names of those given on the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data", default=str(DEFAULT_DATA),
                   help="directory with train.tsv, dev.tsv and test.tsv")
    g.add_argument("--train", help="train TSV (overrides DATA/train.tsv)")
    g.add_argument("--dev", help="dev TSV (overrides DATA/dev.tsv)")
    g.add_argument("--test", help="test TSV (overrides DATA/test.tsv); 'none' to skip")
    g.add_argument("--max-seq-length", type=int_at_least(3), default=128,
                   help="tokens per sequence, [CLS]/[SEP] included (longest-first truncation)")
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
                        "--export-hf without training")
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=positive_int, default=3, help="passes over the train split")
    g.add_argument("--max-steps", type=positive_int, default=None,
                   help="stop after this many optimizer steps (default: all epochs)")
    g.add_argument("--max-train-examples", type=positive_int, default=None,
                   help="use only the first N train rows (quick runs)")
    g.add_argument("--batch-size", type=positive_int, default=32,
                   help="sequences per micro-batch (per step: batch size x accumulation)")
    g.add_argument("--gradient-accumulation-steps", type=positive_int, default=1,
                   help="micro-batches whose gradients are summed (each weighted 1/k) per step")
    g.add_argument("--group-by-length", action="store_true",
                   help="batch train rows of similar length (sorted within shuffled "
                        "mega-batches of up to 50 batches, batch order random per epoch; "
                        "HF Trainer's group_by_length): far less padding, faster epochs")
    g.add_argument("--eval-batch-size", type=positive_int, default=64, help="sequences per eval batch")
    g.add_argument("--lr", type=non_negative_float, default=5e-5, help="peak learning rate")
    g.add_argument("--warmup-proportion", type=float_in(0.0, 1.0), default=0.1,
                   help="share of the steps with linear warmup")
    g.add_argument("--weight-decay", type=non_negative_float, default=0.01, help="decoupled weight decay")
    g.add_argument("--adam-eps", type=positive_float, default=1e-6, help="AdamW epsilon")
    g.add_argument("--no-correct-bias", dest="correct_bias", action="store_false",
                   help="BERT's AdamW without bias correction (default: bias-corrected, as "
                        "torch.optim.AdamW)")
    g.add_argument("--max-grad-norm", type=non_negative_float, default=1.0,
                   help="global-norm clipping threshold (0: no clipping)")
    g.add_argument("--max-nonfinite-steps", type=positive_int, default=5,
                   help="stop after this many steps in a row with a non-finite loss or "
                        "gradient norm (each such step is skipped)")
    g.add_argument("--metric", choices=["accuracy", "macro_f1", "mcc"], default="accuracy",
                   help="dev metric that picks the best checkpoint")
    g.add_argument("--eval-every", type=positive_int, default=None,
                   help="evaluate on dev (and keep the best model) every N steps instead "
                        "of once per epoch")
    g.add_argument("--seed", type=int_at_least(0), default=0, help="seed of head init, shuffling, dropout")
    g.add_argument("--device", choices=list(backend.DEVICES), default=None,
                   help="cpu or cuda (default: $MINIBERT_DEVICE or cpu)")
    g.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                   help="training dtype; float16 is mixed precision: float16 compute, float32 "
                        "master weights, dynamic loss scaling (for GPUs; NumPy's float16 is slow)")
    distributed.add_arguments(g)
    g.add_argument("--tf32", action="store_true",
                   help="let float32 matmuls use TF32 tensor cores (--device cuda, Ampere+)")
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", default="runs/finetune", help="where everything is written")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the run in --output-dir (default: refuse to write over it)")
    g.add_argument("--resume", nargs="?", const="", default=None, metavar="DIR",
                   help="continue the fine-tuning run in DIR (default: --output-dir) from "
                        "its checkpoint")
    g.add_argument("--log-every", type=positive_int, default=10, help="steps between train records")
    g.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars")
    g.add_argument("--predict", nargs="+", metavar="TEXT",
                   help="print each label's probability for TEXT (or a pair TEXT_A TEXT_B)")
    g.add_argument("--plot-attention", nargs="+", metavar="TEXT",
                   help="write OUTPUT_DIR/attention.png: layers x heads maps for TEXT [TEXT_B]")
    g.add_argument("--export-hf", metavar="DIR",
                   help="also write the best model as a Hugging Face directory")
    args = p.parse_args(argv)
    given = explicit_options(p, argv)
    if args.resume:
        args.output_dir = args.resume
    for name in ("predict", "plot_attention"):
        if getattr(args, name) and len(getattr(args, name)) > 2:
            p.error(f"--{name.replace('_', '-')} takes one text or a pair of texts")
    return args, given


def fail(message: str):
    _fail("finetune.py", message)


def split_paths(args) -> dict[str, Path | None]:
    data = Path(args.data)
    paths = {s: Path(getattr(args, s)) if getattr(args, s) else data / f"{s}.tsv"
             for s in ("train", "dev", "test")}
    if args.test and args.test.lower() == "none":
        paths["test"] = None
    return paths


def write_predictions(path: Path, split, probs: np.ndarray, labels) -> None:
    """TSV: line, gold, predicted, then one probability column per label."""
    rows = ["line\tgold\tpredicted\t" + "\t".join(f"p_{l}" for l in labels)]
    for e, p in zip(split.examples, probs):
        rows.append(f"{e.line}\t{e.label}\t{labels[int(p.argmax())]}\t"
                    + "\t".join(f"{x:.6f}" for x in p))
    data = ("\n".join(rows) + "\n").encode("utf-8")
    atomic_write_bytes(path, data)


def encode_texts(tokenizer, texts, max_len, xp):
    enc = tokenizer(texts[0], texts[1] if len(texts) > 1 else None, truncation=True,
                    max_length=max_len, return_tensors="np")
    ids, tt = enc["input_ids"][None], enc["token_type_ids"][None]
    return xp.asarray(ids), xp.asarray(tt), xp.asarray(np.ones_like(ids)), ids[0]


def predict_text(model, tokenizer, labels, texts, max_len, xp) -> dict[str, float]:
    ids, tt, mask, _ = encode_texts(tokenizer, texts, max_len, xp)
    model.eval()
    probs = softmax_np(to_numpy(model(ids, tt, mask).logits))[0]
    return {l: float(p) for l, p in zip(labels, probs)}


def plot_attention(model, tokenizer, texts, max_len, xp, path: Path) -> Path:
    from minibert.viz import plot_attention_grid
    ids, tt, mask, host_ids = encode_texts(tokenizer, texts, max_len, xp)
    model.eval()
    out = model(ids, tt, mask, output_attentions=True)
    tokens = tokenizer.convert_ids_to_tokens([int(i) for i in host_ids])
    return plot_attention_grid([to_numpy(a) for a in out.attentions], tokens, path,
                               title=" | ".join(texts))


# Arguments that must match between a checkpoint's run and a resumed run.
RESUME_FIXED = ("data", "train", "dev", "max_seq_length", "init", "random_init",
                "classifier_dropout", "epochs", "max_steps", "max_train_examples", "batch_size",
                "gradient_accumulation_steps", "group_by_length", "lr", "warmup_proportion",
                "weight_decay", "adam_eps", "correct_bias", "max_grad_norm", "metric",
                "eval_every", "seed", "dtype")
# The value of an argument added later for checkpoints written before it existed.
RESUME_DEFAULTS = {"group_by_length": False,   # older runs batched unsorted
                   "dtype": "float32"}          # and trained in float32


class FinetuneTask:
    """The fine-tuning job for :func:`minibert.training.train`: shuffled epochs of the
    train split (grouped by length with ``args.group_by_length``), dev evaluation that
    keeps the best model in ``best_model.npz``.

    Train records get, besides the loop's ``tokens_per_s`` (real tokens, i.e. attention-mask
    ones, per second of the log window): ``real_tokens`` and ``padded_tokens`` (B x T summed
    over the window's applied steps) and ``padding_fraction`` = 1 - real / padded; the
    padded tokens/s are ``tokens_per_s / (1 - padding_fraction)``.
    """

    def __init__(self, args, run, model, train_split, dev_split, labels, pre, xp,
                 best: dict | None = None):
        self.args, self.run, self.model, self.xp = args, run, model, xp
        self.train_split, self.dev_split, self.labels, self.pre = train_split, dev_split, labels, pre
        self.pad_id = 0
        self.best = best or {"metric": None, "step": None}
        self.evaluate = self._evaluate

    def batches(self, epoch: int, start_batch: int):
        return iterate_batches(self.train_split, self.args.batch_size, self.pad_id,
                               seed=self.args.seed, epoch=epoch, start_batch=start_batch,
                               group_by_length=self.args.group_by_length)

    def forward(self, model, batch):
        xp = self.xp
        labels = xp.asarray(batch.labels)
        out = model(xp.asarray(batch.input_ids), xp.asarray(batch.token_type_ids),
                    xp.asarray(batch.attention_mask), labels=labels)
        mask = batch.attention_mask                    # host (B, T): no device read
        return out.loss, {"correct": (out.logits.argmax(-1) == labels).sum(),
                          "count": labels.shape[0], "real_tokens": int(mask.sum()),
                          "padded_tokens": int(mask.size)}

    def summarize(self, totals: dict) -> dict:
        real, padded = totals.get("real_tokens", 0.0), totals.get("padded_tokens", 0.0)
        return {"accuracy": totals.get("correct", 0.0) / max(totals.get("count", 0.0), 1.0),
                "real_tokens": int(real), "padded_tokens": int(padded),
                "padding_fraction": round(1.0 - real / padded, 4) if padded else None}

    def _evaluate(self, step: int) -> dict:
        m, _ = evaluate(self.model, self.dev_split, self.args.eval_batch_size, self.pad_id,
                        self.xp)
        value = m[self.args.metric]
        if self.best["metric"] is None or value > self.best["metric"]:
            self.best = {"metric": value, "step": step}
            save_checkpoint(self.run.best_model, self.model, None,
                            {"job": "finetune", "step": step, "dev": m, "labels": self.labels,
                             "tokenizer": dict(self.pre.tokenizer_options),
                             "init": self.pre.source})
        return {"dev_" + k: v for k, v in m.items() if k != "n"} | {
            "best_step": self.best["step"]}

    def trainer_record(self) -> dict:
        return {"job": "finetune", "args": vars(self.args),
                "labels": self.labels, "tokenizer": dict(self.pre.tokenizer_options),
                "best": self.best}


def make_optimizer(model, args) -> AdamW:
    """finetune.py's AdamW (also bench/bench_finetune.py's minibert side)."""
    return AdamW(model.named_parameters(), lr=args.lr, eps=args.adam_eps,
                 weight_decay=args.weight_decay, correct_bias=args.correct_bias)


def use_model(args, xp, device) -> int:
    """--model DIR: predict, plot or export with a fine-tuned model, no training."""
    try:
        pre = load_start(args.model, "--model")
    except RunError as e:
        fail(str(e))
    if not pre.labels:
        fail(f"--model {args.model}: not a fine-tuned classifier (no label set saved)")
    try:
        model, _ = build_classifier(pre, pre.labels)
        tokenizer = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    except (HFFormatError, KeyError, ValueError) as e:
        fail(f"--model {args.model}: {e}")
    model.to(device)
    out = Path(args.output_dir) if args.output_dir != "runs/finetune" else Path(args.model)
    finish(args, model, tokenizer, pre.labels, pre.vocab_file, pre.tokenizer_options, xp, out)
    return 0


def main(argv=None) -> int:
    args, given = parse_args(argv)
    if args.export_hf and Path(args.export_hf).exists() and not Path(args.export_hf).is_dir():
        fail(f"--export-hf {args.export_hf}: is a file, not a directory")
    comm = distributed.start(args, fail)
    leader = comm.is_leader
    if args.model and comm.world_size > 1:
        fail("--model (predict / plot / export) runs in one process; start it without mpirun")
    try:
        device = backend.set_device(args.device)
        if args.tf32:
            backend.set_tf32(True)
    except backend.BackendError as e:
        fail(str(e))
    xp = backend.xp_for(device)
    if args.model:
        return use_model(args, xp, device)

    # ---- starting point, run directory, data ------------------------------------------
    resume = args.resume is not None
    resumed = None
    if not leader:  # rank 0 checks and prepares the run directory first
        comm.barrier()
    try:
        if resume:  # the run's own arguments, unless given here
            run = (prepare_run_dir(args.output_dir, "finetune", resume=True) if leader
                   else RunDir(Path(args.output_dir), "finetune"))
            resumed = load_checkpoint(run.checkpoint)
            resume_args(args, RESUME_DEFAULTS | resumed["trainer"].get("args", {}),
                        RESUME_FIXED, given, str(run.checkpoint))
        pre = load_start(args.init)
        if not resume:
            run = (prepare_run_dir(args.output_dir, "finetune", overwrite=args.overwrite)
                   if leader else RunDir(Path(args.output_dir), "finetune"))
        tokenizer = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    except (RunError, CheckpointError, ValueError) as e:
        msg = str(e)
        if args.init == "runs/pretrain" and not Path(args.init).exists():
            msg += (" (the default --init is the output of `python train_mlm.py`; run that "
                    "first, or pass --init DIR)")
        fail(msg)
    if leader:
        comm.barrier()
    if args.batch_size < comm.world_size:
        fail(f"--batch-size {args.batch_size} is the global batch, split over "
             f"{comm.world_size} ranks: it must be at least {comm.world_size}")
    paths = split_paths(args)
    try:
        train_ex = read_tsv(paths["train"])
        if args.max_train_examples:
            train_ex = train_ex[:args.max_train_examples]
        labels = label_list(train_ex)
        if len(labels) < 2:
            raise DatasetError(f"{paths['train']}: the train split has one class only "
                               f"({labels[0]!r}); classification needs at least two")
        dev_ex = read_tsv(paths["dev"])
        test_ex = read_tsv(paths["test"]) if paths["test"] is not None else None
        max_len = min(args.max_seq_length, pre.config.max_position_embeddings)
        train_split = encode_split(tokenizer, train_ex, max_len, labels)
        dev = encode_split(tokenizer, dev_ex, max_len, labels)
        test = encode_split(tokenizer, test_ex, max_len, labels) if test_ex else None
    except (DatasetError, ValueError) as e:
        fail(str(e))
    try:
        model, report = build_classifier(pre, labels, seed=args.seed,
                                         random_init=args.random_init,
                                         classifier_dropout=args.classifier_dropout)
        if resumed is not None:
            check_same_config(resumed["config"], model.config, str(run.checkpoint))
            model.load_state_dict(resumed["model"])
    except (HFFormatError, CheckpointError, KeyError, ValueError) as e:
        fail(str(e))
    model.to(device, dtype=np.dtype(args.dtype))
    fresh = "all weights new (architecture only, random init)" if args.random_init \
        else f"new: {report['new']}; not used: {report['unused'] or 'none'}"
    print(f"model: {pre.source}, {model.num_parameters():,} parameters; {fresh}; labels {labels}; "
          f"train {len(train_split)}, dev {len(dev)}, test {len(test) if test else 0} examples; "
          f"max_seq_length {max_len}")
    if comm.world_size > 1:
        print(distributed.describe(comm, args.batch_size))
    if leader:
        atomic_copy(pre.vocab_file, run.vocab)
        atomic_write_json(run.path / "labels.json", labels)
        atomic_write_bytes(run.config, model.config.to_json().encode())
        write_args(run, vars(args))

    # ---- training -------------------------------------------------------------------
    k = args.gradient_accumulation_steps
    steps_per_epoch = -(-(-(-len(train_split) // args.batch_size)) // k)
    total = steps_per_epoch * args.epochs
    if args.max_steps:
        total = min(total, args.max_steps)
    opt = make_optimizer(model, args)
    state = TrainState()
    best = None
    if resumed is not None:
        try:
            state = resume_state(resumed, opt)
        except TrainingError as e:
            fail(f"checkpoint {run.checkpoint}: {e}")
        best = resumed["trainer"].get("best")
        print(f"resuming {run.checkpoint} at step {state.step}")
        if note := distributed.resume_notice(state.world_size, comm):
            print(note)
        resumed = None
    task = FinetuneTask(args, run, model, train_split, dev, labels, pre, xp, best)
    cfg = TrainingConfig(max_steps=total, lr=args.lr,
                         warmup_steps=int(args.warmup_proportion * total),
                         max_grad_norm=args.max_grad_norm, gradient_accumulation_steps=k,
                         seed=args.seed, log_every=args.log_every,
                         eval_every=args.eval_every or steps_per_epoch, save_every=steps_per_epoch,
                         max_nonfinite_steps=args.max_nonfinite_steps, progress=args.progress,
                         desc="fine-tune")
    t0 = time.perf_counter()
    try:
        state, _ = train(model, opt, task, cfg, state, metrics_path=run.metrics,
                         checkpoint_path=run.checkpoint, comm=comm, device=device)
    except TrainingError as e:
        fail(str(e))
    if not leader:
        return 0
    seconds = time.perf_counter() - t0
    if not run.best_model.exists():  # e.g. --resume of a run whose best was lost
        task.evaluate(state.step)

    # ---- best model: test metrics, predictions, plots ---------------------------------
    best_pre = load_start(run.path)
    model, _ = build_classifier(best_pre, labels)
    model.to(device)
    summary = {"init": pre.source, "random_init": args.random_init, "labels": labels,
               "best_step": task.best["step"], "dev": None, "test": None, "steps": state.step,
               "epochs": args.epochs, "seconds_this_run": round(seconds, 1),
               "seconds_total": round(state.elapsed_s, 1), "max_seq_length": max_len}
    summary["dev"], dev_probs = evaluate(model, dev, args.eval_batch_size, 0, xp)
    write_predictions(run.path / "predictions_dev.tsv", dev, dev_probs, labels)
    if test is not None:
        summary["test"], test_probs = evaluate(model, test, args.eval_batch_size, 0, xp)
        write_predictions(run.path / "predictions_test.tsv", test, test_probs, labels)
        t = summary["test"]
        print(f"test (best step {task.best['step']}): accuracy {t['accuracy']:.4f} macro-F1 "
              f"{t['macro_f1']:.4f} MCC {t['mcc']:.4f} ({t['n']} examples)")
    from minibert.viz import plot_training_curves
    log = MetricsLog.read(run.metrics)
    real = sum(r.get("real_tokens", 0) for r in log if r["kind"] == "train")
    padded = sum(r.get("padded_tokens", 0) for r in log if r["kind"] == "train")
    summary["group_by_length"] = args.group_by_length
    summary["padding_fraction"] = round(1.0 - real / padded, 4) if padded else None
    plot_training_curves([r for r in log if r["kind"] == "train"],
                         [{k.removeprefix("dev_"): v for k, v in r.items()}
                          for r in log if r["kind"] == "eval"],
                         run.path / "training_curves.png", title=f"fine-tuning from {pre.source}")
    atomic_write_json(run.summary, summary)
    print(f"wrote {run.best_model} (best dev {args.metric} {task.best['metric']:.4f} at step "
          f"{task.best['step']}), predictions, training_curves.png, summary.json")
    finish(args, model, tokenizer, labels, pre.vocab_file, pre.tokenizer_options, xp, run.path)
    return 0


def finish(args, model, tokenizer, labels, vocab_file, tok_opts, xp, out: Path) -> None:
    """--predict, --plot-attention and --export-hf with a ready model."""
    max_len = min(args.max_seq_length, model.config.max_position_embeddings)
    if args.predict:
        probs = predict_text(model, tokenizer, labels, args.predict, max_len, xp)
        for label, p in sorted(probs.items(), key=lambda kv: -kv[1]):
            print(f"{label}\t{p:.4f}")
    if args.plot_attention:
        path = plot_attention(model, tokenizer, args.plot_attention, max_len, xp,
                              out / "attention.png")
        print(f"wrote {path}")
    if args.export_hf:
        try:
            d = save_hf_directory(model, args.export_hf, vocab_file,
                                  dict(enumerate(labels)), tok_opts)
        except (HFFormatError, OSError) as e:
            fail(f"--export-hf {args.export_hf}: {e}")
        print(f"wrote Hugging Face directory {d}")


if __name__ == "__main__":
    sys.exit(main())
