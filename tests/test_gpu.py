"""The GPU path against the CPU path (issue 11 item 5), and what a training step reads back.

Marked ``gpu`` (device tests). Each test runs on the real GPU where CuPy and one pass
minibert's start-up check, and otherwise through the NumPy stand-in of tests/fakecupy.py
(the ``cuda`` fixture of conftest.py installs it as ``cupy`` / ``cupyx`` for the test), which
counts every device-to-host read. What the stand-in cannot show is listed in docs/gpu.md
("Unverified on a device"); a test it cannot run at all (NCCL) skips there, saying why.
"""
import numpy as np
import pytest

from minibert import AlbertConfig, AlbertForPreTraining, BertConfig, backend
from minibert.checkpoint import load_checkpoint, save_checkpoint
from minibert.distributed import Communicator
from minibert.finetuning.data import FinetuningBatch as ClassifierBatch
from minibert.finetuning.tasks import SequenceClassification
from minibert.heads import BertForSequenceClassification
from minibert.modeling import BertForPreTraining, masked_lm_from_labels
from minibert.nn import scatter_add_rows
from minibert.objectives import get_objective
from minibert.optim import AdamW
from minibert.optim import adamw_update as formula
from minibert.pretraining import PretrainingBatch
from minibert.training import TrainingConfig, train_step

from helpers import SharedDraws, bfloat16_or_refusal


pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]

CONFIG = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=32, max_position_embeddings=16)
# three depths applying two shared groups, embeddings narrower than the hidden size
ALBERT_CONFIG = AlbertConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=3,
                             num_hidden_groups=2, num_attention_heads=4, intermediate_size=32,
                             max_position_embeddings=16, hidden_dropout_prob=0.1,
                             attention_probs_dropout_prob=0.1)




def inputs(xp, B=3, T=10):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 50, (B, T))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    ids[1, 6:] = 0                                       # padding ids
    labels = np.where(rng.random((B, T)) < 0.3, ids, -100)
    labels[:, 0] = ids[:, 0]
    pos, mids, w = masked_lm_from_labels(labels, width=4)
    host = dict(input_ids=ids, attention_mask=mask, masked_lm_positions=pos, masked_lm_ids=mids,
                masked_lm_weights=w, next_sentence_label=np.array([0, 1, 0]))
    return {k: xp.asarray(v) for k, v in host.items()}


@pytest.mark.parametrize("model_class, config", [(BertForPreTraining, CONFIG),
                                                 (AlbertForPreTraining, ALBERT_CONFIG)],
                         ids=["bert", "albert"])
@pytest.mark.parametrize("dtype, rtol, loss_atol", [(np.float64, 1e-9, 1e-10),
                                                     (np.float32, 2e-3, 1e-3)])
def test_pretraining_gradients_match_the_cpu_with_padding_and_the_same_dropout(
        model_class, config, dtype, rtol, loss_atol):
    import cupy as cp
    cpu = model_class(config, dtype=dtype)
    gpu = model_class(config, dtype=dtype).to("cuda")
    for model, xp in ((cpu, np), (gpu, cp)):
        model.set_dropout_rng(SharedDraws(7, xp))
        x = inputs(xp)
        x[model.sentence_label] = x.pop("next_sentence_label")   # ALBERT's name differs
        out = model(**x)
        model.backward()
        model.loss_value = float(out.loss)
    assert abs(cpu.loss_value - gpu.loss_value) < loss_atol
    for (n, pc), (_, pg) in zip(cpu.named_parameters(), gpu.named_parameters()):
        np.testing.assert_allclose(cp.asnumpy(pg.grad), pc.grad, rtol=rtol, atol=rtol * 1e-3,
                                   err_msg=n)       # float64: rtol 1e-9, atol 1e-12


def test_classification_gradients_match_the_cpu():
    import cupy as cp
    config = BertConfig(**{**CONFIG.to_dict(), "num_labels": 3})
    cpu = BertForSequenceClassification(config, dtype=np.float64)
    gpu = BertForSequenceClassification(config, dtype=np.float64).to("cuda")
    for model, xp in ((cpu, np), (gpu, cp)):
        x = inputs(xp)
        model.set_dropout_rng(SharedDraws(3, xp))
        model(x["input_ids"], attention_mask=x["attention_mask"], labels=xp.asarray([0, 2, 1]))
        model.backward()
    for (n, pc), (_, pg) in zip(cpu.named_parameters(), gpu.named_parameters()):
        np.testing.assert_allclose(cp.asnumpy(pg.grad), pc.grad, rtol=1e-9, atol=1e-12, err_msg=n)


class Task:
    def __init__(self, x):
        self.x = x

    def forward(self, model, _):
        return model(**self.x).loss, {}


def test_a_clipped_adamw_step_matches_the_cpu_and_reads_nothing_back():
    import cupy as cp
    import cupyx
    cfg = TrainingConfig(max_steps=1, lr=1e-3, max_grad_norm=0.5)
    # the devices' dropout generators differ (PCG64 vs cuRAND Philox): compare without dropout
    config = BertConfig(**{**CONFIG.to_dict(), "hidden_dropout_prob": 0.0,
                           "attention_probs_dropout_prob": 0.0})
    models = []
    for device, xp in (("cpu", np), ("cuda", cp)):
        model = BertForPreTraining(config, dtype=np.float32).to(device)
        opt = AdamW(model.named_parameters(), lr=1e-3, correct_bias=True)
        task = Task(inputs(xp))
        if device == "cuda":
            train_step(model, opt, task, [None], 0, 1e-3, cfg, device=device)   # compile first
            model = BertForPreTraining(config, dtype=np.float32).to(device)
            opt = AdamW(model.named_parameters(), lr=1e-3, correct_bias=True)
            with cupyx.allow_synchronize(False):
                train_step(model, opt, task, [None], 0, 1e-3, cfg, device=device)
        else:
            train_step(model, opt, task, [None], 0, 1e-3, cfg, device=device)
        models.append(model)
    for (n, pc), (_, pg) in zip(*(m.named_parameters() for m in models)):
        np.testing.assert_allclose(cp.asnumpy(pg.data), pc.data, rtol=0, atol=1e-4, err_msg=n)


def test_fused_adamw_kernel_equals_the_formula():
    import cupy as cp

    from minibert.gpu_kernels import adamw_update
    rng = np.random.default_rng(0)
    p, g, m, v = (rng.standard_normal(1000).astype(np.float32) for _ in range(4))
    v = np.abs(v)
    dev = [cp.asarray(a) for a in (p, g, m, v)]
    adamw_update(dev[0], dev[1], dev[2], dev[3], 600, 1e-2, 1e-2 / 0.9, 2.0, 0.9, 0.999,
                 1e-6, 0.1)
    hp, hm, hv = p.copy(), m.copy(), v.copy()
    formula(hp, g, hm, hv, 600, 1e-2, 1e-2 / 0.9, 2.0, 0.9, 0.999, 1e-6, 0.1)
    for a, b in ((dev[0], hp), (dev[2], hm), (dev[3], hv)):
        np.testing.assert_allclose(cp.asnumpy(a), b, rtol=1e-6, atol=1e-7)


def _param(a):
    from minibert.nn import Parameter
    return Parameter(a.copy())


@pytest.mark.parametrize("ids", [[3, 1, 3, 3, 0], []])
def test_scatter_add_rows_with_repeated_and_empty_ids(ids):
    import cupy as cp
    rng = np.random.default_rng(1)
    src = rng.standard_normal((len(ids), 4))
    host = np.zeros((5, 4))
    scatter_add_rows(host, np.asarray(ids, np.int64), src)
    dev = cp.zeros((5, 4))
    scatter_add_rows(dev, cp.asarray(ids, cp.int64), cp.asarray(src))
    np.testing.assert_allclose(cp.asnumpy(dev), host, rtol=1e-12)


def test_a_gpu_checkpoint_resumes_on_the_cpu_and_back(tmp_path):
    import cupy as cp
    gpu = BertForPreTraining(CONFIG, dtype=np.float32, seed=4).to("cuda")
    opt = AdamW(gpu.named_parameters(), lr=1e-3)
    train_step(gpu, opt, Task(inputs(cp)), [None], 0, 1e-3, TrainingConfig(max_steps=1, lr=1e-3),
               device="cuda")
    save_checkpoint(tmp_path / "g.npz", gpu, opt, {"step": 1})
    cpu = BertForPreTraining(CONFIG, dtype=np.float32)
    ck = load_checkpoint(tmp_path / "g.npz")
    cpu.load_state_dict(ck["model"])
    copt = AdamW(cpu.named_parameters(), lr=1e-3)
    copt.load_state_dict(ck["optim"])
    save_checkpoint(tmp_path / "c.npz", cpu, copt, {"step": 1})
    back = BertForPreTraining(CONFIG, dtype=np.float32).to("cuda")
    ck2 = load_checkpoint(tmp_path / "c.npz")
    back.load_state_dict(ck2["model"])
    for (n, a), (_, b) in zip(gpu.named_parameters(), back.named_parameters()):
        np.testing.assert_array_equal(cp.asnumpy(a.data), cp.asnumpy(b.data), err_msg=n)
    np.testing.assert_array_equal(copt.m, cp.asnumpy(opt.m))


def test_float64_gradcheck_on_the_gpu():
    import cupy as cp
    config = BertConfig(**{**CONFIG.to_dict(), "hidden_dropout_prob": 0.0,
                           "attention_probs_dropout_prob": 0.0})
    model = BertForPreTraining(config, dtype=np.float64).to("cuda")
    x = inputs(cp)
    model(**x)
    model.backward()
    rng = np.random.default_rng(0)
    for name, p in list(model.named_parameters())[:6]:
        d = rng.standard_normal(p.data.shape)
        if name.endswith("word_embeddings.weight"):
            # the padding row gets no gradient from lookups (as in PyTorch), yet the
            # padded positions of row 1 carry MLM labels: leave that row out
            d[config.pad_token_id] = 0
        d = cp.asarray(d)
        d /= cp.linalg.norm(d)
        analytic = float(cp.vdot(p.grad, d))
        h = 1e-5
        p.data += h * d
        up = float(model(**x).loss)
        p.data -= 2 * h * d
        down = float(model(**x).loss)
        p.data += h * d
        assert abs((up - down) / (2 * h) - analytic) < 1e-6 * max(1.0, abs(analytic)), name


def test_nccl_world_size_one_and_a_training_step(cuda):
    """The NCCL backend started by MPI as a singleton (world size 1): its all-reduce and
    broadcast on device buffers keep the values, and a data-parallel train_step (shards of
    half the rows, gradients through ncclAllReduce) runs to a finite step."""
    if cuda.stand_in:
        pytest.skip("NCCL needs a GPU and libnccl, which the NumPy stand-in does not model "
                    "(it runs train_step's data-parallel branch with no-op collectives in "
                    "test_a_training_step_reads_nothing_back)")
    import cupy
    from cupy.cuda import nccl
    from minibert import backend, distributed
    if not nccl.available:
        pytest.skip("this CuPy finds no NCCL library (CuPy's wheels do not bundle it): "
                    "pip install -e '.[nccl]', which brings nvidia-nccl-cu12")
    pytest.importorskip("mpi4py", reason="NCCL's ranks start through MPI: pip install "
                                         "-e '.[nccl]', which brings mpi4py")
    try:
        comm = distributed.NCCLCommunicator()
        assert (comm.name, comm.world_size, comm.rank) == ("nccl", 1, 0)
        buf = cupy.arange(5, dtype=cupy.float32)
        np.testing.assert_array_equal(comm.allreduce_(buf).get(), np.arange(5))
        np.testing.assert_array_equal(comm.broadcast_(buf).get(), np.arange(5))
        np.testing.assert_array_equal(comm.allreduce_host(np.array([2.0])), [2.0])
        comm.world_size = 2      # force the data-parallel path: shards of half the rows
        backend.set_device("cuda")

        class Task:
            def forward(self, model, batch):
                out = model(cupy.asarray(batch.input_ids),
                            attention_mask=cupy.asarray(batch.attention_mask),
                            labels=cupy.asarray(batch.labels))
                return out.loss, {}

        from dataclasses import dataclass

        @dataclass
        class Rows:
            input_ids: np.ndarray
            attention_mask: np.ndarray
            labels: np.ndarray

        rng = np.random.default_rng(0)
        rows = Rows(rng.integers(1, 50, (4, 8)), np.ones((4, 8), np.int64), rng.integers(0, 2, 4))
        model = BertForSequenceClassification(CONFIG).to("cuda")
        opt = AdamW(model.named_parameters(), lr=1e-3)
        loss, norm, finite, _ = train_step(model, opt, Task(), [rows], 0, 1e-3,
                                           TrainingConfig(max_steps=1, lr=1e-3), comm=comm,
                                           device="cuda")
        assert bool(finite) and np.isfinite(float(loss)) and float(norm) > 0
    finally:
        distributed._current = distributed.Communicator()
        backend.set_device("cpu")


# ------------------------------------------------------------- what a training step reads back

class PretrainingTask:
    """train_mlm.py's forward: the host batch moved to the device, the loss and the
    objective's metric sums left there."""

    objective = get_objective("mlm+nsp")

    def forward(self, model, batch):
        import cupy
        x = {k: cupy.asarray(v) for k, v in batch.model_inputs().items()}
        out = model(**x)
        return out.loss, self.objective.stats(out, x)


class ClassifierTask:
    """finetune.py's forward for --task sequence-classification."""

    def forward(self, model, batch):
        import cupy
        return SequenceClassification().forward(model, batch, cupy)


def host_batches(head):
    """Two host micro-batches (B=3, T=10, padded rows) of the head's batch type."""
    x = inputs(np)
    if head == "pretraining":
        b = PretrainingBatch(x["input_ids"], np.zeros_like(x["input_ids"]), x["attention_mask"],
                             x["masked_lm_positions"], x["masked_lm_ids"],
                             x["masked_lm_weights"].astype(np.float32),
                             x["next_sentence_label"])
    else:
        b = ClassifierBatch(x["input_ids"], np.zeros_like(x["input_ids"]), x["attention_mask"],
                            np.array([0, 2, 1]), np.arange(3))
    return [b, b]


class TwoRanksAsOne(Communicator):
    """Rank 0 of a world of 2 whose collectives leave the buffers as they are: the
    data-parallel branch of train_step (half the rows, the loss all-reduced as a device
    array) without NCCL."""

    world_size = 2


@pytest.mark.parametrize("head, dtype, comm", [
    ("pretraining", np.float32, None), ("pretraining", np.float16, None),
    ("classifier", np.float32, None), ("pretraining", np.float32, TwoRanksAsOne())],
    ids=["pretraining", "pretraining-float16", "classifier", "pretraining-data-parallel"])
def test_a_training_step_reads_nothing_back(cuda, head, dtype, comm):
    """Two micro-batches with padding and dropout (counter-based), clipping, the non-finite check,
    the fused AdamW kernel (float16: master weights and the dynamic loss scale): no host
    read from the first forward to the optimizer step."""
    import cupy
    import cupyx
    config = BertConfig(**{**CONFIG.to_dict(), "num_labels": 3})
    model_class = BertForPreTraining if head == "pretraining" else BertForSequenceClassification
    model = model_class(config, seed=1).to("cuda", dtype=dtype)
    opt = AdamW(model.named_parameters(), lr=1e-3, correct_bias=True)
    task = PretrainingTask() if head == "pretraining" else ClassifierTask()
    cfg = TrainingConfig(max_steps=2, lr=1e-3, max_grad_norm=1.0)
    rng = backend.DropoutRNG("cuda")
    micro = host_batches(head)
    train_step(model, opt, task, micro, 0, 1e-3, cfg, comm=comm, device="cuda",
               dropout_rng=rng)                           # a GPU compiles its kernels here
    before = cupy.asnumpy(opt.flat.data)
    scale = float(opt.loss_scale())
    with cuda.record() as seen, cupyx.allow_synchronize(False):
        loss, norm, finite, sums = train_step(model, opt, task, micro, 1, 1e-3, cfg, comm=comm,
                                              device="cuda", dropout_rng=rng)
    assert seen.syncs == []
    # the step's own machinery uploads two small buffers, before any kernel (the dropout
    # seeds of the two micro-batches and the step's rates: prepare_step); the rest is the
    # task moving its host batch (and the objective its Python-int counts, 8 bytes each)
    staging = [u for u in seen.uploads if " at minibert/" in u]
    assert [u.split(" at ")[0] for u in staging] == ["set() (2,) uint64", "set() (3,) "
                                                     f"{np.dtype(opt.m.dtype).name}"], staging
    assert seen.uploads[:2] == staging
    assert all(u.split(" at ")[1].startswith(("tests/test_gpu.py", "finetuning/tasks.py",
                                              "objectives/base.py"))
               for u in seen.uploads[2:]), seen.uploads
    if bool(finite):                                      # the step did real work
        assert float(norm) > 0 and np.isfinite(float(loss))
        assert all(np.isfinite(float(v)) for v in sums.values())
        assert not np.array_equal(cupy.asnumpy(opt.flat.data), before)
    else:                                                 # float16 overflow: scale halved
        assert dtype == np.float16 and float(opt.loss_scale()) == scale / 2


def test_the_sync_counter_counts_and_refuses_host_reads(cuda):
    """The checks above can fail: a deliberate read is refused inside
    allow_synchronize(False) (CuPy: by get(), which every read goes through) and counted
    outside it (the stand-in); implicit conversions and host operands are refused."""
    import cupy
    import cupyx
    config = BertConfig(**{**CONFIG.to_dict(), "num_labels": 3})
    model = BertForSequenceClassification(config).to("cuda")
    model.set_dropout_rng(backend.DropoutRNG("cuda").reseed(0))
    x = inputs(cupy)
    loss = model(x["input_ids"], attention_mask=x["attention_mask"],
                 labels=cupy.asarray([0, 2, 1])).loss
    mask = x["attention_mask"] > 0
    reads = {"float": lambda: float(loss), "item": loss.item, "bool": lambda: bool(loss > 0),
             "asnumpy": lambda: cupy.asnumpy(loss), "print": lambda: f"{loss}",
             "boolean mask": lambda: x["input_ids"][mask]}    # CuPy reads the count back
    for name, read in reads.items():
        with cupyx.allow_synchronize(False):
            try:
                read()
            except cupyx.DeviceSynchronized:
                continue
        pytest.fail(f"{name}: a host read passed inside allow_synchronize(False)")
    with cuda.record() as seen:
        value = float(loss)
        loss * 2 + loss.sum()                             # stays on the device
    assert np.isfinite(value)
    if cuda.stand_in:
        assert len(seen.syncs) == 1 and seen.syncs[0].startswith("float() at tests/test_gpu.py:")
    with pytest.raises(TypeError):
        np.asarray(loss)                                  # CuPy: "Implicit conversion ..."
    with pytest.raises(TypeError):
        loss + np.ones(1)                                 # CuPy: "Unsupported type"


def test_the_stand_in_runs_only_kernels_it_can_read(cuda):
    """The stand-in's ElementwiseKernel: C's types and the element index; a body outside
    its C subset raises when the kernel is made, never runs as something else."""
    if not cuda.stand_in:
        pytest.skip("checks the NumPy stand-in itself (tests/fakecupy.py)")
    import cupy
    x = cupy.asarray(np.linspace(-1, 1, 5, dtype=np.float32))
    k = cupy.ElementwiseKernel("T x, int64 n", "T y, T z",
                               "y = x * 0.1; z = x * 0.1f; if (i < n) z = -z", "c_types")
    y, z = k(x, 3)
    host = np.linspace(-1, 1, 5, dtype=np.float32)
    np.testing.assert_array_equal(cupy.asnumpy(y), (host.astype(np.float64) * 0.1)
                                  .astype(np.float32))           # a double literal widens
    np.testing.assert_array_equal(cupy.asnumpy(z), host * np.float32(0.1) * [-1, -1, -1, 1, 1])
    for body in ("y = x > 0 ? x : 0", "y += x", "atomicAdd(&y, x)", "y = (float)x",
                 "for (int j = 0; j < 2; j++) y = x", "y = x % 2", "y = foo(x)",
                 "{ y = x; }", "y = x && x"):
        with pytest.raises(NotImplementedError, match="outside the C subset"):
            cupy.ElementwiseKernel("T x", "T y", body, "refused")
    with pytest.raises(NotImplementedError):
        cupy.ElementwiseKernel("raw T x", "T y", "y = x[i]", "raw")
    with pytest.raises(TypeError, match="Type is mismatched"):
        cupy.ElementwiseKernel("T x, T s", "T y", "y = x * s", "mix")(x, x.astype(np.float64))
    with pytest.raises(TypeError, match="Unsupported type"):
        cupy.ElementwiseKernel("T x", "T y", "y = x", "host")(host)
    with pytest.raises(AttributeError, match="not in the NumPy stand-in"):
        _ = cupy.fuse                               # no fuse, no RawKernel


def test_bfloat16_training_follows_float32_without_loss_scaling(cuda, tmp_path):
    """``--dtype bfloat16`` on the device (fast paths on): bfloat16 parameters, products and
    embedding scatter, float32 master weights and gradients, no loss scaler. Thirty steps on
    one batch follow float32's losses; a checkpoint holds float32 weights (every bfloat16
    widens exactly) and the master, and a bfloat16 model resumes from it exactly."""
    import cupy
    from minibert.fast import fast_paths
    bf16 = bfloat16_or_refusal()
    if bf16 is None:                      # the floor run: refused, as asserted there
        return
    config = BertConfig(**{**CONFIG.to_dict(), "hidden_dropout_prob": 0.0,
                           "attention_probs_dropout_prob": 0.0})
    cfg = TrainingConfig(max_steps=30, lr=3e-3, max_grad_norm=1.0)
    micro = host_batches("pretraining")[:1]
    with fast_paths(True):
        models = {d: BertForPreTraining(config, seed=1).to("cuda", dtype=d)
                  for d in (np.dtype(np.float32), bf16)}
        opts = {d: AdamW(m.named_parameters(), lr=3e-3, correct_bias=True)
                for d, m in models.items()}
        half = opts[bf16]
        assert half.master.dtype == np.float32 and half.scaler is None
        assert half.loss_scale() == 1.0 and half.flat.data.dtype == bf16
        losses = {d: [] for d in models}
        for step in range(30):
            for d, m in models.items():
                losses[d].append(float(train_step(m, opts[d], PretrainingTask(), micro, step,
                                                  3e-3, cfg, device="cuda")[0]))
    full, low = losses[np.dtype(np.float32)], losses[bf16]
    assert full[-1] < 0.7 * full[0]                              # it learns the batch
    assert abs(low[0] - full[0]) < 0.01 * full[0]
    assert abs(low[-1] - full[-1]) < 0.03 * full[-1], (full, low)
    assert not any(k.startswith("scaler.") for k in half.state_dict())
    np.testing.assert_array_equal(cupy.asnumpy(half.flat.data).astype(np.float32),
                                  cupy.asnumpy(half.master).astype(bf16).astype(np.float32))
    save_checkpoint(tmp_path / "c.npz", models[bf16], half, {"step": 30})
    ck = load_checkpoint(tmp_path / "c.npz")
    assert {np.asarray(v).dtype for v in ck["model"].values()} == {np.dtype(np.float32)}
    again = BertForPreTraining(config, seed=2).to("cuda", dtype=bf16)
    again.load_state_dict(ck["model"])
    opt = AdamW(again.named_parameters(), lr=3e-3, correct_bias=True)
    opt.load_state_dict(ck["optim"])
    np.testing.assert_array_equal(cupy.asnumpy(opt.master), cupy.asnumpy(half.master))
    np.testing.assert_array_equal(cupy.asnumpy(opt.flat.data).astype(np.float32),
                                  cupy.asnumpy(half.flat.data).astype(np.float32))


def test_bfloat16_is_refused_where_it_cannot_run(monkeypatch):
    """``--dtype bfloat16`` needs the GPU, NumPy >= 2.1.2 and ml_dtypes: each missing piece
    is a BackendError that names it (the jobs print it as their ``error:`` line)."""
    with pytest.raises(backend.BackendError, match="needs --device cuda"):
        backend.resolve_dtype("bfloat16", "cpu")
    with pytest.raises(backend.BackendError, match="unknown dtype 'bf16'"):
        backend.resolve_dtype("bf16", "cuda")
    monkeypatch.setitem(__import__("sys").modules, "ml_dtypes", None)
    new_numpy = np.lib.NumpyVersion(np.__version__) >= "2.1.2"
    with pytest.raises(backend.BackendError, match="ml_dtypes" if new_numpy else "NumPy"):
        backend.resolve_dtype("bfloat16", "cuda")
    monkeypatch.setattr(np, "__version__", "1.26.4")
    with pytest.raises(backend.BackendError, match="NumPy >= 2.1.2.*1.26.4"):
        backend.resolve_dtype("bfloat16", "cuda")
    assert backend.resolve_dtype("float16", "cpu") == np.float16
