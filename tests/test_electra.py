"""ELECTRA's replaced-token detection (minibert.objectives.electra): float64 gradient checks
of the discriminator head (random upstream gradient) and of the whole loss (fixed dropout
and sampling draws), the shared embeddings, the corruption and its labels."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert.modeling import masked_lm_from_labels
from minibert.objectives.electra import ElectraDiscriminatorPredictions, ElectraForPreTraining
from minibert.testing import (assert_module_gradients, assert_parameter_gradients,
                              bert_configs, seeds, token_batches)


def masked(rng, batch, P=3):
    """(positions, ids, weights) with up to P masked real tokens per row (the first row has
    one), and the input with [MASK] (id 4 if in the vocab, else 1) at those positions."""
    B, T = batch.input_ids.shape
    labels = np.full((B, T), -100)
    for b in range(B):
        n = int(batch.attention_mask[b].sum())
        k = min(P, max(1 if b == 0 else 0, int(rng.integers(0, n + 1))))
        pos = rng.choice(n, size=k, replace=False)
        labels[b, pos] = batch.input_ids[b, pos]
    positions, ids, weights = masked_lm_from_labels(labels, width=P)
    inp = batch.input_ids.copy()
    inp[labels != -100] = 1
    return inp, positions, ids, weights


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_discriminator_head_gradients(data):
    config = data.draw(bert_configs(max_hidden=8, max_layers=1, min_hidden=8))
    head = ElectraDiscriminatorPredictions(config, np.random.default_rng(0), np.float64)
    h = np.random.default_rng(1).standard_normal((2, 3, config.hidden_size))
    assert_module_gradients(head, (h,))


@settings(max_examples=8, deadline=None)
@given(data=st.data(), dropout=st.sampled_from([0.0, 0.2]), seed=seeds,
       generator_layers=st.integers(1, 2))
def test_electra_loss_gradients(data, dropout, seed, generator_layers):
    config = data.draw(bert_configs(max_hidden=8, max_layers=2, max_positions=6,
                                    dropout=dropout, min_hidden=8))
    batch = data.draw(token_batches(config, max_batch=3))
    rng = np.random.default_rng(seed)
    inp, positions, ids, weights = masked(rng, batch)
    # a disc weight of 2, not 50: the loss stays small, and so does the noise of the central
    # differences where a gradient is exactly 0 (the key bias, which softmax ignores)
    model = ElectraForPreTraining(config, generator_layers=generator_layers, seed=seed % 1000,
                                  disc_weight=2.0, dtype=np.float64)

    def loss():  # the same dropout masks and Gumbel draws every call
        model.set_dropout_rng(np.random.default_rng(seed))
        return 0.7 * float(model(inp, batch.token_type_ids, batch.attention_mask, positions,
                                 ids, weights).loss)

    loss()
    model.zero_grad()
    model.backward(dloss=0.7)
    assert_parameter_gradients(model, loss, rng, "electra",
                               full=lambda n: n.startswith("discriminator_predictions"))


def test_shared_embeddings_corruption_and_labels():
    from minibert import BertConfig
    config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=10)
    model = ElectraForPreTraining(config, seed=0)
    names = dict(model.named_parameters())
    # the embedding tables exist once (under the discriminator's names) and are used by both
    assert not any(n.startswith("generator.bert.embeddings") for n in names)
    assert model.generator.bert.embeddings.word_embeddings.weight is \
        model.bert.embeddings.word_embeddings.weight
    assert model.generator.cls.predictions.decoder.weight is \
        model.bert.embeddings.word_embeddings.weight
    assert len(model.generator.bert.encoder.layer) == 1 and len(model.bert.encoder.layer) == 2
    state = model.state_dict()
    assert "generator.bert.embeddings.word_embeddings.weight" in state   # every name, as torch
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 30, (4, 8))
    mask = np.ones_like(ids)
    mask[2, 5:] = 0
    labels = np.full(ids.shape, -100)
    labels[:, 1] = ids[:, 1]
    labels[1, 3] = ids[1, 3]
    positions, mids, weights = masked_lm_from_labels(labels, width=2)
    inp = np.where(labels != -100, 4, ids)
    model.set_dropout_rng(np.random.default_rng(3))
    out = model(inp, None, mask, positions, mids, weights)
    c = out.replaced_ids
    # unmasked positions keep the original; labels mark exactly where c differs from it
    np.testing.assert_array_equal(c[labels == -100], ids[labels == -100])
    np.testing.assert_array_equal(out.rtd_labels, (c != ids).astype(int))
    assert out.rtd_logits.shape == ids.shape and np.isfinite(float(out.loss))
    assert float(out.loss) == pytest.approx(float(out.mlm_loss) + 50 * float(out.rtd_loss))
    model.backward()
    assert np.abs(model.bert.embeddings.word_embeddings.weight.grad).sum() > 0
    with pytest.raises(ValueError, match="no sentence-level task"):
        model(inp, None, mask, positions, mids, weights, next_sentence_label=np.zeros(4, int))
    with pytest.raises(ValueError, match="generator_layers"):
        ElectraForPreTraining(config, generator_layers=0)


def test_objective_builds_the_model_and_sums_the_metrics():
    import math
    from minibert import BertConfig
    from minibert.objectives import get_objective
    obj = get_objective("electra")
    config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=10)
    model = obj.build_model(config, seed=0)
    assert isinstance(model, ElectraForPreTraining) and model.generator_layers == 1
    with pytest.raises(ValueError, match="label-smoothing"):
        obj.build_model(config, label_smoothing=0.1)
    rng = np.random.default_rng(1)
    ids = rng.integers(5, 30, (3, 8))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    labels = np.full(ids.shape, -100)
    labels[:, 2] = ids[:, 2]
    positions, mids, weights = masked_lm_from_labels(labels, width=2)
    inputs = dict(input_ids=np.where(labels != -100, 4, ids), attention_mask=mask,
                  masked_lm_positions=positions, masked_lm_ids=mids, masked_lm_weights=weights)
    model.set_dropout_rng(np.random.default_rng(0))
    out = model(**inputs)
    sums = obj.stats(out, inputs)
    # the generator's sums are the MLM objective's, bit for bit; the rtd_* terms come on top
    mlm = get_objective("mlm").stats(out, inputs)
    assert list(sums) == [*mlm, "rtd_loss_sum", "rtd_correct", "rtd_count", "rtd_replaced"]
    assert all(sums[k].dtype == v.dtype and sums[k] == v for k, v in mlm.items())
    s = {k: float(v) for k, v in sums.items()}
    real = mask > 0
    assert s["rtd_count"] == real.sum() and s["mlm_count"] == 3
    assert s["rtd_correct"] == (((out.rtd_logits > 0) == (out.rtd_labels == 1)) & real).sum()
    assert s["rtd_replaced"] == (out.rtd_labels * real).sum()
    assert math.isclose(s["rtd_loss_sum"], float(out.rtd_loss) * real.sum(), rel_tol=1e-6)
    m = obj.summarize(s)
    assert set(m) == {"mlm_loss", "mlm_acc", "rtd_loss", "rtd_acc", "rtd_replaced"}
    assert m["rtd_acc"] == s["rtd_correct"] / s["rtd_count"]


def test_train_mlm_electra_end_to_end_and_its_options(tmp_path, capsys, moby30):
    import json
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    import train_mlm
    from minibert.runs import load_start
    out = tmp_path / "run"
    common = ["--corpus", str(moby30), "--vocab-size", "300", "--hidden-size", "32",
              "--num-hidden-layers", "2", "--max-seq-length", "32", "--batch-size", "4",
              "--eval-fraction", "0.1", "--eval-instances", "8", "--no-progress"]
    assert train_mlm.main([*common, "--output-dir", str(out), "--objective", "electra",
                           "--max-steps", "4", "--log-every", "2", "--eval-every", "4",
                           "--generator-layers", "1"]) == 0
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    assert len(train) == 2 and all(0 <= r["rtd_acc"] <= 1 and r["rtd_loss"] > 0 for r in train)
    assert all(0 < r["rtd_replaced"] < 1 for r in train)    # the generator replaced some tokens
    # the run is a BERT start for fine-tuning: the discriminator is bert.*
    pre = load_start(out)
    assert pre.config.num_hidden_layers == 2
    assert "bert.encoder.layer.1.output.dense.weight" in pre.state
    assert "generator.bert.encoder.layer.0.output.dense.weight" in pre.state
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train_mlm.main([*common, "--output-dir", str(tmp_path / "x"), "--disc-weight", "10"])
    assert "--disc-weight: ELECTRA options, only with --objective electra" in \
        capsys.readouterr().err
