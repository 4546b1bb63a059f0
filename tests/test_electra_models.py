"""ELECTRA models (minibert/electra.py): parity with transformers' ElectraForPreTraining,
ElectraForMaskedLM and the task heads on the same weights (loss, logits and every
gradient; E < H and E = H, padding in the batch), float64 gradient checks of the new
pieces, and Hugging Face directories in and out."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert.electra import (ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining,
                              ElectraForQuestionAnswering, ElectraForSequenceClassification,
                              ElectraForTokenClassification, ElectraModel)
from minibert.gradcheck import random_token_batch, rel_error
from minibert.pretraining import PretrainingBatch
from minibert.testing import assert_parameter_gradients, seeds, token_batches

from helpers import SharedDraws

HEADS = [ElectraForSequenceClassification, ElectraForTokenClassification,
         ElectraForQuestionAnswering]


# Central differences (h = 1e-6) need weights that are not tiny: at initializer_range 0.02
# and widths of 4, LayerNorm normalises rows of variance near 1e-4 and the loss is so
# curved that the difference quotient is off by 1e-4 relative on some biases, a property of
# the check, not of the backward (the parity tests compare every gradient with transformers
# at 0.02 and 0.3). The gradient checks draw from these, as minibert.testing's
# bert_configs does (0.5).
CHECKED_INIT = (0.3, 0.5)


def parity_config(data, num_labels: int = 2, dropout: float = 0.0,
                  init_ranges=(0.02, 0.3)) -> ElectraConfig:
    heads = data.draw(st.sampled_from([1, 2]))
    H = 4 * heads * data.draw(st.integers(1, 2))
    # E >= 3: a LayerNorm over 2 features maps every row to (-1, 1) or (1, -1), so the
    # embeddings' gradient is the eps term alone (about 1e-12 of the rest) and both sides'
    # round-off decides the comparison (rel. errors up to 5e-5 were drawn at E = 2, H = 4)
    return ElectraConfig(vocab_size=data.draw(st.integers(20, 50)),
                         embedding_size=data.draw(st.sampled_from([3, max(3, H // 2), H])),
                         hidden_size=H, num_hidden_layers=data.draw(st.integers(1, 3)),
                         num_attention_heads=heads, intermediate_size=12,
                         hidden_act=data.draw(st.sampled_from(["gelu", "gelu_new", "relu"])),
                         hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                         max_position_embeddings=16, num_labels=num_labels,
                         initializer_range=data.draw(st.sampled_from(init_ranges)))


def rtd_labels(batch, seed):
    return np.random.default_rng(seed).integers(0, 2, batch.input_ids.shape)


# -- gradient checks ------------------------------------------------------------------------

@settings(max_examples=6, deadline=None)
@given(data=st.data(), seed=seeds)
def test_electra_model_gradients_random_upstream(data, seed):
    config = parity_config(data, init_ranges=CHECKED_INIT)
    batch = data.draw(token_batches(config, max_batch=2, max_len=6))
    rng = np.random.default_rng(seed)
    model = ElectraModel(config, seed=seed % 1000, dtype=np.float64)
    out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask)
    assert out.pooler_output is None
    G = rng.standard_normal(out.last_hidden_state.shape) * batch.attention_mask[..., None]
    model.zero_grad()
    model.backward(G)

    def loss():
        o = model(batch.input_ids, batch.token_type_ids, batch.attention_mask)
        return float((o.last_hidden_state * G).sum())

    assert_parameter_gradients(model, loss, rng, f"ElectraModel {config}", full_max_size=24)


@settings(max_examples=6, deadline=None)
@given(data=st.data(), dropout=st.sampled_from([0.0, 0.2]), seed=seeds)
def test_discriminator_gradients_with_loss_upstream_and_fixed_dropout(data, dropout, seed):
    config = parity_config(data, dropout=dropout, init_ranges=CHECKED_INIT)
    batch = data.draw(token_batches(config, max_batch=2, max_len=6))
    labels = rtd_labels(batch, seed)
    model = ElectraForPreTraining(config, seed=seed % 1000, dtype=np.float64)
    rng = np.random.default_rng(seed)
    kw = dict(input_ids=batch.input_ids, token_type_ids=batch.token_type_ids,
              attention_mask=batch.attention_mask, labels=labels)

    def run():
        model.set_dropout_rng(np.random.default_rng(seed))
        return model(**kw)

    out = run()
    c = rng.uniform(0.5, 2.0)
    G = 0.1 * rng.standard_normal(out.logits.shape) * batch.attention_mask
    model.zero_grad()
    model.backward(c, d_logits=G)

    def loss():
        o = run()
        return float(c * o.loss + (o.logits * G).sum())

    assert_parameter_gradients(model, loss, rng, f"ElectraForPreTraining {config}",
                               full_max_size=24)


@settings(max_examples=6, deadline=None)
@given(data=st.data(), seed=seeds)
def test_generator_gradients_with_loss_and_upstream(data, seed):
    config = parity_config(data, init_ranges=CHECKED_INIT)
    batch = data.draw(token_batches(config, max_batch=2, max_len=6))
    model = ElectraForMaskedLM(config, seed=seed % 1000, dtype=np.float64)
    rng = np.random.default_rng(seed)
    kw = batch.model_inputs()
    kw.pop("next_sentence_label", None)
    out = model(**kw)
    G = 0.1 * rng.standard_normal(out.prediction_logits.shape)
    model.zero_grad()
    model.backward(1.0, d_prediction_logits=G)

    def loss():
        o = model(**kw)
        return float(o.loss + (o.prediction_logits * G).sum())

    assert_parameter_gradients(model, loss, rng, f"ElectraForMaskedLM {config}",
                               full_max_size=24)


@settings(max_examples=6, deadline=None)
@given(data=st.data(), cls=st.sampled_from(HEADS), dropout=st.sampled_from([0.0, 0.2]),
       seed=seeds)
def test_head_gradients_random_upstream(data, cls, dropout, seed):
    config = parity_config(data, dropout=dropout, init_ranges=CHECKED_INIT)
    batch = data.draw(token_batches(config, max_batch=2, max_len=6))
    model = cls(config, seed=seed % 1000, dtype=np.float64)
    inputs = (batch.input_ids, batch.token_type_ids, batch.attention_mask)
    rng = np.random.default_rng(seed)

    def run():
        model.set_dropout_rng(np.random.default_rng(seed))
        return model(*inputs)

    out = run()
    if cls is ElectraForQuestionAnswering:
        G = tuple(rng.standard_normal(out.start_logits.shape) * batch.attention_mask
                  for _ in range(2))

        def loss():
            o = run()
            return float((o.start_logits * G[0]).sum() + (o.end_logits * G[1]).sum())
    else:
        G = rng.standard_normal(out.logits.shape)
        G *= batch.attention_mask[..., None] if G.ndim == 3 else 1.0

        def loss():
            return float((run().logits * G).sum())
    model.zero_grad()
    model.backward(d_logits=G)
    assert_parameter_gradients(model, loss, rng, cls.__name__)


def test_config_errors_and_no_pooler():
    with pytest.raises(ValueError, match="num_attention_heads"):
        ElectraConfig(hidden_size=10, num_attention_heads=4)
    with pytest.raises(ValueError, match="norm_position"):
        ElectraConfig(norm_position="pre")
    with pytest.raises(ValueError, match="embedding_size"):
        ElectraConfig(embedding_size=0)
    with pytest.raises(ValueError, match="pooler"):
        ElectraModel(ElectraConfig(num_hidden_layers=1), add_pooling_layer=True)
    small = ElectraConfig(vocab_size=20, embedding_size=8, hidden_size=8, num_hidden_layers=1,
                          num_attention_heads=2, intermediate_size=8)
    assert not any(n.startswith("embeddings_project") for n, _ in
                   ElectraModel(small).named_parameters())


# -- parity with transformers ---------------------------------------------------------------

def _hf(cls_name: str, config: ElectraConfig, seed: int, dtype):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    fields = {k: v for k, v in config.to_dict().items()
              if k not in ("classifier_pooling", "norm_position")}
    hf = getattr(transformers, cls_name)(
        transformers.ElectraConfig(**fields, attn_implementation="eager"))
    return hf.to(getattr(torch, np.dtype(dtype).name)).eval()


def compare(cls, config, batch, seed, dtype=np.float64):
    """Same weights in ours and transformers' class of the same name; returns the relative
    errors of the loss, of the logits and of the worst parameter gradient (with its name).
    In float32 a gradient's error is relative to the largest gradient of the model."""
    import torch
    hf = _hf(cls.__name__, config, seed, dtype)
    ours = cls(config, dtype=dtype).eval()
    ref_state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    ours.load_state_dict(ref_state)
    assert set(ours.state_dict()) == set(ref_state)
    B, T = batch.input_ids.shape
    rng = np.random.default_rng(seed)
    base = dict(input_ids=batch.input_ids, token_type_ids=batch.token_type_ids,
                attention_mask=batch.attention_mask)
    if cls is ElectraForMaskedLM:
        ours_inputs = {k: v for k, v in batch.model_inputs().items()
                       if k != "next_sentence_label"}
        hf_inputs = {k: v for k, v in batch.hf_kwargs().items() if k != "next_sentence_label"}
    elif cls is ElectraForPreTraining:
        ours_inputs = hf_inputs = dict(base, labels=rtd_labels(batch, seed))
    elif cls is ElectraForQuestionAnswering:
        ours_inputs = hf_inputs = dict(base, start_positions=rng.integers(0, T, B),
                                       end_positions=rng.integers(0, T, B))
    elif cls is ElectraForTokenClassification:
        labels = rng.integers(0, config.num_labels, (B, T))
        ours_inputs = hf_inputs = dict(base, labels=np.where(batch.attention_mask > 0,
                                                             labels, -100))
    else:
        ours_inputs = hf_inputs = dict(base, labels=rng.integers(0, config.num_labels, B))
    out = ours(**ours_inputs)
    ours.zero_grad()
    ours.backward()
    ref = hf(**{k: torch.from_numpy(np.asarray(v)) for k, v in hf_inputs.items()})
    ref_loss = ref.loss
    if cls is ElectraForPreTraining:
        # transformers' line is BCEWithLogitsLoss()(active_logits, active_labels.float()):
        # the float32 labels make torch compute the loss in float32 whatever the logits'
        # dtype. The same formula with labels in the logits' dtype is the reference; HF's
        # own loss agrees to float32 round-off.
        active = torch.from_numpy(np.asarray(hf_inputs["attention_mask"])) == 1
        labels = torch.from_numpy(np.asarray(hf_inputs["labels"]))[active]
        ref_loss = torch.nn.BCEWithLogitsLoss()(ref.logits[active],
                                                labels.to(ref.logits.dtype))
        assert rel_error(ref_loss.item(), ref.loss.item()) < 1e-6
    ref_loss.backward()
    if cls is ElectraForMaskedLM:
        mine = out.prediction_logits
        real = batch.masked_lm_weights > 0
        rows = np.broadcast_to(np.arange(B)[:, None], real.shape)
        theirs = ref.logits.detach().numpy()[rows[real], batch.masked_lm_positions[real]]
        mine = mine[real]
    elif cls is ElectraForQuestionAnswering:
        mine = np.stack([out.start_logits, out.end_logits])
        theirs = np.stack([ref.start_logits.detach().numpy(), ref.end_logits.detach().numpy()])
    else:
        mine, theirs = out.logits, ref.logits.detach().numpy()
    ref_grads = {n: p.grad.numpy() for n, p in hf.named_parameters() if p.grad is not None}
    assert set(ref_grads) == {n for n, _ in ours.named_parameters()}
    floor = 1e-8 if dtype == np.float64 else max(np.abs(g).max() for g in ref_grads.values())
    grads = {n: rel_error(p.grad, ref_grads[n], floor) for n, p in ours.named_parameters()}
    worst = max(grads, key=grads.get)
    logit_floor = 1e-8 if dtype == np.float64 else np.abs(theirs).max()
    return (rel_error(float(out.loss), ref_loss.item()), rel_error(mine, theirs, logit_floor),
            grads[worst], worst)


@settings(max_examples=8, deadline=None)
@given(data=st.data(), cls=st.sampled_from([ElectraForPreTraining, ElectraForMaskedLM]),
       seed=seeds)
def test_pretraining_models_loss_and_every_gradient_match_transformers(data, cls, seed):
    config = parity_config(data)
    batch = data.draw(token_batches(config, max_batch=3, max_len=10))
    loss, logits, grad, name = compare(cls, config, batch, seed % 10_000)
    assert loss < 1e-10 and logits < 1e-9
    assert grad <= 1e-6, f"gradient of {name} differs from transformers: {grad:.2e}"


@settings(max_examples=8, deadline=None)
@given(data=st.data(), cls=st.sampled_from(HEADS), num_labels=st.integers(2, 4), seed=seeds)
def test_task_heads_match_transformers(data, cls, num_labels, seed):
    config = parity_config(data, num_labels=2 if cls is ElectraForQuestionAnswering
                           else num_labels)
    batch = data.draw(token_batches(config, max_batch=3, max_len=10))
    loss, logits, grad, name = compare(cls, config, batch, seed % 10_000)
    assert loss < 1e-10 and logits < 1e-9
    assert grad <= 1e-6, f"gradient of {name} differs from transformers: {grad:.2e}"


@pytest.mark.parametrize("cls", [ElectraForPreTraining, ElectraForMaskedLM, *HEADS])
@pytest.mark.parametrize("E", [16, 32])
def test_float32_matches_transformers_to_round_off(cls, E):
    config = ElectraConfig(vocab_size=60, embedding_size=E, hidden_size=32, num_hidden_layers=3,
                           num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=16, initializer_range=0.1)
    batch = PretrainingBatch(**random_token_batch(config, np.random.default_rng(4), 4, 12))
    loss, logits, grad, name = compare(cls, config, batch, 4, np.float32)
    assert loss < 1e-5 and logits < 1e-5
    assert grad <= 1e-5, f"gradient of {name} differs from transformers: {grad:.2e}"


# -- Hugging Face directories ---------------------------------------------------------------

def tiny(**kw) -> ElectraConfig:
    base = dict(vocab_size=30, embedding_size=6, hidden_size=8, num_hidden_layers=2,
                num_attention_heads=2, intermediate_size=12, max_position_embeddings=12,
                initializer_range=0.3)
    base.update(kw)
    return ElectraConfig(**base)


@pytest.mark.parametrize("cls_name", ["ElectraForPreTraining", "ElectraForMaskedLM",
                                      "ElectraForSequenceClassification"])
def test_directory_saved_by_transformers_loads(tmp_path, vocab_file, cls_name):
    torch = pytest.importorskip("torch")
    import minibert.electra as electra
    from minibert.hf import load_hf_directory, load_pretrained_weights
    from minibert.auto import config_from_dict
    config = tiny()
    hf = _hf(cls_name, config, 3, np.float32)
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "vocab.txt").write_text(vocab_file.read_text())
    ck = load_hf_directory(tmp_path / "hf")
    assert isinstance(ck.config, ElectraConfig) and ck.architectures == [cls_name]
    assert config_from_dict(ck.config.to_record()) == ck.config
    ours = getattr(electra, cls_name)(ck.config).eval()
    report = load_pretrained_weights(ours, ck.state)
    assert report["new"] == [] and report["unused"] == []
    ids = np.random.default_rng(1).integers(5, 30, (2, 7))
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits
    if cls_name == "ElectraForMaskedLM":
        mine = ours(ids, attention_mask=mask).prediction_logits
    else:
        mine = ours(ids, attention_mask=mask).logits
    np.testing.assert_allclose(mine, ref.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls", [ElectraForPreTraining, ElectraForMaskedLM,
                                 ElectraForSequenceClassification, ElectraModel])
def test_hf_export_loads_in_transformers_and_back(tmp_path, vocab_file, cls):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from minibert.hf import load_hf_directory, load_pretrained_weights, save_hf_directory
    config = tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = cls(config, seed=2).eval()
    out_dir = save_hf_directory(model, tmp_path / "hf", vocab_file)
    ids = np.random.default_rng(5).integers(5, 30, (2, 7))
    ref = getattr(transformers, cls.__name__).from_pretrained(
        out_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        r = ref(input_ids=torch.from_numpy(ids))
    o = model(ids)
    mine, theirs = ((o.last_hidden_state, r.last_hidden_state) if cls is ElectraModel else
                    (o.prediction_logits, r.logits) if cls is ElectraForMaskedLM else
                    (o.logits, r.logits))
    np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-4, atol=1e-5)
    ck = load_hf_directory(out_dir)
    assert ck.config == config
    again = cls(ck.config, seed=9).eval()
    assert load_pretrained_weights(again, ck.state)["new"] == []
    np.testing.assert_array_equal(
        again(ids).last_hidden_state if cls is ElectraModel else
        (again(ids).prediction_logits if cls is ElectraForMaskedLM else again(ids).logits),
        mine)


def test_a_family_given_as_another_is_one_error_naming_model_type(tmp_path, vocab_file):
    import json
    from minibert.hf import HFFormatError, load_hf_directory, save_hf_directory
    out = save_hf_directory(ElectraForPreTraining(tiny(), seed=1), tmp_path / "hf", vocab_file)
    cfg = json.loads((out / "config.json").read_text())
    cfg["model_type"] = "bert"
    cfg["architectures"] = ["BertForPreTraining"]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFFormatError, match="model_type") as e:
        load_hf_directory(out)
    assert "\n" not in str(e.value) and "electra" in str(e.value)
    # and the other way: BERT weights under model_type "electra"
    from minibert import BertConfig, BertForPreTraining
    bert = save_hf_directory(BertForPreTraining(BertConfig(
        vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=12, max_position_embeddings=12)), tmp_path / "bert", vocab_file)
    cfg = json.loads((bert / "config.json").read_text())
    cfg["model_type"] = "electra"
    (bert / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFFormatError, match="model_type is 'electra' but the weights are "
                                            "a 'bert' model's") as e:
        load_hf_directory(bert)
    assert "\n" not in str(e.value)


# -- the --objective electra model as a Hugging Face ELECTRA --------------------------------

def objective_config(num_hidden_layers: int, **overrides):
    """The BertConfig of a tiny --objective electra model: 30 tokens, width 8, 2 heads,
    weights drawn at 0.3, no dropout; ``overrides`` replace fields."""
    from minibert import BertConfig
    fields = dict(vocab_size=30, hidden_size=8, num_hidden_layers=num_hidden_layers,
                  num_attention_heads=2, intermediate_size=12, max_position_embeddings=12,
                  initializer_range=0.3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertConfig(**{**fields, **overrides})


def padded_ids(rng):
    """(2, 7) ids drawn from 5..29 and their attention mask, the first row padded after 4."""
    ids = rng.integers(5, 30, (2, 7))
    mask = np.ones_like(ids)
    mask[0, 4:] = 0
    return ids, mask


def test_objective_discriminator_exports_as_transformers_electra_and_loads_back(tmp_path,
                                                                                 vocab_file):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from minibert.hf import load_hf_directory, load_pretrained_weights, save_hf_directory
    from minibert.objectives.electra import ElectraForPreTraining as Objective
    run_model = Objective(objective_config(2), generator_layers=1, seed=4).eval()
    disc = run_model.to_electra()
    assert not hasattr(disc.electra, "embeddings_project")
    out = save_hf_directory(disc, tmp_path / "hf", vocab_file)
    ids, mask = padded_ids(np.random.default_rng(2))
    # the objective's discriminator logits on an input, as the run computes them
    h = run_model.bert(ids, attention_mask=mask).last_hidden_state
    mine = run_model.discriminator_predictions(h)
    ref = transformers.ElectraForPreTraining.from_pretrained(
        out, attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = ref(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    np.testing.assert_allclose(mine, theirs.logits.numpy(), rtol=1e-4, atol=1e-5)
    ck = load_hf_directory(out)
    assert isinstance(ck.config, ElectraConfig) and ck.config.embedding_size == 8
    again = ElectraForPreTraining(ck.config, seed=7).eval()
    assert load_pretrained_weights(again, ck.state)["new"] == []
    np.testing.assert_array_equal(again(ids, attention_mask=mask).logits, mine)
    with pytest.raises(ValueError, match="norm_position"):
        Objective(objective_config(2, norm_position="pre")).to_electra()


def generator_logits(run_model, ids, mask=None):
    """(B, T, V) MLM logits of the --objective electra model's generator at every position."""
    h = run_model.generator.bert(ids, attention_mask=mask).last_hidden_state   # (B, T, H)
    return run_model.generator.lm_head(h.reshape(-1, h.shape[-1])).reshape(*ids.shape, -1)


def test_objective_generator_exports_as_transformers_electra_for_masked_lm(tmp_path,
                                                                          vocab_file):
    """The objective's generator (depth-reduced, E = H) is transformers' ElectraForMaskedLM
    with embedding_size = hidden_size: the same logits on every position, padding in the
    batch; a generator with another activation than GELU is refused, naming hidden_act."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from minibert.hf import save_hf_directory
    from minibert.objectives.electra import ElectraForPreTraining as Objective
    run_model = Objective(objective_config(3), generator_layers=2, seed=4).eval()
    rng = np.random.default_rng(5)
    for p in run_model.parameters():         # biases and LayerNorms off their zeros / ones
        p.data[...] = p.data + rng.normal(0, 0.3, p.data.shape).astype(p.data.dtype)
    gen = run_model.generator_to_electra()
    assert gen.config.num_hidden_layers == 2 and gen.config.embedding_size == 8
    out = save_hf_directory(gen, tmp_path / "gen", vocab_file)
    ids, mask = padded_ids(rng)
    mine = generator_logits(run_model, ids, mask)
    ref = transformers.ElectraForMaskedLM.from_pretrained(out, attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = ref(input_ids=torch.from_numpy(ids),
                     attention_mask=torch.from_numpy(mask)).logits.numpy()
    np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="hidden_act 'relu'"):
        Objective(objective_config(2, hidden_act="relu")).generator_to_electra()


# -- an ELECTRA start through finetune.py ---------------------------------------------------

def assert_export_logits(export, cls, ids) -> None:
    """The Hugging Face directory ``export`` loads, every weight used, into transformers'
    class of ``cls``'s name and into ``cls``, and both give the same logits on ``ids``."""
    import torch
    import transformers
    from minibert.hf import load_hf_directory, load_pretrained_weights
    ref = getattr(transformers, cls.__name__).from_pretrained(
        export, attn_implementation="eager").eval()
    ck = load_hf_directory(export)
    ours = cls(ck.config).eval()
    assert load_pretrained_weights(ours, ck.state)["new"] == []
    with torch.no_grad():
        theirs = ref(input_ids=torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(ours(ids).logits, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("E", [8, 16])
def test_finetune_from_a_transformers_electra_and_export_read_by_transformers(
        tmp_path, dataset, E, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from helpers import WORDS, run_ft
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    config = ElectraConfig(vocab_size=len(vocab), embedding_size=E, hidden_size=16,
                           num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                           max_position_embeddings=32)
    start = tmp_path / "electra-start"
    _hf("ElectraForPreTraining", config, 0, np.float32).save_pretrained(start)
    (start / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    out, export = tmp_path / "ft", tmp_path / "hf"
    # a random ELECTRA start attends uniformly, with query / key gradients near 1e-10:
    # Adam's eps of 1e-8 (torch's default) lets them move, where 1e-6 leaves the model
    # on the class prior for these few steps (its gradients are transformers', above)
    assert run_ft("--init", start, "--data", dataset, "--output-dir", out, "--epochs", "20",
                  "--batch-size", "8", "--lr", "1e-2", "--adam-eps", "1e-8",
                  "--max-seq-length", "16", "--export-hf", export) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dev"]["accuracy"] >= 0.75      # one word away from trivial
    cfg = json.loads((export / "config.json").read_text())
    assert cfg["model_type"] == "electra"
    assert cfg["architectures"] == ["ElectraForSequenceClassification"]
    assert_export_logits(export, ElectraForSequenceClassification,
                         np.random.default_rng(3).integers(5, len(vocab), (3, 9)))
    assert run_ft("--model", out, "--predict", "very good film") == 0
    scores = json.loads([l for l in capsys.readouterr().out.splitlines()
                         if l.startswith("[{")][-1])
    assert sorted(s["label"] for s in scores) == ["neg", "pos"]


# -- pipelines and scoring with an ELECTRA generator ----------------------------------------

def test_fill_mask_of_a_transformers_generator_matches_its_pipeline_and_a_discriminator_is_refused(
        tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from helpers import WORDS
    from minibert import pipeline
    from minibert.pipelines import PipelineError
    from minibert.runs import RunError
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    config = tiny(vocab_size=len(vocab), hidden_size=16, embedding_size=8, initializer_range=0.5)
    for cls_name in ("ElectraForMaskedLM", "ElectraForPreTraining"):
        d = tmp_path / cls_name
        _hf(cls_name, config, 0, np.float32).save_pretrained(d)
        (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    gen = tmp_path / "ElectraForMaskedLM"
    text = "the film was [MASK] ."
    ours = pipeline("fill-mask", str(gen), fast_cpu=False)(text, top_k=5)
    ref = transformers.pipeline("fill-mask", model=str(gen),
                                tokenizer=transformers.BertTokenizer(str(gen / "vocab.txt")))
    theirs = ref(text, top_k=5)
    assert [o["token"] for o in ours] == [t["token"] for t in theirs]
    np.testing.assert_allclose([o["score"] for o in ours], [t["score"] for t in theirs],
                               rtol=1e-5)
    with pytest.raises((PipelineError, RunError), match="generator_predictions"):
        pipeline("fill-mask", str(tmp_path / "ElectraForPreTraining"))


def test_train_mlm_objective_electra_export_hf_is_a_transformers_electra(tmp_path, moby30,
                                                                          capsys):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import train_mlm
    from minibert.hf import load_hf_directory, load_pretrained_weights
    from minibert.objectives.electra import ElectraForPreTraining as Objective
    from minibert.runs import load_start
    out, export = tmp_path / "run", tmp_path / "hf"
    assert train_mlm.main(["--corpus", str(moby30), "--vocab-size", "300", "--hidden-size", "32",
                           "--num-hidden-layers", "2", "--max-seq-length", "32",
                           "--batch-size", "4", "--eval-fraction", "0.1",
                           "--eval-instances", "8", "--no-progress", "--output-dir", str(out),
                           "--objective", "electra", "--max-steps", "3",
                           "--generator-layers", "1", "--export-hf", str(export)]) == 0
    assert f"wrote Hugging Face directory {export}" in capsys.readouterr().out
    cfg = json.loads((export / "config.json").read_text())
    assert cfg["model_type"] == "electra" and cfg["architectures"] == ["ElectraForPreTraining"]
    # the run's discriminator, from its checkpoint
    pre = load_start(out)
    run_model = Objective(pre.config, generator_layers=1).eval()
    run_model.load_state_dict(pre.state)
    ids = np.random.default_rng(0).integers(5, pre.config.vocab_size, (2, 11))
    mine = run_model.discriminator_predictions(run_model.bert(ids).last_hidden_state)
    ref = transformers.ElectraForPreTraining.from_pretrained(
        export, attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = ref(input_ids=torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    # the generator beside it, as transformers' ElectraForMaskedLM
    gen = json.loads((export / "generator" / "config.json").read_text())
    assert gen["architectures"] == ["ElectraForMaskedLM"] and gen["num_hidden_layers"] == 1
    ref_gen = transformers.ElectraForMaskedLM.from_pretrained(
        export / "generator", attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = ref_gen(input_ids=torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(generator_logits(run_model, ids), theirs, rtol=1e-4, atol=1e-5)
    # and back: minibert reads the directory as ELECTRA, with the same logits
    ck = load_hf_directory(export)
    again = ElectraForPreTraining(ck.config).eval()
    assert load_pretrained_weights(again, ck.state)["new"] == []
    np.testing.assert_allclose(again(ids).logits, mine, rtol=1e-6, atol=1e-6)
    # and back into the objective: the exported directory continues an ELECTRA run
    capsys.readouterr()
    assert train_mlm.main(["--corpus", str(moby30), "--max-seq-length", "32",
                           "--batch-size", "4", "--eval-fraction", "0.1",
                           "--eval-instances", "8", "--no-progress", "--objective", "electra",
                           "--max-steps", "1", "--generator-layers", "1",
                           "--init-checkpoint", str(export),
                           "--output-dir", str(tmp_path / "more")]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("weights from"))
    import ast
    new, unused = line.split("new: ")[1].split("; not used: ")
    assert new != "none" and all(n.startswith("generator.") for n in ast.literal_eval(new))
    assert unused == "none"          # every exported tensor found its place


def test_an_electra_generator_is_a_distillation_teacher_and_a_discriminator_an_encoder_one(
        tmp_path, vocab_file):
    from minibert.distillation import load_teacher
    from minibert.hf import save_hf_directory
    from minibert.runs import load_start
    gen = ElectraForMaskedLM(tiny(), seed=3).eval()
    save_hf_directory(gen, tmp_path / "gen", vocab_file)
    teacher = load_teacher(load_start(tmp_path / "gen"), dtype=np.float32)
    assert teacher.has_mlm_head
    ids = np.random.default_rng(0).integers(5, 30, (2, 7))
    tt, mask = np.zeros_like(ids), np.ones_like(ids)
    out = teacher(ids, tt, mask)
    np.testing.assert_allclose(out.prediction_logits, gen(ids, tt, mask).prediction_logits,
                               rtol=1e-6)
    save_hf_directory(ElectraForPreTraining(tiny(), seed=3), tmp_path / "disc", vocab_file)
    encoder = load_teacher(load_start(tmp_path / "disc"))
    assert not encoder.has_mlm_head
    assert encoder(ids, tt, mask, logits=False).last_hidden_state.shape == (2, 7, 8)


def test_freeze_covers_the_projection_and_frozen_gradients_stay_zero():
    config = tiny(num_hidden_layers=2, num_labels=3, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    model = ElectraForTokenClassification(config, seed=1).freeze(embeddings=True, layers=1)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert "electra.embeddings_project.weight" in frozen
    assert "electra.embeddings.word_embeddings.weight" in frozen
    assert "electra.encoder.layer.0.output.dense.weight" in frozen
    assert "electra.encoder.layer.1.output.dense.weight" not in frozen
    ids = np.random.default_rng(0).integers(5, 30, (2, 7))
    labels = np.random.default_rng(1).integers(0, 3, (2, 7))
    model.zero_grad()
    model(ids, labels=labels)
    model.backward()
    for n, p in model.named_parameters():
        assert (not np.any(p.grad)) == (n in frozen), n
    with pytest.raises(ValueError, match="layers"):
        model.freeze(layers=3)


def test_evaluate_harness_takes_an_electra_start_and_its_random_twin(tmp_path, vocab_file,
                                                                     capsys):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import evaluate
    from minibert.hf import save_hf_directory
    start = save_hf_directory(ElectraForPreTraining(tiny(hidden_size=16, embedding_size=8),
                                                    seed=1), tmp_path / "electra", vocab_file)
    rng = np.random.default_rng(0)
    task = tmp_path / "toy"
    task.mkdir()
    for split, n in (("train", 24), ("dev", 8), ("test", 8)):
        rows = []
        for _ in range(n):
            y = int(rng.integers(0, 2))
            words = " ".join(rng.choice([f"w{i}" for i in range(2, 20)], 3))
            rows.append(f"{'pos' if y else 'neg'}\t{words} {'w0' if y else 'w1'}")
        (task / f"{split}.tsv").write_text("label\tsentence\n" + "\n".join(rows) + "\n")
    out = tmp_path / "eval"
    assert evaluate.main([str(start), f"random:{start}", "--task-dir", f"toy={task}",
                          "--tasks", "toy", "--budgets", "all", "--seeds", "1", "--epochs", "1",
                          "--lr", "1e-3", "--batch-size", "8", "--max-seq-length", "12",
                          "--output-dir", str(out)]) == 0
    configs = [json.loads(p.read_text()) for p in out.glob("runs/**/config.json")]
    assert configs and all(c["model_type"] == "electra" for c in configs)
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert {r["kind"] for r in runs} == {"finetune", "probe", "bow"}


def test_train_mlm_refuses_an_electra_init_checkpoint_in_one_line(tmp_path, vocab_file, moby30,
                                                                   capsys):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import train_mlm
    from minibert.hf import save_hf_directory
    start = save_hf_directory(ElectraForPreTraining(tiny(), seed=1), tmp_path / "e", vocab_file)
    with pytest.raises(SystemExit):
        train_mlm.main(["--corpus", str(moby30), "--init-checkpoint", str(start),
                        "--output-dir", str(tmp_path / "run"), "--max-steps", "1",
                        "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0] and "model_type 'electra'" in err[0]


def test_pseudo_log_likelihood_of_an_electra_generator_matches_transformers(tmp_path,
                                                                            vocab_file):
    torch = pytest.importorskip("torch")
    from minibert.scoring import score_texts
    from minibert.tokenization import BertTokenizer
    config = tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  initializer_range=0.5)
    hf = _hf("ElectraForMaskedLM", config, 5, np.float64)
    ours = ElectraForMaskedLM(config, dtype=np.float64).eval()
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})
    tok = BertTokenizer(str(vocab_file))
    text = "w3 w7 w1 w12 w5"
    got = score_texts(ours, tok, [text], method="pll")[0]
    ids = tok(text)["input_ids"]
    want = 0.0
    for i in range(1, len(ids) - 1):               # each piece masked in turn, as Salazar et al.
        masked = list(ids)
        masked[i] = tok.mask_token_id
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([masked])).logits[0, i]
        want += torch.log_softmax(logits, -1)[ids[i]].item()
    assert got["tokens"] == len(ids) - 2
    assert got["score"] == pytest.approx(want, rel=1e-9)


def test_electra_is_core_it_loads_numpy_and_the_core_only():
    import subprocess
    import sys
    from pathlib import Path
    probe = ("import json, sys, minibert.electra; "
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith('minibert')"
             " or m in ('torch', 'safetensors', 'tqdm', 'matplotlib', 'regex'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    core = {"minibert", "minibert.backend", "minibert.fast", "minibert.modeling",
            "minibert.heads", "minibert.electra", "minibert.nn"}
    assert {m for m in json.loads(out.stdout)
            if not m.startswith("minibert.nn.")} <= core, out.stdout


# -- the GPU path (a real GPU, else the NumPy stand-in tests/fakecupy.py) -------------------



@pytest.mark.gpu
@pytest.mark.parametrize("cls", [ElectraForPreTraining, ElectraForMaskedLM,
                                 ElectraForSequenceClassification, ElectraForQuestionAnswering])
def test_gpu_gradients_match_the_cpu_and_a_step_reads_nothing_back(cuda, cls):
    import cupy as cp
    import cupyx
    config = tiny(hidden_size=16, num_attention_heads=4, embedding_size=8, num_labels=2,
                  hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 30, (3, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    ids[1, 6:] = 0
    if cls is ElectraForMaskedLM:
        host = dict(input_ids=ids, attention_mask=mask, masked_lm_positions=np.array([[1, 2]] * 3),
                    masked_lm_ids=rng.integers(5, 30, (3, 2)))
    elif cls is ElectraForPreTraining:
        host = dict(input_ids=ids, attention_mask=mask, labels=rng.integers(0, 2, ids.shape))
    elif cls is ElectraForQuestionAnswering:
        host = dict(input_ids=ids, attention_mask=mask, start_positions=np.array([1, 2, 3]),
                    end_positions=np.array([2, 4, 3]))
    else:
        host = dict(input_ids=ids, attention_mask=mask, labels=np.array([0, 1, 1]))
    cpu = cls(config, dtype=np.float64)
    gpu = cls(config, dtype=np.float64).to("cuda")
    losses = []
    for model, xp in ((cpu, np), (gpu, cp)):
        model.set_dropout_rng(SharedDraws(7, xp))
        x = {k: xp.asarray(v) for k, v in host.items()}
        model.zero_grad()
        if xp is cp:
            with cuda.record() as seen, cupyx.allow_synchronize(False):
                out = model(**x)
                model.backward()
            assert seen.syncs == []
        else:
            out = model(**x)
            model.backward()
        losses.append(float(out.loss))
    assert abs(losses[0] - losses[1]) < 1e-10
    for (n, pc), (_, pg) in zip(cpu.named_parameters(), gpu.named_parameters()):
        np.testing.assert_allclose(cp.asnumpy(pg.grad), pc.grad, rtol=1e-9, atol=1e-12,
                                   err_msg=n)


def test_every_bert_role_built_from_an_electra_start_is_the_electra_class(tmp_path,
                                                                          vocab_file):
    from minibert import (BertForPreTraining, BertForQuestionAnswering,
                          BertForSequenceClassification, BertForTokenClassification, BertModel)
    from minibert.auto import bert_role, model_class
    from minibert.runs import load_start
    from minibert.hf import save_hf_directory
    save_hf_directory(ElectraForPreTraining(tiny(), seed=1), tmp_path / "d", vocab_file)
    pre = load_start(tmp_path / "d")
    assert isinstance(pre.config, ElectraConfig) and pre.architecture == "ElectraForPreTraining"
    for role, cls in ((BertModel, ElectraModel), (BertForPreTraining, ElectraForMaskedLM),
                      (BertForSequenceClassification, ElectraForSequenceClassification),
                      (BertForTokenClassification, ElectraForTokenClassification),
                      (BertForQuestionAnswering, ElectraForQuestionAnswering)):
        assert model_class(pre.config, role) is cls and bert_role(cls.__name__) == role.__name__
        model, report = pre.build(role)
        assert type(model) is cls and isinstance(model, role)
        assert report["loaded"] and all(not n.startswith("electra.") for n in report["new"])
        assert set(report["unused"]) <= {n for n in pre.state
                                         if n.startswith("discriminator_predictions.")}


def test_tagging_from_an_electra_start_and_its_export_in_transformers(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from helpers import NEG, POS, WORDS, run_ft
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    start = tmp_path / "electra-start"
    _hf("ElectraForPreTraining", tiny(vocab_size=len(vocab), hidden_size=16,
                                      embedding_size=8, initializer_range=0.02),
        0, np.float32).save_pretrained(start)
    (start / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    rng = np.random.default_rng(0)
    data = tmp_path / "tag"
    data.mkdir()
    for split, n in (("train", 40), ("dev", 10), ("test", 10)):
        lines = []
        for _ in range(n):
            words = list(rng.choice(WORDS, 5))
            lines += [f"{w}\t{'ADJ' if w in POS + NEG else 'X'}" for w in words] + [""]
        (data / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out, export = tmp_path / "ft", tmp_path / "hf"
    assert run_ft("--task", "token-classification", "--init", start, "--data", data,
                  "--output-dir", out, "--epochs", "2", "--batch-size", "8", "--lr", "1e-2",
                  "--adam-eps", "1e-8", "--max-seq-length", "12", "--export-hf", export) == 0
    assert json.loads((export / "config.json").read_text())["architectures"] == [
        "ElectraForTokenClassification"]
    assert_export_logits(export, ElectraForTokenClassification,
                         np.random.default_rng(3).integers(5, len(vocab), (2, 8)))


def test_an_electra_generator_teaches_a_bert_student_of_its_own_sizes(tmp_path, moby30,
                                                                      moby_vocab, capsys):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import train_mlm
    from minibert.hf import save_hf_directory
    n = len(moby_vocab.read_text(encoding="utf-8").splitlines())
    gen = ElectraForMaskedLM(ElectraConfig(vocab_size=n, embedding_size=16, hidden_size=32,
                                           num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=64, max_position_embeddings=64),
                             seed=1)
    teacher = save_hf_directory(gen, tmp_path / "gen", moby_vocab)
    common = ["--corpus", str(moby30), "--teacher", str(teacher), "--objective", "mlm",
              "--max-steps", "2", "--batch-size", "4", "--max-seq-length", "32",
              "--no-progress", "--eval-instances", "4", "--eval-fraction", "0.1"]
    assert train_mlm.main([*common, "--student-init", "preset", "--preset", "tiny",
                           "--hidden-size", "32", "--num-attention-heads", "2",
                           "--output-dir", str(tmp_path / "student")]) == 0
    summary = json.loads((tmp_path / "student" / "summary.json").read_text())
    assert np.isfinite(summary["teacher_mlm_loss"]) and np.isfinite(summary["eval_kl_loss"])
    capsys.readouterr()
    with pytest.raises(SystemExit):     # a copy of its layers would be an ELECTRA student
        train_mlm.main([*common, "--student-init", "every-other-layer",
                        "--output-dir", str(tmp_path / "copy")])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--student-init preset" in err[0]


def test_sequence_regression_matches_transformers():
    torch = pytest.importorskip("torch")
    config = tiny(num_labels=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf = _hf("ElectraForSequenceClassification", config, 2, np.float64)
    ours = ElectraForSequenceClassification(config, dtype=np.float64).eval()
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})
    rng = np.random.default_rng(2)
    ids = rng.integers(5, 30, (3, 6))
    mask = np.ones_like(ids)
    mask[2, 4:] = 0
    y = rng.standard_normal(3)
    out = ours(ids, attention_mask=mask, labels=y)
    ours.zero_grad()
    ours.backward()
    ref = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
             labels=torch.from_numpy(y))
    ref.loss.backward()
    assert rel_error(float(out.loss), ref.loss.item()) < 1e-12
    for n, p in ours.named_parameters():
        assert rel_error(p.grad, dict(hf.named_parameters())[n].grad.numpy(), 1e-8) < 1e-6, n


def test_objective_electra_refuses_an_electra_start_with_a_projection(tmp_path, vocab_file,
                                                                      moby30, moby_vocab,
                                                                      capsys):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import train_mlm
    from minibert.hf import save_hf_directory
    n = len(moby_vocab.read_text(encoding="utf-8").splitlines())
    start = save_hf_directory(ElectraForPreTraining(tiny(vocab_size=n, hidden_size=16,
                                                         embedding_size=8,
                                                         max_position_embeddings=64)),
                              tmp_path / "e", moby_vocab)
    with pytest.raises(SystemExit):
        train_mlm.main(["--corpus", str(moby30), "--objective", "electra",
                        "--init-checkpoint", str(start), "--max-steps", "1", "--no-progress",
                        "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "embedding_size 8 != hidden_size 16" in err[0]
