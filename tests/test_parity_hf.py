"""Parity with Hugging Face transformers' BertForPreTraining (the reference), float64.

The same weights go into both models through our load_state_dict; the loss, the logits
and the gradient of every parameter must agree to a relative error of 1e-6 or better.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from minibert import BertConfig, BertForPreTraining  # noqa: E402
from minibert.gradcheck import rel_error  # noqa: E402
from minibert.testing import seeds, token_batches  # noqa: E402

HF_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "hidden_act", "hidden_dropout_prob",
             "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
             "initializer_range", "layer_norm_eps", "pad_token_id")


def hf_model(config: BertConfig, seed: int):
    torch.manual_seed(seed)
    hf_config = transformers.BertConfig(**{k: getattr(config, k) for k in HF_FIELDS},
                                        attn_implementation="eager")
    return transformers.BertForPreTraining(hf_config).double().eval()


def compare(config, batch, seed):
    hf = hf_model(config, seed)
    ours = BertForPreTraining(config, dtype=np.float64).eval()
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})

    out = ours(**batch.model_inputs())
    ours.zero_grad()
    ours.backward()
    ref = hf(**{k: torch.from_numpy(v) for k, v in batch.hf_kwargs().items()})
    ref.loss.backward()

    assert rel_error(float(out.loss), ref.loss.item()) < 1e-10
    rows = np.arange(len(batch.input_ids))[:, None]
    assert rel_error(out.prediction_logits,
                     ref.prediction_logits.detach().numpy()[rows, batch.masked_lm_positions]) < 1e-10
    assert rel_error(out.seq_relationship_logits,
                     ref.seq_relationship_logits.detach().numpy()) < 1e-10
    ref_params = dict(hf.named_parameters())
    ours_params = dict(ours.named_parameters())
    assert set(ours_params) == set(ref_params)
    assert set(ours.state_dict()) == set(hf.state_dict())
    worst = {n: rel_error(p.grad, ref_params[n].grad.numpy()) for n, p in ours_params.items()}
    bad = {n: e for n, e in worst.items() if not e <= 1e-6}
    assert not bad, f"gradients differ from transformers: {bad}"


@settings(max_examples=10, deadline=None)
@given(data=st.data(), heads=st.sampled_from([1, 2, 4]), act=st.sampled_from(["gelu", "gelu_new"]),
       seed=seeds)
def test_loss_logits_and_every_gradient_match_transformers(data, heads, act, seed):
    config = BertConfig(vocab_size=data.draw(st.integers(20, 60)), hidden_size=4 * heads,
                        num_hidden_layers=data.draw(st.integers(1, 2)), num_attention_heads=heads,
                        intermediate_size=data.draw(st.integers(4, 24)), hidden_act=act,
                        max_position_embeddings=16, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    batch = data.draw(token_batches(config, max_batch=4, max_len=12))
    compare(config, batch, seed % 10_000)


def test_bert_base_shaped_layer_with_heavy_padding():
    """A wider model, with rows padded to a third of the length."""
    config = BertConfig(vocab_size=300, hidden_size=96, num_hidden_layers=2,
                        num_attention_heads=12, intermediate_size=384,
                        max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    rng = np.random.default_rng(3)
    B, T = 4, 48
    mask = (np.arange(T)[None] < np.array([48, 30, 16, 5])[:, None]).astype(np.int64)
    ids = rng.integers(1, 300, (B, T)) * mask
    labels = np.where((rng.random((B, T)) < 0.15) & (mask == 1), ids, -100)
    labels[:, 1] = ids[:, 1]
    from minibert.modeling import masked_lm_from_labels
    from minibert.pretraining import PretrainingBatch
    batch = PretrainingBatch(ids, ((np.arange(T)[None] >= 3) & (mask == 1)).astype(np.int64), mask,
                  *masked_lm_from_labels(labels), np.array([0, 1, 1, 0]))
    compare(config, batch, 0)


@settings(max_examples=4, deadline=None)
@given(heads=st.sampled_from([1, 2]), layers=st.integers(1, 2), seed=seeds)
def test_pre_ln_encoder_is_megatron_berts(heads, layers, seed):
    """Pre-LN's parameter names are Megatron-BERT's (transformers' MegatronBertEncoder:
    ``attention.ln`` before self-attention, ``layer.N.ln`` before the feed-forward block,
    ``ln`` at the end), and under those names the two encoders compute the same output and
    gradients (its embeddings differ: Megatron-BERT has no embedding LayerNorm)."""
    from minibert.modeling import BertEncoder
    from minibert.nn import extended_attention_mask
    config = BertConfig(vocab_size=30, hidden_size=4 * heads, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=12,
                        max_position_embeddings=16, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, norm_position="pre")
    torch.manual_seed(seed % 10_000)
    ref = transformers.MegatronBertModel(transformers.MegatronBertConfig(
        **{k: getattr(config, k) for k in HF_FIELDS}, attn_implementation="eager"))
    ref = ref.encoder.double().eval()
    ours = BertEncoder(config, np.random.default_rng(0), np.float64)
    ours.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 5, config.hidden_size))                # (B, T, C)
    mask = (np.arange(5)[None] < np.array([5, 2, 4])[:, None]).astype(np.int64)
    G = rng.standard_normal(x.shape)
    mask_add = extended_attention_mask(mask, x.dtype)                   # (B, 1, 1, T)
    y = ours(x, mask_add)
    ours.zero_grad()
    dx = ours.backward(G)
    xt = torch.from_numpy(x).requires_grad_()
    yt = ref(xt, attention_mask=torch.from_numpy(mask_add)).last_hidden_state
    (yt * torch.from_numpy(G)).sum().backward()

    assert rel_error(y, yt.detach().numpy()) < 1e-10
    assert rel_error(dx, xt.grad.numpy()) < 1e-10
    ref_params = dict(ref.named_parameters())
    worst = {n: rel_error(p.grad, ref_params[n].grad.numpy()) for n, p in ours.named_parameters()}
    bad = {n: e for n, e in worst.items() if not e <= 1e-6}
    assert not bad, f"gradients differ from Megatron-BERT: {bad}"
