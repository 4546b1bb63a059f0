"""Attributions by our own backward (minibert.attribution), float64.

Integrated gradients is checked against its completeness axiom on drawn models and
inputs, and both gradient x input and integrated gradients against Captum's
(``InputXGradient``, ``IntegratedGradients``) on transformers' model of the same class
with the same weights. Rollout is checked against the published formula written out
here, raw attention against transformers' ``output_attentions``.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import BertConfig
from minibert.albert import (AlbertConfig, AlbertForPreTraining, AlbertForSequenceClassification,
                             AlbertForTokenClassification)
from minibert.attribution import (AttributionError, Inputs, attention_maps,
                                  attention_rollout, baseline_ids, explain, gradient_x_input,
                                  head_kind, integrated_gradients, step_rule, word_sums)
from minibert.distilbert import (DistilBertConfig, DistilBertForMaskedLM,
                                 DistilBertForSequenceClassification,
                                 DistilBertForTokenClassification)
from minibert.electra import (ElectraConfig, ElectraForMaskedLM, ElectraForSequenceClassification,
                              ElectraForTokenClassification)
from minibert.gradcheck import rel_error
from minibert.heads import (BertForQuestionAnswering, BertForSequenceClassification,
                            BertForTokenClassification)
from minibert.modeling import BertForPreTraining, BertModel
from minibert.testing import seeds
from minibert.tokenization import BertTokenizer

CLS, SEP, PAD, MASK = 2, 3, 0, 4
SMALL = dict(vocab_size=30, num_hidden_layers=2, intermediate_size=12,
             max_position_embeddings=16, initializer_range=0.4, num_labels=3)


def bert_config(**kw) -> BertConfig:
    return BertConfig(**{**SMALL, "hidden_size": 8, "num_attention_heads": 2, **kw})


def family_config(family: str):
    """A tiny config of each of the four families, weights large enough to matter."""
    if family == "bert":
        return bert_config()
    if family == "albert":
        return AlbertConfig(**SMALL, embedding_size=6, hidden_size=8, num_attention_heads=2)
    if family == "electra":
        return ElectraConfig(**SMALL, embedding_size=6, hidden_size=8, num_attention_heads=2)
    return DistilBertConfig(vocab_size=30, n_layers=2, n_heads=2, dim=8, hidden_dim=12,
                            max_position_embeddings=16, initializer_range=0.4, num_labels=3)


SEQUENCE = {"bert": BertForSequenceClassification, "albert": AlbertForSequenceClassification,
            "electra": ElectraForSequenceClassification,
            "distilbert": DistilBertForSequenceClassification}


def model_of(kind: str, config, seed: int):
    if kind == "sequence":
        return BertForSequenceClassification(config, seed=seed, dtype=np.float64)
    if kind == "token":
        return BertForTokenClassification(config, seed=seed, dtype=np.float64)
    return BertForPreTraining(config, seed=seed, dtype=np.float64, seq_relationship_head=False)


def sequence(rng, T: int, mask_at: int | None = None) -> np.ndarray:
    ids = np.concatenate([[CLS], rng.integers(5, 30, T - 2), [SEP]]).astype(np.int64)
    if mask_at is not None:
        ids[mask_at] = MASK
    return ids


def inputs_for(kind: str, ids: np.ndarray, target: int, position: int = 1) -> Inputs:
    tt = np.zeros_like(ids)
    return Inputs(ids, tt, target, 0 if kind == "sequence" else position)


# -- completeness ----------------------------------------------------------------------------

@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(["sequence", "token", "mlm"]), heads=st.sampled_from([1, 2]),
       layers=st.integers(1, 2), T=st.integers(3, 8), seed=seeds, data=st.data())
def test_ig_is_complete_at_64_steps(kind, heads, layers, T, seed, data):
    config = bert_config(num_hidden_layers=layers, num_attention_heads=heads,
                         hidden_size=4 * heads)
    rng = np.random.default_rng(seed)
    model = model_of(kind, config, seed % 1000)
    position = data.draw(st.integers(1, T - 2))
    ids = sequence(rng, T, position if kind == "mlm" else None)
    target = data.draw(st.integers(0, (30 if kind == "mlm" else 3) - 1))
    output = data.draw(st.sampled_from(["probability", "logit"]))
    base = baseline_ids(ids, data.draw(st.sampled_from([PAD, MASK])), (CLS, SEP))
    r = integrated_gradients(model, inputs_for(kind, ids, target, position), base, steps=64,
                             batch_size=data.draw(st.integers(1, 64)), output=output)
    assert abs(r.gap) < 1e-3
    assert r.gap == pytest.approx(r.scores.sum() - (r.value - r.baseline_value), abs=1e-12)
    assert r.scores[0] == r.scores[-1] == 0          # [CLS] and [SEP] are in the baseline


HEADS = {"bert": (BertForTokenClassification, BertForPreTraining),
         "albert": (AlbertForTokenClassification, AlbertForPreTraining),
         "electra": (ElectraForTokenClassification, ElectraForMaskedLM),
         "distilbert": (DistilBertForTokenClassification, DistilBertForMaskedLM)}


@pytest.mark.parametrize("kind", ["sequence", "token", "mlm"])
@pytest.mark.parametrize("family", list(SEQUENCE))
def test_ig_is_complete_on_every_family_and_head(family, kind):
    cls = {"sequence": SEQUENCE[family], "token": HEADS[family][0], "mlm": HEADS[family][1]}[kind]
    kw = {"seq_relationship_head": False} if cls in (BertForPreTraining,
                                                     AlbertForPreTraining) else {}
    model = cls(family_config(family), seed=3, dtype=np.float64, **kw)
    ids = sequence(np.random.default_rng(1), 7, 3 if kind == "mlm" else None)
    r = integrated_gradients(model, inputs_for(kind, ids, 1, 3), baseline_ids(
        ids, PAD, (CLS, SEP, MASK)), steps=64)
    assert abs(r.gap) < 1e-3 and abs(r.value - r.baseline_value) > 1e-4
    assert not any(p.grad.any() for p in model.parameters())


def test_gap_shrinks_as_steps_grow():
    model = model_of("sequence", bert_config(), 5)
    ids = sequence(np.random.default_rng(2), 8)
    inputs, base = inputs_for("sequence", ids, 2), baseline_ids(ids, PAD, (CLS, SEP))
    gaps = [abs(integrated_gradients(model, inputs, base, steps=n, method="riemann_right").gap)
            for n in (4, 16, 64, 256)]
    assert gaps[0] > gaps[1] > gaps[2] > gaps[3]
    assert gaps[3] < gaps[0] / 20                    # first order: about 1/n


def test_batches_and_rules_agree():
    model = model_of("sequence", bert_config(), 5)
    ids = sequence(np.random.default_rng(2), 6)
    inputs, base = inputs_for("sequence", ids, 0), baseline_ids(ids, PAD, (CLS, SEP))
    one = integrated_gradients(model, inputs, base, steps=32, batch_size=1).scores
    all_ = integrated_gradients(model, inputs, base, steps=32, batch_size=32).scores
    np.testing.assert_allclose(one, all_, rtol=1e-12, atol=1e-15)
    for rule in ("riemann_left", "riemann_middle", "riemann_trapezoid"):
        a, w = step_rule(rule, 5)
        total = 0.8 if rule == "riemann_trapezoid" else 1.0        # Captum's trapezoid
        assert w.sum() == pytest.approx(total) and a.min() >= 0 and a.max() <= 1
    with pytest.raises(AttributionError, match="at least 2 steps"):
        step_rule("riemann_left", 1)
    with pytest.raises(AttributionError, match="unknown step rule"):
        step_rule("simpson", 8)


def test_model_is_left_as_it_was():
    model = model_of("mlm", bert_config(), 4).eval()
    frozen = model.bert.encoder.layer[0].output.dense.weight
    frozen.requires_grad = False
    ids = sequence(np.random.default_rng(0), 6, 2)
    before = model(ids[None], masked_lm_positions=np.array([[2]])).prediction_logits.copy()
    model.train()
    integrated_gradients(model, inputs_for("mlm", ids, 7, 2), baseline_ids(ids, PAD, (CLS, SEP)),
                         steps=4)
    gradient_x_input(model, inputs_for("mlm", ids, 7, 2))
    assert model.training and not frozen.requires_grad
    assert all(p.requires_grad for p in model.parameters() if p is not frozen)
    assert not any(p.grad.any() for p in model.parameters())
    assert getattr(model.bert.embeddings, "tap") is None
    after = model.eval()(ids[None], masked_lm_positions=np.array([[2]])).prediction_logits
    np.testing.assert_array_equal(before, after)


# -- Captum on transformers' model ------------------------------------------------------------

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
captum_attr = pytest.importorskip("captum.attr")

HF_DROP = {"bert": ("classifier_pooling", "norm_position", "position_embedding_type"),
           "albert": ("classifier_pooling",), "electra": ("classifier_pooling", "norm_position"),
           "distilbert": ()}


def hf_twin(ours, family: str, hf_class: str):
    """transformers' ``hf_class`` with random weights, loaded into ``ours`` as well."""
    torch.manual_seed(0)
    fields = {k: v for k, v in ours.config.to_dict().items() if k not in HF_DROP[family]}
    hf_config = getattr(transformers, f"{type(ours.config).__name__}")(
        **fields, attn_implementation="eager")
    hf = getattr(transformers, hf_class)(hf_config).double().eval()
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    ours.load_state_dict({k: state[k] for k in ours.state_dict()})
    return hf


def hf_score(hf, kind: str, inputs: Inputs):
    """f(word-piece embeddings (n, T, C)) on transformers' model: the target probability."""
    tt = torch.from_numpy(inputs.token_type_ids)[None]

    def f(embeds):
        kw = {} if "DistilBert" in type(hf).__name__ else {"token_type_ids": tt.expand(
            len(embeds), -1)}
        logits = hf(inputs_embeds=embeds, **kw).logits
        if kind != "sequence":
            logits = logits[:, inputs.position]
        return torch.softmax(logits, -1)[:, inputs.target]
    return f


def word_embeds(hf, ids):
    table = hf.get_input_embeddings()
    return table(torch.from_numpy(np.asarray(ids))[None]).detach()       # (1, T, C)


CASES = [("bert", "sequence", "BertForSequenceClassification"),
         ("bert", "token", "BertForTokenClassification"),
         ("bert", "mlm", "BertForMaskedLM"),
         ("albert", "sequence", "AlbertForSequenceClassification"),
         ("electra", "sequence", "ElectraForSequenceClassification"),
         ("distilbert", "sequence", "DistilBertForSequenceClassification")]


@pytest.mark.parametrize("family,kind,hf_class", CASES)
def test_equal_to_captum_on_transformers(family, kind, hf_class):
    config = family_config(family)
    ours = SEQUENCE[family](config, dtype=np.float64) if kind == "sequence" else \
        model_of(kind, config, 0)
    hf = hf_twin(ours, family, hf_class)
    ids = sequence(np.random.default_rng(7), 9, 4 if kind == "mlm" else None)
    inputs = inputs_for(kind, ids, 2, 4)
    base = baseline_ids(ids, PAD, (CLS, SEP))
    f = hf_score(hf, kind, inputs)
    x, xb = word_embeds(hf, ids), word_embeds(hf, base)

    ref = captum_attr.InputXGradient(f).attribute(x.clone().requires_grad_())
    ours_gxi = gradient_x_input(ours, inputs)
    assert rel_error(ours_gxi.scores, ref.detach().numpy()[0].sum(-1)) < 1e-6

    for method in ("gausslegendre", "riemann_trapezoid"):
        ig = captum_attr.IntegratedGradients(f)
        ref, delta = ig.attribute(x, baselines=xb, n_steps=32, method=method,
                                  internal_batch_size=8, return_convergence_delta=True)
        r = integrated_gradients(ours, inputs, base, steps=32, method=method)
        assert rel_error(r.scores, ref.detach().numpy()[0].sum(-1)) < 1e-6
        assert r.gap == pytest.approx(float(delta), abs=1e-6)   # Captum's delta: the same gap


@pytest.mark.parametrize("family", list(SEQUENCE))
def test_raw_attention_equals_transformers(family):
    ours = SEQUENCE[family](family_config(family), dtype=np.float64)
    hf = hf_twin(ours, family, type(ours).__name__)
    ids = sequence(np.random.default_rng(3), 8)
    ref = hf(torch.from_numpy(ids)[None], output_attentions=True).attentions
    got = attention_maps(ours, inputs_for("sequence", ids, 0))
    assert got.shape == (len(ref), *ref[0].shape[1:])
    for layer, a in enumerate(ref):
        assert rel_error(got[layer], a[0].detach().numpy()) < 1e-6


# -- rollout ----------------------------------------------------------------------------------

def rollout_by_the_paper(attentions):
    """Abnar & Zuidema 2020, section 3, written out: per layer the heads' mean with the
    residual, 0.5 A + 0.5 I, rows normalised, and the product from the bottom layer up."""
    L, NH, T, _ = attentions.shape
    joint = None
    out = []
    for layer in range(L):
        a = sum(attentions[layer, h] for h in range(NH)) / NH
        a = 0.5 * a + 0.5 * np.eye(T)
        a = a / a.sum(axis=1)[:, None]
        joint = a if joint is None else a.dot(joint)
        out.append(joint)
    return np.array(out)


@settings(max_examples=20, deadline=None)
@given(L=st.integers(1, 4), NH=st.integers(1, 3), T=st.integers(1, 6), seed=seeds)
def test_rollout_is_the_published_formula(L, NH, T, seed):
    logits = np.random.default_rng(seed).normal(size=(L, NH, T, T)) * 3
    att = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    got = attention_rollout(att)
    np.testing.assert_allclose(got, rollout_by_the_paper(att), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-12)


def test_rollout_of_a_model():
    model = model_of("sequence", bert_config(num_hidden_layers=3), 1)
    att = attention_maps(model, inputs_for("sequence", sequence(np.random.default_rng(0), 7), 0))
    np.testing.assert_allclose(attention_rollout(att), rollout_by_the_paper(att), rtol=1e-12)


# -- words, explain() and its errors ----------------------------------------------------------

def test_word_sums():
    assert word_sums(np.array([9.0, 1, 2, 3, 9]), [None, 0, 0, 1, None]).tolist() == [3, 3]
    assert word_sums(np.array([1.0, 2.0]), [None, None]).tolist() == []


@pytest.fixture
def tokenizer(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was", "grip",
             "##ping", "and", "dull", ".", "a", "plot"]
    words += [f"w{i}" for i in range(30 - len(words))]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return BertTokenizer(tmp_path / "vocab.txt")


@pytest.mark.parametrize("method", ["ig", "grad-x-input", "rollout"])
def test_explain_a_sequence_classifier(tokenizer, method):
    model = model_of("sequence", bert_config(), 2)
    e = explain(model, tokenizer, "The film was gripping.", method=method,
                labels=["neg", "pos", "mixed"], steps=16)
    assert e.tokens == ["[CLS]", "the", "film", "was", "grip", "##ping", ".", "[SEP]"]
    assert e.words == ["The", "film", "was", "gripping", "."]
    assert e.scores.shape == e.grad_norm.shape == (8,)
    np.testing.assert_allclose(e.word_scores[3], e.scores[4] + e.scores[5])
    assert e.attentions.shape == (2, 2, 8, 8) and e.rollout.shape == (2, 8, 8)
    assert e.predicted in ("neg", "pos", "mixed") and e.target_label == e.predicted
    assert (e.gap is None) == (method != "ig")
    assert e.to_dict()["tokens"] == e.tokens


def test_explain_targets_and_errors(tokenizer):
    model = model_of("sequence", bert_config(), 2)
    labels = ["neg", "pos", "mixed"]
    e = explain(model, tokenizer, "a dull plot", target="pos", labels=labels, steps=8)
    assert e.target == 1 and e.target_label == "pos"
    with pytest.raises(AttributionError, match="unknown label 'happy'.*neg, pos, mixed"):
        explain(model, tokenizer, "a dull plot", target="happy", labels=labels)
    with pytest.raises(AttributionError, match="the text is empty"):
        explain(model, tokenizer, "   ")
    with pytest.raises(AttributionError, match="unknown method"):
        explain(model, tokenizer, "a plot", method="shap")
    for other in (BertModel(bert_config()), BertForQuestionAnswering(bert_config(num_labels=2))):
        with pytest.raises(AttributionError, match="has no head to explain"):
            head_kind(other)
    mlm = model_of("mlm", bert_config(), 2)
    with pytest.raises(AttributionError, match=r"one \[MASK\] prediction: the text has none"):
        explain(mlm, tokenizer, "the film was dull")
    e = explain(mlm, tokenizer, "the film was [MASK] .", target="dull", steps=32)
    assert e.scores[4] == 0                    # the [MASK] asked about is in the baseline
    assert e.position == 4 and e.target_label == "dull" and abs(e.gap) < 1e-3
    tagger = model_of("token", bert_config(), 2)
    e = explain(tagger, tokenizer, "the film was dull", position=2, steps=8)
    assert e.position == 2 and e.kind == "token"
    with pytest.raises(AttributionError, match=r"position must be a word piece in \[1, 4\]"):
        explain(tagger, tokenizer, "the film was dull", position=5)
