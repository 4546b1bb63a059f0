"""AdamW (BERT and bias-corrected forms), the LR schedule and gradient clipping."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert.nn import Parameter
from minibert.optim import AdamW, clip_grad_norm, decays, linear_schedule_with_warmup
from minibert.testing import seeds

torch = pytest.importorskip("torch")


def make_params(rng):
    return [("layer.dense.weight", Parameter(rng.standard_normal((3, 4)))),
            ("layer.dense.bias", Parameter(rng.standard_normal(3))),
            ("layer.LayerNorm.weight", Parameter(rng.standard_normal(4)))]


@settings(max_examples=20, deadline=None)
@given(seed=seeds, lr=st.sampled_from([1e-3, 3e-2]), wd=st.sampled_from([0.0, 0.01, 0.1]))
def test_bias_corrected_adamw_matches_torch(seed, lr, wd):
    rng = np.random.default_rng(seed)
    ours = make_params(rng)
    ref = [torch.tensor(p.data.copy(), requires_grad=True) for _, p in ours]
    opt = AdamW(ours, lr=lr, weight_decay=wd, correct_bias=True, eps=1e-6)
    groups = [{"params": [t], "weight_decay": wd if decays(n) else 0.0}
              for (n, _), t in zip(ours, ref)]
    topt = torch.optim.AdamW(groups, lr=lr, eps=1e-6, betas=(0.9, 0.999))
    for _ in range(5):
        for (_, p), t in zip(ours, ref):
            g = rng.standard_normal(p.data.shape)
            p.grad[...] = g
            t.grad = torch.tensor(g)
        opt.step()
        topt.step()
    for (n, p), t in zip(ours, ref):
        np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=n)


def test_bert_adamw_has_no_bias_correction_and_skips_layernorm_and_bias():
    rng = np.random.default_rng(0)
    params = make_params(rng)
    before = {n: p.data.copy() for n, p in params}
    grads = {n: rng.standard_normal(p.data.shape) for n, p in params}
    for n, p in params:
        p.grad[...] = grads[n]
    lr, wd, eps = 0.1, 0.2, 1e-6
    AdamW(params, lr=lr, weight_decay=wd, eps=eps).step()
    for n, p in params:
        g = grads[n]
        m, v = 0.1 * g, 0.001 * g * g       # one step of the moment updates, uncorrected
        update = m / (np.sqrt(v) + eps) + (wd * before[n] if n.endswith("weight")
                                            and "LayerNorm" not in n else 0.0)
        np.testing.assert_allclose(p.data, before[n] - lr * update, rtol=1e-12, atol=1e-14,
                                   err_msg=n)


def test_optimizer_state_round_trip_continues_identically():
    rng = np.random.default_rng(1)
    a, b = make_params(rng), [(n, Parameter(p.data.copy())) for n, p in make_params(np.random.default_rng(1))]
    opt_a, opt_b = AdamW(a, lr=0.01), AdamW(b, lr=0.01)
    grads = [[rng.standard_normal(p.data.shape) for _, p in a] for _ in range(4)]
    for step, gs in enumerate(grads):
        for (_, pa), (_, pb), g in zip(a, b, gs):
            pa.grad[...] = g
            pb.grad[...] = g
        opt_a.step()
        opt_b.step()
        if step == 1:  # rebuild b's optimizer from a saved state
            opt_b = AdamW(b, lr=0.01)
            opt_b.load_state_dict(opt_a.state_dict())
    for (_, pa), (_, pb) in zip(a, b):
        np.testing.assert_array_equal(pa.data, pb.data)
    with pytest.raises(KeyError, match="no moments"):
        AdamW(a).load_state_dict({"t": np.asarray(1)})


def test_linear_schedule_with_warmup():
    lrs = [linear_schedule_with_warmup(s, 1.0, 10, 110) for s in range(111)]
    assert lrs[0] == 0.0 and lrs[5] == 0.5 and lrs[10] == 1.0
    assert lrs[60] == pytest.approx(0.5) and lrs[110] == 0.0
    assert all(x >= y for x, y in zip(lrs[10:], lrs[11:]))


@settings(max_examples=20, deadline=None)
@given(seed=seeds, max_norm=st.sampled_from([0.1, 1.0, 100.0]))
def test_clip_grad_norm_matches_torch(seed, max_norm):
    rng = np.random.default_rng(seed)
    params = [p for _, p in make_params(rng)]
    for p in params:
        p.grad[...] = rng.standard_normal(p.data.shape)
    ts = [torch.zeros(p.data.shape, dtype=torch.float64, requires_grad=True) for p in params]
    for p, t in zip(params, ts):
        t.grad = torch.tensor(p.grad.copy())
    ref_norm = torch.nn.utils.clip_grad_norm_(ts, max_norm)
    norm = clip_grad_norm(params, max_norm)
    assert float(norm) == pytest.approx(ref_norm.item(), rel=1e-12)
    for p, t in zip(params, ts):
        np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=1e-12)
