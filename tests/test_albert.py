"""ALBERT: float64 gradient checks on drawn shapes (E < H and E = H, one and several
groups, one and two layers per group), the sum rule of shared layers, and parity with
transformers' AlbertForPreTraining and AlbertForSequenceClassification on the same weights."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import (AlbertConfig, AlbertForPreTraining, AlbertForQuestionAnswering,
                      AlbertForSequenceClassification, AlbertForTokenClassification,
                      AlbertModel)
from minibert.gradcheck import random_token_batch, rel_error
from minibert.pretraining import PretrainingBatch
from minibert.testing import albert_configs, assert_parameter_gradients, seeds, token_batches


def albert_inputs(batch: PretrainingBatch) -> dict:
    """A batch's model inputs with the sentence label under ALBERT's name."""
    inputs = batch.model_inputs()
    inputs["sentence_order_label"] = inputs.pop("next_sentence_label")
    return inputs


def tiny(**kw) -> AlbertConfig:
    base = dict(vocab_size=30, embedding_size=6, hidden_size=8, num_hidden_layers=3,
                num_hidden_groups=1, num_attention_heads=2, intermediate_size=12,
                max_position_embeddings=10, classifier_dropout_prob=0.0)
    base.update(kw)
    return AlbertConfig(**base)


# -- gradient checks ------------------------------------------------------------------------

@settings(max_examples=8, deadline=None)
@given(data=st.data(), seed=seeds)
def test_albert_model_gradients_random_upstream(data, seed):
    config = data.draw(albert_configs(max_hidden=8, max_positions=6))
    batch = data.draw(token_batches(config, max_batch=2))
    rng = np.random.default_rng(seed)
    model = AlbertModel(config, seed=seed % 1000, dtype=np.float64)
    out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask)
    G_h = rng.standard_normal(out.last_hidden_state.shape)               # (B, T, H)
    G_h *= batch.attention_mask[..., None]  # padding reads the pad row, which learns nothing
    G_p = rng.standard_normal(out.pooler_output.shape)                   # (B, H)
    model.zero_grad()
    model.backward(G_h, G_p)

    def loss():
        o = model(batch.input_ids, batch.token_type_ids, batch.attention_mask)
        return float((o.last_hidden_state * G_h).sum() + (o.pooler_output * G_p).sum())

    assert_parameter_gradients(model, loss, rng, f"AlbertModel {config}", full_max_size=24)


@settings(max_examples=8, deadline=None)
@given(data=st.data(), dropout=st.sampled_from([0.0, 0.2]), smoothing=st.sampled_from([0.0, 0.1]),
       seed=seeds)
def test_pretraining_gradients_random_upstream_fixed_dropout(data, dropout, smoothing, seed):
    """dloss * loss plus random upstream gradients of the MLM logits and the last hidden
    state, dropout masks replayed from one seed."""
    config = data.draw(albert_configs(max_hidden=8, max_positions=6, dropout=dropout,
                                      min_hidden=8 if dropout else 3))
    batch = data.draw(token_batches(config, max_batch=2))
    model = AlbertForPreTraining(config, seed=seed % 1000, dtype=np.float64,
                                 label_smoothing=smoothing)
    rng = np.random.default_rng(seed)

    def run():  # the same generator seed every call: the same dropout masks
        model.set_dropout_rng(np.random.default_rng(seed))
        return model(**albert_inputs(batch))

    out = run()
    c = rng.uniform(0.5, 2.0)
    # scaled so the loss stays O(1): central differences carry a noise of ~1e-10 |L| / h,
    # which must stay under atol where a true gradient is 0 (a key bias)
    G_logits = 0.1 * rng.standard_normal(out.prediction_logits.shape)    # (B, P, V)
    G_h = 0.1 * rng.standard_normal(out.hidden_states.shape)             # (B, T, H)
    G_h *= batch.attention_mask[..., None]  # padding reads the pad row, which learns nothing
    model.zero_grad()
    model.backward(c, d_prediction_logits=G_logits, d_hidden_states=G_h)

    def loss():
        o = run()
        return float(c * o.loss + (o.prediction_logits * G_logits).sum()
                     + (o.hidden_states * G_h).sum())

    assert_parameter_gradients(model, loss, rng, f"AlbertForPreTraining {config}",
                               full_max_size=24)


@settings(max_examples=6, deadline=None)
@given(data=st.data(), cls=st.sampled_from([AlbertForSequenceClassification,
                                            AlbertForTokenClassification,
                                            AlbertForQuestionAnswering]), seed=seeds)
def test_head_gradients_random_upstream(data, cls, seed):
    config = data.draw(albert_configs(max_hidden=8, max_positions=6))
    batch = data.draw(token_batches(config, max_batch=2))
    model = cls(config, seed=seed % 1000, dtype=np.float64)
    inputs = (batch.input_ids, batch.token_type_ids, batch.attention_mask)
    rng = np.random.default_rng(seed)
    out = model(*inputs)
    if cls is AlbertForQuestionAnswering:  # padded positions masked, as below
        G = tuple(rng.standard_normal(out.start_logits.shape) * batch.attention_mask
                  for _ in range(2))

        def loss():
            o = model(*inputs)
            return float((o.start_logits * G[0]).sum() + (o.end_logits * G[1]).sum())
    else:
        G = rng.standard_normal(out.logits.shape)
        G *= batch.attention_mask[..., None] if G.ndim == 3 else 1.0

        def loss():
            return float((model(*inputs).logits * G).sum())
    model.zero_grad()
    model.backward(d_logits=G)
    assert_parameter_gradients(model, loss, rng, cls.__name__)


@settings(max_examples=8, deadline=None)
@given(layers=st.integers(2, 4), inner=st.integers(1, 2), seed=seeds)
def test_a_shared_group_gets_the_sum_of_its_depths_gradients(layers, inner, seed):
    """One group at every depth against the same weights copied into one group per depth:
    same loss, and the shared gradient is the sum of the per-depth gradients."""
    shared_config = tiny(num_hidden_layers=layers, inner_group_num=inner)
    shared = AlbertForPreTraining(shared_config, seed=seed % 1000, dtype=np.float64)
    unshared = AlbertForPreTraining(tiny(num_hidden_layers=layers, num_hidden_groups=layers,
                                         inner_group_num=inner), dtype=np.float64)
    group = "albert.encoder.albert_layer_groups.0."
    state = shared.state_dict()
    unshared.load_state_dict({**{k: v for k, v in state.items() if not k.startswith(group)},
                              **{k.replace(".0.", f".{d}.", 1): v for k, v in state.items()
                                 for d in range(layers) if k.startswith(group)}})
    batch = PretrainingBatch(**random_token_batch(shared_config, np.random.default_rng(seed), 2, 7))
    losses = []
    for model in (shared, unshared):
        losses.append(float(model(**albert_inputs(batch)).loss))
        model.zero_grad()
        model.backward()
    assert losses[0] == pytest.approx(losses[1], rel=1e-12)
    grads = {n: p.grad for n, p in unshared.named_parameters()}
    for name, p in shared.named_parameters():
        if name.startswith(group):
            total = sum(grads[name.replace(".0.", f".{d}.", 1)] for d in range(layers))
            np.testing.assert_allclose(p.grad, total, rtol=1e-10, atol=1e-14, err_msg=name)
        else:
            np.testing.assert_allclose(p.grad, grads[name], rtol=1e-10, atol=1e-14,
                                       err_msg=name)


# -- contracts ------------------------------------------------------------------------------

def test_caches_per_depth_one_backward_per_forward_and_release():
    model = AlbertForPreTraining(tiny(), dtype=np.float64)
    batch = PretrainingBatch(**random_token_batch(model.config, np.random.default_rng(0), 2, 6))
    out = model(**albert_inputs(batch), output_attentions=True)
    assert len(model.albert.encoder._applications) == 3      # one stash per depth
    assert len(out.attentions) == 3 and out.attentions[0] is not out.attentions[1]
    model.backward()
    with pytest.raises(RuntimeError, match="preceding forward"):
        model.backward()
    model(**albert_inputs(batch))
    model.release_caches()
    assert model.albert.encoder._applications is None
    hidden = model.albert(batch.input_ids, output_hidden_states=True).hidden_states
    assert len(hidden) == 4 and all(h.shape == (2, 6, 8) for h in hidden)


def test_config_presets_and_errors():
    tiny_preset = AlbertConfig.from_preset("tiny")
    assert (tiny_preset.num_hidden_layers, tiny_preset.hidden_size, tiny_preset.embedding_size,
            tiny_preset.hidden_act) == (2, 128, 64, "gelu_new")
    assert AlbertConfig.from_dict(tiny_preset.to_dict()) == tiny_preset
    for kw, field in [(dict(embedding_size=12), "embedding_size"),
                      (dict(num_hidden_groups=4), "num_hidden_groups"),
                      (dict(inner_group_num=0), "inner_group_num"),
                      (dict(num_attention_heads=3), "num_attention_heads"),
                      (dict(hidden_act="swish"), "hidden_act")]:
        with pytest.raises(ValueError, match=field):
            tiny(**kw)
    with pytest.raises(ValueError, match="unknown preset"):
        AlbertConfig.from_preset("huge")
    assert [tiny(num_hidden_layers=5, num_hidden_groups=2).group_of_depth(i)
            for i in range(5)] == [0, 0, 0, 1, 1]


def test_freeze_counts_depths_and_keeps_frozen_gradients_zero():
    """Freezing the lowest depth freezes its group (here the only one, so every depth);
    freezing the embeddings freezes the E -> H mapping too."""
    config = tiny(num_hidden_groups=3)
    model = AlbertForTokenClassification(config, dtype=np.float64).freeze(embeddings=True,
                                                                          layers=1)
    trainable = {n for n, _ in model.named_trainable_parameters()}
    assert not any(n.startswith(("albert.embeddings.", "albert.encoder.embedding_hidden",
                                 "albert.encoder.albert_layer_groups.0.")) for n in trainable)
    assert any(n.startswith("albert.encoder.albert_layer_groups.1.") for n in trainable)
    batch = PretrainingBatch(**random_token_batch(config, np.random.default_rng(0), 2, 6))
    model(batch.input_ids, labels=np.ones_like(batch.input_ids))
    model.zero_grad()
    model.backward()
    for n, p in model.named_parameters():
        assert p.grad.any() == (n in trainable), n
    with pytest.raises(ValueError, match=r"layers must be an int in \[0, 3\]"):
        model.freeze(layers=4)


# -- parity with transformers ---------------------------------------------------------------

def _hf_albert(cls_name: str, config: AlbertConfig, seed: int, dtype):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    fields = {k: v for k, v in config.to_dict().items() if k != "classifier_pooling"}
    hf = getattr(transformers, cls_name)(
        transformers.AlbertConfig(**fields, attn_implementation="eager"))
    return hf.to(getattr(torch, np.dtype(dtype).name)).eval()


def compare(cls, config, batch, seed, dtype=np.float64):
    """Same weights in ours and transformers' class of the same name; returns the
    relative errors of the loss and of the worst parameter gradient (with its name). In
    float32 a gradient's error is relative to the largest gradient of the model (as
    round-off is; see tests/test_heads.py)."""
    import torch
    hf = _hf_albert(cls.__name__, config, seed, dtype)
    ours = cls(config, dtype=dtype).eval()
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})
    assert set(ours.state_dict()) == set(hf.state_dict())
    if cls is AlbertForPreTraining:
        ours_inputs, hf_inputs = albert_inputs(batch), batch.hf_kwargs()
        hf_inputs["sentence_order_label"] = hf_inputs.pop("next_sentence_label")
    else:
        labels = np.random.default_rng(seed).integers(0, config.num_labels,
                                                      len(batch.input_ids))
        ours_inputs = hf_inputs = dict(input_ids=batch.input_ids, labels=labels,
                                       token_type_ids=batch.token_type_ids,
                                       attention_mask=batch.attention_mask)
    out = ours(**ours_inputs)
    ours.zero_grad()
    ours.backward()
    ref = hf(**{k: torch.from_numpy(v) for k, v in hf_inputs.items()})
    ref.loss.backward()
    ref_grads = {n: p.grad.numpy() for n, p in hf.named_parameters()}
    assert set(ref_grads) == {n for n, _ in ours.named_parameters()}
    floor = 1e-8 if dtype == np.float64 else max(np.abs(g).max() for g in ref_grads.values())
    grads = {n: rel_error(p.grad, ref_grads[n], floor) for n, p in ours.named_parameters()}
    worst = max(grads, key=grads.get)
    return rel_error(float(out.loss), ref.loss.item()), grads[worst], worst


def parity_config(data, groups: int, num_labels: int = 2) -> AlbertConfig:
    heads = data.draw(st.sampled_from([1, 2]))
    H = 4 * heads * data.draw(st.integers(1, 2))
    return AlbertConfig(vocab_size=data.draw(st.integers(20, 50)),
                        embedding_size=data.draw(st.sampled_from([4, H])), hidden_size=H,
                        num_hidden_layers=data.draw(st.integers(groups, 3)),
                        num_hidden_groups=groups, num_attention_heads=heads,
                        intermediate_size=12, inner_group_num=data.draw(st.integers(1, 2)),
                        hidden_act=data.draw(st.sampled_from(["gelu_new", "gelu"])),
                        max_position_embeddings=16, num_labels=num_labels)


@settings(max_examples=6, deadline=None)
@given(data=st.data(), groups=st.sampled_from([1, 2, 3]), seed=seeds)
def test_pretraining_loss_and_every_gradient_match_transformers(data, groups, seed):
    config = parity_config(data, groups)
    batch = data.draw(token_batches(config, max_batch=3, max_len=10))
    loss, grad, name = compare(AlbertForPreTraining, config, batch, seed % 10_000)
    assert loss < 1e-10
    assert grad <= 1e-6, f"gradient of {name} differs from transformers: {grad:.2e}"


@settings(max_examples=4, deadline=None)
@given(data=st.data(), groups=st.sampled_from([1, 2]), num_labels=st.integers(2, 4), seed=seeds)
def test_sequence_classification_matches_transformers(data, groups, num_labels, seed):
    config = parity_config(data, groups, num_labels)
    batch = data.draw(token_batches(config, max_batch=3, max_len=10))
    loss, grad, name = compare(AlbertForSequenceClassification, config, batch, seed % 10_000)
    assert loss < 1e-10
    assert grad <= 1e-6, f"gradient of {name} differs from transformers: {grad:.2e}"


@pytest.mark.parametrize("cls", [AlbertForPreTraining, AlbertForSequenceClassification])
@pytest.mark.parametrize("groups", [1, 2])
def test_float32_matches_transformers_to_round_off(cls, groups):
    config = AlbertConfig(vocab_size=60, embedding_size=16, hidden_size=32, num_hidden_layers=4,
                          num_hidden_groups=groups, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=16)
    batch = PretrainingBatch(**random_token_batch(config, np.random.default_rng(4), 4, 12))
    loss, grad, name = compare(cls, config, batch, 4, np.float32)
    assert loss < 1e-5
    assert grad <= 1e-5, f"gradient of {name} differs from transformers: {grad:.2e}"


# -- Hugging Face directories ---------------------------------------------------------------

@pytest.mark.parametrize("groups", [1, 3])
def test_hf_export_loads_in_transformers_and_back(tmp_path, vocab_file, groups):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from minibert.hf import load_hf_directory, load_pretrained_weights, save_hf_directory
    config = tiny(num_hidden_groups=groups, inner_group_num=2, initializer_range=0.3)
    model = AlbertForPreTraining(config, seed=2).eval()
    out_dir = save_hf_directory(model, tmp_path / "hf", vocab_file)
    batch = PretrainingBatch(**random_token_batch(config, np.random.default_rng(5), 3, 9))
    ours = float(model(**albert_inputs(batch)).loss)
    ref = transformers.AlbertForPreTraining.from_pretrained(out_dir,
                                                            attn_implementation="eager").eval()
    kw = batch.hf_kwargs()
    kw["sentence_order_label"] = kw.pop("next_sentence_label")
    with torch.no_grad():
        theirs = ref(**{k: torch.from_numpy(v) for k, v in kw.items()}).loss.item()
    assert ours == pytest.approx(theirs, rel=1e-5)
    ck = load_hf_directory(out_dir)
    assert ck.config == config
    again = AlbertForPreTraining(ck.config, seed=9).eval()
    assert load_pretrained_weights(again, ck.state)["new"] == []
    assert float(again(**albert_inputs(batch)).loss) == ours


def test_hf_bare_encoder_new_head_and_mismatches(tmp_path, vocab_file):
    from minibert import BertConfig, BertForTokenClassification
    from minibert.hf import (HFFormatError, config_from_hf, load_hf_directory,
                             load_pretrained_weights, save_hf_directory)
    enc = AlbertModel(tiny(), seed=3).eval()
    ck = load_hf_directory(save_hf_directory(enc, tmp_path / "hf", vocab_file))
    clf = AlbertForSequenceClassification(ck.config)
    assert load_pretrained_weights(clf, ck.state)["new"] == ["classifier.bias",
                                                             "classifier.weight"]
    ids = np.random.default_rng(0).integers(5, 30, (2, 7))
    np.testing.assert_array_equal(clf.eval().albert(ids).last_hidden_state,
                                  enc(ids).last_hidden_state)
    bert = BertForTokenClassification(BertConfig(vocab_size=30, hidden_size=8,
                                                 num_hidden_layers=3, num_attention_heads=2,
                                                 intermediate_size=12))
    with pytest.raises(HFFormatError, match="encoder weights missing"):
        load_pretrained_weights(bert, ck.state)
    with pytest.raises(HFFormatError, match="embedding_size"):
        config_from_hf({"model_type": "albert", "embedding_size": 8192}, "x/config.json")


# -- ALBERT's n-gram masking ------------------------------------------------------------------

def ngram_vocab():
    from minibert.pretraining import VocabInfo
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(40)]
    tokens += [f"##p{i}" for i in range(20)]
    return VocabInfo.from_vocab({t: i for i, t in enumerate(tokens)})


def test_ngram_span_lengths_follow_one_over_n():
    """Long rows of one-piece words and a small budget (so spans rarely meet); spans chosen
    while at least max_ngram tokens of budget were left (never shortened to fit)."""
    from scipy.stats import chisquare
    from minibert.pretraining.masking import choose_word_spans, ngram_probabilities
    vi, budget = ngram_vocab(), 30
    rng = np.random.default_rng(0)
    counts = np.zeros(3)
    for _ in range(300):
        ids = np.concatenate([[2], rng.integers(5, 45, 3000), [3]])
        used = 0
        for start, stop, n in choose_word_spans(ids, vi, budget, 3, rng):
            if used + 3 <= budget:
                counts[n - 1] += 1
            used += stop - start
    expected = ngram_probabilities(3) * counts.sum()
    np.testing.assert_allclose(ngram_probabilities(3), [6 / 11, 3 / 11, 2 / 11])
    assert counts.sum() > 4000
    assert chisquare(counts, expected).pvalue > 1e-3, counts / counts.sum()
    assert chisquare(counts, np.full(3, counts.sum() / 3)).pvalue < 1e-6  # the test has power


@settings(max_examples=30, deadline=None)
@given(seed=seeds, prob=st.sampled_from([0.15, 0.4]), L=st.integers(8, 128))
def test_ngram_masking_keeps_words_whole_stays_in_segments_and_fills_the_budget(seed, prob, L):
    from minibert.pretraining import create_masked_lm_predictions
    from minibert.pretraining.masking import choose_word_spans
    vi = ngram_vocab()
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 45, L)
    pieces = rng.random(L) < 0.3
    ids[pieces] = rng.integers(45, 65, pieces.sum())                    # ## continuations
    ids[0], ids[-1], ids[rng.integers(2, L - 2)] = 2, 3, 3               # [CLS] A [SEP] B [SEP]
    special = np.isin(ids, [0, 2, 3])
    budget = max(1, round(L * prob))
    for start, stop, n in choose_word_spans(ids, vi, budget, 3, np.random.default_rng(seed)):
        assert not special[start:stop].any() and 1 <= n <= 3            # never across [SEP]
        assert start == 0 or not vi.is_continuation[ids[start]] or special[start - 1]
        assert stop == L or not vi.is_continuation[ids[stop]]           # whole words
    out, pos, labels = create_masked_lm_predictions(ids, vi, prob, budget, rng, max_ngram=3)
    masked = np.zeros(L, dtype=bool)
    masked[pos] = True
    assert not (masked & special).any() and len(pos) <= budget
    continuation = vi.is_continuation[ids] & ~special
    # a masked word is masked whole: a ## piece is masked iff the token before it is
    inner = continuation[1:] & ~special[:-1]
    assert np.array_equal(masked[1:][inner], masked[:-1][inner])
    np.testing.assert_array_equal(labels, ids[pos])


def test_ngram_masking_fills_the_masking_rate():
    from minibert.pretraining import create_masked_lm_predictions
    vi, rng = ngram_vocab(), np.random.default_rng(1)
    fractions = []
    for _ in range(300):
        ids = rng.integers(5, 65, 128)
        ids[0], ids[60], ids[-1] = 2, 3, 3
        _, pos, _ = create_masked_lm_predictions(ids, vi, 0.15, 20, rng, max_ngram=3)
        fractions.append(len(pos) / 128)
    assert round(128 * 0.15) / 128 * 0.97 <= np.mean(fractions) <= round(128 * 0.15) / 128
    with pytest.raises(ValueError, match="max_ngram"):
        create_masked_lm_predictions(ids, vi, 0.15, 20, rng, max_ngram=0)
