"""Benchmark: our WordPiece trainer and BertTokenizer against Hugging Face, in one run.

Usage::

    python bench/bench_tokenizer.py [--data ../shared/data] [--vocab-size 30000] [--min-frequency 2]

What it measures, all on the same text in the same run:

1. Trainer: wall time and peak memory to learn a ``--vocab-size`` vocabulary from the
   English pretraining text (``pretrain/en/*.txt``, first 90% of the documents of each
   file), for ``minibert.tokenization.train_wordpiece`` with each merge score
   (``wordpiece`` = likelihood gain, ``wordpiece-ratio``, ``bpe``) and for Hugging Face ``tokenizers``' ``WordPieceTrainer`` (Rust, all cores).
   Each trainer runs in a fresh child process; peak memory is that process's peak RSS
   minus its RSS after imports.
2. Quality: tokens per whitespace word (and the [UNK] share) on the held-out last 10% of
   documents of each file, every vocabulary applied by the same tokenizer.
3. Encoding: tokens/s of ``BertTokenizer.encode`` per line for ours, transformers' Python
   ``BertTokenizer`` (``BertTokenizerLegacy`` in transformers 5) and ``BertTokenizerFast``
   (per line and as one batch), same lines, bert-base-uncased vocab; the ids of all of
   them are compared and any difference is reported. Ours starts with an empty cache.

transformers / tokenizers are used only here and in tests, never in minibert/.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _rss_mb() -> float:
    """Current resident set size in MiB (Linux /proc), else peak."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(kind: str, train_file: str, out_file: str, vocab_size: int, min_frequency: int) -> None:
    """Run one trainer; print a JSON line with seconds and memory."""
    if kind.startswith("ours"):
        from minibert.tokenization import train_wordpiece

        base = _rss_mb()
        t0 = time.perf_counter()
        train_wordpiece(
            [train_file], vocab_size, min_frequency=min_frequency, algorithm=kind.split("-", 1)[1],
            output=out_file, show_progress=False,
        )
        dt = time.perf_counter() - t0
    else:
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

        base = _rss_mb()
        t0 = time.perf_counter()
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True, clean_text=True, handle_chinese_chars=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIALS, show_progress=False
        )
        tok.train([train_file], trainer)
        vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
        Path(out_file).write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
        dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": dt, "peak_mb": peak - base}))


def _run_child(kind, train_file, out_file, vocab_size, min_frequency) -> dict:
    cmd = [sys.executable, __file__, "--_child", kind, train_file, out_file, str(vocab_size), str(min_frequency)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{kind} trainer failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def split_documents(path: Path, held_out: float = 0.1) -> tuple[list[str], list[str]]:
    """-> (train lines, held-out lines): the last ``held_out`` share of the documents is held out."""
    docs = path.read_text(encoding="utf-8").split("\n\n")
    docs = [d for d in docs if d.strip()]
    n_test = max(1, round(len(docs) * held_out))
    train, test = docs[:-n_test], docs[-n_test:]
    return "\n\n".join(train).split("\n"), "\n\n".join(test).split("\n")


def tokens_per_word(vocab_file: str, lines: list[str]) -> tuple[float, float]:
    from minibert.tokenization import BertTokenizer

    tok = BertTokenizer(vocab_file)
    n_tok = n_word = n_unk = 0
    unk = tok.unk_token_id
    for line in lines:
        ids = tok.text_to_ids(line)
        n_tok += len(ids)
        n_unk += ids.count(unk)
        n_word += len(line.split())
    return n_tok / n_word, n_unk / max(n_tok, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="the shared data folder")
    ap.add_argument("--vocab-size", type=int, default=30000)
    ap.add_argument("--min-frequency", type=int, default=2)
    ap.add_argument("--_child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        kind, train_file, out_file, vs, mf = args._child
        _child(kind, train_file, out_file, int(vs), int(mf))
        return

    import platform

    import tokenizers
    import transformers

    data = Path(args.data)
    en = sorted((data / "pretrain" / "en").glob("*.txt"))
    if not en:
        sys.exit(f"no English pretraining text under {data / 'pretrain' / 'en'}")
    train_lines, test_lines = [], []
    for p in en:
        tr, te = split_documents(p)
        train_lines += tr + [""]
        test_lines += [l for l in te if l.strip()]
    print(f"python {platform.python_version()}, transformers {transformers.__version__}, "
          f"tokenizers {tokenizers.__version__}, {os.cpu_count()} CPUs")
    print(f"text: {', '.join(p.name for p in en)}; train {sum(len(l) + 1 for l in train_lines) / 1e6:.1f} M chars "
          f"(first 90% of documents), held out {len(test_lines):,} lines / "
          f"{sum(len(l.split()) for l in test_lines):,} words (last 10%)")

    with tempfile.TemporaryDirectory() as tmp:
        train_file = os.path.join(tmp, "train.txt")
        Path(train_file).write_text("\n".join(train_lines) + "\n", encoding="utf-8")

        print(f"\n== 1. trainer: vocab_size={args.vocab_size}, min_frequency={args.min_frequency} ==")
        results = {}
        for kind, label in [
            ("hf", "HF tokenizers WordPieceTrainer (Rust)"),
            ("ours-wordpiece", "ours, algorithm=wordpiece"),
            ("ours-wordpiece-ratio", "ours, algorithm=wordpiece-ratio"),
            ("ours-bpe", "ours, algorithm=bpe"),
        ]:
            out = os.path.join(tmp, f"{kind}.txt")
            r = _run_child(kind, train_file, out, args.vocab_size, args.min_frequency)
            results[kind] = (r, out)
            print(f"{label:40s} {r['seconds']:7.2f} s   peak memory +{r['peak_mb']:7.1f} MiB")
        hf_s = results["hf"][0]["seconds"]
        our_kinds = ("ours-wordpiece", "ours-wordpiece-ratio", "ours-bpe")
        for kind in our_kinds:
            print(f"ratio {kind} / HF time: {results[kind][0]['seconds'] / hf_s:.2f}x")

        print("\n== 2. quality: tokens per word on held-out text (same tokenizer code, each vocab) ==")
        tpw = {}
        for kind in ("hf", *our_kinds):
            out = results[kind][1]
            n_vocab = len(Path(out).read_text(encoding="utf-8").split("\n")) - 1
            tpw[kind], unk = tokens_per_word(out, test_lines)
            print(f"{kind:20s} vocab {n_vocab:6d}   tokens/word {tpw[kind]:.4f}   [UNK] share {unk:.4%}")
        for kind in our_kinds:
            print(f"{kind} vs HF: {100 * (tpw[kind] / tpw['hf'] - 1):+.2f}% tokens/word")

    print("\n== 3. encoding speed (bert-base-uncased vocab, held-out lines, encode() per line) ==")
    from transformers import BertTokenizerFast

    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as RefTokenizer
    except ImportError:  # transformers 4: the Python tokenizer is BertTokenizer
        from transformers import BertTokenizer as RefTokenizer
    from minibert.tokenization import BertTokenizer

    vocab = str(data / "vocab" / "bert-base-uncased-vocab.txt")
    lines = test_lines
    ours = BertTokenizer(vocab)
    ref = RefTokenizer(vocab)
    fast = BertTokenizerFast(vocab)

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0

    ids_ours, t_ours = timed(lambda: [ours.encode(l) for l in lines])
    ids_ours_warm, t_ours_warm = timed(lambda: [ours.encode(l) for l in lines])
    ids_ref, t_ref = timed(lambda: [ref.encode(l) for l in lines])
    ids_fast, t_fast = timed(lambda: [fast.encode(l) for l in lines])
    batch_fast, t_fast_b = timed(lambda: fast(lines)["input_ids"])
    n = sum(len(x) for x in ids_ref)
    rows = [
        ("ours (cold cache)", t_ours),
        ("ours (warm cache, 2nd pass)", t_ours_warm),
        ("transformers BertTokenizer (Python)", t_ref),
        ("transformers BertTokenizerFast, per line", t_fast),
        ("transformers BertTokenizerFast, one batch", t_fast_b),
    ]
    print(f"{len(lines):,} lines, {n:,} tokens")
    for label, t in rows:
        print(f"{label:45s} {n / t:12,.0f} tokens/s   ({t:6.2f} s)   {t_ref / t:6.2f}x Python ref")
    diff_ref = sum(a != b for a, b in zip(ids_ours, ids_ref))
    diff_fast = sum(a != b for a, b in zip(ids_ours, ids_fast))
    diff_batch = sum(a != b for a, b in zip(ids_ours, batch_fast))
    print(f"lines whose ids differ: ours vs Python ref {diff_ref}, ours vs Fast {diff_fast}, "
          f"ours vs Fast batch {diff_batch}, ours cold vs warm {sum(a != b for a, b in zip(ids_ours, ids_ours_warm))}")


if __name__ == "__main__":
    main()
