"""A live view of a run: ``--report-to tensorboard`` (the Hugging Face Trainer's option).

:class:`TensorBoardLog` mirrors every record the run writes to ``metrics.jsonl``
(:class:`minibert.runs.MetricsLog`) into TensorBoard event files in
``RUN/tensorboard/``, through ``tensorboardX`` (an optional extra:
``pip install 'minibert[tensorboard]'``), so ``tensorboard --logdir RUN`` shows the run as
it goes. Each numeric field of a record becomes the scalar ``KIND/FIELD`` at the record's
step: ``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/tokens_per_s``,
``eval/mlm_loss``, ``eval/dev_accuracy`` ..., and for ``grad_flow`` records (with
``--log-grad-norms``) ``grad_flow/grad_norm/PARAMETER`` and so on; strings and lists are
left out.

A resumed run rebuilds the event files from the records ``metrics.jsonl`` keeps (those
up to the checkpoint's step): a new event file is written with them, then the old files
are removed, so no step is there twice, whatever the run wrote after its checkpoint
before it stopped. A stop between the two leaves both, and the next resume clears it.
Event files are append-only logs, as ``metrics.jsonl`` is, not replaced atomically.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

REPORT_TO = ("none", "tensorboard")
EVENT_GLOB = "events.out.tfevents.*"
INSTALL = "pip install 'minibert[tensorboard]' (or pip install tensorboardX)"


def report_to_choice(text: str) -> str:
    """argparse type of ``--report-to``: ``none`` or ``tensorboard``, the latter only
    where ``tensorboardX`` can be imported.

    Raises:
        argparse.ArgumentTypeError: another value, or tensorboard without the package
            (the message says what to install).
    """
    if text not in REPORT_TO:
        raise argparse.ArgumentTypeError(f"invalid choice {text!r} (choose from "
                                         f"{', '.join(REPORT_TO)})")
    if text == "tensorboard":
        try:
            import tensorboardX  # noqa: F401
        except ImportError:
            raise argparse.ArgumentTypeError(
                f"tensorboard needs the tensorboardX package, which is not installed: "
                f"{INSTALL}") from None
    return text


def scalars(record: Mapping[str, Any], prefix: str | None = None) -> Iterator[tuple[str, float]]:
    """(tag, value) for each number of a metrics record, nested dicts flattened:
    ``KIND/FIELD[/KEY...]``; ``kind`` and ``step`` themselves, booleans, strings and lists
    are left out."""
    prefix = prefix if prefix is not None else str(record.get("kind", "record"))
    for key, value in record.items():
        if prefix == record.get("kind") and key in ("kind", "step"):
            continue
        if isinstance(value, Mapping):
            yield from scalars(value, f"{prefix}/{key}")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}/{key}", float(value)


class TensorBoardLog:
    """The TensorBoard twin of a run's ``metrics.jsonl`` (see the module docstring).

    Args:
        directory: where the event files go (``RUN/tensorboard``).
        records: the records ``metrics.jsonl`` holds already (a resumed run's), written
            first; older event files in ``directory`` are removed after them.
    Raises:
        ImportError: no ``tensorboardX`` (``--report-to`` checks this where it is parsed).
    """

    def __init__(self, directory: str | os.PathLike, records: Iterable[Mapping[str, Any]] = ()):
        from tensorboardX import SummaryWriter
        self.directory = Path(directory)
        old = sorted(self.directory.glob(EVENT_GLOB)) if self.directory.is_dir() else []
        # a name of its own (pid, nanoseconds), never one of the old files it replaces
        self.writer = SummaryWriter(logdir=str(self.directory), flush_secs=30,
                                    filename_suffix=f".{os.getpid()}.{time.time_ns()}")
        for record in records:
            self.write(record, flush=False)
        self.writer.flush()
        for path in old:
            path.unlink(missing_ok=True)

    def write(self, record: Mapping[str, Any], flush: bool = True) -> None:
        """Add the record's scalars (:func:`scalars`) at its step; flushed, so a viewer
        sees it at once."""
        step = int(record.get("step", 0))
        for tag, value in scalars(record):
            self.writer.add_scalar(tag, value, global_step=step)
        if flush:
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()
