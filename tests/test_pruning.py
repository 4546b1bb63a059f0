"""Structured pruning (minibert.distillation.pruning): activation scores on hypothesis-drawn
models and batches, units that carry nothing score zero and pruning them leaves the function
exactly as it was, every kept tensor is the teacher's at the kept indices, and config
checks."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import BertConfig, BertModel
from minibert.distillation import (ActivationImportance, activation_importance,
                                   layer_activations, pruned_config, pruned_state, top_indices)
from minibert.nn import extended_attention_mask
from minibert.testing import bert_configs, seeds, token_batches


def prefixed(model: BertModel) -> dict:
    return {f"bert.{k}": np.array(v) for k, v in model.state_dict().items()}


def student_of(config: BertConfig, state: dict, seed: int = 1) -> BertModel:
    model = BertModel(config, seed=seed, dtype=np.float64)
    model.load_state_dict({k[len("bert."):]: v.astype(np.float64) for k, v in state.items()})
    return model.eval()


def hidden_states(model: BertModel, batch) -> np.ndarray:
    return model.eval()(batch.input_ids, batch.token_type_ids,
                        batch.attention_mask).last_hidden_state


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_keeping_every_unit_gives_back_the_teacher(data):
    config = data.draw(bert_configs(max_layers=3))
    teacher = BertModel(config, seed=data.draw(st.integers(0, 99)), dtype=np.float64)
    batch = data.draw(token_batches(config))
    importance = activation_importance(teacher, [batch])
    assert teacher.training                                       # mode given back
    assert importance.hidden.shape == (config.hidden_size,)
    assert (importance.hidden >= 0).all() and (importance.heads >= 0).all()
    assert (importance.neurons >= 0).all() and (importance.layers > -1e-12).all()
    state, channels, _ = pruned_state(prefixed(teacher), config, pruned_config(config),
                                      importance)
    np.testing.assert_array_equal(channels, np.arange(config.hidden_size))
    want = prefixed(teacher)
    assert set(state) == set(want)
    for k, v in state.items():
        np.testing.assert_array_equal(v, want[k].astype(np.float32), err_msg=k)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), seed=seeds)
def test_layer_activations_are_what_the_projections_read_in_a_forward(data, seed):
    """Recomputed from a layer's input hidden state, the activations are, bit for bit,
    the inputs the query/key/value, attention-output, up and down projections read in
    BertModel.forward (the values the scores are defined on), post- and pre-LN."""
    config = data.draw(bert_configs(max_layers=3))
    model = BertModel(config, seed=seed, dtype=np.float64).eval()
    batch = data.draw(token_batches(config))
    seen = {}

    def spy(module, key):
        # a projection is read through forward, or forward_without_bias where the layer
        # adds the bias in a fused step of its own (BertSelfOutput, BertOutput)
        for entry in ("forward", "forward_without_bias"):
            if hasattr(module, entry):
                def recording(x, *args, _call=getattr(module, entry)):
                    seen[key] = x
                    return _call(x, *args)
                setattr(module, entry, recording)

    names = ("read", "ctx", "normed", "act")
    for i, layer in enumerate(model.encoder.layer):
        for name, module in zip(names, (layer.attention.self, layer.attention.output.dense,
                                        layer.intermediate.dense, layer.output.dense)):
            spy(module, (i, name))
    out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask,
                output_hidden_states=True)
    in_forward = dict(seen)
    mask_add = extended_attention_mask(batch.attention_mask, np.float64)
    for i, layer in enumerate(model.encoder.layer):
        got = layer_activations(layer, out.hidden_states[i], mask_add)
        for name, a in zip(names, got):
            np.testing.assert_array_equal(a, in_forward[(i, name)], err_msg=f"{i} {name}")


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_silent_neurons_and_identity_layers_score_zero_and_go_without_a_trace(data):
    """Neurons whose up projection is zero output act(0) = 0 for every activation here, and
    a pre-LN layer whose two output projections are zero adds nothing to the residual
    stream. Both score exactly 0 (block influence 1 - cos(x, x)); the student without
    them computes the teacher's hidden states to rounding, in float64."""
    config = data.draw(bert_configs(max_layers=3))
    config = BertConfig.from_dict({**config.to_dict(), "norm_position": "pre",
                                   "num_hidden_layers": config.num_hidden_layers + 1,
                                   "intermediate_size": max(config.intermediate_size, 3)})
    L, I = config.num_hidden_layers, config.intermediate_size
    teacher = BertModel(config, seed=data.draw(st.integers(0, 99)), dtype=np.float64)
    for p in teacher.parameters():              # pruned_state gives float32 weights
        p.data[...] = p.data.astype(np.float32)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    n_dead = int(rng.integers(1, I))
    dead = [rng.choice(I, n_dead, replace=False) for _ in range(L)]
    for layer, d in zip(teacher.encoder.layer, dead):
        layer.intermediate.dense.weight.data[d] = 0
        layer.intermediate.dense.bias.data[d] = 0
    gone = int(rng.integers(L))
    for dense in (teacher.encoder.layer[gone].attention.output.dense,
                  teacher.encoder.layer[gone].output.dense):
        dense.weight.data[:] = 0
        dense.bias.data[:] = 0
    batch = data.draw(token_batches(config))
    importance = activation_importance(teacher, [batch])
    for i in range(L):
        assert (importance.neurons[i, dead[i]] == 0).all()
    assert abs(importance.layers[gone]) < 1e-12
    student_config = pruned_config(config, num_hidden_layers=L - 1,
                                   intermediate_size=I - n_dead)
    state, _, _ = pruned_state(prefixed(teacher), config, student_config, importance)
    kept_layers = top_indices(importance.layers, L - 1)
    if gone not in kept_layers:          # a live layer can tie at 0 on one short batch
        # (at real tokens: a relu neuron silent there may fire at padding, unscored)
        real = batch.attention_mask.astype(bool)
        student = student_of(student_config, state)
        np.testing.assert_allclose(hidden_states(student, batch)[real],
                                   hidden_states(teacher, batch)[real], rtol=1e-9, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_kept_tensor_is_the_teachers_at_the_kept_indices(data):
    """Random scores, drawn student sizes: each student weight, read entry by entry, is
    the teacher's at (kept row, kept column), the rows of a kept head contiguous."""
    config = data.draw(bert_configs(max_layers=3))
    H, C, I, L = (config.num_attention_heads, config.hidden_size, config.intermediate_size,
                  config.num_hidden_layers)
    head = C // H
    teacher = BertModel(config, seed=0, dtype=np.float64)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    Hs, Ls, Is = (data.draw(st.integers(1, n)) for n in (H, L, I))
    student_config = pruned_config(config, num_attention_heads=Hs, hidden_size=Hs * head,
                                   num_hidden_layers=Ls, intermediate_size=Is)
    importance = ActivationImportance(rng.random(C), rng.random((L, H)), rng.random((L, I)),
                                      rng.random(L))
    state, channels, layers = pruned_state(prefixed(teacher), config, student_config,
                                           importance)
    order = lambda s, k: sorted(sorted(range(len(s)), key=lambda i: -s[i])[:k])  # noqa: E731
    assert list(channels) == order(importance.hidden, Hs * head)
    assert list(layers) == order(importance.layers, Ls)
    t = prefixed(teacher)
    for s_layer, t_layer in enumerate(order(importance.layers, Ls)):
        heads = order(importance.heads[t_layer], Hs)
        rows = [h * head + j for h in heads for j in range(head)]
        neurons = order(importance.neurons[t_layer], Is)
        sp, tp = f"bert.encoder.layer.{s_layer}.", f"bert.encoder.layer.{t_layer}."
        for a, i in enumerate(rows):
            for b, j in enumerate(channels):
                assert state[sp + "attention.self.key.weight"][a, b] == np.float32(
                    t[tp + "attention.self.key.weight"][i, j])
                assert state[sp + "attention.output.dense.weight"][b, a] == np.float32(
                    t[tp + "attention.output.dense.weight"][j, i])
        for norm in ("attention.ln.weight", "ln.bias") if config.norm_position == "pre" else ():
            np.testing.assert_array_equal(state[sp + norm],   # pre-LN's per-layer norms
                                          t[tp + norm][channels].astype(np.float32))
        for a, n in enumerate(neurons):
            assert state[sp + "intermediate.dense.bias"][a] == np.float32(
                t[tp + "intermediate.dense.bias"][n])
            for b, j in enumerate(channels):
                assert state[sp + "output.dense.weight"][b, a] == np.float32(
                    t[tp + "output.dense.weight"][j, n])
    np.testing.assert_array_equal(state["bert.embeddings.word_embeddings.weight"],
                                  t["bert.embeddings.word_embeddings.weight"][:, channels]
                                  .astype(np.float32))
    student = student_of(student_config, state)                   # loads: shapes all fit
    assert student.num_parameters() <= teacher.num_parameters()


def test_top_indices_keeps_the_largest_in_index_order_ties_to_the_lower():
    np.testing.assert_array_equal(top_indices([0.5, 2.0, 0.5, 3.0, 0.5], 3), [0, 1, 3])
    with pytest.raises(ValueError, match="cannot keep 0 of 2"):
        top_indices([1.0, 2.0], 0)


@pytest.mark.parametrize("fields, message", [
    (dict(num_hidden_layers=3), "cannot grow num_hidden_layers from the teacher's 2 to 3"),
    (dict(intermediate_size=64), "cannot grow intermediate_size"),
    (dict(hidden_size=16, num_attention_heads=4), "whole heads of size 8: hidden_size 16 "
     "needs num_attention_heads 2 (got 4)"),
])
def test_pruned_config_refuses_what_pruning_cannot_give(fields, message):
    teacher = BertConfig(vocab_size=20, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=48)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pruned_config(teacher, **fields)


def test_importance_of_no_tokens_is_an_error():
    config = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=8)
    with pytest.raises(ValueError, match="at least one batch"):
        activation_importance(BertModel(config, seed=0), [])
