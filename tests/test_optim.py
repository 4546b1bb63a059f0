"""AdamW (BERT and bias-corrected forms), the LR schedule and gradient clipping."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import BertConfig, BertForPreTraining, BertForSequenceClassification
from minibert.nn import Module, Parameter
from minibert.optim import (AdamW, clip_grad_norm, decay_phase_start, decays,
                            linear_schedule_with_warmup, warmup_stable_decay_schedule)
from minibert.testing import seeds

from helpers import cpu_blocking

torch = pytest.importorskip("torch")


def make_params(rng):
    return [("layer.dense.weight", Parameter(rng.standard_normal((3, 4)))),
            ("layer.dense.bias", Parameter(rng.standard_normal(3))),
            ("layer.LayerNorm.weight", Parameter(rng.standard_normal(4)))]


@settings(max_examples=20, deadline=None)
@given(seed=seeds, lr=st.sampled_from([1e-3, 3e-2]), wd=st.sampled_from([0.0, 0.01, 0.1]),
       block=st.sampled_from([None, 1, 5]), threads=st.sampled_from([1, 2]))
def test_bias_corrected_adamw_matches_torch(seed, lr, wd, block, threads):
    """Also with the update cut into blocks over threads (blocks of 1 and 5 of the 19
    values, so the decayed matrix and the undecayed vectors share blocks)."""
    with cpu_blocking(block, threads):
        check_adamw_against_torch(seed, lr, wd)


def check_adamw_against_torch(seed, lr, wd):
    rng = np.random.default_rng(seed)
    ours = make_params(rng)
    ref = [torch.tensor(p.data.copy(), requires_grad=True) for _, p in ours]
    opt = AdamW(ours, lr=lr, weight_decay=wd, correct_bias=True, eps=1e-6)
    groups = [{"params": [t], "weight_decay": wd if decays(p) else 0.0}
              for (_, p), t in zip(ours, ref)]
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


def _old_name_rule(name: str) -> bool:
    """The rule decays() replaced: a list of name suffixes that are not decayed."""
    return not name.endswith(("bias", "LayerNorm.weight", "LayerNorm.bias", "ln.weight",
                              "ln.bias"))


def _google_rule(name: str) -> bool:
    """google-research/bert optimization.py: exclude_from_weight_decay=["LayerNorm",
    "layer_norm", "bias"], matched with re.search against the variable name."""
    return not any(s in name for s in ("LayerNorm", "layer_norm", "bias"))


@pytest.mark.parametrize("model_cls, norm", [(BertForPreTraining, "post"),
                                             (BertForPreTraining, "pre"),
                                             (BertForSequenceClassification, "post")])
def test_decay_by_shape_agrees_with_the_name_rules_on_bert(model_cls, norm):
    config = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=16, max_position_embeddings=8,
                        norm_position=norm, num_labels=3)
    named = list(model_cls(config).named_parameters())
    assert {decays(p) for _, p in named} == {True, False}
    assert [n for n, p in named if decays(p) != _old_name_rule(n)] == []
    # the reference has no pre-LN norms (named ``ln``, as Megatron-BERT's); its name rule
    # would decay their gains
    expected = ["bert.encoder.layer.0.attention.ln.weight", "bert.encoder.layer.0.ln.weight",
                "bert.encoder.layer.1.attention.ln.weight", "bert.encoder.layer.1.ln.weight",
                "bert.encoder.ln.weight"] if norm == "pre" else []
    assert [n for n, p in named if decays(p) != _google_rule(n)] == expected


class NewLayer(Module):
    """A made-up layer whose 1-d parameters have names no list would expect."""

    def __init__(self, rng):
        self.kernel = Parameter(rng.standard_normal((3, 4)))
        self.offset = Parameter(rng.standard_normal(3))    # a bias by another name
        self.gamma_weight = Parameter(rng.standard_normal(3))  # a gain ending in "weight"


def test_a_new_layers_oddly_named_vector_is_not_decayed():
    layer = NewLayer(np.random.default_rng(0))
    named = dict(layer.named_parameters())
    assert _old_name_rule("gamma_weight") and _old_name_rule("offset")  # the old rule's trap
    assert decays(named["kernel"]) and not decays(named["offset"])
    assert not decays(named["gamma_weight"])
    before = {n: p.data.copy() for n, p in named.items()}
    lr, wd = 0.1, 0.5
    AdamW(layer.named_parameters(), lr=lr, weight_decay=wd).step()  # zero grads: decay only
    np.testing.assert_array_equal(named["offset"].data, before["offset"])
    np.testing.assert_array_equal(named["gamma_weight"].data, before["gamma_weight"])
    np.testing.assert_allclose(named["kernel"].data, before["kernel"] * (1 - lr * wd),
                               rtol=1e-15)


def test_optimizer_state_round_trip_continues_identically():
    rng = np.random.default_rng(1)
    a = make_params(rng)
    b = [(n, Parameter(p.data.copy())) for n, p in make_params(np.random.default_rng(1))]
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


def test_warmup_stable_decay_schedule_at_its_boundaries():
    """Warmup 10, decay 20 of 110 steps: 0 at step 0, the peak from step 10 through the
    decay's first step 90, then peak x (1 - sqrt((s - 90) / 20)), 0 at step 110."""
    lrs = [warmup_stable_decay_schedule(s, 2.0, 10, 20, 110) for s in range(111)]
    assert lrs[0] == 0.0 and lrs[5] == 1.0 and lrs[9] == pytest.approx(1.8)
    assert lrs[10:91] == [2.0] * 81                       # stable, and the decay's first step
    assert lrs[91] == pytest.approx(2.0 * (1 - 0.05 ** 0.5))
    assert lrs[100] == pytest.approx(2.0 * (1 - 0.5 ** 0.5))
    assert lrs[109] == pytest.approx(2.0 * (1 - 0.95 ** 0.5)) and lrs[110] == 0.0
    assert all(x >= y for x, y in zip(lrs[10:], lrs[11:]))
    # a decay longer than what follows the warmup starts where the warmup ends
    assert decay_phase_start(10, 200, 110) == 10
    assert warmup_stable_decay_schedule(10, 1.0, 10, 200, 110) == 1.0
    assert warmup_stable_decay_schedule(60, 1.0, 10, 200, 110) == pytest.approx(1 - 0.5 ** 0.5)


@settings(max_examples=50, deadline=None)
@given(total=st.integers(1, 5000), more=st.integers(1, 5000), warmup=st.integers(0, 600),
       ratio=st.floats(0.01, 0.99))
def test_a_longer_wsd_run_has_the_same_rates_up_to_the_shorter_ones_decay(total, more,
                                                                        warmup, ratio):
    """What an extended run relies on: the decay starts no earlier in the longer plan, and
    every step before the shorter plan's decay has the same rate in both."""
    from minibert.pretraining.extension import decay_steps
    short = decay_phase_start(warmup, decay_steps(ratio, total), total)
    long = decay_phase_start(warmup, decay_steps(ratio, total + more), total + more)
    assert long >= short
    for s in {0, warmup // 2, max(0, short - 1), short}:    # the decay's first step too
        assert warmup_stable_decay_schedule(s, 1.0, warmup, decay_steps(ratio, total),
                                            total) == warmup_stable_decay_schedule(
            s, 1.0, warmup, decay_steps(ratio, total + more), total + more)


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
