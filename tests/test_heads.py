"""BertForTokenClassification, BertForQuestionAnswering and layer freezing: gradient checks
(float64, hypothesis-drawn shapes, random upstream gradient, fixed dropout masks) through the
-100 and clamped-position paths; frozen parameters (zero grads, the others equal to the
unfrozen model's, no backward below the lowest trainable layer); parity with transformers'
BertForTokenClassification / BertForQuestionAnswering (loss, logits and every gradient) and
Hugging Face export and import of both heads."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import (BertConfig, BertForPreTraining, BertForQuestionAnswering,
                      BertForSequenceClassification, BertForTokenClassification, BertModel)
from minibert.gradcheck import rel_error
from minibert.optim import AdamW
from minibert.testing import assert_parameter_gradients, bert_configs, seeds, token_batches


def token_labels(rng, attention_mask, num_labels):
    """(B, T) labels: -100 at padding and at ~30% of real tokens, a class elsewhere; the
    first token always labelled (so the loss counts at least one token)."""
    labels = rng.integers(0, num_labels, attention_mask.shape)
    labels[(rng.random(labels.shape) < 0.3) | (attention_mask == 0)] = -100
    labels[0, 0] = rng.integers(0, num_labels)
    return labels


def span_positions(rng, attention_mask):
    """(B,) start or end positions: a real token's index, a negative one or -100 (clamped
    to 0) or one in [T, T + 3] (clamped to T: ignored), the paths of HF's loss; the first
    row's is a real token. Never a padded position, as in real data (the pad token's
    embedding row gets no gradient, as in torch, so a label there breaks a gradient check)."""
    B, T = attention_mask.shape
    pos = rng.integers(-3, attention_mask.sum(axis=1))                  # (B,) below the length
    u = rng.random(B)
    pos[u < 0.3] = T + rng.integers(0, 4, B)[u < 0.3]
    pos[u > 0.85] = -100
    pos[0] = rng.integers(0, attention_mask[0].sum())
    return pos


def small_config(data, dropout, max_layers=1):
    return data.draw(bert_configs(max_hidden=8, max_layers=max_layers, max_positions=6,
                                  dropout=dropout, min_hidden=8))


# -- gradient checks ------------------------------------------------------------------------

@settings(max_examples=8, deadline=None)
@given(data=st.data(), num_labels=st.integers(1, 4), dropout=st.sampled_from([0.0, 0.3]),
       seed=seeds)
def test_token_gradients_random_upstream_fixed_dropout(data, num_labels, dropout, seed):
    config = dataclasses.replace(small_config(data, dropout), num_labels=num_labels)
    batch = data.draw(token_batches(config, max_batch=3))
    rng = np.random.default_rng(seed)
    model = BertForTokenClassification(config, seed=seed % 1000, dtype=np.float64)
    # (B, T, K), 0 at padding: the pad token's embedding row gets no gradient (as torch)
    G = rng.standard_normal((*batch.input_ids.shape, num_labels)) * batch.attention_mask[..., None]

    def logits():  # same generator seed every call: the same dropout masks
        model.set_dropout_rng(np.random.default_rng(seed))
        return model(batch.input_ids, batch.token_type_ids, batch.attention_mask).logits

    logits()
    model.zero_grad()
    model.backward(d_logits=G)
    assert_parameter_gradients(model, lambda: float((logits() * G).sum()), rng, "upstream",
                               full=lambda n: n.startswith("classifier"))


@settings(max_examples=8, deadline=None)
@given(data=st.data(), num_labels=st.integers(2, 4), seed=seeds)
def test_token_gradients_of_the_loss_with_ignored_tokens(data, num_labels, seed):
    config = dataclasses.replace(small_config(data, 0.2), num_labels=num_labels,
                                 classifier_dropout=0.5)
    batch = data.draw(token_batches(config, max_batch=3))
    rng = np.random.default_rng(seed)
    labels = token_labels(rng, batch.attention_mask, num_labels)
    model = BertForTokenClassification(config, seed=seed % 1000, dtype=np.float64)

    def loss():
        model.set_dropout_rng(np.random.default_rng(seed))
        return 0.7 * float(model(batch.input_ids, batch.token_type_ids, batch.attention_mask,
                                 labels=labels).loss)

    loss()
    model.zero_grad()
    model.backward(dloss=0.7)
    assert_parameter_gradients(model, loss, rng, "loss", full=lambda n: n.startswith("classifier"))


@settings(max_examples=8, deadline=None)
@given(data=st.data(), dropout=st.sampled_from([0.0, 0.3]), seed=seeds)
def test_qa_gradients_random_upstream_fixed_dropout(data, dropout, seed):
    config = small_config(data, dropout)
    batch = data.draw(token_batches(config, max_batch=3))
    rng = np.random.default_rng(seed)
    model = BertForQuestionAnswering(config, seed=seed % 1000, dtype=np.float64)
    Gs, Ge = rng.standard_normal((2, *batch.input_ids.shape)) * batch.attention_mask  # (B, T)

    def f():
        model.set_dropout_rng(np.random.default_rng(seed))
        out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask)
        return float((out.start_logits * Gs).sum() + (out.end_logits * Ge).sum())

    f()
    model.zero_grad()
    model.backward(d_logits=(Gs, Ge))
    assert_parameter_gradients(model, f, rng, "upstream", full=lambda n: n.startswith("qa_"))


@settings(max_examples=8, deadline=None)
@given(data=st.data(), seed=seeds)
def test_qa_gradients_of_the_loss_with_clamped_positions(data, seed):
    config = small_config(data, 0.2)
    batch = data.draw(token_batches(config, max_batch=4))
    # the softmax over T counts padded positions (as HF), whose logits read the pad token's
    # embedding row, which gets no gradient (padding_idx, as torch): pad with another id
    ids = np.where(batch.attention_mask == 1, batch.input_ids, 1)
    rng = np.random.default_rng(seed)
    start, end = (span_positions(rng, batch.attention_mask) for _ in range(2))
    model = BertForQuestionAnswering(config, seed=seed % 1000, dtype=np.float64)

    def loss():
        model.set_dropout_rng(np.random.default_rng(seed))
        return 1.3 * float(model(ids, batch.token_type_ids, batch.attention_mask,
                                 start_positions=start, end_positions=end).loss)

    loss()
    model.zero_grad()
    model.backward(dloss=1.3)
    assert_parameter_gradients(model, loss, rng, "loss", full=lambda n: n.startswith("qa_"))


def tiny(num_labels=3, **kw):
    base = dict(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=8, max_position_embeddings=16, num_labels=num_labels,
                initializer_range=0.3)
    return BertConfig(**dict(base, **kw))


def test_loss_formulas_and_batches_with_nothing_to_count():
    """The losses are the means stated in the docstrings; a batch with nothing counted gives
    0 and zero gradients (torch gives nan there)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 30, (2, 5))
    tok = BertForTokenClassification(tiny(), dtype=np.float64).eval()
    labels = np.array([[0, -100, 2, 1, -100], [-100, -100, 1, -100, -100]])
    out = tok(ids, labels=labels)
    logp = out.logits - np.log(np.exp(out.logits).sum(-1, keepdims=True))
    rows, cols = np.nonzero(labels != -100)
    assert np.isclose(out.loss, -logp[rows, cols, labels[rows, cols]].mean(), rtol=1e-12)

    qa = BertForQuestionAnswering(tiny(2), dtype=np.float64).eval()
    out = qa(ids, start_positions=np.array([-100, 7]), end_positions=np.array([3, 5]))
    # start: -100 -> 0 counted, 7 -> T = 5 ignored; end: 3 counted, 5 = T ignored

    def nll(logits, pos):
        return -(logits[pos[0], pos[1]] - np.log(np.exp(logits[pos[0]]).sum()))
    assert np.isclose(out.loss, (nll(out.start_logits, (0, 0)) + nll(out.end_logits, (0, 3))) / 2,
                      rtol=1e-12)

    for model, kw in ((tok, dict(labels=np.full((2, 5), -100))),
                      (qa, dict(start_positions=np.array([5, 9]), end_positions=np.array([6, 5])))):
        model.zero_grad()
        out = model(ids, **kw)
        assert out.loss == 0.0
        model.backward()
        assert all(not p.grad.any() for p in model.parameters())


def test_errors_names_and_shapes():
    config = tiny()
    tok = BertForTokenClassification(config)
    names = dict(tok.named_parameters())
    assert names["classifier.weight"].shape == (3, 8) and names["classifier.bias"].shape == (3,)
    assert not any("pooler" in n for n in names)
    ids = np.ones((2, 4), dtype=np.int64)
    with pytest.raises(RuntimeError, match="preceding forward"):
        tok.backward()
    assert tok.eval()(ids).logits.shape == (2, 4, 3)
    with pytest.raises(RuntimeError, match="labels"):
        tok.backward()
    with pytest.raises(ValueError, match="d_logits"):
        tok.backward(d_logits=np.zeros((2, 4, 2)))
    with pytest.raises(ValueError, match="labels: expected shape"):
        tok(ids, labels=np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError, match="labels must be in"):
        tok(ids, labels=np.array([[0, 1, 2, 3], [0, 0, 0, 0]]))
    with pytest.raises(ValueError, match="num_labels"):
        BertForTokenClassification(dataclasses.replace(config, num_labels=0))

    with pytest.raises(ValueError, match="num_labels must be 2"):
        BertForQuestionAnswering(config)
    qa = BertForQuestionAnswering(dataclasses.replace(config, num_labels=2)).eval()
    names = dict(qa.named_parameters())
    assert names["qa_outputs.weight"].shape == (2, 8) and names["qa_outputs.bias"].shape == (2,)
    assert not any("pooler" in n for n in names)
    out = qa(ids)
    assert out.loss is None and out.start_logits.shape == out.end_logits.shape == (2, 4)
    with pytest.raises(RuntimeError, match="positions"):
        qa.backward()
    with pytest.raises(ValueError, match="both or neither"):
        qa.backward(d_logits=(np.zeros((2, 4)), None))
    with pytest.raises(ValueError, match="d_end_logits: expected shape"):
        qa.backward(d_logits=(np.zeros((2, 4)), np.zeros((2, 3))))
    with pytest.raises(ValueError, match="both or neither"):
        qa(ids, start_positions=np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError, match="end_positions: expected shape"):
        qa(ids, start_positions=np.zeros(2, dtype=np.int64),
           end_positions=np.zeros((2, 1), dtype=np.int64))


def test_one_backward_signature_whose_upstream_gradient_adds_to_the_loss():
    """backward(dloss=1.0, *, d_logits=None) on every head: the gradient of
    dloss * loss + sum(logits * d_logits) is the sum of the two parts' gradients."""
    import inspect
    sigs = {str(inspect.signature(cls.backward)) for cls in (
        BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering)}
    assert sigs == {"(self, dloss=1.0, *, d_logits=None) -> 'None'"}
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 30, (2, 5))
    cases = [(BertForSequenceClassification(tiny(), dtype=np.float64),
              dict(labels=np.array([0, 2])), rng.standard_normal((2, 3))),
             (BertForTokenClassification(tiny(), dtype=np.float64),
              dict(labels=rng.integers(0, 3, (2, 5))), rng.standard_normal((2, 5, 3))),
             (BertForQuestionAnswering(tiny(2), dtype=np.float64),
              dict(start_positions=np.array([1, 2]), end_positions=np.array([3, 2])),
              tuple(rng.standard_normal((2, 2, 5))))]
    for model, targets, G in cases:
        model.eval()

        def grads(targets, **kw):
            model(ids, **targets)
            model.zero_grad()
            model.backward(**kw)
            return {n: p.grad.copy() for n, p in model.named_parameters()}
        loss_part = grads(targets, dloss=0.7)
        upstream_part = grads({}, d_logits=G)
        both = grads(targets, dloss=0.7, d_logits=G)
        for n, g in both.items():
            np.testing.assert_allclose(g, loss_part[n] + upstream_part[n], rtol=1e-10,
                                       atol=1e-14, err_msg=f"{type(model).__name__} {n}")
        model(ids, **targets)
        with pytest.raises(ValueError, match="dloss: expected a float or a 0-d array"):
            model.backward(np.ones(2))                  # a logit gradient given as dloss
    with pytest.raises(ValueError, match="the pair"):
        cases[2][0].backward(d_logits=np.zeros((2, 5, 2)))


# -- freezing -------------------------------------------------------------------------------

def _run(model, batch, rng):
    """forward with labels and backward on ``model`` (any head); dropout masks fixed."""
    B = batch.input_ids.shape[0]
    inputs = (batch.input_ids, batch.token_type_ids, batch.attention_mask)
    model.set_dropout_rng(np.random.default_rng(1))
    if isinstance(model, BertForTokenClassification):
        model(*inputs, labels=token_labels(rng, batch.attention_mask, model.num_labels))
    elif isinstance(model, BertForQuestionAnswering):
        model(*inputs, start_positions=span_positions(rng, batch.attention_mask),
              end_positions=span_positions(rng, batch.attention_mask))
    elif isinstance(model, BertForSequenceClassification):
        model(*inputs, labels=rng.integers(0, 2, B))
    else:
        model(**batch.model_inputs())
    model.zero_grad()
    model.backward()


HEADS = (BertForTokenClassification, BertForQuestionAnswering, BertForSequenceClassification,
         BertForPreTraining)


@settings(max_examples=12, deadline=None)
@given(data=st.data(), cls=st.sampled_from(HEADS), embeddings=st.booleans(), seed=seeds)
def test_frozen_parameters_get_no_gradient_and_no_backward(data, cls, embeddings, seed):
    config = small_config(data, 0.2, max_layers=3)
    L = config.num_hidden_layers
    layers = data.draw(st.integers(0, L))
    batch = data.draw(token_batches(config, max_batch=3))
    full = cls(config, seed=seed % 1000, dtype=np.float64)
    frozen = cls(config, seed=seed % 1000, dtype=np.float64).freeze(embeddings, layers)
    # count the backward calls of every stage (embeddings, layer 0, ...) of the frozen model
    stages = [frozen.bert.embeddings, *frozen.bert.encoder.layer]
    ran = []
    for i, m in enumerate(stages):
        m.backward = (lambda i, f: lambda *a: (ran.append(i), f(*a))[1])(i, m.backward)

    _run(full, batch, np.random.default_rng(seed))
    _run(frozen, batch, np.random.default_rng(seed))

    # below the lowest trainable stage nothing runs; above it everything does
    first = 0 if not embeddings else layers + 1
    assert sorted(ran) == list(range(first, L + 1))
    reference = dict(full.named_parameters())
    frozen_names = {n for n, _ in frozen.named_parameters()} - {
        n for n, _ in frozen.named_trainable_parameters()}
    expected = {n for n in reference if (embeddings and n.startswith("bert.embeddings."))
                or any(n.startswith(f"bert.encoder.layer.{i}.") for i in range(layers))}
    assert frozen_names == expected
    for n, p in frozen.named_parameters():
        if n in frozen_names:  # the tied MLM decoder adds nothing to frozen word embeddings
            assert not p.grad.any(), n
        else:
            np.testing.assert_array_equal(p.grad, reference[n].grad, err_msg=n)


def test_freeze_arguments_unfreeze_and_a_bare_encoder():
    model = BertForTokenClassification(tiny())
    n_all = len(model.parameters())
    for bad in (-1, 3, 1.0, True, "1"):
        with pytest.raises(ValueError, match=r"layers must be an int in \[0, 2\]"):
            model.freeze(layers=bad)
    names = [n for n, _ in model.freeze(embeddings=True, layers=np.int64(2))
             .named_trainable_parameters()]
    assert names == ["classifier.weight", "classifier.bias"]
    assert len(model.freeze().trainable_parameters()) == n_all
    enc = BertModel(tiny()).freeze(layers=1)
    assert all(n.startswith(("encoder.layer.1.", "pooler.", "embeddings."))
               for n, _ in enc.named_trainable_parameters())


def test_adamw_over_the_trainable_parameters_leaves_frozen_ones_alone():
    model = BertForTokenClassification(tiny(), seed=1).freeze(embeddings=True, layers=1)
    before = model.state_dict()
    opt = AdamW(model.named_trainable_parameters(), lr=1e-2)
    assert opt.flat.data.size == sum(p.data.size for p in model.trainable_parameters())
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 30, (2, 6))
    model.set_dropout_rng(np.random.default_rng(0))
    model(ids, labels=rng.integers(0, 3, (2, 6)))
    opt.zero_grad()
    model.backward()
    opt.step()
    after = model.state_dict()
    trainable = {n for n, _ in model.named_trainable_parameters()}
    for n in before:
        assert np.array_equal(before[n], after[n]) == (n not in trainable), n


# -- parity with transformers ---------------------------------------------------------------

HF_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "hidden_act", "hidden_dropout_prob",
             "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
             "initializer_range", "layer_norm_eps", "pad_token_id", "num_labels")


def _hf():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


def compare_with_transformers(cls, config, batch, seed, dtype=np.float64):
    """Same weights in ours and HF's ``cls``; padding in the batch, -100 token labels or
    clamped span positions. Returns the errors of the loss, the logits, and the worst
    parameter gradient (with its name). In float32 a gradient's error is relative to the
    largest gradient of the model, as round-off is: some true gradients are 0 (a key bias,
    the QA bias, whose softmax rows sum to 0) and hold noise only."""
    transformers = _hf()
    import torch
    torch.manual_seed(seed)
    hf_config = transformers.BertConfig(**{k: getattr(config, k) for k in HF_FIELDS},
                                        attn_implementation="eager")
    hf = getattr(transformers, cls.__name__)(hf_config).to(getattr(torch, np.dtype(dtype).name))
    hf.eval()
    ours = cls(config, dtype=dtype).eval()
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})
    assert set(ours.state_dict()) == set(hf.state_dict())

    rng = np.random.default_rng(seed)
    if cls is BertForTokenClassification:
        targets = dict(labels=token_labels(rng, batch.attention_mask, config.num_labels))
    else:
        targets = dict(start_positions=span_positions(rng, batch.attention_mask),
                       end_positions=span_positions(rng, batch.attention_mask))
    inputs = dict(input_ids=batch.input_ids, token_type_ids=batch.token_type_ids,
                  attention_mask=batch.attention_mask)
    out = ours(**inputs, **targets)
    ours.zero_grad()
    ours.backward()
    ref = hf(**{k: torch.from_numpy(v) for k, v in {**inputs, **targets}.items()})
    ref.loss.backward()

    names = ["logits"] if cls is BertForTokenClassification else ["start_logits", "end_logits"]
    logits_err = max(rel_error(getattr(out, n), getattr(ref, n).detach().numpy()) for n in names)
    ref_grads = {n: p.grad.numpy() for n, p in hf.named_parameters()}
    floor = 1e-8 if dtype == np.float64 else max(np.abs(g).max() for g in ref_grads.values())
    grads = {n: rel_error(p.grad, ref_grads[n], floor) for n, p in ours.named_parameters()}
    worst = max(grads, key=grads.get)
    return rel_error(float(out.loss), ref.loss.item()), logits_err, (grads[worst], worst)


def parity_config(data, heads, num_labels):
    return BertConfig(vocab_size=data.draw(st.integers(20, 50)), hidden_size=4 * heads,
                      num_hidden_layers=data.draw(st.integers(1, 2)), num_attention_heads=heads,
                      intermediate_size=12, max_position_embeddings=16, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, num_labels=num_labels)


@settings(max_examples=6, deadline=None)
@given(data=st.data(), heads=st.sampled_from([1, 2]), num_labels=st.integers(1, 5), seed=seeds)
def test_token_classification_matches_transformers(data, heads, num_labels, seed):
    config = parity_config(data, heads, num_labels)
    batch = data.draw(token_batches(config, max_batch=4, max_len=10))
    loss, logits, (grad, name) = compare_with_transformers(BertForTokenClassification, config,
                                                           batch, seed % 10_000)
    assert loss < 1e-10 and logits < 1e-10
    assert grad <= 1e-6, f"gradient of {name} differs from transformers: {grad:.2e}"


@settings(max_examples=6, deadline=None)
@given(data=st.data(), heads=st.sampled_from([1, 2]), seed=seeds)
def test_question_answering_matches_transformers(data, heads, seed):
    config = parity_config(data, heads, 2)
    batch = data.draw(token_batches(config, max_batch=4, max_len=10))
    loss, logits, (grad, name) = compare_with_transformers(BertForQuestionAnswering, config,
                                                           batch, seed % 10_000)
    assert loss < 1e-10 and logits < 1e-10
    assert grad <= 1e-6, f"gradient of {name} differs from transformers: {grad:.2e}"


@pytest.mark.parametrize("cls", [BertForTokenClassification, BertForQuestionAnswering])
def test_float32_matches_transformers_to_round_off(cls):
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=16,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        num_labels=2 if cls is BertForQuestionAnswering else 5)
    from minibert.gradcheck import random_token_batch
    from minibert.pretraining import PretrainingBatch
    batch = PretrainingBatch(**random_token_batch(config, np.random.default_rng(4), 4, 12))
    loss, logits, (grad, name) = compare_with_transformers(cls, config, batch, 4, np.float32)
    assert loss < 1e-5 and logits < 1e-5
    assert grad <= 1e-5, f"gradient of {name} differs from transformers: {grad:.2e}"


@pytest.mark.parametrize("cls, auto", [
    (BertForTokenClassification, "AutoModelForTokenClassification"),
    (BertForQuestionAnswering, "AutoModelForQuestionAnswering")])
def test_export_and_import_through_transformers(tmp_path, cls, auto):
    transformers = _hf()
    import torch
    from minibert.hf import load_hf_directory, load_pretrained_weights, save_hf_directory
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                               + [f"w{i}" for i in range(25)]) + "\n", encoding="utf-8")
    model = cls(tiny(2), seed=5).eval()
    out_dir = save_hf_directory(model, tmp_path / "hf", vocab)
    ref = getattr(transformers, auto).from_pretrained(out_dir, attn_implementation="eager").eval()
    assert type(ref).__name__ == cls.__name__
    rng = np.random.default_rng(0)
    mask = (np.arange(7)[None] < np.array([7, 3])[:, None]).astype(np.int64)
    ids = rng.integers(5, 30, (2, 7)) * mask
    ours = model(ids, attention_mask=mask)
    with torch.no_grad():
        theirs = ref(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    for name in ("logits", "start_logits", "end_logits"):
        if hasattr(ours, name):
            np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name).numpy(),
                                       rtol=0, atol=1e-5)
    ck = load_hf_directory(out_dir)
    again = cls(ck.config, seed=9).eval()
    report = load_pretrained_weights(again, ck.state)
    assert report["new"] == [] and report["unused"] == []
    for k, v in again.state_dict().items():
        np.testing.assert_array_equal(v, model.state_dict()[k], err_msg=k)
