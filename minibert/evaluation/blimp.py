"""BLiMP as the development set: the shipped pairs and the command that cut them.

BLiMP (Warstadt et al. 2020, "BLiMP: The Benchmark of Linguistic Minimal Pairs for
English", TACL 8; github.com/alexwarstadt/blimp, CC BY 4.0) has 67 paradigms of 1,000
generated pairs each (``pairID`` 0-999), in 12 phenomena and four fields. The project
splits every paradigm by ``pairID``:

- ``pairID`` 0-99 are **held out**: never shipped, scored or tuned on. :func:`cut_dev`
  skips them by their ID and keeps nothing of them; no file of the repository holds one.
- ``pairID`` 100-299 (200 a paradigm, 13,400 pairs) are the development set shipped as
  ``data/minimal_pairs/blimp/dev.jsonl`` (:data:`BLIMP_DEV`), which
  ``python -m minibert minimal-pairs RUN --blimp`` scores and the pretraining probe samples.

Two labels of the source are normalised so the report has BLiMP's 12 phenomena and four
fields (the paper's Table 1): the two ``animate_subject_*`` paradigms are labelled
``s-selection`` in the files and belong to argument structure in the paper, and
``principle_A_case_2`` has the field ``syntax/semantics`` where its six binding siblings
have ``syntax_semantics``.

Cut the file again from a checkout of the BLiMP repository::

    python -m minibert.evaluation.blimp --source blimp/data \\
        --output data/minimal_pairs/blimp/dev.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BLIMP_DEV = Path(__file__).resolve().parents[2] / "data" / "minimal_pairs" / "blimp" / "dev.jsonl"
HELD_OUT = 100                      # pairIDs 0 .. HELD_OUT-1 of every paradigm: held out
PARADIGM_SIZE = 1000                # pairs per paradigm in BLiMP
KEPT_FIELDS = ("sentence_good", "sentence_bad", "field", "linguistics_term", "UID", "pairID")
FIELD_FIX = {"syntax/semantics": "syntax_semantics"}
PHENOMENON_FIX = {"s-selection": "argument_structure"}


def dev_rows(lines, first: int = HELD_OUT, count: int = 200, source: str = "") -> list[dict]:
    """The development rows of one paradigm file's lines: ``pairID`` in
    ``[first, first + count)``, with :data:`KEPT_FIELDS` only and the labels normalised.

    Args:
        lines: the file's text lines (BLiMP JSON lines).
        first: the first ``pairID`` kept, >= :data:`HELD_OUT`.
        count: how many IDs from ``first`` (>= 1, ``first + count`` <= 1,000).
        source: the file's name, for messages.

    Raises:
        ValueError: ``first`` inside the held-out IDs or the range past 999, a line that is
            not a JSON object with the kept fields, or an ID of the range missing.
    """
    if first < HELD_OUT or count < 1 or first + count > PARADIGM_SIZE:
        raise ValueError(f"the development IDs must lie in [{HELD_OUT}, {PARADIGM_SIZE}); "
                         f"got [{first}, {first + count})")
    rows = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            pair_id = int(d["pairID"])
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{source}:{lineno}: not a BLiMP pair (JSON object with an "
                             f"integer pairID)") from None
        if not first <= pair_id < first + count:
            continue                # the held-out IDs are dropped here, unread beyond the ID
        missing = [f for f in KEPT_FIELDS if not isinstance(d.get(f), str)]
        if missing:
            raise ValueError(f"{source}:{lineno}: field {missing[0]!r} is missing")
        row = {f: d[f] for f in KEPT_FIELDS}
        row["field"] = FIELD_FIX.get(row["field"], row["field"])
        row["linguistics_term"] = PHENOMENON_FIX.get(row["linguistics_term"],
                                                     row["linguistics_term"])
        rows[pair_id] = row
    absent = sorted(set(range(first, first + count)) - set(rows))
    if absent:
        raise ValueError(f"{source}: pairID {absent[0]} is missing ({len(absent)} of the "
                         f"range in all)")
    return [rows[i] for i in sorted(rows)]


def cut_dev(source: Path, output: Path, first: int = HELD_OUT, count: int = 200) -> int:
    """Write the development rows of every ``*.jsonl`` under ``source`` (paradigms in file
    name order) to ``output`` atomically; returns the number of pairs.

    Raises:
        ValueError: no paradigm files, a line that is not UTF-8 (naming file, line and
            column), or a file :func:`dev_rows` refuses.
        OSError: a file cannot be read.
    """
    from ..atomic import atomic_write_bytes
    from ..textfiles import utf8_lines
    files = sorted(Path(source).glob("*.jsonl"))
    if not files:
        raise ValueError(f"--source: no *.jsonl files in {source}")
    rows = []
    for f in files:
        rows += dev_rows((text for _, text in utf8_lines(f)), first, count, str(f))
    atomic_write_bytes(output, "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8"))
    return len(rows)


def main(argv=None) -> int:
    """``python -m minibert.evaluation.blimp``: cut the development file."""
    from ..cli import fail, positive_int
    ap = argparse.ArgumentParser(prog="python -m minibert.evaluation.blimp",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, required=True,
                    help="the data/ folder of a BLiMP checkout (67 paradigm files)")
    ap.add_argument("--output", type=Path, default=BLIMP_DEV)
    ap.add_argument("--first", type=positive_int, default=HELD_OUT,
                    help=f"the first pairID kept (>= {HELD_OUT}: 0-{HELD_OUT - 1} are held out)")
    ap.add_argument("--per-paradigm", type=positive_int, default=200)
    args = ap.parse_args(argv)
    try:
        n = cut_dev(args.source, args.output, args.first, args.per_paradigm)
    except (ValueError, OSError) as e:
        fail(ap.prog, str(e))
    print(f"wrote {n} pairs to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["BLIMP_DEV", "HELD_OUT", "cut_dev", "dev_rows"]
