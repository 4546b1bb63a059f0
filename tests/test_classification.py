"""BertForSequenceClassification: gradient checks (float64, hypothesis-drawn shapes, random
upstream gradient, fixed dropout masks) and parity with transformers'
BertForSequenceClassification (loss, logits and every gradient)."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import BertConfig, BertForSequenceClassification
from minibert.gradcheck import rel_error
from minibert.testing import assert_parameter_gradients, bert_configs, seeds, token_batches

@settings(max_examples=8, deadline=None)
@given(data=st.data(), num_labels=st.integers(1, 4), dropout=st.sampled_from([0.0, 0.3]),
       pooling=st.sampled_from(["cls", "mean"]), seed=seeds)
def test_gradients_random_upstream_fixed_dropout(data, num_labels, dropout, pooling, seed):
    config = data.draw(bert_configs(max_hidden=8, max_layers=1, max_positions=6,
                                    dropout=dropout, min_hidden=8))
    config = dataclasses.replace(config, num_labels=num_labels, classifier_pooling=pooling)
    batch = data.draw(token_batches(config, max_batch=3))
    rng = np.random.default_rng(seed)
    model = BertForSequenceClassification(config, seed=seed % 1000, dtype=np.float64)
    G = rng.standard_normal((batch.input_ids.shape[0], num_labels))

    def logits():  # same generator seed every call: the same dropout masks
        model.set_dropout_rng(np.random.default_rng(seed))
        return model(batch.input_ids, batch.token_type_ids, batch.attention_mask).logits

    logits()
    model.zero_grad()
    model.backward(d_logits=G)
    assert_parameter_gradients(model, lambda: float((logits() * G).sum()), rng, "upstream",
                               full=lambda n: n.startswith("classifier"))


@settings(max_examples=6, deadline=None)
@given(data=st.data(), num_labels=st.integers(1, 3), pooling=st.sampled_from(["cls", "mean"]),
       seed=seeds)
def test_gradients_of_the_loss(data, num_labels, pooling, seed):
    config = data.draw(bert_configs(max_hidden=8, max_layers=1, max_positions=6, dropout=0.2,
                                    min_hidden=8))
    config = dataclasses.replace(config, num_labels=num_labels, classifier_dropout=0.5,
                                 classifier_pooling=pooling)
    batch = data.draw(token_batches(config, max_batch=3))
    B = batch.input_ids.shape[0]
    rng = np.random.default_rng(seed)
    labels = (rng.standard_normal(B) if num_labels == 1
              else rng.integers(0, num_labels, B))
    model = BertForSequenceClassification(config, seed=seed % 1000, dtype=np.float64)

    def loss():
        model.set_dropout_rng(np.random.default_rng(seed))
        return float(model(batch.input_ids, batch.token_type_ids, batch.attention_mask,
                           labels=labels).loss)

    loss()
    model.zero_grad()
    model.backward()
    assert_parameter_gradients(model, loss, rng, "loss", full=lambda n: n.startswith("classifier"))


def test_errors_and_names():
    config = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=8, num_labels=3)
    m = BertForSequenceClassification(config)
    names = dict(m.named_parameters())
    assert names["classifier.weight"].shape == (3, 8) and names["classifier.bias"].shape == (3,)
    assert "bert.pooler.dense.weight" in names
    ids = np.ones((2, 4), dtype=np.int64)
    with pytest.raises(RuntimeError):
        m.backward()
    m.eval()(ids)
    with pytest.raises(RuntimeError, match="labels"):
        m.backward()
    with pytest.raises(ValueError, match="labels"):
        m(ids, labels=np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="labels must be in"):
        m(ids, labels=np.array([0, 3]))
    with pytest.raises(ValueError, match="num_labels"):
        BertForSequenceClassification(dataclasses.replace(config, num_labels=0))


@settings(max_examples=5, deadline=None)
@given(data=st.data(), seed=seeds)
def test_mean_pooling_reads_the_masked_mean_of_the_last_hidden_states(data, seed):
    config = data.draw(bert_configs(max_hidden=8, max_layers=2, max_positions=8, dropout=0.0,
                                    min_hidden=8))
    config = dataclasses.replace(config, classifier_pooling="mean")
    batch = data.draw(token_batches(config, max_batch=3))
    model = BertForSequenceClassification(config, seed=seed % 1000, dtype=np.float64).eval()
    assert not any("pooler" in n for n, _ in model.named_parameters())
    out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask)
    h = model.bert(batch.input_ids, batch.token_type_ids, batch.attention_mask).last_hidden_state
    m = batch.attention_mask.astype(np.float64)
    expect = (h * m[:, :, None]).sum(1) / np.maximum(m.sum(1), 1)[:, None]
    np.testing.assert_allclose(out.pooler_output, expect, rtol=1e-12, atol=1e-12)
    w, b = model.classifier.weight.data, model.classifier.bias.data
    np.testing.assert_allclose(out.logits, expect @ w.T + b, rtol=1e-12, atol=1e-12)


def test_mean_pooling_is_checked_and_not_exported(tmp_path):
    from minibert.hf import HFFormatError, config_to_hf
    with pytest.raises(ValueError, match="classifier_pooling"):
        BertConfig(classifier_pooling="max")
    config = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=8, classifier_pooling="mean")
    with pytest.raises(HFFormatError, match="classifier_pooling"):
        config_to_hf(config, "BertForSequenceClassification")


torch = None


def _hf():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


HF_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "hidden_act", "hidden_dropout_prob",
             "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
             "initializer_range", "layer_norm_eps", "pad_token_id", "num_labels")


@settings(max_examples=6, deadline=None)
@given(data=st.data(), heads=st.sampled_from([1, 2]), num_labels=st.integers(1, 4), seed=seeds)
def test_parity_with_transformers(data, heads, num_labels, seed):
    transformers = _hf()
    import torch
    config = BertConfig(vocab_size=data.draw(st.integers(20, 50)), hidden_size=4 * heads,
                        num_hidden_layers=data.draw(st.integers(1, 2)),
                        num_attention_heads=heads, intermediate_size=12,
                        max_position_embeddings=16, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, num_labels=num_labels)
    batch = data.draw(token_batches(config, max_batch=4, max_len=10))
    B = batch.input_ids.shape[0]
    rng = np.random.default_rng(seed)
    labels = rng.standard_normal(B) if num_labels == 1 else rng.integers(0, num_labels, B)

    torch.manual_seed(seed % 10_000)
    hf_config = transformers.BertConfig(**{k: getattr(config, k) for k in HF_FIELDS},
                                        attn_implementation="eager")
    hf = transformers.BertForSequenceClassification(hf_config).double().eval()
    ours = BertForSequenceClassification(config, dtype=np.float64).eval()
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})
    assert set(ours.state_dict()) == set(hf.state_dict())

    out = ours(batch.input_ids, batch.token_type_ids, batch.attention_mask, labels=labels)
    ours.zero_grad()
    ours.backward()
    ref = hf(input_ids=torch.from_numpy(batch.input_ids),
             token_type_ids=torch.from_numpy(batch.token_type_ids),
             attention_mask=torch.from_numpy(batch.attention_mask),
             labels=torch.from_numpy(labels))
    ref.loss.backward()
    assert rel_error(float(out.loss), ref.loss.item()) < 1e-10
    assert rel_error(out.logits, ref.logits.detach().numpy()) < 1e-10
    ref_params = dict(hf.named_parameters())
    bad = {n: e for n, p in ours.named_parameters()
           if not (e := rel_error(p.grad, ref_params[n].grad.numpy())) <= 1e-6}
    assert not bad, f"gradients differ from transformers: {bad}"
