"""Command line: ``python -m minibert.tokenization {train,tokenize} ...``.

    python -m minibert.tokenization train --files data/brown.txt data/moby_dick.txt \\
        --vocab-size 8000 --output vocab.txt [--algorithm wordpiece|wordpiece-ratio|bpe]
    python -m minibert.tokenization tokenize --vocab vocab.txt "Some text to split."
"""

from __future__ import annotations

import argparse
import logging
import sys

from .bert import BertTokenizer
from .trainer import ALGORITHMS, DEFAULT_SPECIAL_TOKENS, train_wordpiece


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m minibert.tokenization",
        description="Train a WordPiece vocab.txt from raw text, or tokenize text with one.",
    )
    sub = ap.add_subparsers(dest="command", required=True)

    tr = sub.add_parser("train", help="learn a vocab.txt from UTF-8 text files (one sentence per line)")
    tr.add_argument("--files", nargs="+", required=True, help="training text files")
    tr.add_argument("--vocab-size", type=int, required=True, help="tokens in the vocabulary, specials included")
    tr.add_argument("--output", required=True, help="where to write vocab.txt (written atomically)")
    tr.add_argument("--min-frequency", type=int, default=2,
                    help="minimum count for a character to enter the alphabet and for a pair to be merged (2)")
    tr.add_argument("--algorithm", choices=ALGORITHMS, default="wordpiece",
                    help="merge score: wordpiece = gain in unigram log-likelihood (Schuster & Nakajima 2012); "
                         "wordpiece-ratio = count(ab)/(count(a)count(b)) (Hugging Face course); "
                         "bpe = count(ab) (Hugging Face tokenizers); default wordpiece")
    tr.add_argument("--special-tokens", nargs="+", default=list(DEFAULT_SPECIAL_TOKENS),
                    help="special tokens, placed first (default: %(default)s)")
    tr.add_argument("--no-lowercase", action="store_true", help="cased vocabulary (do_lower_case=False)")
    tr.add_argument("--strip-accents", choices=("auto", "yes", "no"), default="auto",
                    help="auto = strip exactly when lower-casing (BERT default)")
    tr.add_argument("--no-chinese-chars", action="store_true", help="do not split CJK ideographs into single words")
    tr.add_argument("--quiet", action="store_true", help="no progress bars")

    tk = sub.add_parser("tokenize", help="print the WordPiece tokens (or ids) of text with a vocab.txt")
    tk.add_argument("--vocab", required=True, help="vocab.txt")
    tk.add_argument("--cased", action="store_true", help="do_lower_case=False")
    tk.add_argument("--ids", action="store_true", help="print ids ([CLS] ... [SEP]) instead of tokens")
    tk.add_argument("text", nargs="*", help="text to tokenize (default: read lines from stdin)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        if args.command == "train":
            vocab = train_wordpiece(
                args.files,
                args.vocab_size,
                min_frequency=args.min_frequency,
                special_tokens=args.special_tokens,
                algorithm=args.algorithm,
                lowercase=not args.no_lowercase,
                strip_accents={"auto": None, "yes": True, "no": False}[args.strip_accents],
                tokenize_chinese_chars=not args.no_chinese_chars,
                output=args.output,
                show_progress=not args.quiet,
            )
            print(vocab.report.summary(), file=sys.stderr)
            print(f"wrote {len(vocab)} tokens to {args.output}", file=sys.stderr)
            return 0
        tok = BertTokenizer(args.vocab, do_lower_case=not args.cased)
        lines = [" ".join(args.text)] if args.text else (l.rstrip("\n") for l in sys.stdin)
        for line in lines:
            if args.ids:
                print(" ".join(map(str, tok.encode(line))))
            else:
                print(" ".join(tok.tokenize(line)))
        return 0
    except (FileNotFoundError, ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
