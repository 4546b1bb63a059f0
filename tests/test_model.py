"""Whole-model gradient checks (float64) and the model's properties and contracts."""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import BertConfig, BertForPreTraining, BertModel
from minibert.checkpoint import load_checkpoint, rename_old_pre_ln_keys, save_checkpoint
from minibert.modeling import BertEncoder, labels_from_masked_lm, masked_lm_from_labels
from minibert.optim import AdamW
from minibert.testing import assert_parameter_gradients, bert_configs, seeds, token_batches

@settings(max_examples=12, deadline=None)
@given(data=st.data(), seed=seeds)
def test_bert_model_gradients_random_upstream(data, seed):
    config = data.draw(bert_configs(max_hidden=8, max_positions=6))
    batch = data.draw(token_batches(config, max_batch=2))
    rng = np.random.default_rng(seed)
    model = BertModel(config, seed=seed % 1000, dtype=np.float64)
    out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask)
    G_h = rng.standard_normal(out.last_hidden_state.shape)
    G_h *= batch.attention_mask[..., None]  # a loss that ignores padded positions
    G_p = rng.standard_normal(out.pooler_output.shape)
    model.zero_grad()
    model.backward(G_h, G_p)

    def loss():
        o = model(batch.input_ids, batch.token_type_ids, batch.attention_mask)
        return float((o.last_hidden_state * G_h).sum() + (o.pooler_output * G_p).sum())

    assert_parameter_gradients(model, loss, rng, "BertModel")


@settings(max_examples=12, deadline=None)
@given(data=st.data(), dropout=st.sampled_from([0.0, 0.2]), smoothing=st.sampled_from([0.0, 0.1]),
       seed=seeds)
def test_pretraining_model_gradients_with_fixed_dropout(data, dropout, smoothing, seed):
    config = data.draw(bert_configs(max_hidden=8, max_positions=6, dropout=dropout,
                                    min_hidden=8))
    batch = data.draw(token_batches(config, max_batch=2))
    model = BertForPreTraining(config, seed=seed % 1000, dtype=np.float64,
                               label_smoothing=smoothing)

    def loss():  # the same generator seed every call: the same dropout masks
        model.set_dropout_rng(np.random.default_rng(seed))
        return float(model(**batch.model_inputs()).loss)

    loss()
    model.zero_grad()
    model.backward()
    assert_parameter_gradients(model, loss, np.random.default_rng(seed), "BertForPreTraining")


def tiny_config(**kw):
    base = dict(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=16, max_position_embeddings=10, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0)
    base.update(kw)
    return BertConfig(**base)


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_padding_changes_nothing_at_real_positions(data):
    config = data.draw(bert_configs(max_hidden=8, max_positions=8))
    batch = data.draw(token_batches(config, max_batch=3))
    model = BertModel(config, dtype=np.float64).eval()
    h = model(batch.input_ids, batch.token_type_ids, batch.attention_mask).last_hidden_state
    rng = np.random.default_rng(0)
    pad = batch.attention_mask == 0
    ids2 = np.where(pad, rng.integers(0, config.vocab_size, pad.shape), batch.input_ids)
    h2 = model(ids2, batch.token_type_ids, batch.attention_mask).last_hidden_state
    real = ~pad
    np.testing.assert_allclose(h2[real], h[real], rtol=1e-10, atol=1e-12)
    # and each padded row equals the same row run alone without its padding
    for b in range(batch.input_ids.shape[0]):
        n = int(batch.attention_mask[b].sum())
        alone = model(batch.input_ids[b:b + 1, :n], batch.token_type_ids[b:b + 1, :n]).last_hidden_state
        np.testing.assert_allclose(alone[0], h[b, :n], rtol=1e-9, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(config=bert_configs(max_hidden=8), t=st.integers(2, 6), seed=seeds)
def test_encoder_is_permutation_equivariant(config, t, seed):
    """Without position embeddings, self-attention commutes with permuting positions."""
    rng = np.random.default_rng(seed)
    enc = BertEncoder(config, np.random.default_rng(seed), np.float64).eval()
    x = rng.standard_normal((2, t, config.hidden_size))
    mask = np.ones((2, t), dtype=np.int64)
    mask[1, rng.integers(1, t):] = 0
    mask_add = (1 - mask[:, None, None, :]) * -1e9
    perm = rng.permutation(t)
    y = enc(x, mask_add)
    y_perm = enc(x[:, perm], mask_add[..., perm])
    np.testing.assert_allclose(y_perm, y[:, perm], rtol=1e-9, atol=1e-10)


def held_arrays(model) -> list[tuple[str, str]]:
    """(class, attribute) of every module attribute that holds an array, searched through
    tuples, lists and dicts, except parameters and the fixed ``*_buffer`` arrays."""
    def holds(v):
        if isinstance(v, np.ndarray):
            return True
        if isinstance(v, (tuple, list)):
            return any(holds(x) for x in v)
        return isinstance(v, dict) and any(holds(x) for x in v.values())
    return [(type(m).__name__, name) for m in model.modules() for name, v in vars(m).items()
            if not name.endswith("_buffer") and holds(v)]


@settings(max_examples=10, deadline=None)
@given(data=st.data(), seed=seeds)
def test_release_caches_drops_every_activation_and_a_backward_after_it_raises(data, seed):
    config = data.draw(bert_configs(max_layers=2))
    batch = data.draw(token_batches(config))
    kw = batch.model_inputs()
    model = BertForPreTraining(config, seed=seed, dtype=np.float64).eval()
    assert held_arrays(model) == []
    model(**kw, output_attentions=True)
    assert held_arrays(model)                                     # the caches of a forward
    assert model.release_caches() is model
    assert held_arrays(model) == []                               # an inference forward
    with pytest.raises(RuntimeError, match="preceding forward"):
        model.backward()
    bert = model.bert
    bert(batch.input_ids, batch.token_type_ids, batch.attention_mask,
         output_attentions=True, output_hidden_states=True)
    assert ("BertEncoder", "hidden_states") in held_arrays(bert)
    assert held_arrays(bert.release_caches()) == []
    with pytest.raises(RuntimeError, match="without a preceding forward"):
        bert.backward(np.ones((*batch.input_ids.shape, config.hidden_size)))
    # parameters and buffers stay: a training step after it is a training step
    fresh = BertForPreTraining(config, seed=seed, dtype=np.float64).eval()
    for m in (model, fresh):
        m.zero_grad()
        m(**kw)
        m.backward()
    for (name, p), (_, q) in zip(model.named_parameters(), fresh.named_parameters()):
        np.testing.assert_array_equal(p.grad, q.grad, err_msg=name)


def test_take_cache_hands_the_forward_cache_to_one_backward():
    from minibert.nn import Module

    class Twice(Module):
        cache_attributes = ("_cache", "_other")

        def forward(self, x):
            self._cache, self._other = x, -x
            return 2 * x

    m = Twice()
    with pytest.raises(RuntimeError, match="needs a preceding forward"):
        m.take_cache()                                            # no forward yet
    x = np.arange(3.0)
    m(x)
    assert m.take_cache() is x and m._cache is None               # taken once
    with pytest.raises(RuntimeError, match="needs a preceding forward"):
        m.take_cache()
    np.testing.assert_array_equal(m.take_cache("_other"), -x)     # another cache attribute
    m(x)
    m.release_caches()
    with pytest.raises(RuntimeError, match="needs a preceding forward"):
        m.take_cache("_other")


@settings(max_examples=15, deadline=None)
@given(data=st.data(), seed=seeds)
def test_output_hidden_states_are_the_embeddings_and_every_layers_output(data, seed):
    from minibert.nn import extended_attention_mask
    config = data.draw(bert_configs(max_layers=3))
    batch = data.draw(token_batches(config))
    ids, types, mask = batch.input_ids, batch.token_type_ids, batch.attention_mask
    model = BertModel(config, seed=seed, dtype=np.float64).eval()
    out = model(ids, types, mask, output_hidden_states=True)
    assert isinstance(out.hidden_states, tuple)
    assert len(out.hidden_states) == config.num_hidden_layers + 1
    want = [model.embeddings(ids, types)]                         # (B, T, C)
    mask_add = extended_attention_mask(mask, want[0].dtype)
    for layer in model.encoder.layer:
        want.append(layer(want[-1], mask_add))                    # each layer's output
    for i, (got, w) in enumerate(zip(out.hidden_states, want)):
        assert got.shape == (*ids.shape, config.hidden_size)
        np.testing.assert_array_equal(got, w, err_msg=f"hidden_states[{i}]")
    last = model.encoder.ln(want[-1]) if config.norm_position == "pre" else want[-1]
    np.testing.assert_array_equal(out.last_hidden_state, last)
    # asking for them changes neither the outputs nor the gradients
    rng = np.random.default_rng(seed)
    d_last = rng.standard_normal(out.last_hidden_state.shape)
    grads = []
    for flag in (True, False):
        model.zero_grad()
        o = model(ids, types, mask, output_hidden_states=flag)
        assert (o.hidden_states is None) == (not flag)
        np.testing.assert_array_equal(o.last_hidden_state, out.last_hidden_state)
        model.backward(d_last)
        grads.append([p.grad.copy() for p in model.parameters()])
    for a, b in zip(*grads):
        np.testing.assert_array_equal(a, b)


def test_output_hidden_states_match_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = BertConfig(vocab_size=30, hidden_size=12, num_hidden_layers=3,
                        num_attention_heads=3, intermediate_size=20, max_position_embeddings=10)
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(
        **{k: getattr(config, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                           "num_attention_heads", "intermediate_size",
                                           "max_position_embeddings")},
        attn_implementation="eager")).double().eval()
    ours = BertModel(config, dtype=np.float64).eval()
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 30, (2, 7))
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    ref = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
             output_hidden_states=True).hidden_states
    got = ours(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert len(got) == len(ref) == 4
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_layernorm_output_is_normalised():
    from minibert.nn import layernorm_forward
    x = np.random.default_rng(0).standard_normal((4, 7, 16)) * 5 + 3
    out, _ = layernorm_forward(x, np.ones(16), np.zeros(16))
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(out.var(-1), 1, rtol=1e-9)


def test_softmax_rows_sum_to_one_even_for_large_scores():
    from minibert.nn import softmax_forward
    x = np.random.default_rng(0).standard_normal((5, 9)) * 1e4
    p, _ = softmax_forward(x)
    assert np.all(np.isfinite(p)) and np.all(p >= 0)
    np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-12)


def test_state_dict_names_tying_and_round_trip():
    model = BertForPreTraining(tiny_config(), seed=1)
    sd = model.state_dict()
    assert "cls.predictions.decoder.weight" in sd and "cls.predictions.decoder.bias" in sd
    names = [n for n, _ in model.named_parameters()]
    assert "cls.predictions.decoder.weight" not in names  # tied: listed once
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    other = BertForPreTraining(tiny_config(), seed=2)
    other.load_state_dict(sd)
    for k, v in other.state_dict().items():
        np.testing.assert_array_equal(v, sd[k])


def test_layernorm_names_say_what_they_normalise():
    """Post-LN keeps HF BERT's names; pre-LN names its norms as Megatron-BERT: ``ln`` of
    the attention sub-layer, of the layer (before the feed-forward block) and of the
    encoder (after the last layer)."""
    def norms(norm):
        return [n for n, _ in BertModel(tiny_config(norm_position=norm)).named_parameters()
                if n.endswith(("LayerNorm.weight", "ln.weight"))]
    assert norms("post") == ["embeddings.LayerNorm.weight",
                             "encoder.layer.0.attention.output.LayerNorm.weight",
                             "encoder.layer.0.output.LayerNorm.weight",
                             "encoder.layer.1.attention.output.LayerNorm.weight",
                             "encoder.layer.1.output.LayerNorm.weight"]
    assert norms("pre") == ["embeddings.LayerNorm.weight",
                            "encoder.layer.0.attention.ln.weight", "encoder.layer.0.ln.weight",
                            "encoder.layer.1.attention.ln.weight", "encoder.layer.1.ln.weight",
                            "encoder.ln.weight"]


def _old_pre_ln_name(key: str) -> str:
    """A pre-LN key as minibert wrote it before the Megatron-BERT names (by hand, the
    inverse of rename_old_pre_ln_keys)."""
    return re.sub(r"encoder\.layer\.(\d+)\.(attention\.)?ln\.",
                  r"encoder.layer.\1.\2output.LayerNorm.", key)


def test_rename_old_pre_ln_keys():
    old = {"bert.encoder.layer.3.attention.output.LayerNorm.weight": 1,
           "m.bert.encoder.layer.0.output.LayerNorm.bias": 2,
           "encoder.layer.11.output.LayerNorm.weight": 3,             # a bare BertModel
           "bert.encoder.layer.0.output.dense.weight": 4, "bert.encoder.ln.bias": 5,
           "bert.embeddings.LayerNorm.weight": 6, "cls.predictions.transform.LayerNorm.bias": 7,
           "bert.encoder.layer.1.ln.weight": 8}                       # already new
    assert rename_old_pre_ln_keys(old) == {
        "bert.encoder.layer.3.attention.ln.weight": 1, "m.bert.encoder.layer.0.ln.bias": 2,
        "encoder.layer.11.ln.weight": 3, "bert.encoder.layer.0.output.dense.weight": 4,
        "bert.encoder.ln.bias": 5, "bert.embeddings.LayerNorm.weight": 6,
        "cls.predictions.transform.LayerNorm.bias": 7, "bert.encoder.layer.1.ln.weight": 8}


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_checkpoints_with_the_old_pre_ln_names_load_bit_exactly(tmp_path, norm):
    """A checkpoint written before the pre-LN rename (model and optimizer state under the
    old names) loads into today's model and optimizer bit for bit; post-LN checkpoints,
    whose names did not change, load as they always did."""
    model = BertForPreTraining(tiny_config(norm_position=norm), seed=3)
    opt = AdamW(model.named_parameters(), lr=1e-2)
    ids = np.random.default_rng(0).integers(1, 30, (2, 6))
    model(ids, masked_lm_ids=ids)
    model.backward()
    opt.step()
    save_checkpoint(tmp_path / "new.npz", model, opt, {"step": 1})
    with np.load(tmp_path / "new.npz") as z:
        arrays = {k: z[k] for k in z.files}
    old = {(_old_pre_ln_name(k) if norm == "pre" else k): v for k, v in arrays.items()}
    assert (old == arrays) == (norm == "post") and len(old) == len(arrays)
    np.savez(tmp_path / "old.npz", **old)

    c = load_checkpoint(tmp_path / "old.npz")
    again = BertForPreTraining(c["config"], seed=9)
    again.load_state_dict(c["model"])
    for k, v in model.state_dict().items():
        assert again.state_dict()[k].dtype == v.dtype
        np.testing.assert_array_equal(again.state_dict()[k], v, err_msg=k)
    opt_again = AdamW(again.named_parameters(), lr=1e-2)
    opt_again.load_state_dict(c["optim"])
    for k, v in opt.state_dict().items():
        np.testing.assert_array_equal(opt_again.state_dict()[k], v, err_msg=k)
    np.testing.assert_array_equal(again.eval()(ids).prediction_logits,
                                  model.eval()(ids).prediction_logits)


def test_load_state_dict_errors_name_the_key():
    model = BertForPreTraining(tiny_config())
    sd = model.state_dict()
    bad = dict(sd)
    del bad["bert.pooler.dense.bias"]
    bad["bert.extra.weight"] = np.zeros(3)
    with pytest.raises(KeyError, match=r"missing keys \['bert.pooler.dense.bias'\].*"
                                       r"unexpected keys \['bert.extra.weight'\]"):
        model.load_state_dict(bad)
    bad = dict(sd)
    bad["bert.pooler.dense.weight"] = np.zeros((8, 7))
    with pytest.raises(ValueError, match=r"bert.pooler.dense.weight.*expected shape \(8, 8\), "
                                         r"got \(8, 7\)"):
        model.load_state_dict(bad)


def test_config_errors():
    with pytest.raises(ValueError, match=r"hidden_size \(10\) must be divisible by "
                                         r"num_attention_heads \(4\)"):
        BertConfig(hidden_size=10, num_attention_heads=4)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        BertConfig.from_preset("huge")
    with pytest.raises(ValueError, match="hidden_act"):
        BertConfig(hidden_act="swish")


def test_input_errors():
    model = BertForPreTraining(tiny_config())
    with pytest.raises(ValueError, match="sequence length 11 exceeds max_position_embeddings 10"):
        model(np.zeros((1, 11), dtype=np.int64))
    with pytest.raises(ValueError, match=r"input_ids: values must be in \[0, 30\)"):
        model(np.full((1, 3), 30))
    with pytest.raises(ValueError, match="integer"):
        model(np.zeros((1, 3)))
    with pytest.raises(RuntimeError, match="backward"):
        BertForPreTraining(tiny_config()).backward()


def test_presets_follow_turc_et_al():
    c = BertConfig.from_preset("mini", vocab_size=100)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == \
        (4, 256, 4, 1024)


def test_gradients_accumulate_until_zero_grad():
    model = BertForPreTraining(tiny_config(), dtype=np.float64)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 30, (2, 5))
    labels = np.where(rng.random((2, 5)) < 0.5, ids, -100)
    labels[0, 0] = ids[0, 0]
    positions, mlm_ids, weights = masked_lm_from_labels(labels)
    kw = dict(masked_lm_positions=positions, masked_lm_ids=mlm_ids, masked_lm_weights=weights,
              next_sentence_label=np.array([0, 1]))
    model(ids, **kw)
    model.backward()
    once = {n: p.grad.copy() for n, p in model.named_parameters()}
    model(ids, **kw)
    model.backward()
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, 2 * once[n], rtol=1e-12, atol=1e-15)
    model.zero_grad()
    assert all(not p.grad.any() for p in model.parameters())


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 4), T=st.integers(1, 9), seed=seeds)
def test_masked_lm_from_labels_round_trip(B, T, seed):
    rng = np.random.default_rng(seed)
    labels = np.where(rng.random((B, T)) < 0.4, rng.integers(0, 50, (B, T)), -100)
    positions, ids, weights = masked_lm_from_labels(labels)
    assert positions.shape == ids.shape == weights.shape == (B, int((labels != -100).sum(1).max()))
    assert labels_from_masked_lm(positions, ids, weights, T).tolist() == labels.tolist()
    assert np.all(np.diff(np.where(weights > 0, positions, T), axis=1) >= 0)  # increasing


def test_fixed_shape_mlm_loss_equals_dense_labels_and_padding_slots_change_nothing():
    model = BertForPreTraining(tiny_config(), dtype=np.float64)
    rng = np.random.default_rng(3)
    ids = rng.integers(1, 30, (3, 6))
    labels = np.where(rng.random((3, 6)) < 0.4, ids, -100)
    labels[0, 1] = ids[0, 1]
    narrow = masked_lm_from_labels(labels)
    wide = masked_lm_from_labels(labels, width=6)          # more padding slots (position 0)
    outs = []
    for positions, mlm_ids, weights in (narrow, wide):
        out = model(ids, masked_lm_positions=positions, masked_lm_ids=mlm_ids,
                    masked_lm_weights=weights)
        model.zero_grad()
        model.backward()
        outs.append((float(out.loss), {n: p.grad.copy() for n, p in model.named_parameters()}))
        assert out.prediction_logits.shape == (3, positions.shape[1], 30)
    # the loss is the mean over real slots: a direct computation from full logits
    full = model(ids).prediction_logits                                   # (B, T, V)
    logp = full - np.log(np.exp(full).sum(-1, keepdims=True))
    b, t = np.nonzero(labels != -100)
    assert abs(outs[0][0] + logp[b, t, labels[b, t]].mean()) < 1e-12
    assert abs(outs[0][0] - outs[1][0]) < 1e-12
    for n, g in outs[0][1].items():
        np.testing.assert_allclose(outs[1][1][n], g, rtol=1e-12, atol=1e-15, err_msg=n)


def test_repeated_masked_positions_add_their_gradients():
    """The gather's backward is a scatter-add: a position listed twice gets both rows."""
    model = BertForPreTraining(tiny_config(), dtype=np.float64)
    ids = np.array([[3, 4, 5, 6]])
    pos = np.array([[1, 1, 2]])
    mlm_ids = np.array([[7, 8, 9]])

    def loss():
        return float(model(ids, masked_lm_positions=pos, masked_lm_ids=mlm_ids).loss)

    loss()
    model.zero_grad()
    model.backward()
    assert_parameter_gradients(model, loss, np.random.default_rng(0), "repeated positions")


def test_model_without_seq_relationship_head_has_masked_lm_names():
    model = BertForPreTraining(tiny_config(), seq_relationship_head=False)
    names = set(model.state_dict())
    assert not any(n.startswith(("bert.pooler", "cls.seq_relationship")) for n in names)
    assert "cls.predictions.transform.dense.weight" in names
    with pytest.raises(ValueError, match="without seq_relationship_head"):
        model(np.ones((1, 3), np.int64), next_sentence_label=np.zeros(1, np.int64))


@settings(max_examples=8, deadline=None)
@given(data=st.data(), seed=seeds)
def test_masked_lm_only_model_gradients(data, seed):
    """The MLM-only model (no pooler, no sentence head: --objective mlm) in float64."""
    config = data.draw(bert_configs(max_hidden=8, max_positions=6))
    batch = data.draw(token_batches(config, max_batch=2))
    model = BertForPreTraining(config, seed=seed % 1000, dtype=np.float64,
                               seq_relationship_head=False)
    inputs = {k: v for k, v in batch.model_inputs().items() if k != "next_sentence_label"}

    def loss():
        return float(model(**inputs).loss)

    loss()
    model.zero_grad()
    model.backward()
    assert_parameter_gradients(model, loss, np.random.default_rng(seed), "BertForMaskedLM")
