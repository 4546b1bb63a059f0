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
Training: AdamW with warmup and linear decay, global-norm clipping, dynamic padding per
batch; dev metrics (accuracy, macro-F1, Matthews correlation) after every epoch; the best
dev model is kept in OUTPUT_DIR/checkpoint.npz (atomic writes); then test metrics and
predictions. Writes to --output-dir: checkpoint.npz, vocab.txt, labels.json, config.json,
metrics.jsonl, summary.json, predictions_{dev,test}.tsv, training_curves.png.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from minibert import backend
from minibert.backend import to_numpy
from minibert.checkpoint import CheckpointError, atomic_write
from minibert.finetuning import (DatasetError, build_classifier, encode_split, evaluate,
                                 iterate_batches, label_list, load_pretrained, read_tsv,
                                 save_finetuned, softmax_np)
from minibert.hf import HFFormatError, save_hf_directory
from minibert.optim import AdamW, clip_grad_norm, linear_schedule_with_warmup
from minibert.tokenization import BertTokenizer

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "classify" / "en" / "movie_reviews"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data", default=str(DEFAULT_DATA),
                   help="directory with train.tsv, dev.tsv and test.tsv")
    g.add_argument("--train", help="train TSV (overrides DATA/train.tsv)")
    g.add_argument("--dev", help="dev TSV (overrides DATA/dev.tsv)")
    g.add_argument("--test", help="test TSV (overrides DATA/test.tsv); 'none' to skip")
    g.add_argument("--max-seq-length", type=int, default=128,
                   help="tokens per sequence, [CLS]/[SEP] included (longest-first truncation)")
    g = p.add_argument_group("model")
    g.add_argument("--init", default="runs/pretrain",
                   help="train_mlm.py run dir / checkpoint .npz, finetune.py output dir, or "
                        "Hugging Face BERT dir")
    g.add_argument("--random-init", action="store_true",
                   help="take only the architecture and vocab from --init; fresh weights")
    g.add_argument("--classifier-dropout", type=float, default=None,
                   help="dropout before the classifier (default: the model's hidden dropout)")
    g.add_argument("--model", default=None,
                   help="a finetune.py output dir to use for --predict / --plot-attention / "
                        "--export-hf without training")
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=int, default=3, help="passes over the train split")
    g.add_argument("--max-steps", type=int, default=None,
                   help="stop after this many optimizer steps (default: all epochs)")
    g.add_argument("--max-train-examples", type=int, default=None,
                   help="use only the first N train rows (quick runs)")
    g.add_argument("--batch-size", type=int, default=32, help="sequences per step")
    g.add_argument("--eval-batch-size", type=int, default=64, help="sequences per eval batch")
    g.add_argument("--lr", type=float, default=5e-5, help="peak learning rate")
    g.add_argument("--warmup-proportion", type=float, default=0.1,
                   help="share of the steps with linear warmup")
    g.add_argument("--weight-decay", type=float, default=0.01, help="decoupled weight decay")
    g.add_argument("--adam-eps", type=float, default=1e-6, help="AdamW epsilon")
    g.add_argument("--no-correct-bias", dest="correct_bias", action="store_false",
                   help="BERT's AdamW without bias correction (default: bias-corrected, as "
                        "torch.optim.AdamW)")
    g.add_argument("--max-grad-norm", type=float, default=1.0, help="global-norm clipping")
    g.add_argument("--metric", choices=["accuracy", "macro_f1", "mcc"], default="accuracy",
                   help="dev metric that picks the best checkpoint")
    g.add_argument("--eval-every", type=int, default=None,
                   help="also evaluate on dev every N steps (default: once per epoch)")
    g.add_argument("--seed", type=int, default=0, help="seed of head init, shuffling, dropout")
    g.add_argument("--device", choices=list(backend.DEVICES), default=None,
                   help="cpu or cuda (default: $MINIBERT_DEVICE or cpu)")
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", default="runs/finetune", help="where everything is written")
    g.add_argument("--log-every", type=int, default=10, help="steps between train records")
    g.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars")
    g.add_argument("--predict", nargs="+", metavar="TEXT",
                   help="print each label's probability for TEXT (or a pair TEXT_A TEXT_B)")
    g.add_argument("--plot-attention", nargs="+", metavar="TEXT",
                   help="write OUTPUT_DIR/attention.png: layers x heads maps for TEXT [TEXT_B]")
    g.add_argument("--export-hf", metavar="DIR",
                   help="also write the best model as a Hugging Face directory")
    args = p.parse_args(argv)
    for name in ("predict", "plot_attention"):
        if getattr(args, name) and len(getattr(args, name)) > 2:
            p.error(f"--{name.replace('_', '-')} takes one text or a pair of texts")
    return args


def fail(message: str) -> None:
    print(f"finetune.py: error: {message}", file=sys.stderr)
    sys.exit(2)


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
    atomic_write(path, lambda f: f.write(data))


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


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        device = backend.set_device(args.device)
    except backend.BackendError as e:
        fail(str(e))
    xp = backend.xp_for(device)
    out = Path(args.output_dir)

    # ---- use an already fine-tuned model, no training ---------------------------------
    if args.model:
        try:
            pre = load_pretrained(args.model)
        except (FileNotFoundError, CheckpointError, HFFormatError) as e:
            fail(str(e))
        if not pre.labels:
            fail(f"--model {args.model}: not a fine-tuned classifier (no label set saved)")
        model, _ = build_classifier(pre, pre.labels)
        model.to(device)
        tokenizer = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
        finish(args, model, tokenizer, pre.labels, pre.vocab_file, pre.tokenizer_options, xp,
               out if args.output_dir != "runs/finetune" else Path(args.model))
        return 0

    # ---- data and starting point -----------------------------------------------------
    paths = split_paths(args)
    try:
        pre = load_pretrained(args.init)
    except (FileNotFoundError, CheckpointError, HFFormatError) as e:
        msg = str(e)
        if args.init == "runs/pretrain" and not Path(args.init).exists():
            msg += (" (the default --init is the output of `python train_mlm.py`; run that "
                    "first, or pass --init DIR)")
        fail(msg)
    tokenizer = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    try:
        train_ex = read_tsv(paths["train"])
        if args.max_train_examples:
            train_ex = train_ex[:args.max_train_examples]
        labels = label_list(train_ex)
        dev_ex = read_tsv(paths["dev"])
        test_ex = read_tsv(paths["test"]) if paths["test"] is not None else None
        max_len = min(args.max_seq_length, pre.config.max_position_embeddings)
        train = encode_split(tokenizer, train_ex, max_len, labels)
        dev = encode_split(tokenizer, dev_ex, max_len, labels)
        test = encode_split(tokenizer, test_ex, max_len, labels) if test_ex else None
    except (DatasetError, ValueError) as e:
        fail(str(e))
    if len(labels) < 2:
        fail(f"{paths['train']}: the train split has a single label {labels}; "
             "classification needs at least two")
    try:
        model, report = build_classifier(pre, labels, seed=args.seed,
                                         random_init=args.random_init,
                                         classifier_dropout=args.classifier_dropout)
    except HFFormatError as e:
        fail(str(e))
    model.to(device)
    model.set_dropout_rng(xp.random.default_rng(args.seed))
    fresh = "all weights new (architecture only, random init)" if args.random_init \
        else f"new: {report['new']}"
    print(f"model: {pre.source}, {model.num_parameters():,} parameters; {fresh}; labels {labels}; "
          f"train {len(train)}, dev {len(dev)}, test {len(test) if test else 0} examples; "
          f"max_seq_length {max_len}")

    # ---- training -------------------------------------------------------------------
    steps_per_epoch = -(-len(train) // args.batch_size)
    total = steps_per_epoch * args.epochs
    if args.max_steps:
        total = min(total, args.max_steps)
    warmup = int(args.warmup_proportion * total)
    opt = AdamW(model.named_parameters(), lr=args.lr, eps=args.adam_eps,
                weight_decay=args.weight_decay, correct_bias=args.correct_bias)
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    metrics_path.write_text("")
    train_log, eval_log = [], []
    best, best_step = -np.inf, None
    rng = np.random.default_rng(args.seed)
    pad_id = tokenizer.pad_token_id
    args_record = {k: v for k, v in vars(args).items()}

    def log(record):
        with metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def run_eval(step, epoch):
        nonlocal best, best_step
        m, _ = evaluate(model, dev, args.eval_batch_size, pad_id, xp)
        rec = dict(kind="eval", step=step, epoch=epoch, **m)
        eval_log.append(rec)
        log(rec)
        better = m[args.metric] > best
        if better:
            best, best_step = m[args.metric], step
            save_finetuned(out, model, labels, pre.vocab_file, pre.tokenizer_options,
                           {"step": step, "epoch": epoch, "dev": m, "args": args_record,
                            "init": pre.source})
        tqdm.write(f"step {step} epoch {epoch}: dev loss {m['loss']:.4f} accuracy "
                   f"{m['accuracy']:.4f} macro-F1 {m['macro_f1']:.4f} MCC {m['mcc']:.4f}"
                   f"{'  (best, saved)' if better else ''}")

    step, t_start = 0, time.perf_counter()
    epoch_seconds = []
    model.train()
    for epoch in range(args.epochs):
        if step >= total:
            break
        t0 = time.perf_counter()
        bar = tqdm(total=min(steps_per_epoch, total - step), desc=f"epoch {epoch + 1}",
                   disable=not args.progress, leave=False)
        loss_sum, n_sum = 0.0, 0
        for batch in iterate_batches(train, args.batch_size, rng, pad_id):
            if step >= total:
                break
            d = batch.to(xp)
            o = model(d.input_ids, d.token_type_ids, d.attention_mask, labels=d.labels)
            model.zero_grad()
            model.backward()
            if args.max_grad_norm:
                clip_grad_norm(model.parameters(), args.max_grad_norm)
            opt.step(lr=linear_schedule_with_warmup(step, args.lr, warmup, total))
            step += 1
            loss_sum = loss_sum + o.loss  # stays on the device; read back when logged
            n_sum += 1
            bar.update(1)
            if step % args.log_every == 0 or step == total:
                rec = dict(kind="train", step=step, epoch=epoch, loss=float(loss_sum) / n_sum,
                           lr=linear_schedule_with_warmup(step, args.lr, warmup, total),
                           seconds=time.perf_counter() - t_start)
                train_log.append(rec)
                log(rec)
                bar.set_postfix(loss=f"{rec['loss']:.4f}")
                loss_sum, n_sum = 0.0, 0
            if args.eval_every and step % args.eval_every == 0 and step < total:
                run_eval(step, epoch)
        bar.close()
        epoch_seconds.append(time.perf_counter() - t0)
        tqdm.write(f"epoch {epoch + 1}: {epoch_seconds[-1]:.1f} s of training")
        run_eval(step, epoch)

    # ---- best model: test metrics, predictions, plots ---------------------------------
    best_pre = load_pretrained(out)
    model, _ = build_classifier(best_pre, labels)
    model.to(device)
    summary = {"init": pre.source, "random_init": args.random_init, "labels": labels,
               "best_step": best_step, "dev": None, "test": None, "steps": step,
               "train_seconds_per_epoch": epoch_seconds, "max_seq_length": max_len}
    summary["dev"], dev_probs = evaluate(model, dev, args.eval_batch_size, pad_id, xp)
    write_predictions(out / "predictions_dev.tsv", dev, dev_probs, labels)
    if test is not None:
        summary["test"], test_probs = evaluate(model, test, args.eval_batch_size, pad_id, xp)
        write_predictions(out / "predictions_test.tsv", test, test_probs, labels)
        t = summary["test"]
        print(f"test ({best_step=}): accuracy {t['accuracy']:.4f} macro-F1 "
              f"{t['macro_f1']:.4f} MCC {t['mcc']:.4f} ({t['n']} examples)")
    from minibert.viz import plot_training_curves
    plot_training_curves(train_log, eval_log, out / "training_curves.png",
                         title=f"fine-tuning from {pre.source}")
    atomic_write(out / "summary.json",
                 lambda f: f.write(json.dumps(summary, indent=2).encode("utf-8")))
    print(f"wrote {out}/checkpoint.npz (best dev {args.metric} {best:.4f} at step "
          f"{best_step}), predictions, training_curves.png, summary.json")
    finish(args, model, tokenizer, labels, pre.vocab_file, pre.tokenizer_options, xp, out)
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
        except HFFormatError as e:
            fail(str(e))
        print(f"wrote Hugging Face directory {d}")


if __name__ == "__main__":
    sys.exit(main())
