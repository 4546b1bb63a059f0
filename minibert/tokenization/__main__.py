"""Command line: ``python -m minibert.tokenization {train,tokenize} ...``.

    python -m minibert.tokenization train --files data/brown.txt data/moby_dick.txt \\
        --vocab-size 8000 --output vocab.txt [--algorithm wordpiece|wordpiece-ratio|bpe]
    python -m minibert.tokenization tokenize --vocab vocab.txt "Some text to split."
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..cli import int_at_least, job_main, note_args
from ..runs import RunError, check_inputs, lock_run_dir
from .bert import BertTokenizer
from .trainer import ALGORITHMS, train_wordpiece
from .vocab import SPECIAL_TOKENS, check_writable, write_vocab


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m minibert.tokenization",
        description="Train a WordPiece vocab.txt from raw text, or tokenize text with one.",
    )
    sub = ap.add_subparsers(dest="command", required=True)

    tr = sub.add_parser("train", help="learn a vocab.txt from UTF-8 text files (one sentence per line)")
    tr.add_argument("--files", nargs="+", required=True, help="training text files")
    tr.add_argument("--vocab-size", type=int_at_least(1), required=True,
                    help="tokens in the vocabulary, specials included (at least the special tokens + 1)")
    tr.add_argument("--output", required=True, help="the vocab.txt file to write (written atomically)")
    tr.add_argument("--min-frequency", type=int_at_least(0), default=2,
                    help="minimum count for a character to enter the alphabet and for a pair to be merged (2)")
    tr.add_argument("--algorithm", choices=ALGORITHMS, default="wordpiece",
                    help="merge score: wordpiece = gain in unigram log-likelihood (Schuster & Nakajima 2012); "
                         "wordpiece-ratio = count(ab)/(count(a)count(b)) (Hugging Face course); "
                         "bpe = count(ab) (Hugging Face tokenizers); default wordpiece")
    tr.add_argument("--special-tokens", nargs="+", default=list(SPECIAL_TOKENS),
                    help="special tokens, placed first (default: %(default)s)")
    tr.add_argument("--no-lowercase", action="store_true", help="cased vocabulary (do_lower_case=False)")
    tr.add_argument("--strip-accents", choices=("auto", "yes", "no"), default="auto",
                    help="auto = strip exactly when lower-casing (BERT default)")
    tr.add_argument("--no-chinese-chars", action="store_true", help="do not split CJK ideographs into single words")
    tr.add_argument("--quiet", action="store_true", help="no progress bars")
    tr.set_defaults(run=_train, parser=tr)

    tk = sub.add_parser("tokenize", help="print the WordPiece tokens (or ids) of text with a vocab.txt")
    tk.add_argument("--vocab", required=True, help="vocab.txt")
    tk.add_argument("--cased", action="store_true", help="do_lower_case=False")
    tk.add_argument("--ids", action="store_true", help="print ids ([CLS] ... [SEP]) instead of tokens")
    tk.add_argument("text", nargs="*", help="text to tokenize (default: read lines from stdin)")
    tk.set_defaults(run=_tokenize, parser=tk)
    return ap


def _train(args: argparse.Namespace) -> None:
    """Check the arguments before the long run, train, write. Bad input ends in ``ap.error``."""
    ap = args.parser
    for f in args.files:
        if not Path(f).is_file():
            what = "is a directory" if Path(f).is_dir() else "no such file"
            ap.error(f"argument --files: {f!r}: {what}")
    n_special = len(args.special_tokens)
    if args.vocab_size <= n_special:
        ap.error(f"argument --vocab-size: must be at least {n_special + 1} (the {n_special} special tokens "
                 f"and one more), got {args.vocab_size}")
    try:
        check_writable(args.output)
        check_inputs(args.output, {"--files": args.files}, "--output")
        lock_run_dir(Path(args.output).parent, "the directory of --output")  # its one writer
    except (OSError, RunError) as e:
        ap.error(f"argument --output: {e}")
    note_args(vars(args))
    try:
        vocab = train_wordpiece(
            args.files,
            args.vocab_size,
            min_frequency=args.min_frequency,
            special_tokens=args.special_tokens,
            algorithm=args.algorithm,
            lowercase=not args.no_lowercase,
            strip_accents={"auto": None, "yes": True, "no": False}[args.strip_accents],
            tokenize_chinese_chars=not args.no_chinese_chars,
            show_progress=not args.quiet,
        )
    except ValueError as e:  # corpus that is empty / not UTF-8, vocab size below the alphabet, bad specials
        ap.error(str(e))
    try:
        write_vocab(vocab, args.output)
    except OSError as e:
        ap.error(f"argument --output: cannot write {args.output!r}: {e.strerror or e}")
    print(vocab.report.summary(), file=sys.stderr)
    print(f"wrote {len(vocab)} tokens to {args.output}", file=sys.stderr)


def _tokenize(args: argparse.Namespace) -> None:
    ap = args.parser
    try:
        tok = BertTokenizer(args.vocab, do_lower_case=not args.cased)
    except (OSError, ValueError) as e:
        ap.error(f"argument --vocab: {e}")
    lines = [" ".join(args.text)] if args.text else (l.rstrip("\n") for l in sys.stdin)
    for line in lines:
        if args.ids:
            print(" ".join(map(str, tok.encode(line))))
        else:
            print(" ".join(tok.tokenize(line)))


@job_main("python -m minibert.tokenization")
def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns 0.

    Bad arguments or input (missing files, an ``--output`` that cannot be written or that
    is one of the ``--files``, a directory of ``--output`` that another job owns, a
    ``--vocab-size`` too small, a vocab file that cannot be read ...) print one
    ``...: error: ...`` line naming the option to stderr and raise ``SystemExit(2)``, as
    argparse does for its own checks. A fault on the way (disk full, out of memory,
    Ctrl-C) ends in one line too (:func:`minibert.cli.job_main`).
    """
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
