"""The gradient-check tool, the public strategies, and the gradient-flow statistics."""
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import BertConfig, BertForPreTraining
from minibert.gradcheck import (PERTURBATIONS, GradcheckReport, check_module, check_tensor,
                                difference_noise, numerical_gradient, perturbed)
from minibert.gradflow import (adamw_updates, grad_flow_record, grad_flow_stats, layer_of,
                               read_grad_flow)
from minibert.nn import Linear, Module, Parameter, softmax_backward
from minibert.viz import plot_grad_flow
from minibert.nn import activations
from minibert.optim import AdamW, clip_grad_norm
from minibert.testing import (assert_module_gradients, assert_parameter_gradients,
                              attention_inputs, bert_configs, float_arrays, hidden_states,
                              layer_shapes, padding_masks, token_batches)

ROOT = Path(__file__).resolve().parents[1]


def gradcheck_cli(*args):
    return subprocess.run([sys.executable, "-m", "minibert.gradcheck", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


# -- the command line ---------------------------------------------------------------------

def test_cli_all_layers_pass_on_default_shapes():
    r = gradcheck_cli("--layer", "all")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout
    for name in ("linear.weight", "embedding.weight", "layernorm.x", "gelu.x", "gelu_new.x",
                 "softmax.scores", "attention.q", "ffn.x", "post.x", "pre.x",
                 "predictions.decoder.weight", "nsp.pooler.dense.weight",
                 "cross_entropy(eps=0.1).logits", "post:bert.embeddings.word_embeddings.weight",
                 "pre:bert.encoder.ln.weight", "pre:cls.seq_relationship.bias"):
        assert name in r.stdout, name
    assert "dir x4" in r.stdout and " full " in r.stdout  # both methods are exercised
    assert "0 failed" in r.stdout


@pytest.mark.parametrize("perturbation, layers, failing, passing", [
    ("softmax-diagonal", ["softmax", "attention"], ["softmax.scores", "attention.q"],
     ["attention.v"]),
    ("layernorm-mean", ["layernorm"], ["layernorm.x"], ["layernorm.weight"]),
    ("gelu-pdf", ["gelu"], ["gelu.x"], ["gelu_new.x"]),
    ("attention-scale", ["attention"], ["attention.q", "attention.k"], ["attention.v"]),
    ("tied-decoder", ["mlm_head"], ["predictions.decoder.weight"], ["predictions.bias"]),
])
def test_cli_perturbation_fails_and_names_the_tensor(perturbation, layers, failing, passing):
    r = gradcheck_cli("--perturb", perturbation, "--layer", *layers)
    assert r.returncode == 1, r.stdout + r.stderr
    failed_line = next(l for l in r.stdout.splitlines() if l.startswith("FAILED: "))
    failed = failed_line[len("FAILED: "):].split(", ")
    assert set(failing) <= set(failed) and not set(passing) & set(failed), r.stdout
    rows = {l.split()[0]: l for l in r.stdout.splitlines() if l.startswith("  ")}
    assert rows[failing[0]].rstrip().endswith("FAIL")


@pytest.mark.parametrize("perturbation, layer, tensor", [
    ("embedding-fancy-index", "embedding", "embedding.weight"),
    ("cross-entropy-ignored", "cross_entropy", "cross_entropy(eps=0.0).logits"),
    ("residual", "ffn", "ffn.x"),
    ("attention-scale", "encoder_layer", "pre.layer.attention.self.query.weight"),
])
def test_other_perturbations_in_process(perturbation, layer, tensor):
    from minibert.gradcheck import Shapes, run_checks
    reports = run_checks([layer], Shapes(), perturbation=perturbation)
    assert tensor in [r.name for rep in reports for r in rep.failures]
    assert all(rep.passed for rep in run_checks([layer], Shapes()))


def test_the_tied_decoder_perturbation_breaks_the_model_word_embeddings():
    from minibert.gradcheck import Shapes, run_checks
    s = Shapes(layers=1)
    failures = [r.name for rep in run_checks(["model"], s, perturbation="tied-decoder")
                for r in rep.failures]
    assert failures == ["post:bert.embeddings.word_embeddings.weight",
                        "pre:bert.embeddings.word_embeddings.weight"]


def test_perturbations_are_undone():
    for name in PERTURBATIONS:
        with perturbed(name):
            pass
    assert activations.softmax_backward is softmax_backward
    assert activations.ACTIVATIONS["gelu"][1] is activations.gelu_backward
    with pytest.raises(ValueError, match="unknown perturbation 'nope'"):
        with perturbed("nope"):
            pass


def test_cli_rejects_bad_shapes():
    r = gradcheck_cli("--hidden", "6", "--heads", "4", "--layer", "linear")
    assert r.returncode == 2 and "divisible" in r.stderr


# -- check_module on a user's own Module ----------------------------------------------------

class Scale(Module):
    """y = x * w + x^2 (elementwise, w (C,)), with a switch for a wrong backward."""

    def __init__(self, c, wrong=False):
        self.w = Parameter(np.linspace(0.5, 1.5, c))
        self.wrong = wrong

    def forward(self, x):
        self.x = x
        return x * self.w.data + x * x

    def backward(self, dout):
        self.w.grad += (dout * self.x).reshape(-1, self.x.shape[-1]).sum(0)
        return dout * (self.w.data + (1 if self.wrong else 2) * self.x)


def test_check_module_on_a_user_module():
    x = np.random.default_rng(0).standard_normal((3, 4))
    x0 = x.copy()
    report = check_module(Scale(4), [x], input_names=["x"])
    assert isinstance(report, GradcheckReport) and report.passed
    assert [r.name for r in report.rows] == ["w", "x"]
    assert all(r.method == "full" for r in report.rows)
    assert "w " in str(report) and "pass" in str(report)
    np.testing.assert_array_equal(x, x0)  # the caller's input is untouched

    bad = check_module(Scale(4, wrong=True), [x], input_names=["x"])
    assert not bad.passed and [r.name for r in bad.failures] == ["x"]
    assert "FAIL" in str(bad)
    with pytest.raises(AssertionError, match="gradient check failed for x"):
        assert_module_gradients(Scale(4, wrong=True), [x], input_names=["x"])


def test_a_zero_gradient_passes_to_the_loss_rounding_noise_and_no_further():
    """A loss that a shift of x cannot change (softmax of scores + x[0], as a key bias)
    has a true gradient of 0; with a large loss, central differences of it are rounding
    noise well above atol = 1e-8, which difference_noise admits. A wrong gradient above
    that noise still fails."""
    rng = np.random.default_rng(3)
    z, w = rng.standard_normal(64), 1e4 * rng.standard_normal(64)
    x = np.zeros(1)

    def loss():
        e = np.exp(z + x[0] - (z + x[0]).max())
        return float(w @ (e / e.sum()))

    noise = abs(numerical_gradient(loss, x, 1e-6)[0])
    assert noise > 1e-8                                 # what atol alone would refuse
    floor = difference_noise(loss(), 1e-6)
    assert floor > noise
    assert check_tensor(loss, x, np.zeros(1), "shift").result == "pass (abs)"
    assert check_tensor(loss, x, np.full(1, 3 * floor), "shift").result == "FAIL"


def test_check_tensor_results_and_parameter_assertion():
    x = np.zeros(3)
    noise = check_tensor(lambda: 0.0, x, np.full(3, 1e-12), "b")  # true gradient 0
    assert (noise.result, noise.method, noise.passed) == ("pass (abs)", "full", True)
    wrong = check_tensor(lambda: float(x.sum()), x, np.full(3, 2.0), "x", full=False,
                         directions=2)
    assert (wrong.result, wrong.method, wrong.passed) == ("FAIL", "dir x2", False)

    model, inp = Scale(4), np.random.default_rng(0).standard_normal((3, 4))
    model.forward(inp)
    model.zero_grad()
    model.backward(np.ones((3, 4)))                     # the gradient of loss below
    loss = lambda: float(model.forward(inp).sum())
    assert_parameter_gradients(model, loss, np.random.default_rng(0), "scale")
    model.w.grad[0] += 1e-3
    with pytest.raises(AssertionError, match="scale: gradient check failed for w"):
        assert_parameter_gradients(model, loss, np.random.default_rng(0), "scale")


def test_check_module_directional_and_errors():
    rng = np.random.default_rng(1)
    lin = Linear(30, 20, rng=rng, dtype=np.float64)  # weight 600 entries: directional
    report = check_module(lin, [rng.standard_normal((4, 30))], full_max_size=100, directions=3)
    methods = {r.name: r.method for r in report.rows}
    assert methods == {"weight": "dir x3", "bias": "full", "input0": "dir x3"}
    assert report.passed
    with pytest.raises(TypeError, match="float64"):
        check_module(Linear(3, 2, rng=rng), [np.zeros((1, 3))])  # float32 parameters


# -- the strategies -------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_token_batches_agree_with_their_config(data):
    config = data.draw(bert_configs(max_hidden=8, max_positions=7))
    assert config.hidden_size % config.num_attention_heads == 0
    assert 3 <= config.hidden_size <= 8
    b = data.draw(token_batches(config, max_batch=3))
    B, T = b.input_ids.shape
    assert 1 <= B <= 3 and 1 <= T <= config.max_position_embeddings
    for a in (b.token_type_ids, b.attention_mask):
        assert a.shape == (B, T) and a.dtype == np.int64
    labels = b.hf_kwargs()["labels"]
    assert labels.shape == (B, T) and labels.dtype == np.int64
    assert b.next_sentence_label.shape == (B,) and set(b.next_sentence_label) <= {0, 1}
    assert (b.attention_mask.sum(1) >= 1).all()
    assert (np.diff(b.attention_mask, axis=1) <= 0).all()  # padding only at the end
    assert ((b.input_ids == 0) == (b.attention_mask == 0)).all()
    assert (b.input_ids < config.vocab_size).all()
    assert (b.token_type_ids < config.type_vocab_size).all()
    real = labels != -100
    assert real.any() and (b.attention_mask[real] == 1).all()
    assert ((labels[real] >= 0) & (labels[real] < config.vocab_size)).all()
    assert int(b.masked_lm_weights.sum()) == int(real.sum())


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_layer_input_strategies(data):
    config = data.draw(bert_configs(max_hidden=8))
    h = data.draw(hidden_states(config, max_batch=2))
    assert h.ndim == 3 and h.shape[2] == config.hidden_size and h.dtype == np.float64
    assert h.shape[1] <= config.max_position_embeddings
    m = data.draw(padding_masks(st.integers(1, 4), 6))
    assert m.shape[1] == 6 and (m.sum(1) >= 1).all() and (np.diff(m, axis=1) <= 0).all()
    a = data.draw(attention_inputs())
    assert a.q.shape == a.k.shape == a.v.shape and a.q.shape[2] % a.num_heads == 0
    assert a.mask_add.shape == (a.q.shape[0], 1, 1, a.q.shape[1])
    assert ((a.mask_add[:, 0, 0] < 0) == (a.attention_mask == 0)).all()
    x = data.draw(float_arrays(layer_shapes(min_dims=2, max_dims=3, last=5)))
    assert 2 <= x.ndim <= 3 and x.shape[-1] == 5


# -- gradient flow --------------------------------------------------------------------------

def test_layer_names():
    assert layer_of("bert.embeddings.word_embeddings.weight") == "embeddings"
    assert layer_of("bert.encoder.layer.11.output.dense.bias") == "encoder.layer.11"
    assert layer_of("bert.encoder.ln.weight") == "encoder.ln"
    assert layer_of("bert.pooler.dense.weight") == "pooler"
    assert layer_of("cls.predictions.transform.dense.weight") == "cls.predictions"
    assert layer_of("cls.predictions.bias") == "cls.predictions"
    assert layer_of("cls.seq_relationship.weight") == "cls.seq_relationship"
    assert layer_of("weight") == "weight"


@pytest.mark.parametrize("correct_bias", [False, True])
def test_grad_flow_stats_match_direct_norms(correct_bias, tmp_path):
    config = BertConfig(
        vocab_size=20, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=6, norm_position="pre",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(config, seed=0, dtype=np.float64)
    from minibert.gradcheck import random_token_batch
    batch = random_token_batch(config, np.random.default_rng(0), 2, 6)
    opt = AdamW(model.named_parameters(), lr=1e-2, correct_bias=correct_bias)
    for _ in range(3):  # several steps so that m and v are not a single gradient
        model.zero_grad()
        model(**batch)
        model.backward()
        raw = {n: p.grad.copy() for n, p in model.named_parameters()}
        total = clip_grad_norm(model.parameters(), 0.05)
        before = {n: p.data.copy() for n, p in model.named_parameters()}
        opt.step(1e-2)
    stats = grad_flow_stats(model, opt, 1e-2, total)
    g, u, w, w_after = (defaultdict(float) for _ in range(4))
    for n, p in model.named_parameters():
        k = layer_of(n)
        g[k] += (raw[n] ** 2).sum()
        u[k] += ((p.data - before[n]) ** 2).sum()
        w[k] += (before[n] ** 2).sum()
        w_after[k] += (p.data ** 2).sum()
    assert list(stats["grad_norm"]) == ["embeddings", "encoder.layer.0", "encoder.layer.1",
                                        "encoder.ln", "pooler", "cls.predictions",
                                        "cls.seq_relationship"]
    for k in g:
        assert stats["grad_norm"][k] == pytest.approx(np.sqrt(g[k]), rel=1e-9)
        assert stats["update_ratio"][k] == pytest.approx(np.sqrt(u[k] / w[k]), rel=1e-6)
        assert stats["weight_norm"][k] == pytest.approx(np.sqrt(w_after[k]), rel=1e-12)
    updates = adamw_updates(opt, 1e-2)
    for n, p in model.named_parameters():
        np.testing.assert_allclose(updates[n], p.data - before[n], rtol=1e-7, atol=1e-12)

    # records -> metrics.jsonl -> PNG
    path = tmp_path / "metrics.jsonl"
    recs = [grad_flow_record(s, model, opt, 1e-2, total) for s in (5, 10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in
                            [{"type": "train", "step": 5}] + recs))
    assert [r["step"] for r in read_grad_flow(path)] == [5, 10]
    png = plot_grad_flow(read_grad_flow(path), tmp_path / "out" / "gf.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no grad_flow records"):
        path.write_text('{"type": "train", "step": 1}\n')
        read_grad_flow(path)


def test_train_mlm_logs_grad_flow(tmp_path):
    sys.path.insert(0, str(ROOT))
    import train_mlm
    text = (ROOT / "data" / "pretrain" / "en" / "moby_dick.txt").read_text(encoding="utf-8")
    corpus = tmp_path / "moby40.txt"
    corpus.write_text("\n\n".join(text.split("\n\n")[:40]) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    assert train_mlm.main([
        "--corpus", str(corpus), "--output-dir", str(out), "--vocab-size", "400",
        "--preset", "tiny", "--hidden-size", "32", "--num-hidden-layers", "2",
        "--max-seq-length", "32", "--batch-size", "4", "--max-steps", "6",
        "--log-every", "3", "--eval-every", "6", "--save-every", "6", "--eval-fraction", "0.1",
        "--eval-instances", "8", "--no-progress", "--log-grad-norms", "2",
        "--objective", "mlm+nsp"]) == 0
    recs = read_grad_flow(out / "metrics.jsonl")
    assert [r["step"] for r in recs] == [2, 4, 6]
    layers = ["embeddings", "encoder.layer.0", "encoder.layer.1", "pooler",
              "cls.predictions", "cls.seq_relationship"]
    for r in recs:
        assert list(r["grad_norm"]) == layers and list(r["update_ratio"]) == layers
        assert all(np.isfinite(v) and v > 0 for v in r["grad_norm"].values())
        assert all(0 < v < 1 for v in r["update_ratio"].values())
    assert plot_grad_flow(read_grad_flow(out / "metrics.jsonl"),
                          tmp_path / "gf.png").stat().st_size > 1000
