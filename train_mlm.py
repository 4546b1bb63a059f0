#!/usr/bin/env python
"""Pretrain a BERT with masked-LM + next-sentence prediction (Devlin et al. 2019).

    python train_mlm.py                     # tiny BERT on the embedded English corpus
    python train_mlm.py --preset mini --max-steps 20000 --device cuda
    python train_mlm.py --resume runs/pretrain      # continue from the last checkpoint
    python train_mlm.py --init-checkpoint runs/pretrain --corpus more.txt --output-dir runs/more
                                            # a new run (new schedule) from trained weights

Steps: learn a WordPiece vocab from the corpus (unless --vocab is given), tokenize the
corpus into a cached token store, hold out whole documents for evaluation, then train
with AdamW, warmup + linear decay and global-norm clipping. Writes to --output-dir:
vocab.txt, checkpoint.npz (atomically, every --save-every steps and at the end),
metrics.jsonl (one JSON object per line: "train" and "eval" records) and summary.json.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from minibert import backend
from minibert.checkpoint import (CheckpointError, atomic_copy, atomic_write, check_same_config,
                                 load_checkpoint, save_checkpoint)
from minibert.gradflow import grad_flow_record
from minibert.modeling import PRESETS, BertConfig, BertForPreTraining
from minibert.optim import AdamW, clip_grad_norm, linear_schedule_with_warmup
from minibert.pretraining import (CorpusError, VocabInfo, build_or_load_store, iter_documents,
                                  iterate_batches, make_eval_batches, resolve_corpus_files,
                                  split_documents, token_counts, unigram_cross_entropy)
from minibert.tokenization import BertTokenizer, train_wordpiece

DEFAULT_CORPUS = Path(__file__).resolve().parent / "data" / "pretrain" / "en"

# Arguments that must match between a checkpoint's run and a resumed run: they decide the
# data stream and the schedule, so changing them would not continue the same curve.
RESUME_FIXED = ("corpus", "vocab", "vocab_size", "vocab_algorithm", "lowercase", "seed", "max_seq_length",
                "batch_size", "masking", "dupe_factor", "short_seq_prob", "masked_lm_prob",
                "max_predictions_per_seq", "whole_word_mask", "eval_fraction", "max_steps",
                "lr", "warmup_steps", "weight_decay", "correct_bias", "max_grad_norm",
                "label_smoothing", "dtype", "init_checkpoint")


def parse_args(argv=None) -> argparse.Namespace:
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
    g.add_argument("--vocab-size", type=int, default=8192, help="size of a learned vocab")
    g.add_argument("--vocab-algorithm", default=None,
                   help="merge criterion of the vocab trainer (see python -m "
                        "minibert.tokenization train --help); default: the trainer's")
    g.add_argument("--no-lowercase", dest="lowercase", action="store_false",
                   help="keep case (lower-casing and accent stripping are on by default)")
    g.add_argument("--max-seq-length", type=int, default=32,
                   help="tokens per sequence (short sequences make a tiny model learn to use "
                        "context sooner on a small corpus; BERT used 128, then 512)")
    g.add_argument("--masked-lm-prob", type=float, default=0.15, help="share of tokens masked")
    g.add_argument("--max-predictions-per-seq", type=int, default=20,
                   help="cap on masked positions per sequence")
    g.add_argument("--short-seq-prob", type=float, default=0.1,
                   help="probability of a shorter target length (as google-research/bert)")
    g.add_argument("--masking", choices=["dynamic", "static"], default="dynamic",
                   help="fresh masks every epoch, or dupe_factor fixed versions as the reference")
    g.add_argument("--dupe-factor", type=int, default=10,
                   help="distinct pairings (and static maskings) of the corpus before repeating")
    g.add_argument("--whole-word-mask", action="store_true",
                   help="mask all WordPiece pieces of a chosen word together")
    g.add_argument("--eval-fraction", type=float, default=0.02,
                   help="share of documents held out for evaluation")
    g.add_argument("--eval-instances", type=int, default=1024,
                   help="held-out sequences evaluated each time")

    g = p.add_argument_group("model")
    g.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help=f"model size (Turc et al. 2019 sizes): {presets}")
    g.add_argument("--num-hidden-layers", type=int, help="override the preset's layers")
    g.add_argument("--hidden-size", type=int, help="override the preset's hidden size")
    g.add_argument("--num-attention-heads", type=int, help="override the preset's heads")
    g.add_argument("--intermediate-size", type=int, help="override the feed-forward width")
    g.add_argument("--hidden-act", choices=["gelu", "gelu_new", "relu"], default="gelu",
                   help="feed-forward activation (gelu = exact erf form)")
    g.add_argument("--hidden-dropout-prob", type=float, default=0.1, help="dropout")
    g.add_argument("--attention-probs-dropout-prob", type=float, default=0.1,
                   help="dropout on attention probabilities")
    g.add_argument("--max-position-embeddings", type=int, default=512,
                   help="longest sequence the model can take")
    g.add_argument("--position-embedding-type", choices=["absolute", "sinusoidal"],
                   default="absolute", help="learned (BERT) or fixed sinusoidal positions")
    g.add_argument("--norm-position", choices=["post", "pre"], default="post",
                   help="LayerNorm after the residual sum (BERT) or before each sub-layer")

    g = p.add_argument_group("training")
    g.add_argument("--max-steps", type=int, default=3000, help="optimizer steps")
    g.add_argument("--batch-size", type=int, default=128, help="sequences per step")
    g.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    g.add_argument("--warmup-steps", type=int, default=None,
                   help="linear warmup steps (default: 10%% of --max-steps)")
    g.add_argument("--weight-decay", type=float, default=0.01,
                   help="decoupled weight decay (not on LayerNorm and biases)")
    g.add_argument("--no-correct-bias", dest="correct_bias", action="store_false",
                   help="Adam without bias correction, as BERT's optimizer; over the first "
                        "~1000 steps that acts as a several times larger learning rate")
    g.add_argument("--max-grad-norm", type=float, default=1.0, help="global-norm clipping")
    g.add_argument("--label-smoothing", type=float, default=0.0, help="MLM label smoothing")
    g.add_argument("--seed", type=int, default=0, help="seed of weights, data and dropout")
    g.add_argument("--device", choices=list(backend.DEVICES), default=None,
                   help="cpu (NumPy) or cuda (CuPy); default: $MINIBERT_DEVICE or cpu")
    g.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="parameter and activation dtype")

    g = p.add_argument_group("output")
    g.add_argument("--output-dir", default="runs/pretrain", help="where everything is written")
    g.add_argument("--init-checkpoint", default=None, metavar="DIR_OR_FILE",
                   help="start from the weights (and config and vocab) of this train_mlm.py "
                        "run or checkpoint, with a fresh optimizer and schedule "
                        "(google-research/bert's init_checkpoint); architecture options "
                        "are then taken from it")
    g.add_argument("--resume", nargs="?", const="", default=None, metavar="DIR_OR_FILE",
                   help="continue from a checkpoint (default: OUTPUT_DIR/checkpoint.npz)")
    g.add_argument("--log-every", type=int, default=10, help="steps between train records")
    g.add_argument("--log-grad-norms", type=int, default=0, metavar="N",
                   help="every N steps, record per-layer gradient norms and update/weight "
                        "ratios in metrics.jsonl (type grad_flow; plot: python -m "
                        "minibert.gradflow); 0 = off")
    g.add_argument("--eval-every", type=int, default=250, help="steps between evaluations")
    g.add_argument("--save-every", type=int, default=250, help="steps between checkpoints")
    g.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars")
    args = p.parse_args(argv)
    if args.warmup_steps is None:
        args.warmup_steps = max(1, args.max_steps // 10)
    return args


def fail(message: str) -> None:
    print(f"train_mlm.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def build_config(args, vocab_size: int) -> BertConfig:
    overrides = {k: getattr(args, k) for k in ("num_hidden_layers", "hidden_size",
                 "num_attention_heads", "intermediate_size") if getattr(args, k) is not None}
    if "hidden_size" in overrides:
        overrides.setdefault("num_attention_heads", max(1, overrides["hidden_size"] // 64))
        overrides.setdefault("intermediate_size", 4 * overrides["hidden_size"])
    config = BertConfig.from_preset(
        args.preset, vocab_size=vocab_size, hidden_act=args.hidden_act,
        hidden_dropout_prob=args.hidden_dropout_prob,
        attention_probs_dropout_prob=args.attention_probs_dropout_prob,
        max_position_embeddings=args.max_position_embeddings,
        position_embedding_type=args.position_embedding_type,
        norm_position=args.norm_position, **overrides)
    return config


def get_tokenizer(args, out: Path, files) -> BertTokenizer:
    """The given vocab (copied into the run directory, so the run is self-contained for
    finetune.py), the run's own vocab.txt (on resume), or a newly learned one."""
    vocab_path = Path(args.vocab) if args.vocab else out / "vocab.txt"
    if args.vocab and vocab_path.is_file():
        atomic_copy(vocab_path, out / "vocab.txt")
    if not args.vocab and not vocab_path.exists():
        # read the corpus once first: bad bytes, an empty corpus or a single document are
        # reported with file and line before any time goes into learning a vocab
        documents = sum(1 for _ in iter_documents(files))
        where = ", ".join(map(str, files))
        if documents == 0:
            raise CorpusError(f"{where}: the corpus is empty (no non-blank line)")
        if documents < 2:
            raise CorpusError(f"{where}: one document only; NSP needs at least 2 "
                              "(separate documents with a blank line)")
        print(f"learning a {args.vocab_size}-token WordPiece vocab from "
              f"{', '.join(str(f) for f in files)}")
        t0 = time.time()
        algorithm = {"algorithm": args.vocab_algorithm} if args.vocab_algorithm else {}
        train_wordpiece([str(f) for f in files], vocab_size=args.vocab_size,
                        lowercase=args.lowercase, output=str(vocab_path),
                        show_progress=args.progress, **algorithm)
        print(f"vocab written to {vocab_path} in {time.time() - t0:.1f} s")
    return BertTokenizer(str(vocab_path), do_lower_case=args.lowercase)


def to_device(batch, xp):
    return {k: xp.asarray(getattr(batch, k)) for k in
            ("input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label")}


def batch_stats(out, inputs, xp) -> dict:
    """Sums for the metrics of one batch, on the device: loss * count, correct counts."""
    labels = inputs["labels"][out.mlm_positions]
    nsp = inputs["next_sentence_label"]
    return {
        "mlm_loss_sum": out.mlm_loss * labels.shape[0],
        "mlm_correct": (out.prediction_logits.argmax(-1) == labels).sum(),
        "mlm_count": labels.shape[0],
        "nsp_loss_sum": out.nsp_loss * nsp.shape[0],
        "nsp_correct": (out.seq_relationship_logits.argmax(-1) == nsp).sum(),
        "nsp_count": nsp.shape[0],
    }


def summarize(sums: list[dict]) -> dict:
    """Host floats from per-batch sums: mean losses (nats) and accuracies."""
    tot = {k: sum(float(s[k]) for s in sums) for k in sums[0]}
    return {"mlm_loss": tot["mlm_loss_sum"] / max(tot["mlm_count"], 1),
            "mlm_acc": tot["mlm_correct"] / max(tot["mlm_count"], 1),
            "nsp_loss": tot["nsp_loss_sum"] / max(tot["nsp_count"], 1),
            "nsp_acc": tot["nsp_correct"] / max(tot["nsp_count"], 1)}


def evaluate(model, eval_batches, xp) -> dict:
    model.eval()
    sums = []
    for b in eval_batches:
        inputs = to_device(b, xp)
        out = model(**inputs)
        sums.append(batch_stats(out, inputs, xp))
    model.train()
    return summarize(sums)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        device = backend.set_device(args.device)
    except backend.BackendError as e:
        fail(str(e))
    xp = backend.xp_for(device)
    out = Path(args.output_dir)
    ckpt_path = out / "checkpoint.npz"
    init_state = None
    if args.init_checkpoint:
        src = Path(args.init_checkpoint)
        src = src / "checkpoint.npz" if src.is_dir() else src
        beside = src.parent / "vocab.txt"
        if args.resume is None and src.parent.resolve() == out.resolve():
            fail(f"--init-checkpoint {src} is in the output directory {out}; this new run "
                 "would overwrite it: pass another --output-dir")
        if args.vocab is None:
            if not beside.is_file():
                fail(f"--init-checkpoint {src}: no vocab.txt beside it; pass --vocab")
            args.vocab = str(beside)
        elif beside.is_file() and Path(args.vocab).is_file() and \
                Path(args.vocab).read_bytes() != beside.read_bytes():
            fail(f"--vocab {args.vocab} differs from {beside}, the vocab the weights of "
                 f"{src} were trained with")
        if args.resume is None:  # on resume the weights come from the resumed checkpoint
            try:
                init_state = load_checkpoint(src)
            except CheckpointError as e:
                fail(f"--init-checkpoint: {e}")
            saved = init_state["trainer"].get("args", {})
            if "lowercase" in saved and saved["lowercase"] != args.lowercase:
                fail(f"--init-checkpoint {src} was trained with lowercase={saved['lowercase']}"
                     f"; this run has lowercase={args.lowercase} (add or drop --no-lowercase)")
    resume_state = None
    if args.resume is not None:
        src = Path(args.resume) if args.resume else ckpt_path
        src = src / "checkpoint.npz" if src.is_dir() else src
        try:
            resume_state = load_checkpoint(src)
        except CheckpointError as e:
            fail(str(e))
        saved_args = resume_state["trainer"].get("args", {})
        diffs = [f"--{k.replace('_', '-')}: checkpoint {saved_args.get(k)!r}, now {getattr(args, k)!r}"
                 for k in RESUME_FIXED if k in saved_args and saved_args[k] != getattr(args, k)]
        if diffs:
            fail(f"cannot resume from {src}: the run's settings differ: " + "; ".join(diffs))
        ckpt_path = src
        out = src.parent
    out.mkdir(parents=True, exist_ok=True)

    try:
        files = resolve_corpus_files(args.corpus)
        tokenizer = get_tokenizer(args, out, files)
        store = build_or_load_store(files, tokenizer, cache_dir=out / "cache",
                                    show_progress=args.progress)
        train_store, eval_store = split_documents(store, eval_fraction=args.eval_fraction,
                                                  seed=args.seed)
        if args.init_checkpoint:  # the architecture of the run started from (or resumed)
            config = (resume_state or init_state)["config"]
            if config.vocab_size != len(tokenizer):
                raise ValueError(f"--init-checkpoint {args.init_checkpoint}: its vocab_size is "
                                 f"{config.vocab_size}, the vocab has {len(tokenizer)} tokens")
        else:
            config = build_config(args, len(tokenizer))
        if args.max_seq_length > config.max_position_embeddings:
            raise ValueError(f"--max-seq-length {args.max_seq_length} exceeds "
                             f"max_position_embeddings {config.max_position_embeddings}")
    except (CorpusError, ValueError, OSError) as e:
        fail(str(e))
    single = float(np.mean(train_store.sentences_per_document() == 1))  # >= 2 documents
    if single > 0.5:
        # google-research/bert pairs a one-sentence chunk only with a random B, so such
        # documents give NSP nothing but "random next" examples.
        print(f"warning: {single:.0%} of the {train_store.num_documents} training documents "
              "hold a single sentence, so their NSP pairs are always random and NSP is nearly "
              "a constant task; the corpus format is one sentence per line with a blank line "
              "between documents, not between sentences", file=sys.stderr)
    vocab = VocabInfo.from_tokenizer(tokenizer)
    dtype = np.dtype(args.dtype)

    model = BertForPreTraining(config, seed=args.seed, dtype=dtype,
                               label_smoothing=args.label_smoothing)
    step, epoch, batch_in_epoch = 0, 0, 0
    if init_state is not None:
        try:
            model.load_state_dict(init_state["model"])
        except (KeyError, ValueError) as e:
            fail(f"--init-checkpoint {args.init_checkpoint}: {e}")
        print(f"weights from {args.init_checkpoint}")
        init_state = None  # the weights are in the model now
    if resume_state is not None:
        try:
            check_same_config(resume_state["config"], config, str(ckpt_path))
            model.load_state_dict(resume_state["model"])
        except (CheckpointError, KeyError, ValueError) as e:
            fail(str(e))
    model.to(device)
    optimizer = AdamW(model.named_parameters(), lr=args.lr, weight_decay=args.weight_decay,
                      correct_bias=args.correct_bias)
    if resume_state is not None:
        try:
            optimizer.load_state_dict(resume_state["optim"])
        except (KeyError, ValueError) as e:
            fail(f"checkpoint {ckpt_path}: {e}")
        t = resume_state["trainer"]
        step, epoch, batch_in_epoch = t["step"], t["epoch"], t["batch_in_epoch"]
        print(f"resuming from {ckpt_path} at step {step} (epoch {epoch}, batch {batch_in_epoch})")
    atomic_write(out / "config.json", lambda f: f.write(config.to_json().encode()))

    data_kw = dict(masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
                   max_predictions_per_seq=args.max_predictions_per_seq,
                   whole_word_mask=args.whole_word_mask)
    eval_batches = make_eval_batches(eval_store, vocab, args.batch_size, args.max_seq_length,
                                     seed=args.seed + 1, max_instances=args.eval_instances,
                                     **data_kw)
    baseline = nsp_majority = None
    if eval_batches:  # none when --eval-fraction is 0
        counts = token_counts(train_store, config.vocab_size)
        baseline = unigram_cross_entropy(counts, [b.labels for b in eval_batches])
        # A reference point for NSP accuracy: always guessing the commoner label. At short
        # max_seq_length most chunks hold one segment, which the reference always pairs
        # with a random B.
        random_share = float(np.concatenate([b.next_sentence_label for b in eval_batches]).mean())
        nsp_majority = max(random_share, 1.0 - random_share)
    arch = f"config of {args.init_checkpoint}" if args.init_checkpoint else f"{args.preset} preset"
    print(f"model: {arch}, {model.num_parameters():,} parameters, vocab "
          f"{config.vocab_size}; train documents {train_store.num_documents}, tokens "
          f"{train_store.num_tokens:,}; held-out documents {eval_store.num_documents}, "
          f"{sum(len(b.input_ids) for b in eval_batches)} sequences"
          + (f"; unigram baseline {baseline:.3f} nats, NSP majority label "
             f"{nsp_majority:.3f}" if eval_batches else ""))

    # metrics.jsonl: keep the records up to the resumed step, so the file is one curve.
    metrics_path = out / "metrics.jsonl"
    kept = []
    if resume_state is not None and metrics_path.exists():
        kept = [line for line in metrics_path.read_text().splitlines()
                if line and json.loads(line)["step"] <= step]
    atomic_write(metrics_path, lambda f: f.write("".join(l + "\n" for l in kept).encode()))
    metrics_file = metrics_path.open("a")

    def log(record: dict) -> None:
        metrics_file.write(json.dumps(record) + "\n")
        metrics_file.flush()

    def trainer_state() -> dict:
        return {"step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch,
                "args": {k: getattr(args, k) for k in RESUME_FIXED}}

    bar = tqdm(total=args.max_steps, initial=step, disable=not args.progress, desc="pretrain",
               dynamic_ncols=True)
    window, grad_norms, tokens, t_window = [], [], 0, time.perf_counter()
    t_start = time.perf_counter()
    last_eval = None
    model.train()
    while step < args.max_steps:
        batches = iterate_batches(train_store, vocab, args.batch_size, args.max_seq_length,
                                  epoch=epoch, seed=args.seed, start_batch=batch_in_epoch,
                                  masking=args.masking, dupe_factor=args.dupe_factor, **data_kw)
        for batch in batches:
            lr = linear_schedule_with_warmup(step, args.lr, args.warmup_steps, args.max_steps)
            model.set_dropout_rng(backend.make_rng(backend.derive_seed(args.seed, step), device))
            inputs = to_device(batch, xp)
            model.zero_grad()
            outputs = model(**inputs)
            loss = float(outputs.loss)
            if not math.isfinite(loss):
                bar.close()
                fail(f"loss is {loss} at step {step}: stopping; the last good checkpoint "
                     f"({ckpt_path if ckpt_path.exists() else 'none written yet'}) is kept")
            model.backward()
            grad_norm = clip_grad_norm(model.parameters(), args.max_grad_norm)
            optimizer.step(lr)
            if args.log_grad_norms and (step + 1) % args.log_grad_norms == 0:
                log(grad_flow_record(step + 1, model, optimizer, lr, grad_norm))
            step += 1
            batch_in_epoch += 1
            window.append(batch_stats(outputs, inputs, xp))
            grad_norms.append(grad_norm)
            tokens += int(batch.attention_mask.sum())
            if step % args.log_every == 0 or step == args.max_steps:
                now = time.perf_counter()
                m = summarize(window)
                rec = {"type": "train", "step": step, "epoch": epoch, "lr": lr,
                       "loss": m["mlm_loss"] + m["nsp_loss"], **m,
                       "grad_norm": sum(float(g) for g in grad_norms) / len(grad_norms),
                       "tokens_per_s": tokens / (now - t_window),
                       "elapsed_s": now - t_start}
                log(rec)
                bar.set_postfix(loss=f"{rec['loss']:.3f}", mlm_acc=f"{m['mlm_acc']:.3f}",
                                nsp_acc=f"{m['nsp_acc']:.3f}", lr=f"{lr:.2e}",
                                tok_s=f"{rec['tokens_per_s']:.0f}")
                window, grad_norms, tokens, t_window = [], [], 0, now
            bar.update(1)
            if eval_batches and (step % args.eval_every == 0 or step == args.max_steps):
                last_eval = evaluate(model, eval_batches, xp)
                log({"type": "eval", "step": step, **last_eval, "unigram_baseline": baseline,
                     "nsp_majority": nsp_majority})
                bar.write(f"step {step}: held-out mlm_loss {last_eval['mlm_loss']:.3f} "
                          f"(unigram {baseline:.3f}) mlm_acc {last_eval['mlm_acc']:.3f} "
                          f"nsp_acc {last_eval['nsp_acc']:.3f} (majority {nsp_majority:.3f})")
            if step % args.save_every == 0 or step == args.max_steps:
                save_checkpoint(ckpt_path, model, optimizer, trainer_state())
            if step >= args.max_steps:
                break
        else:
            epoch, batch_in_epoch = epoch + 1, 0
    bar.close()
    metrics_file.close()

    summary = {"steps": step, "epochs_started": epoch + 1,
               "seconds_this_run": round(time.perf_counter() - t_start, 1),
               "parameters": model.num_parameters(), "vocab_size": config.vocab_size,
               "unigram_baseline": baseline, "nsp_majority": nsp_majority, **{"eval_" + k: v for k, v in (last_eval or {}).items()},
               "checkpoint": str(ckpt_path)}
    atomic_write(out / "summary.json", lambda f: f.write(json.dumps(summary, indent=2).encode()))
    print("summary: " + json.dumps(summary, indent=2))
    if last_eval:
        print(f"held-out MLM loss {last_eval['mlm_loss']:.3f} nats vs unigram baseline "
              f"{baseline:.3f} ({baseline - last_eval['mlm_loss']:+.3f} better); "
              f"NSP accuracy {last_eval['nsp_acc']:.3f} vs {nsp_majority:.3f} by always "
              f"guessing the commoner label")
    return 0


if __name__ == "__main__":
    sys.exit(main())
