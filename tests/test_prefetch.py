"""Batches made ahead on a background thread (minibert/prefetch.py) and its use by the
training loop (minibert.training.step_batches): the same items in the same order, errors
where the plain iterator would raise them, no thread left behind, and a pretraining run
whose metrics do not change with it."""
import gc
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import prefetch as prefetch_module
from minibert.prefetch import Prefetcher, prefetch
from minibert.training import TrainingConfig, TrainState, step_batches

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import train_mlm  # noqa: E402

from helpers import moby_chapters, records  # noqa: E402


def producers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == prefetch_module.THREAD_NAME]


def wait_until_gone(timeout: float = 5.0) -> bool:
    """True once no producer thread is alive (a closed one ends at once; an abandoned one
    at its next look at its stop flag)."""
    end = time.monotonic() + timeout
    while producers() and time.monotonic() < end:
        time.sleep(0.01)
    return not producers()


@pytest.fixture(autouse=True)
def no_thread_left():
    yield
    assert wait_until_gone(), "a prefetch thread outlived its test"


@settings(max_examples=25, deadline=None)
@given(items=st.lists(st.integers()), depth=st.integers(1, 4))
def test_items_come_in_the_plain_iterators_order(items, depth):
    def source():
        for x in items:
            yield x, threading.current_thread().name

    got = list(Prefetcher(source(), depth))
    assert [x for x, _ in got] == items
    assert all(name == prefetch_module.THREAD_NAME for _, name in got)   # made ahead
    assert list(prefetch(source(), 0)) == [(x, threading.current_thread().name) for x in items]


@pytest.mark.parametrize("error", [ValueError("bad batch"), KeyboardInterrupt()])
@pytest.mark.parametrize("depth", [1, 3])
def test_an_error_comes_out_after_the_items_before_it(error, depth):
    """The consumer gets every item made before the failure, then the source's own
    exception object, from the next() that would have met it; the source's finally runs."""
    finished = []

    def source():
        try:
            yield from range(5)
            raise error
        finally:
            finished.append(threading.current_thread().name)

    it = Prefetcher(source(), depth)
    assert [next(it) for _ in range(5)] == list(range(5))
    with pytest.raises(type(error)) as caught:
        next(it)
    assert caught.value is error
    assert finished == [prefetch_module.THREAD_NAME]
    assert not it.alive
    with pytest.raises(StopIteration):              # finished: nothing more, no hang
        next(it)


def test_closing_early_stops_the_thread_and_closes_the_source():
    """close() (and a with block's end) stops a producer blocked on a full queue, runs
    the source's finally on the producer's thread and joins it; the source is not read
    further than the queue's depth past what was taken."""
    made, closed = [], []

    def endless():
        try:
            n = 0
            while True:
                made.append(n)
                yield n
                n += 1
        finally:
            closed.append(threading.current_thread().name)

    with Prefetcher(endless(), depth=2) as it:
        assert [next(it) for _ in range(3)] == [0, 1, 2]
        time.sleep(0.05)                            # let it fill the queue and block
    assert not it.alive and not producers()
    assert closed == [prefetch_module.THREAD_NAME]
    assert len(made) <= 3 + 2 + 1                   # taken + queued + one waiting to be put
    it.close()                                      # twice: nothing happens
    with pytest.raises(StopIteration):
        next(it)


def test_an_abandoned_prefetcher_ends_its_thread():
    """A Prefetcher dropped without close() (garbage collected) stops its producer,
    which holds no reference to it."""
    it = Prefetcher(iter(range(10 ** 9)), depth=2)
    assert next(it) == 0 and producers()
    del it
    gc.collect()
    assert wait_until_gone()


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        Prefetcher([], 0)


class Numbered:
    """A workload of n numbered batches an epoch, made ahead when prefetch_batches > 0;
    each batch names the thread that made it."""

    evaluate = None

    def __init__(self, n: int, prefetch_batches: int, fail_at=None):
        self.n, self.prefetch_batches, self.fail_at = n, prefetch_batches, fail_at

    def batches(self, epoch, start_batch):
        for i in range(start_batch, self.n):
            if (epoch, i) == self.fail_at:
                raise RuntimeError(f"no batch {epoch}.{i}")
            yield epoch, i, threading.current_thread().name


def grouped(workload, steps, k=3):
    state = TrainState()
    groups = step_batches(workload, TrainingConfig(max_steps=steps, lr=1e-3,
                                                   gradient_accumulation_steps=k), state)
    out = [(next(groups), state.epoch, state.batch_in_epoch) for _ in range(steps)]
    groups.close()
    return out


def test_step_batches_group_the_same_batches_with_and_without_prefetch():
    plain, ahead = grouped(Numbered(7, 0), 9), grouped(Numbered(7, 2), 9)
    assert ([[b[:2] for b in m] for m, *_ in plain] == [[b[:2] for b in m] for m, *_ in ahead])
    assert [pos for _, *pos in plain] == [pos for _, *pos in ahead]   # the state, step by step
    assert {b[2] for m, *_ in plain for b in m} == {threading.current_thread().name}
    assert {b[2] for m, *_ in ahead for b in m} == {prefetch_module.THREAD_NAME}


def test_step_batches_raise_the_workloads_error_at_its_batch():
    """A workload that fails at batch 2 of epoch 1: every step before it comes out,
    then its error; the thread is gone once the generator is closed."""
    groups = step_batches(Numbered(4, 2, fail_at=(1, 2)),
                          TrainingConfig(max_steps=10, lr=1e-3, gradient_accumulation_steps=2),
                          TrainState())
    assert [[b[:2] for b in next(groups)] for _ in range(3)] == [
        [(0, 0), (0, 1)], [(0, 2), (0, 3)], [(1, 0), (1, 1)]]
    with pytest.raises(RuntimeError, match="no batch 1.2"):
        next(groups)
    groups.close()


def test_a_dropped_step_batches_generator_stops_its_thread():
    groups = step_batches(Numbered(5, 2), TrainingConfig(max_steps=10, lr=1e-3), TrainState())
    next(groups)
    assert producers()
    del groups                       # what happens to train()'s when train returns
    assert wait_until_gone()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return moby_chapters(tmp_path_factory, 8)


def test_a_pretraining_run_has_the_same_metrics_with_and_without_prefetch(
        corpus, tmp_path, monkeypatch):
    """train_mlm.py with the pretraining workload's batches made ahead (its default) and
    made in line: every train and eval record equal, bit for bit, but for the times.
    Two epochs' worth of steps, so that the producer runs into the next epoch ahead."""
    from minibert.pretraining.job import PretrainingWorkload
    assert PretrainingWorkload.prefetch_batches > 0
    argv = ["--corpus", str(corpus), "--vocab-size", "300", "--hidden-size", "16",
            "--num-hidden-layers", "1", "--num-attention-heads", "2",
            "--intermediate-size", "32", "--max-seq-length", "32", "--batch-size", "64",
            "--max-steps", "24", "--log-every", "1", "--eval-every", "12",
            "--eval-fraction", "0.3", "--eval-instances", "8", "--eval-pairs-per-paradigm", "2",
            "--no-progress", "--overwrite"]
    timing = {"elapsed_s", "tokens_per_s", "steps_per_s", "seconds", "eval_s"}

    def run(name):
        out = tmp_path / name
        assert train_mlm.main([*argv, "--output-dir", str(out)]) == 0
        return [{k: v for k, v in r.items() if k not in timing and not k.endswith("_s")}
                for kind in ("train", "eval") for r in records(out, kind)]

    ahead = run("ahead")
    monkeypatch.setattr(PretrainingWorkload, "prefetch_batches", 0)
    plain = run("plain")
    assert max(r.get("epoch", 0) for r in plain) >= 1, "the run should cross an epoch"
    assert ahead == plain
