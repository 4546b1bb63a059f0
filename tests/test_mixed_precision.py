"""Mixed precision (Micikevicius et al. 2018): float16 compute with float32 master weights
and dynamic loss scaling, each part checked against float32 with a stated tolerance."""
import numpy as np
import pytest

from minibert import BertConfig
from minibert.checkpoint import load_checkpoint, save_checkpoint
from minibert.modeling import BertForPreTraining, masked_lm_from_labels
from minibert.nn import cross_entropy_backward, cross_entropy_forward, layernorm_backward
from minibert.nn import layernorm_forward, softmax_backward, softmax_forward
from minibert.optim import AdamW, DynamicLossScaler
from minibert.training import TrainingConfig, train_step

CONFIG = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16)


def batch(seed=0, B=4, T=12):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 64, (B, T))
    labels = np.full((B, T), -100)
    labels[:, 2:5] = ids[:, 2:5]
    mask = np.ones((B, T), np.int64)
    mask[0, -3:] = 0
    pos, mids, w = masked_lm_from_labels(labels, width=4)
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=np.zeros_like(ids),
                masked_lm_positions=pos, masked_lm_ids=mids, masked_lm_weights=w,
                next_sentence_label=rng.integers(0, 2, B))


class Task:
    def __init__(self, inputs):
        self.inputs = inputs

    def forward(self, model, _):
        return model(**self.inputs).loss, {}


def pair(dropout=0.0):
    cfg = BertConfig(**{**CONFIG.to_dict(), "hidden_dropout_prob": dropout,
                        "attention_probs_dropout_prob": dropout})
    full = BertForPreTraining(cfg, seed=3, dtype=np.float32)
    half = BertForPreTraining(cfg, seed=3, dtype=np.float32)
    half.load_state_dict(full.state_dict())
    return full, half.to("cpu", dtype=np.float16)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


@pytest.mark.parametrize("shape", [(3, 7, 16), (2, 50)])
def test_row_reductions_run_in_float32_for_float16_input(shape):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3 + 100).astype(np.float16)   # large mean: fp16 var fails
    w, b = rng.standard_normal(shape[-1]), rng.standard_normal(shape[-1])
    out16, c16 = layernorm_forward(x, w.astype(np.float16), b.astype(np.float16))
    out32, c32 = layernorm_forward(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32))
    assert out16.dtype == np.float16 and rel(out16, out32) < 2e-3
    g = rng.standard_normal(shape)
    dx16 = layernorm_backward(g.astype(np.float16), c16)[0]
    dx32 = layernorm_backward(g.astype(np.float32), c32)[0]
    assert dx16.dtype == np.float16 and rel(dx16, dx32) < 5e-3
    p16, s16 = softmax_forward(x)
    p32, s32 = softmax_forward(x.astype(np.float32))
    assert p16.dtype == np.float16 and rel(p16, p32) < 2e-3
    assert rel(softmax_backward(g.astype(np.float16), s16),
               softmax_backward(g.astype(np.float32), s32)) < 5e-3
    logits = x.reshape(-1, shape[-1])
    labels = rng.integers(0, shape[-1], logits.shape[0])
    l16, ce16 = cross_entropy_forward(logits, labels)
    l32, ce32 = cross_entropy_forward(logits.astype(np.float32), labels)
    assert l16.dtype == np.float32 and abs(float(l16) - float(l32)) < 1e-3 * abs(float(l32))
    d16 = cross_entropy_backward(1.0, ce16)
    assert d16.dtype == np.float16 and rel(d16, cross_entropy_backward(1.0, ce32)) < 2e-3


def test_float16_step_matches_float32_within_tolerance():
    full, half = pair()
    inputs = batch()
    cfg = TrainingConfig(max_steps=1, lr=1e-3, max_grad_norm=1e9)
    opt32 = AdamW(full.named_parameters(), lr=1e-3)
    opt16 = AdamW(half.named_parameters(), lr=1e-3)
    assert opt16.master is not None and opt16.master.dtype == np.float32
    l32, n32, f32, _ = train_step(full, opt32, Task(inputs), [None], 0, 1e-3, cfg)
    l16, n16, f16, _ = train_step(half, opt16, Task(inputs), [None], 0, 1e-3, cfg)
    assert bool(f16) and bool(f32)
    assert abs(float(l16) - float(l32)) < 5e-3 * float(l32)
    # the float32 gradient the optimizer stepped on (already unscaled) vs float32 training
    assert rel(opt16.master_grad, opt32.flat.grad) < 3e-2
    assert rel(float(n16), float(n32)) < 3e-2
    # float16 parameters are the rounded float32 master weights
    np.testing.assert_array_equal(opt16.flat.data, opt16.master.astype(np.float16))
    assert rel(opt16.master, opt32.flat.data) < 1e-3


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_an_overflow_skips_the_step_and_halves_the_scale():
    _, half = pair()
    opt = AdamW(half.named_parameters(), lr=1e-3)
    opt.scaler.scale = np.asarray(3e38, np.float32)      # any gradient overflows float16
    before = opt.master.copy()
    cfg = TrainingConfig(max_steps=1, lr=1e-3)
    loss, _, finite, _ = train_step(half, opt, Task(batch()), [None], 0, 1e-3, cfg)
    assert np.isfinite(float(loss)) and not bool(finite)
    np.testing.assert_array_equal(opt.master, before)
    assert np.all(np.isfinite(opt.m)) and np.all(np.isfinite(opt.v))
    assert float(opt.loss_scale()) == np.float32(3e38) * np.float32(0.5)


def test_scaler_grows_after_an_interval_of_good_steps_and_backs_off_on_overflow():
    s = DynamicLossScaler(np, init_scale=8.0, growth_interval=3)
    seen = []
    for ok in (True, True, True, True, False, True):
        s.update(np.asarray(ok))
        seen.append((float(s.scale), int(s.good_steps)))
    assert seen == [(8, 1), (8, 2), (16, 0), (16, 1), (8, 0), (8, 1)]
    with pytest.raises(ValueError):
        DynamicLossScaler(np, backoff_factor=1.5)


def test_float16_training_follows_float32_and_checkpoints_keep_the_master(tmp_path):
    full, half = pair()
    inputs = batch(1)
    cfg = TrainingConfig(max_steps=30, lr=3e-3, max_grad_norm=1.0)
    opt32 = AdamW(full.named_parameters(), lr=3e-3)
    opt16 = AdamW(half.named_parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        l32 = train_step(full, opt32, Task(inputs), [None], step, 3e-3, cfg)[0]
        l16 = train_step(half, opt16, Task(inputs), [None], step, 3e-3, cfg)[0]
        losses.append((float(l32), float(l16)))
    assert losses[-1][0] < 0.7 * losses[0][0]                  # it learns the batch
    assert abs(losses[-1][1] - losses[-1][0]) < 0.05 * losses[-1][0]
    save_checkpoint(tmp_path / "c.npz", half, opt16, {"step": 30})
    ck = load_checkpoint(tmp_path / "c.npz")
    _, again = pair()
    again.load_state_dict(ck["model"])
    opt = AdamW(again.named_parameters(), lr=3e-3)
    opt.load_state_dict(ck["optim"])
    np.testing.assert_array_equal(opt.master, opt16.master)   # not the float16 rounding
    assert float(opt.loss_scale()) == float(opt16.loss_scale())
