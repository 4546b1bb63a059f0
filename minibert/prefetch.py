"""Batches made ahead of the step: an iterator run on a background thread.

The training loop asks for its next batch only when the previous step is done, so the
batch's making (packing, masking, collation: Python work of a few milliseconds a step)
sits between two steps. :class:`Prefetcher` runs the same iterator on a thread of its own,
up to ``depth`` items ahead, and hands the items over through a bounded queue: the
consumer sees exactly the items of the plain iterator, in its order, and nothing else.
What the producer does between items (the matrix products of the step release the GIL)
overlaps with the step.

The contract, what :func:`minibert.training.step_batches` relies on:

- **Order and content.** The items are those of ``iter(source)``, in order. The source
  runs on one thread (the producer's), so its state is touched by one thread only; it
  must not share mutable state with the consumer (the pretraining batches read the token
  store and their own generators only).
- **Errors where they occur.** An exception the source raises (any ``BaseException``,
  KeyboardInterrupt too) is raised again in the consumer by the ``next()`` that would have
  met it in the plain iterator: after every item made before it.
- **No thread left behind.** :meth:`Prefetcher.close` (also on ``with`` exit, at the
  iterator's end, after an error, and when the object is garbage collected) stops the
  producer, closes the source on the producer's thread (its ``finally`` blocks run) and
  joins the thread. The thread is a daemon, so even a consumer that never closes it
  cannot keep the interpreter from exiting.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Iterable, Iterator

__all__ = ["Prefetcher", "prefetch"]

THREAD_NAME = "minibert-prefetch"
_ITEM, _END, _ERROR = 0, 1, 2
_POLL_S = 0.05          # how often a producer blocked on a full queue looks at its stop flag


def _produce(source: Iterator, items: "queue.Queue", stop: threading.Event) -> None:
    """The producer thread's body: put ``(_ITEM, x)`` for each x of ``source`` into
    ``items``, then ``(_END, None)``, or ``(_ERROR, exception)`` if ``source`` raised;
    stop early when ``stop`` is set. Holds no reference to the :class:`Prefetcher` (so
    that an abandoned one can be garbage collected, which closes it)."""

    def put(entry) -> bool:                     # False: the consumer has gone
        while not stop.is_set():
            try:
                items.put(entry, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    try:
        while not stop.is_set():
            try:
                item = next(source)
            except StopIteration:
                put((_END, None))
                return
            except BaseException as error:      # noqa: BLE001 - handed to the consumer
                put((_ERROR, error))
                return
            if not put((_ITEM, item)):
                return
    finally:
        close = getattr(source, "close", None)
        if close is not None:                   # a generator's finally blocks, here
            try:
                close()
            except Exception:                   # noqa: BLE001 - nobody is left to tell
                pass


class Prefetcher:
    """Iterate over ``source`` on a background thread, at most ``depth`` items ahead.

    Args:
        source: any iterable; it is iterated on the producer thread only.
        depth: items made ahead and waiting (>= 1).
    Iterating gives the items of ``source`` in order; an exception of ``source`` comes
    out of the ``next()`` at its place (see the module docstring). Use as a context
    manager, or call :meth:`close`, to stop the thread early.

    Raises:
        ValueError: depth < 1.
    """

    def __init__(self, source: Iterable, depth: int = 2):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._items: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=_produce, name=THREAD_NAME, daemon=True,
                                        args=(iter(source), self._items, self._stop))
        self._thread.start()

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        kind, value = self._items.get()
        if kind == _ITEM:
            return value
        self.close()                            # the source has ended, or failed
        if kind == _ERROR:
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the producer, close the source and join the thread (idempotent). Items
        made ahead and not taken are dropped."""
        self._finished = True
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._drain()
            self._thread.join()
        self._drain()                           # nothing of the source's is kept alive

    def _drain(self) -> None:
        """Take what waits in the queue, which wakes a producer blocked on it."""
        try:
            while True:
                self._items.get_nowait()
        except queue.Empty:
            pass

    @property
    def alive(self) -> bool:
        """Whether the producer thread is still running."""
        return self._thread.is_alive()

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        stop = getattr(self, "_stop", None)
        if stop is not None:                    # __init__ got as far as the flag
            self._finished = True
            stop.set()                          # the producer ends at its next check


def prefetch(source: Iterable, depth: int) -> Iterator:
    """``source`` made ``depth`` items ahead on a background thread (a
    :class:`Prefetcher`), or ``iter(source)`` itself when depth is 0: the same items
    either way."""
    return Prefetcher(source, depth) if depth > 0 else iter(source)
