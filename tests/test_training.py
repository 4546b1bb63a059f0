"""minibert.training: the one loop. Gradient accumulation is the larger batch, a step reads
no device value on the host, non-finite steps are skipped and stop the run, and a run
killed at any moment resumes onto the uninterrupted loss curve (both jobs)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import BertConfig
from minibert.heads import BertForSequenceClassification
from minibert.averaging import WeightAverage
from minibert.optim import AdamW
from minibert.runs import MetricsLog
from minibert.training import (LogWindow, NonfiniteGuard, TrainingConfig, TrainingError,
                               TrainState, ramped_accumulation, step_batches, train,
                               train_record)
from minibert.distributed import Communicator

from helpers import Rows, ToyTask


def toy(seed=0, rows=16, dtype=np.float64):
    config = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=8, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, num_labels=3)
    rng = np.random.default_rng(seed)
    data = Rows(rng.integers(1, 20, (rows, 6)), np.ones((rows, 6), np.int64),
                rng.integers(0, 3, rows))
    return BertForSequenceClassification(config, seed=1, dtype=dtype), data


def run(model, task, tmp_path, steps, k=1, log_every=1, **kw):
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.01, correct_bias=True)
    cfg = TrainingConfig(max_steps=steps, lr=1e-2, warmup_steps=1, gradient_accumulation_steps=k,
                         log_every=log_every, progress=False, **kw)
    state, _ = train(model, opt, task, cfg, TrainState(), metrics_path=tmp_path / "m.jsonl",
                     checkpoint_path=tmp_path / "c.npz")
    return state, MetricsLog.read(tmp_path / "m.jsonl")


def test_gradient_accumulation_equals_the_larger_batch(tmp_path):
    big, data = toy()
    acc, _ = toy()
    run(big, ToyTask(data, 8), tmp_path, steps=4)
    run(acc, ToyTask(data, 2), tmp_path, steps=4, k=4)
    for (n, p), (_, q) in zip(big.named_parameters(), acc.named_parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=0, atol=1e-10, err_msg=n)


class SizedTask(ToyTask):
    """The rows in order, cut into micro-batches of the given sizes (one epoch)."""

    def __init__(self, data: Rows, sizes):
        super().__init__(data, 0)
        self.sizes = list(sizes)

    def batches(self, epoch, start_batch):
        ends = np.cumsum([0, *self.sizes])
        for a, b in zip(ends[start_batch:-1], ends[start_batch + 1:]):
            yield Rows(*(x[a:b] for x in
                         (self.data.input_ids, self.data.attention_mask, self.data.labels)))


@given(k=st.integers(1, 9), ramp=st.integers(0, 40), step=st.integers(0, 60))
@settings(max_examples=200, deadline=None)
def test_the_batch_ramp_grows_linearly_from_one_micro_batch_to_k(k, ramp, step):
    j = ramped_accumulation(step, k, ramp)
    assert 1 <= j <= k
    assert j >= ramped_accumulation(max(step - 1, 0), k, ramp)            # never shrinks
    if ramp == 0 or step >= ramp - 1:
        assert j == k
    else:                                     # within one micro-batch of the line k * t / ramp
        assert k * (step + 1) / ramp <= j < k * (step + 1) / ramp + 1


def test_a_ramped_run_is_the_run_of_growing_batches(tmp_path):
    """Micro-batches of 2 rows, k 4, a 4-step ramp: steps of 1, 2, 3, 4, 4 micro-batches,
    the same updates as steps on single batches of 2, 4, 6, 8, 8 rows."""
    ramped, data = toy(rows=32)
    plain, _ = toy(rows=32)
    task = ToyTask(data, 2)
    run(ramped, task, tmp_path, steps=5, k=4, batch_size_ramp_steps=4)
    assert task.calls == 1 + 2 + 3 + 4 + 4
    run(plain, SizedTask(data, [2, 4, 6, 8, 8]), tmp_path / "b", steps=5)
    for (n, p), (_, q) in zip(plain.named_parameters(), ramped.named_parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=0, atol=1e-10, err_msg=n)


class Guarded(np.ndarray):
    """A NumPy array that refuses to be read on the host (a stand-in for device memory)."""

    reads = 0

    def _refuse(self, *a, **k):
        Guarded.reads += 1
        raise AssertionError("host read of a device value inside a training step")

    __float__ = __int__ = __bool__ = __index__ = item = tolist = _refuse


@pytest.mark.parametrize("with_ema", [False, True])
def test_a_training_step_reads_no_device_value(tmp_path, monkeypatch, with_ema):
    model, data = toy(dtype=np.float32)
    task = ToyTask(data, 8)
    from minibert import training
    # log steps may read: with log_every past max_steps the first read is the final log
    opt = AdamW(model.named_parameters(), lr=1e-3)
    # guarded views of the same memory: the parameters still alias the flat buffers
    for p in model.parameters():
        p.data = p.data.view(Guarded)
        p.grad = p.grad.view(Guarded)
    for owner, name in ((opt.flat, "data"), (opt.flat, "grad"), (opt, "m"), (opt, "v"),
                        (opt, "_tmp")):
        setattr(owner, name, getattr(owner, name).view(Guarded))
    ema = WeightAverage(opt, 0.9) if with_ema else None       # its buffers guarded too
    assert ema is None or isinstance(ema.average, Guarded) and isinstance(ema._scratch, Guarded)
    cfg = TrainingConfig(max_steps=3, lr=1e-3, log_every=10**6, progress=False)
    monkeypatch.setattr(training, "save_checkpoint", lambda *a, **k: None)
    with pytest.raises(AssertionError, match="host read"):
        # the final log step reads the sums: that is the first read, after 3 steps
        train(model, opt, task, cfg, TrainState(), metrics_path=tmp_path / "m.jsonl",
              checkpoint_path=tmp_path / "c", ema=ema)
    assert task.calls == 3  # every forward of the 3 steps ran before the first read


def test_non_finite_steps_are_skipped_then_stop_the_run(tmp_path):
    model, data = toy()
    before = {}

    class Spy(ToyTask):
        def forward(self, model, batch):
            if self.calls == 1:
                before.update({n: p.data.copy() for n, p in model.named_parameters()})
            return super().forward(model, batch)

    spy = Spy(data, 8, nan_steps={2})
    state, records = run(model, spy, tmp_path, steps=2)
    for n, p in model.named_parameters():  # the second (non-finite) step changed nothing
        np.testing.assert_array_equal(p.data, before[n], err_msg=n)
    assert [r["skipped_steps"] for r in records if r["kind"] == "train"] == [0, 1]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert np.isfinite(losses[0]) and losses[1] is None  # a window of skipped steps only

    model, data = toy()
    with pytest.raises(TrainingError, match=r"not finite in 3 steps in a row since step 2"):
        run(model, ToyTask(data, 8, nan_steps={2, 3, 4, 5, 6}), tmp_path / "b", steps=6,
            max_nonfinite_steps=3)
    # a run of bad steps that ends between two log steps is still caught
    model, data = toy()
    with pytest.raises(TrainingError, match=r"since step 2 \(to step 4\)"):
        run(model, ToyTask(data, 8, nan_steps={2, 3, 4}), tmp_path / "c", steps=8,
            max_nonfinite_steps=3, log_every=8)


def test_an_epoch_without_batches_is_an_error(tmp_path):
    model, data = toy(rows=0)
    with pytest.raises(TrainingError, match="epoch 0 yields no batch"):
        run(model, ToyTask(data, 8), tmp_path, steps=1)


def test_parameters_moved_after_the_optimizer_was_built_are_an_error(tmp_path):
    model, data = toy()
    opt = AdamW(model.named_parameters(), lr=1e-2)
    p = model.parameters()[0]
    p.data = p.data.copy()                      # no longer a view of the optimizer's buffer
    with pytest.raises(TrainingError, match="no longer alias the optimizer's buffer"):
        train(model, opt, ToyTask(data, 8), TrainingConfig(max_steps=1, lr=1e-2, progress=False),
              TrainState(), metrics_path=tmp_path / "m.jsonl", checkpoint_path=tmp_path / "c")


# ---------------------------------------------------------------------- the loop's helpers
class Numbered:
    """``n`` batches an epoch, each the pair (epoch, index)."""

    def __init__(self, n):
        self.n = n

    def batches(self, epoch, start_batch):
        yield from ((epoch, i) for i in range(start_batch, self.n))


@given(n=st.integers(1, 7), k=st.integers(1, 4), ramp=st.integers(0, 6), steps=st.integers(1, 20),
       cut=st.integers(0, 20))
@settings(max_examples=100, deadline=None)
def test_step_batches_group_each_epoch_into_ramped_steps(n, k, ramp, steps, cut):
    cfg = TrainingConfig(max_steps=steps, lr=1e-3, gradient_accumulation_steps=k,
                         batch_size_ramp_steps=ramp)
    state = TrainState()
    groups = step_batches(Numbered(n), cfg, state)
    taken, positions = [], []
    for step in range(steps):
        micro = next(groups)
        taken.append(micro)
        positions.append((state.epoch, state.batch_in_epoch))
        epoch = micro[0][0]
        assert all(e == epoch for e, _ in micro)                   # one epoch per step
        left = n - micro[0][1]                                     # batches left in the epoch
        assert len(micro) == min(ramped_accumulation(step, k, ramp), left)
        assert (state.epoch, state.batch_in_epoch) == (epoch, micro[-1][1] + 1)
    flat = [b for micro in taken for b in micro]
    assert flat == [(e, i) for e in range(flat[-1][0] + 1) for i in range(n)][:len(flat)]
    # a run resumed from any step's position takes the same steps from there on
    cut = min(cut, steps - 1)
    resumed = TrainState(cut, *(positions[cut - 1] if cut else (0, 0)))
    again = step_batches(Numbered(n), cfg, resumed)
    assert [next(again) for _ in range(cut, steps)] == taken[cut:]


@given(bad=st.lists(st.booleans(), min_size=1, max_size=12), limit=st.integers(1, 4),
       run=st.integers(0, 3))
@settings(max_examples=100, deadline=None)
def test_the_nonfinite_guard_counts_bad_steps_in_a_row(bad, limit, run):
    guard = NonfiniteGuard(np, limit, "c.npz", run=run, since=7 if run else 0)
    since, hit = (7 if run else 0), None                          # the plain-Python reference
    for step, b in enumerate(bad, start=10):
        guard.update(step, np.asarray(not b), np.float64(np.nan if b else 1.0), False)
        since = since if not b or run else step
        run = run + 1 if b else 0
        if hit is None and run >= limit:
            hit = (since, step)
        assert (int(guard.run), int(guard.since)) == (run, since)
    if hit is None:
        guard.check(99)
    else:
        # c.npz was never written: the message says so and does not name it (issue 32)
        with pytest.raises(TrainingError, match=rf"not finite in {limit} steps in a row since "
                           rf"step {hit[0] + 1} \(to step {hit[1] + 1}\); stopped at step 99 "
                           r".*no checkpoint had been written yet\)$") as e:
            guard.check(99)
        assert "c.npz" not in str(e.value)


def test_with_loss_scaling_an_overflow_at_a_finite_loss_is_not_a_bad_step():
    guard = NonfiniteGuard(np, 1, "c")
    guard.update(0, np.asarray(False), np.float64(2.0), loss_scaled=True)
    guard.check(1)
    guard.update(1, np.asarray(False), np.float64(np.inf), loss_scaled=True)
    with pytest.raises(TrainingError, match="since step 2 "):
        guard.check(2)


def test_the_log_window_and_the_train_record():
    window = LogWindow({"loss": 3.0, "steps": 1.0, "correct": 5.0}, Communicator(), np,
                       np.float32)
    window.count_tokens([Rows(None, np.ones((2, 3), np.int64), None)] * 2)
    window.add(np.float64(1.0), np.float64(0.5), np.asarray(True), {"correct": np.int64(2)})
    window.add(np.float64(np.nan), np.float64(9.0), np.asarray(False), {"correct": np.int64(4)})
    opened = window.opened
    totals, tokens_per_s = window.close(opened + 2.0)
    assert totals == {"loss": 4.0, "steps": 2.0, "correct": 7.0, "grad_norm": 0.5, "skipped": 1.0}
    assert tokens_per_s == 6.0                                  # 12 tokens in 2 seconds
    assert (window.sums, window.tokens, window.opened) == ({}, 0, opened + 2.0)
    record = train_record(TrainState(step=4, epoch=1), 1e-3, totals, {"acc": 0.5}, 1.25, 6.0)
    assert list(record) == ["kind", "step", "epoch", "elapsed_s", "lr", "loss", "acc",
                            "grad_norm", "skipped_steps", "tokens_per_s"]
    assert (record["loss"], record["grad_norm"], record["skipped_steps"]) == (2.0, 0.25, 1)
    skipped = train_record(TrainState(), 0.0, {"loss": 0.0, "grad_norm": 0.0, "steps": 0.0,
                                               "skipped": 3.0}, {}, 0.0, 0.0, loss_scale=1024.0)
    assert (skipped["loss"], skipped["grad_norm"], skipped["loss_scale"]) == (None, None, 1024.0)


# ---------------------------------------------------------------- steps, epochs, skipped steps
def test_accumulated_steps_end_with_their_epoch(tmp_path):
    """5 micro-batches an epoch, 2 per step: steps of 2, 2, 1 micro-batches, so an epoch is
    3 whole steps and no step mixes two epochs."""
    model, data = toy(rows=10)
    task = ToyTask(data, 2)
    state, _ = run(model, task, tmp_path, steps=3, k=2)
    assert (state.epoch, state.batch_in_epoch, task.calls) == (0, 5, 5)
    state, _ = run(model, ToyTask(data, 2), tmp_path / "b", steps=6, k=2)
    assert (state.epoch, state.batch_in_epoch) == (1, 5)


class RecordingAverage(WeightAverage):
    """A WeightAverage that records the step and the weights of every update."""

    def __init__(self, *a):
        super().__init__(*a)
        self.seen = []

    def update(self, step):
        self.seen.append((step, self._weights().copy()))
        super().update(step)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_the_weight_average_is_the_ema_of_the_weights_after_each_step(tmp_path, dtype):
    """The loop updates the average once after every optimizer step, with that step's
    weights: ema_0 = w_0, ema_{t+1} = d_t ema_t + (1 - d_t) w_{t+1}, d_t = min(d, (1 + t) /
    (10 + t)), computed here directly in float64 (float16 runs average the float32
    master weights)."""
    model, data = toy(dtype=dtype)
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.01, correct_bias=True)
    w0 = (opt.flat.data if opt.master is None else opt.master).astype(np.float64)
    ema = RecordingAverage(opt, 0.95)
    cfg = TrainingConfig(max_steps=40, lr=1e-2, warmup_steps=1, log_every=100, progress=False)
    train(model, opt, ToyTask(data, 4), cfg, TrainState(), metrics_path=tmp_path / "m.jsonl",
          checkpoint_path=tmp_path / "c.npz", ema=ema)
    assert [t for t, _ in ema.seen] == list(range(40))
    final = opt.flat.data if opt.master is None else opt.master
    np.testing.assert_array_equal(ema.seen[-1][1], final)        # after the optimizer step
    expected = w0
    for t, w in ema.seen:
        d = min(0.95, (1 + t) / (10 + t))
        expected = d * expected + (1 - d) * w.astype(np.float64)
    assert ema.average.dtype == (np.float64 if dtype == np.float64 else np.float32)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(ema.average, expected, rtol=tol, atol=tol)
    assert not np.allclose(expected, final.astype(np.float64), rtol=1e-3, atol=0)
    # swapped in: the parameters hold the average; put back bit for bit, also on an error
    raw = [p.data.copy() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="inside"):
        with ema.swapped_in():
            np.testing.assert_array_equal(opt.flat.data, ema.average.astype(dtype))
            raise RuntimeError("inside")
    for p, r in zip(model.parameters(), raw):
        np.testing.assert_array_equal(p.data, r)
    # the checkpoint form round-trips
    other = WeightAverage(AdamW(toy(dtype=dtype)[0].named_parameters()), 0.95)
    other.load_state_dict(ema.state_dict())
    np.testing.assert_array_equal(other.average, ema.average)
    with pytest.raises(KeyError, match="no entry"):
        other.load_state_dict({})


def test_the_ema_decay_warms_up_as_tensorflows_num_updates_rule():
    from minibert.averaging import ema_decay_at
    assert [ema_decay_at(t, 0.999) for t in (0, 8, 80)] == [0.1, 0.5, 0.9]
    assert ema_decay_at(8990, 0.999) == pytest.approx(0.999) and ema_decay_at(10**6, 0.999) == 0.999
    with pytest.raises(ValueError, match="decay"):
        WeightAverage(AdamW(toy()[0].named_parameters()), 1.0)


def test_evaluations_and_checkpoints_see_the_average_and_training_the_raw_weights(tmp_path):
    """Each evaluation runs with the average swapped in; the next step trains on the raw
    weights, as a run without evaluations does; the checkpoint offers the average as its
    model, the raw weights for resuming."""
    from minibert.checkpoint import load_checkpoint

    def fit(evaluate):
        model, data = toy()
        opt = AdamW(model.named_parameters(), lr=1e-2)
        ema, task = WeightAverage(opt, 0.9), ToyTask(data, 4)
        seen = []
        if evaluate:
            task.evaluate = lambda step: seen.append((opt.flat.data.copy(),
                                                      ema.average.copy())) or {}
        cfg = TrainingConfig(max_steps=6, lr=1e-2, warmup_steps=1, eval_every=2,
                             save_every=6, progress=False)
        train(model, opt, task, cfg, TrainState(), metrics_path=tmp_path / "m.jsonl",
              checkpoint_path=tmp_path / f"c{evaluate}.npz", ema=ema)
        return opt.flat.data.copy(), ema, seen, model

    raw, ema, seen, model = fit(True)
    assert len(seen) == 3 and all(np.array_equal(w, a) for w, a in seen)
    np.testing.assert_array_equal(raw, fit(False)[0])
    ckpt = load_checkpoint(tmp_path / "cTrue.npz")
    with ema.swapped_in():
        averaged_state = model.state_dict()
    for name, v in model.state_dict().items():
        np.testing.assert_array_equal(ckpt["train"][name], v)
        np.testing.assert_array_equal(ckpt["model"][name], averaged_state[name])
    assert not np.array_equal(ema.average, raw)
