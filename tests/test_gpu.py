"""The GPU path against the CPU path (issue 11 item 5). Marked ``gpu``: these run where CuPy
and a CUDA GPU are present and skip elsewhere (CI has no GPU; docs/gpu.md lists what has not
yet run on a device)."""
import numpy as np
import pytest

from minibert import BertConfig
from minibert.checkpoint import load_checkpoint, save_checkpoint
from minibert.modeling import BertForPreTraining, BertForSequenceClassification
from minibert.modeling import masked_lm_from_labels
from minibert.nn import scatter_add_rows
from minibert.optim import AdamW
from minibert.testing import gpu_available
from minibert.training import TrainingConfig, train_step


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")]

CONFIG = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=32, max_position_embeddings=16)


class SharedDraws:
    """A dropout generator that gives both devices the same uniforms (drawn on the host)."""

    def __init__(self, seed, xp):
        self.rng, self.xp = np.random.default_rng(seed), xp

    def random(self, shape, dtype=np.float64):
        return self.xp.asarray(self.rng.random(shape, dtype=dtype))


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


@pytest.mark.parametrize("dtype, rtol, loss_atol", [(np.float64, 1e-9, 1e-10),
                                                     (np.float32, 2e-3, 1e-3)])
def test_pretraining_gradients_match_the_cpu_with_padding_and_the_same_dropout(dtype, rtol,
                                                                              loss_atol):
    import cupy as cp
    cpu = BertForPreTraining(CONFIG, dtype=dtype)
    gpu = BertForPreTraining(CONFIG, dtype=dtype).to("cuda")
    for model, xp in ((cpu, np), (gpu, cp)):
        model.set_dropout_rng(SharedDraws(7, xp))
        out = model(**inputs(xp))
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


def test_fused_adamw_kernel_equals_the_numpy_passes():
    import cupy as cp

    from minibert.gpu_kernels import adamw_update
    rng = np.random.default_rng(0)
    p, g, m, v = (rng.standard_normal(1000).astype(np.float32) for _ in range(4))
    v = np.abs(v)
    host = AdamW([("w", _param(p.reshape(10, 100)))], lr=1e-2, weight_decay=0.1)
    dev = [cp.asarray(a) for a in (p, g, m, v)]
    tmp = np.empty_like(p)
    hp, hm, hv = p.copy(), m.copy(), v.copy()
    host._update(hp, g, hm, hv, tmp, 1e-2, 1e-2 / 0.9, 2.0)
    adamw_update(dev[0], dev[1], dev[2], dev[3], 600, 1e-2, 1e-2 / 0.9, 2.0, 0.9, 0.999,
                 host.eps, 0.1)
    host.n_decay = 600
    hp2, hm2, hv2 = p.copy(), m.copy(), v.copy()
    host._update(hp2, g, hm2, hv2, tmp, 1e-2, 1e-2 / 0.9, 2.0)
    for a, b in ((dev[0], hp2), (dev[2], hm2), (dev[3], hv2)):
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
        d = cp.asarray(rng.standard_normal(p.data.shape))
        d /= cp.linalg.norm(d)
        analytic = float(cp.vdot(p.grad, d))
        h = 1e-5
        p.data += h * d
        up = float(model(**x).loss)
        p.data -= 2 * h * d
        down = float(model(**x).loss)
        p.data += h * d
        assert abs((up - down) / (2 * h) - analytic) < 1e-6 * max(1.0, abs(analytic)), name


def test_nccl_world_size_one_and_a_training_step():
    """The NCCL backend started by MPI as a singleton (world size 1): its all-reduce and
    broadcast on device buffers keep the values, and a data-parallel train_step (shards of
    half the rows, gradients through ncclAllReduce) runs to a finite step."""
    import cupy
    from minibert import backend, distributed
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
