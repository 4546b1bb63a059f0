"""``python -m minibert.gradcheck``: every layer's gradients against central differences.

Prints one table per checked configuration and exits 1 if any tensor fails (2 on bad
arguments). ``--perturb NAME`` runs the checks with one backward term corrupted.
"""
from __future__ import annotations

import argparse
import sys
import time

from ..cli import dropout_probability, non_negative_int, positive_float, positive_int
from .catalogue import LAYERS, Shapes, run_checks
from .perturbations import PERTURBATIONS


def _parser() -> argparse.ArgumentParser:
    """The command line: which layers, their shapes (defaults: :class:`Shapes`), the
    tolerances and an optional perturbation."""
    p = argparse.ArgumentParser(
        prog="python -m minibert.gradcheck",
        description="Compare minibert's hand-written gradients with float64 central "
                    "differences, layer by layer.",
        epilog="perturbations (--perturb): " + "; ".join(
            f"{k}: {v[0]}" for k, v in PERTURBATIONS.items()),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--layer", choices=LAYERS + ("all",), default="all", nargs="+",
                   help="which checks to run")
    d = Shapes()
    p.add_argument("--batch", type=positive_int, default=d.batch, help="B, sequences")
    p.add_argument("--seq-len", type=positive_int, default=d.seq_len,
                   help="T, tokens per sequence")
    p.add_argument("--hidden", type=positive_int, default=d.hidden, help="C, hidden size")
    p.add_argument("--heads", type=positive_int, default=d.heads,
                   help="NH, attention heads (divides C)")
    p.add_argument("--intermediate", type=positive_int, default=d.intermediate,
                   help="I, FFN width")
    p.add_argument("--vocab", type=positive_int, default=d.vocab, help="V, vocabulary size")
    p.add_argument("--layers", type=positive_int, default=d.layers,
                   help="encoder layers of the model")
    p.add_argument("--dropout", type=dropout_probability, default=d.dropout,
                   help="dropout probability (masks fixed during a check)")
    p.add_argument("--label-smoothing", type=dropout_probability, default=d.label_smoothing)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--tol", type=positive_float, default=1e-5,
                   help="largest passing relative error (a finite number > 0)")
    p.add_argument("--atol", type=positive_float, default=1e-8,
                   help="an abs error this small passes too (a finite number > 0)")
    p.add_argument("--full-max-size", type=non_negative_int, default=100,
                   help="tensors up to this many entries are checked entry by entry, larger "
                        "ones along random directions")
    p.add_argument("--perturb", choices=list(PERTURBATIONS), default=None,
                   help="corrupt one backward term to see what a wrong gradient looks like")
    return p


def main(argv=None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the checks, print the tables.
    Returns the exit status: 0 if every tensor passed, 1 otherwise."""
    p = _parser()
    args = p.parse_args(argv)
    if args.hidden % args.heads:
        p.error(f"--hidden ({args.hidden}) must be divisible by --heads ({args.heads})")
    layers = LAYERS if "all" in args.layer else tuple(dict.fromkeys(args.layer))
    shapes = Shapes(args.batch, args.seq_len, args.hidden, args.heads, args.intermediate,
                    args.vocab, args.layers, args.dropout, args.label_smoothing)
    try:
        shapes.check_fits()
    except ValueError as e:
        p.error(str(e))
    if args.perturb:
        print(f"PERTURBED backward ({args.perturb}): {PERTURBATIONS[args.perturb][0]}\n")
    t0 = time.perf_counter()
    reports = run_checks(layers, shapes, args.seed, args.perturb, tol=args.tol, atol=args.atol,
                         full_max_size=args.full_max_size)
    elapsed = time.perf_counter() - t0
    for r in reports:
        print(r, end="\n\n")
    rows = [row for r in reports for row in r.rows]
    failed = [row.name for row in rows if not row.passed]
    print(f"{len(rows)} tensors checked in {elapsed:.1f} s (float64, central differences, "
          f"h=1e-6, tol {args.tol:g}): {len(rows) - len(failed)} passed, {len(failed)} failed")
    if failed:
        print("FAILED: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
