"""Command-line plumbing shared by the jobs: range-checked argparse types and the one way a
job stops on bad input (an ``error:`` line naming the problem, exit status 2, no
traceback)."""
from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn


def fail(prog: str, message: str) -> NoReturn:
    """Print ``PROG: error: MESSAGE`` to stderr and exit with status 2 (argparse's).

    In a data-parallel run with several ranks the line names the rank, and every rank is
    stopped (``MPI_Abort``), so that none is left waiting in a collective."""
    from .distributed import current
    comm = current()
    where = f" [rank {comm.rank} of {comm.world_size}]" if comm.world_size > 1 else ""
    print(f"{prog}: error: {message}{where}", file=sys.stderr)
    comm.abort(2)
    sys.exit(2)  # abort does not return


def _number(kind, text: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def int_at_least(low: int):
    """argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        value = _number(int, text)
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def float_in(low: float, high: float = math.inf, *, low_open: bool = False,
             high_open: bool = False):
    """argparse type: a finite float in [low, high] (ends open where asked)."""
    def parse(text: str) -> float:
        value = _number(float, text)
        if value < low or (low_open and value == low) or value > high or \
                (high_open and value == high):
            if high == math.inf:
                want = f"a number {'>' if low_open else '>='} {low:g}"
            else:
                lo, hi = "(" if low_open else "[", ")" if high_open else "]"
                want = f"a number in {lo}{low:g}, {high:g}{hi}"
            raise argparse.ArgumentTypeError(f"expected {want}, got {value:g}")
        return value
    parse.__name__ = "number"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
probability = float_in(0.0, 1.0)
dropout_probability = float_in(0.0, 1.0, high_open=True)
positive_float = float_in(0.0, low_open=True)
non_negative_float = float_in(0.0)


def explicit_options(parser: argparse.ArgumentParser, argv) -> set[str]:
    """The destinations (``args`` attribute names) of the options given in ``argv``, as
    opposed to those left at their defaults: a resumed run takes the rest from its
    checkpoint."""
    defaults = {a.dest: a.default for a in parser._actions}
    for a in parser._actions:
        a.default = argparse.SUPPRESS
    try:
        given, _ = parser.parse_known_args(argv)
    finally:
        for a in parser._actions:
            a.default = defaults[a.dest]
    return set(vars(given))
