"""DistilBERT: parity with transformers' DistilBertForMaskedLM and task heads on the same
weights (loss, logits and every gradient; float64 on hypothesis-drawn configurations with
padding, float32 to round-off), float64 gradient checks of the new pieces, a directory
saved by transformers read through minibert's loader, the family error line, and
fine-tuning a DistilBERT start end to end with --export-hf read back by transformers."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert.distilbert import (DistilBertConfig, DistilBertForMaskedLM,
                                 DistilBertForQuestionAnswering,
                                 DistilBertForSequenceClassification,
                                 DistilBertForTokenClassification, DistilBertModel)
from minibert.gradcheck import rel_error
from minibert.testing import assert_parameter_gradients, padding_masks, seeds

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import SharedDraws  # noqa: E402


@st.composite
def distilbert_configs(draw, num_labels: int = 2, dropout: float = 0.0) -> DistilBertConfig:
    """Small DistilBERT configs: 1-2 heads of 2-4 wide, 1-3 layers, learned or
    sinusoidal positions, gelu or relu."""
    heads = draw(st.integers(1, 2))
    return DistilBertConfig(
        vocab_size=draw(st.integers(12, 40)), max_position_embeddings=12,
        sinusoidal_pos_embds=draw(st.booleans()), n_layers=draw(st.integers(1, 3)),
        n_heads=heads, dim=heads * draw(st.sampled_from([2, 4])),
        hidden_dim=draw(st.integers(3, 12)), dropout=dropout, attention_dropout=dropout,
        activation=draw(st.sampled_from(["gelu", "relu"])), qa_dropout=dropout,
        seq_classif_dropout=dropout, num_labels=num_labels)


@st.composite
def batches(draw, config: DistilBertConfig, max_batch: int = 3, max_len: int = 9):
    """(input_ids (B, T) int64, attention_mask (B, T)) with padding at the end of rows
    (pad id 0 there, ids >= 1 at real tokens)."""
    B, T = draw(st.integers(1, max_batch)), draw(st.integers(1, max_len))
    mask = draw(padding_masks(B, T))
    rng = np.random.default_rng(draw(seeds))
    ids = rng.integers(1, config.vocab_size, (B, T)) * mask
    return ids.astype(np.int64), mask


def hf_twin(cls, config: DistilBertConfig, seed: int, dtype=np.float64):
    """transformers' class of ``cls``'s name with random weights, and ours with the same."""
    torch.manual_seed(seed)
    fields = {k: v for k, v in config.to_dict().items()}
    hf = getattr(transformers, cls.__name__)(
        transformers.DistilBertConfig(**fields, attn_implementation="eager"))
    hf = hf.to(getattr(torch, np.dtype(dtype).name)).eval()
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    ours = cls(config, dtype=dtype).eval()
    assert set(ours.state_dict()) == set(state)       # key for key
    ours.load_state_dict(state)
    return hf, ours


def grad_error(ours, hf, dtype) -> tuple[float, str]:
    """The worst relative error of a parameter gradient against transformers' (in float32
    relative to the model's largest gradient, as round-off is), and its name."""
    ref = {n: p.grad.numpy() for n, p in hf.named_parameters()}
    assert set(ref) == {n for n, _ in ours.named_parameters()}
    floor = 1e-8 if dtype == np.float64 else max(np.abs(g).max() for g in ref.values())
    errs = {n: rel_error(p.grad, ref[n], floor) for n, p in ours.named_parameters()}
    worst = max(errs, key=errs.get)
    return errs[worst], worst


def mlm_labels(ids, mask, rng):
    """transformers' (B, T) labels: the id at about half the real tokens (at least one),
    -100 elsewhere."""
    labels = np.where((rng.random(ids.shape) < 0.5) & (mask > 0), ids, -100)
    labels[0, 0] = ids[0, 0]
    return labels


def mlm_compare(config, ids, mask, seed, dtype=np.float64):
    hf, ours = hf_twin(DistilBertForMaskedLM, config, seed, dtype)
    labels = mlm_labels(ids, mask, np.random.default_rng(seed))
    out = ours(ids, attention_mask=mask, masked_lm_ids=labels)
    ours.zero_grad()
    ours.backward()
    ref = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
             labels=torch.from_numpy(labels))
    ref.loss.backward()
    logits = rel_error(out.prediction_logits, ref.logits.detach().numpy(), 1e-8)
    return rel_error(float(out.loss), ref.loss.item()), logits, *grad_error(ours, hf, dtype)


# -- parity with transformers ---------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(data=st.data(), seed=seeds)
def test_masked_lm_loss_logits_and_every_gradient_match_transformers(data, seed):
    config = data.draw(distilbert_configs())
    ids, mask = data.draw(batches(config))
    loss, logits, grad, name = mlm_compare(config, ids, mask, seed % 10_000)
    assert loss < 1e-10 and logits < 1e-10
    assert grad <= 1e-6, f"gradient of {name} differs from transformers: {grad:.2e}"


def test_masked_lm_float32_matches_transformers_to_round_off():
    config = DistilBertConfig(vocab_size=60, dim=32, n_layers=3, n_heads=4, hidden_dim=64,
                              max_position_embeddings=16, dropout=0.0, attention_dropout=0.0)
    rng = np.random.default_rng(4)
    mask = (np.arange(12)[None] < np.array([12, 9, 5, 1])[:, None]).astype(np.int64)
    ids = rng.integers(1, 60, (4, 12)) * mask
    loss, logits, grad, name = mlm_compare(config, ids, mask, 4, np.float32)
    assert loss < 1e-5 and logits < 1e-5
    assert grad <= 1e-5, f"gradient of {name} differs from transformers: {grad:.2e}"


@settings(max_examples=10, deadline=None)
@given(data=st.data(), seed=seeds,
       head=st.sampled_from(["sequence", "regression", "token", "qa"]))
def test_task_heads_logits_loss_and_gradients_match_transformers(data, seed, head):
    K = {"sequence": data.draw(st.integers(2, 4)), "regression": 1, "qa": 2,
         "token": data.draw(st.integers(2, 4))}[head]
    config = data.draw(distilbert_configs(num_labels=K))
    ids, mask = data.draw(batches(config))
    B, T = ids.shape
    cls = {"sequence": DistilBertForSequenceClassification,
           "regression": DistilBertForSequenceClassification,
           "token": DistilBertForTokenClassification, "qa": DistilBertForQuestionAnswering}[head]
    hf, ours = hf_twin(cls, config, seed % 10_000)
    rng = np.random.default_rng(seed)
    t = lambda a: torch.from_numpy(np.asarray(a))     # noqa: E731
    if head == "qa":
        # T (ignored) only beside a counted example: all ignored is our 0, torch's nan
        s, e = rng.integers(0, T + 1, B), rng.integers(0, T + 1, B)
        s[0] = e[0] = 0
        out = ours(ids, attention_mask=mask, start_positions=s, end_positions=e)
        ref = hf(input_ids=t(ids), attention_mask=t(mask), start_positions=t(s),
                 end_positions=t(e))
        pairs = [(out.start_logits, ref.start_logits), (out.end_logits, ref.end_logits)]
    else:
        if head == "regression":
            labels = rng.standard_normal(B)
        elif head == "sequence":
            labels = rng.integers(0, K, B)
        else:
            labels = np.where(mask > 0, rng.integers(0, K, (B, T)), -100)
            labels[0, 0] = 0
        out = ours(ids, attention_mask=mask, labels=labels)
        ref = hf(input_ids=t(ids), attention_mask=t(mask), labels=t(labels))
        pairs = [(out.logits, ref.logits)]
    for a, b in pairs:
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert rel_error(float(out.loss), ref.loss.item()) < 1e-10
    ours.zero_grad()
    ours.backward()
    ref.loss.backward()
    grad, name = grad_error(ours, hf, np.float64)
    assert grad <= 1e-6, f"{cls.__name__}: gradient of {name} differs: {grad:.2e}"


def test_token_type_ids_are_ignored_and_padding_changes_nothing_at_real_positions():
    config = DistilBertConfig(vocab_size=20, dim=8, n_layers=2, n_heads=2, hidden_dim=10,
                              max_position_embeddings=12)
    model = DistilBertModel(config, seed=1, dtype=np.float64).eval()
    ids = np.random.default_rng(0).integers(1, 20, (2, 6))
    mask = np.ones_like(ids)
    base = model(ids, attention_mask=mask).last_hidden_state
    types = np.ones_like(ids)
    np.testing.assert_array_equal(model(ids, types, mask).last_hidden_state, base)
    padded = np.concatenate([ids, np.zeros((2, 3), np.int64)], axis=1)
    pmask = np.concatenate([mask, np.zeros((2, 3), np.int64)], axis=1)
    np.testing.assert_allclose(model(padded, attention_mask=pmask).last_hidden_state[:, :6],
                               base, atol=1e-12)
    assert model(ids).pooler_output is None
    with pytest.raises(ValueError, match="token_type_ids: expected shape"):
        model(ids, types[:, :3])


# -- gradient checks (float64, central differences) -----------------------------------------

def jitter_biases(model, rng) -> None:
    """Non-zero biases: with zero ones a row that dropout empties reaches a LayerNorm as an
    exact zero vector, where LayerNorm (eps 1e-12) is not smooth at the scale of a
    central difference."""
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            p.data += 0.1 * rng.standard_normal(p.data.shape)


@settings(max_examples=8, deadline=None)
@given(data=st.data(), seed=seeds, dropout=st.sampled_from([0.0, 0.3]),
       piece=st.sampled_from(["block", "attention", "ffn"]))
def test_block_attention_and_ffn_input_and_parameter_gradients(data, seed, dropout, piece):
    """check_module on each new layer: its input gradient (dx) and every parameter's, with
    a padding mask and dropout masks replayed from one seed."""
    from minibert.distilbert import DistilBertFFN, DistilBertSelfAttention, TransformerBlock
    from minibert.nn import extended_attention_mask
    from minibert.testing import assert_module_gradients
    config = data.draw(distilbert_configs(dropout=dropout))
    rng = np.random.default_rng(seed)
    B, T = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 4))
    x = rng.standard_normal((B, T, config.dim))
    mask_add = extended_attention_mask(data.draw(padding_masks(B, T)), np.float64)
    cls = {"block": TransformerBlock, "attention": DistilBertSelfAttention,
           "ffn": DistilBertFFN}[piece]
    module = cls(config, rng, np.float64)
    jitter_biases(module, rng)
    inputs = (x,) if piece == "ffn" else (x, mask_add)

    def same_dropout():
        for m in module.modules():
            if hasattr(m, "p"):
                m.rng = np.random.default_rng(seed)

    assert_module_gradients(module, inputs, before_forward=same_dropout, seed=seed,
                            input_names=["x", "mask_add"][:len(inputs)])


@settings(max_examples=6, deadline=None)
@given(data=st.data(), seed=seeds, dropout=st.sampled_from([0.0, 0.3]))
def test_model_gradients_random_upstream_fixed_dropout(data, seed, dropout):
    """DistilBertModel with a random upstream gradient of the last hidden state; dropout
    masks replayed from one seed for every evaluation."""
    config = data.draw(distilbert_configs(dropout=dropout))
    ids, mask = data.draw(batches(config, max_batch=2, max_len=5))
    rng = np.random.default_rng(seed)
    model = DistilBertModel(config, seed=seed % 1000, dtype=np.float64)
    jitter_biases(model, rng)

    def run():
        model.set_dropout_rng(np.random.default_rng(seed))
        return model(ids, attention_mask=mask).last_hidden_state

    G = rng.standard_normal(run().shape) * mask[..., None]
    model.zero_grad()
    model.backward(G)
    assert_parameter_gradients(model, lambda: float((run() * G).sum()), rng,
                               f"DistilBertModel {config}", full_max_size=24)


@settings(max_examples=6, deadline=None)
@given(data=st.data(), seed=seeds,
       cls=st.sampled_from([DistilBertForMaskedLM, DistilBertForSequenceClassification,
                            DistilBertForTokenClassification, DistilBertForQuestionAnswering]))
def test_heads_gradients_loss_plus_random_upstream(data, seed, cls):
    """Each model's loss plus a random upstream gradient of its logits, with dropout 0.2
    replayed from a fixed generator (the heads' own dropouts included)."""
    K = 2 if cls is DistilBertForQuestionAnswering else data.draw(st.integers(1, 3)) \
        if cls is DistilBertForSequenceClassification else 3
    config = data.draw(distilbert_configs(num_labels=K, dropout=0.2))
    ids, mask = data.draw(batches(config, max_batch=2, max_len=5))
    # padded positions (attention mask 0) hold a real id: the pad row of the word
    # embeddings learns nothing by contract, yet QA's softmax over all T reads them
    ids = np.where(mask > 0, ids, 1)
    B, T = ids.shape
    rng = np.random.default_rng(seed)
    model = cls(config, seed=seed % 1000, dtype=np.float64)
    jitter_biases(model, rng)
    if cls is DistilBertForMaskedLM:
        kw = dict(masked_lm_ids=mlm_labels(ids, mask, rng))
    elif cls is DistilBertForQuestionAnswering:
        kw = dict(start_positions=rng.integers(0, T, B), end_positions=rng.integers(0, T, B))
    elif cls is DistilBertForTokenClassification:
        kw = dict(labels=np.where(mask > 0, rng.integers(0, K, (B, T)), -100))
    else:
        kw = dict(labels=rng.standard_normal(B) if K == 1 else rng.integers(0, K, B))

    def run():
        model.set_dropout_rng(np.random.default_rng(seed))
        return model(ids, attention_mask=mask, **kw)

    def logits(o):
        if cls is DistilBertForMaskedLM:
            return o.prediction_logits
        return (o.start_logits, o.end_logits) if cls is DistilBertForQuestionAnswering \
            else o.logits

    out = run()
    L = logits(out)
    G = tuple(rng.standard_normal(x.shape) for x in L) if isinstance(L, tuple) \
        else rng.standard_normal(L.shape)
    model.zero_grad()
    if cls is DistilBertForMaskedLM:
        model.backward(0.7, d_prediction_logits=G)
    else:
        model.backward(0.7, d_logits=G)

    def loss():
        o = run()
        L = logits(o)
        up = sum(float((a * g).sum()) for a, g in zip(L, G)) if isinstance(L, tuple) \
            else float((L * G).sum())
        return 0.7 * float(o.loss) + up

    # the position table and the pad row: compare in full where they are small
    assert_parameter_gradients(model, loss, rng, f"{cls.__name__} {config}", full_max_size=24)


# -- configs, auto and Hugging Face directories -------------------------------------------

def test_config_aliases_errors_and_auto_classes():
    from minibert.auto import bert_role, config_from_dict, model_class
    from minibert.heads import BertForSequenceClassification
    from minibert.modeling import BertForPreTraining
    c = DistilBertConfig(dim=16, n_heads=4, n_layers=2, hidden_dim=32)
    assert (c.hidden_size, c.num_attention_heads, c.num_hidden_layers, c.intermediate_size,
            c.hidden_act, c.model_type) == (16, 4, 2, 32, "gelu", "distilbert")
    assert config_from_dict(c.to_record()) == c
    assert model_class(c, BertForPreTraining) is DistilBertForMaskedLM
    assert model_class(c, BertForSequenceClassification) is DistilBertForSequenceClassification
    assert bert_role("DistilBertForMaskedLM") == "BertForPreTraining"
    with pytest.raises(ValueError, match="divisible by num_attention_heads"):
        DistilBertConfig(dim=10, n_heads=4)
    with pytest.raises(ValueError, match="n_layers must be positive"):
        DistilBertConfig(n_layers=0)
    with pytest.raises(ValueError, match="hidden_act"):
        DistilBertConfig(activation="swish")
    with pytest.raises(ValueError, match="no sentence-level head"):
        DistilBertForMaskedLM(c, seq_relationship_head=True)
    with pytest.raises(ValueError, match="next_sentence_label given"):
        m = DistilBertForMaskedLM(DistilBertConfig(vocab_size=10, dim=4, n_heads=1,
                                                   n_layers=1, hidden_dim=4)).eval()
        m(np.ones((1, 3), np.int64), next_sentence_label=np.zeros(1, np.int64))


def transformers_directory(path: Path, vocab_file: Path, cls_name="DistilBertForMaskedLM",
                           **kw) -> Path:
    """A tiny random DistilBERT saved by transformers' save_pretrained, with a vocab."""
    torch.manual_seed(0)
    fields = dict(vocab_size=30, dim=8, n_layers=2, n_heads=2, hidden_dim=12,
                  max_position_embeddings=32)
    fields.update(kw)
    getattr(transformers, cls_name)(transformers.DistilBertConfig(**fields)).save_pretrained(path)
    (path / "vocab.txt").write_bytes(vocab_file.read_bytes())
    return path


def test_directory_saved_by_transformers_loads_and_matches(tmp_path, vocab_file):
    from minibert.hf import load_hf_directory, load_pretrained_weights
    d = transformers_directory(tmp_path / "hf", vocab_file, sinusoidal_pos_embds=True)
    ck = load_hf_directory(d)
    assert isinstance(ck.config, DistilBertConfig) and ck.config.n_layers == 2
    assert ck.config.sinusoidal_pos_embds
    model = DistilBertForMaskedLM(ck.config, seed=3).eval()
    report = load_pretrained_weights(model, ck.state, str(d))
    assert report["new"] == [] and report["unused"] == []
    ref = transformers.DistilBertForMaskedLM.from_pretrained(d).eval()
    ids = np.random.default_rng(0).integers(5, 30, (2, 7))
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    with torch.no_grad():
        theirs = ref(input_ids=torch.from_numpy(ids),
                     attention_mask=torch.from_numpy(mask)).logits.numpy()
    np.testing.assert_allclose(model(ids, attention_mask=mask).prediction_logits, theirs,
                               rtol=1e-4, atol=1e-5)
    # the encoder alone, under a new head
    clf = DistilBertForSequenceClassification(ck.config)
    assert sorted(load_pretrained_weights(clf, ck.state)["new"]) == [
        "classifier.bias", "classifier.weight", "pre_classifier.bias", "pre_classifier.weight"]


def test_a_checkpoint_of_another_family_is_one_error_naming_model_type(tmp_path, vocab_file):
    from minibert.hf import HFFormatError, load_hf_directory
    d = transformers_directory(tmp_path / "hf", vocab_file)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "bert"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFFormatError, match=r"field model_type is 'bert' but the weights "
                                            r"are a 'distilbert' model's") as e:
        load_hf_directory(d)
    assert "\n" not in str(e.value)
    # a bare BERT encoder (keys embeddings.*, encoder.layer.*) given as a DistilBERT
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(
        vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=12, max_position_embeddings=32)).save_pretrained(tmp_path / "bert")
    (tmp_path / "bert" / "vocab.txt").write_bytes(vocab_file.read_bytes())
    cfg = json.loads((tmp_path / "bert" / "config.json").read_text())
    cfg["model_type"] = "distilbert"
    (tmp_path / "bert" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFFormatError, match=r"field model_type is 'distilbert' but the "
                                            r"weights are a 'bert' model's"):
        load_hf_directory(tmp_path / "bert")


def test_export_of_our_model_loads_in_transformers_and_back(tmp_path, vocab_file):
    from minibert.hf import load_hf_directory, load_pretrained_weights, save_hf_directory
    config = DistilBertConfig(vocab_size=30, dim=8, n_layers=2, n_heads=2, hidden_dim=12,
                              max_position_embeddings=16, initializer_range=0.3, num_labels=3)
    model = DistilBertForSequenceClassification(config, seed=2).eval()
    d = save_hf_directory(model, tmp_path / "out", vocab_file)
    ref = transformers.DistilBertForSequenceClassification.from_pretrained(d).eval()
    ids = np.random.default_rng(1).integers(5, 30, (3, 6))
    with torch.no_grad():
        theirs = ref(input_ids=torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(model(ids).logits, theirs, rtol=1e-4, atol=1e-6)
    ck = load_hf_directory(d)
    assert ck.config == config and ck.architectures == ["DistilBertForSequenceClassification"]
    again = DistilBertForSequenceClassification(ck.config, seed=9).eval()
    assert load_pretrained_weights(again, ck.state)["new"] == []
    np.testing.assert_array_equal(again(ids).logits, model(ids).logits)


# -- fine-tuning a DistilBERT start end to end ------------------------------------------------

@pytest.fixture
def distilbert_start(tmp_path):
    """A tiny random DistilBertForMaskedLM saved by transformers, with the toy vocabulary
    of tests/helpers.py (WORDS)."""
    from helpers import WORDS
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n",
                     encoding="utf-8")
    return transformers_directory(tmp_path / "start", vocab, vocab_size=5 + len(WORDS),
                                  dim=16, hidden_dim=32)


def test_finetune_from_a_distilbert_start_and_export_read_by_transformers(
        distilbert_start, dataset, tmp_path, capsys):
    from helpers import run_ft
    out, hf_dir = tmp_path / "ft", tmp_path / "exported"
    assert run_ft("--init", distilbert_start, "--data", dataset, "--output-dir", out,
                  "--max-steps", 2, "--batch-size", 8, "--max-seq-length", 16,
                  "--classifier-dropout", 0.0, "--export-hf", hf_dir) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["labels"] == ["neg", "pos"]
    log = capsys.readouterr().out
    assert "new: ['classifier.bias', 'classifier.weight', 'pre_classifier.bias', " \
           "'pre_classifier.weight']" in log
    assert run_ft("--model", out, "--predict", "very good film") == 0
    scores = json.loads([l for l in capsys.readouterr().out.splitlines()
                         if l.startswith("[{")][0])
    cfg = json.loads((hf_dir / "config.json").read_text())
    assert cfg["model_type"] == "distilbert" and cfg["seq_classif_dropout"] == 0.0
    ref = transformers.DistilBertForSequenceClassification.from_pretrained(hf_dir).eval()
    assert ref.config.id2label == {0: "neg", 1: "pos"}
    from minibert.tokenization import BertTokenizer
    enc = BertTokenizer(hf_dir / "vocab.txt")("very good film", return_tensors="np")
    with torch.no_grad():
        p = torch.softmax(ref(input_ids=torch.from_numpy(enc["input_ids"][None])).logits,
                          -1)[0].numpy()
    probs = {s["label"]: s["score"] for s in scores}
    assert probs["pos"] == pytest.approx(float(p[1]), abs=1e-5)


def test_finetune_distilbert_tagging_and_mean_pooling_error(distilbert_start, dataset, tmp_path,
                                                            capsys):
    from helpers import run_ft
    d = tmp_path / "tags"
    d.mkdir()
    rows = "\n\n".join("\n".join(f"{w}\t{'B' if w.startswith('good') else 'O'}" for w in s)
                       for s in [["good", "film"], ["bad", "plot", "good"]] * 4)
    for split in ("train", "dev", "test"):
        (d / f"{split}.tsv").write_text(rows + "\n", encoding="utf-8")
    assert run_ft("--task", "token-classification", "--init", distilbert_start, "--data", d,
                  "--output-dir", tmp_path / "tag", "--max-steps", 2, "--batch-size", 4,
                  "--max-seq-length", 12) == 0
    with pytest.raises(SystemExit):
        run_ft("--init", distilbert_start, "--data", dataset, "--output-dir", tmp_path / "m",
               "--pooling", "mean", "--max-steps", 1)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("finetune.py: error:") and "first token" in err[-1]


# -- pipelines, PLL scoring and distillation from a DistilBERT start --------------------------

def test_fill_mask_and_pll_scoring_match_transformers(distilbert_start):
    from minibert.pipelines import pipeline
    from minibert.scoring import score_texts
    from minibert.tokenization import BertTokenizer
    fill = pipeline("fill-mask", distilbert_start, top_k=5, fast_cpu=False)
    ours = fill("very good [MASK] .")
    ref = transformers.DistilBertForMaskedLM.from_pretrained(distilbert_start).eval()
    tok = BertTokenizer(distilbert_start / "vocab.txt")
    ids = tok("very good [MASK] .", return_tensors="np")["input_ids"]
    at = int(np.flatnonzero(ids == tok.mask_token_id)[0])
    with torch.no_grad():
        p = torch.softmax(ref(input_ids=torch.from_numpy(ids[None])).logits[0, at], -1).numpy()
    top = np.argsort(-p)[:5]
    assert [r["token"] for r in ours] == top.tolist()
    np.testing.assert_allclose([r["score"] for r in ours], p[top], rtol=1e-4)
    # PLL (Salazar et al. 2020): the sum over pieces of log p(piece | the rest)
    text = "the film was good"
    model = fill.model
    got = score_texts(model, tok, [text], method="pll")[0]
    ids = tok(text, return_tensors="np")["input_ids"]
    want = 0.0
    for i in range(1, len(ids) - 1):
        masked = ids.copy()
        masked[i] = tok.mask_token_id
        with torch.no_grad():
            logp = torch.log_softmax(ref(input_ids=torch.from_numpy(masked[None])).logits[0, i],
                                     -1)
        want += float(logp[ids[i]])
    assert got["tokens"] == len(ids) - 2
    assert got["score"] == pytest.approx(want, rel=1e-4)


def test_a_distilbert_teaches_a_bert_student(distilbert_start, tmp_path, capsys):
    import train_mlm
    from helpers import WORDS
    rng = np.random.default_rng(0)
    docs = ["\n".join(" ".join(rng.choice(WORDS[6:], size=8)) for _ in range(6))
            for _ in range(12)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    argv = ["--corpus", str(corpus), "--vocab", str(distilbert_start / "vocab.txt"),
            "--teacher", str(distilbert_start), "--hidden-size", "16",
            "--num-hidden-layers", "1", "--num-attention-heads", "2",
            "--intermediate-size", "32", "--max-seq-length", "16", "--batch-size", "4",
            "--max-steps", "2", "--eval-every", "100", "--eval-fraction", "0.1",
            "--eval-instances", "4", "--no-progress"]
    assert train_mlm.main(argv + ["--output-dir", str(tmp_path / "student")]) == 0
    log = capsys.readouterr().out
    assert f"teacher: {distilbert_start}" in log and "soft-target KL" in log
    with pytest.raises(SystemExit):
        train_mlm.main(argv + ["--output-dir", str(tmp_path / "s2"),
                               "--student-init", "every-other-layer"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("train_mlm.py: error:") and "--student-init preset" in err[-1]
    # a DistilBERT start continues as --model distilbert only: one line, no traceback
    with pytest.raises(SystemExit):
        train_mlm.main(argv[:4] + argv[6:] + ["--output-dir", str(tmp_path / "s3"),
                                              "--init-checkpoint", str(distilbert_start)])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("train_mlm.py: error:") and "model_type 'distilbert'" in err[-1]
    assert "give --model distilbert" in err[-1]


@pytest.fixture
def bert_teacher(distilbert_start, tmp_path):
    """A tiny random BertForMaskedLM saved by transformers, on distilbert_start's vocab."""
    torch.manual_seed(1)
    d = tmp_path / "bert"
    transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=json.loads((distilbert_start / "config.json").read_text())["vocab_size"],
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32)).save_pretrained(d)
    (d / "vocab.txt").write_bytes((distilbert_start / "vocab.txt").read_bytes())
    return d


def test_pretrain_a_distilbert_and_distil_one_from_a_bert_then_finetune(
        distilbert_start, bert_teacher, dataset, tmp_path, capsys):
    """train_mlm.py --model distilbert: MLM from scratch, continued from a DistilBERT
    start, and as the student of a BERT teacher (Sanh et al. 2019); the student fine-tunes
    and loads in transformers; the options it cannot take are one error line each."""
    import train_mlm
    from helpers import WORDS, run_ft
    rng = np.random.default_rng(0)
    docs = ["\n".join(" ".join(rng.choice(WORDS[6:], size=8)) for _ in range(6))
            for _ in range(12)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    vocab = distilbert_start / "vocab.txt"
    argv = ["--model", "distilbert", "--corpus", str(corpus), "--vocab", str(vocab),
            "--max-seq-length", "16", "--batch-size", "4", "--max-steps", "2",
            "--eval-every", "100", "--eval-fraction", "0.1", "--eval-instances", "4",
            "--no-progress"]
    sizes = ["--hidden-size", "16", "--num-hidden-layers", "2", "--num-attention-heads", "2",
             "--intermediate-size", "32"]
    assert train_mlm.main(argv + sizes + ["--output-dir", str(tmp_path / "scratch")]) == 0
    assert train_mlm.main(argv + ["--output-dir", str(tmp_path / "continued"),
                                  "--init-checkpoint", str(distilbert_start)]) == 0
    student = tmp_path / "student"
    assert train_mlm.main(argv + sizes + ["--output-dir", str(student),
                                          "--teacher", str(bert_teacher)]) == 0
    assert train_mlm.main(argv + ["--output-dir", str(tmp_path / "paper"), "--teacher",
                                  str(bert_teacher), "--student-init", "every-other-layer"]) == 0
    log = capsys.readouterr().out
    assert "objective mlm" in log and f"teacher: {bert_teacher}" in log
    assert "student: layers 0 of the teacher and its other weights; new: none" in log
    from minibert.checkpoint import load_checkpoint
    ck = load_checkpoint(student / "checkpoint.npz")
    assert isinstance(ck["config"], DistilBertConfig)
    assert any(k.startswith("distilbert.transformer.layer.1.") for k in ck["model"])
    hf_dir = tmp_path / "exported"
    assert run_ft("--init", student, "--data", dataset, "--output-dir", tmp_path / "ft",
                  "--max-steps", 1, "--batch-size", 8, "--max-seq-length", 16,
                  "--export-hf", hf_dir) == 0
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(hf_dir)
    assert type(ref).__name__ == "DistilBertForSequenceClassification"
    capsys.readouterr()
    for extra, words in ((["--objective", "mlm+nsp"], "masked-LM only"),
                         (["--teacher", str(bert_teacher), "--student-init", "pruned"],
                          "--student-init preset or every-other-layer")):
        with pytest.raises(SystemExit):
            train_mlm.main(argv + extra + ["--output-dir", str(tmp_path / "bad")])
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("train_mlm.py: error:") and words in err[-1], err[-1]


# -- the GPU path (the real GPU, or the NumPy stand-in of tests/fakecupy.py) ----------------



@pytest.mark.gpu
@pytest.mark.parametrize("cls", [DistilBertForMaskedLM, DistilBertForSequenceClassification,
                                 DistilBertForQuestionAnswering])
def test_gpu_gradients_match_the_cpu_with_padding_and_dropout_reading_nothing_back(cuda, cls):
    import cupy as cp
    import cupyx
    config = DistilBertConfig(vocab_size=50, dim=16, n_layers=2, n_heads=4, hidden_dim=32,
                              max_position_embeddings=16, dropout=0.1, attention_dropout=0.1,
                              qa_dropout=0.1, seq_classif_dropout=0.1)
    rng = np.random.default_rng(0)
    mask = (np.arange(10)[None] < np.array([10, 6, 3])[:, None]).astype(np.int64)
    ids = rng.integers(1, 50, (3, 10)) * mask
    targets = {DistilBertForMaskedLM: dict(masked_lm_ids=mlm_labels(ids, mask, rng)),
               DistilBertForSequenceClassification: dict(labels=np.array([0, 1, 1])),
               DistilBertForQuestionAnswering: dict(start_positions=np.array([1, 2, 0]),
                                                    end_positions=np.array([3, 4, 2]))}[cls]
    cpu = cls(config, dtype=np.float64)
    gpu = cls(config, dtype=np.float64).to("cuda")
    losses = []
    for model, xp in ((cpu, np), (gpu, cp)):
        model.set_dropout_rng(SharedDraws(7, xp))
        x = {k: xp.asarray(v) for k, v in dict(input_ids=ids, attention_mask=mask,
                                                 **targets).items()}
        model(**x)                                       # a GPU compiles its kernels here
        model.zero_grad()
        with cuda.record() as seen, cupyx.allow_synchronize(xp is np):
            out = model(**x)
            model.backward()
        if xp is cp:
            assert seen.syncs == []
        losses.append(float(out.loss))
    assert losses[0] == pytest.approx(losses[1], abs=1e-10)
    for (n, pc), (_, pg) in zip(cpu.named_parameters(), gpu.named_parameters()):
        np.testing.assert_allclose(cp.asnumpy(pg.grad), pc.grad, rtol=1e-9, atol=1e-12,
                                   err_msg=n)


def test_evaluate_harness_on_a_distilbert_start_and_its_random_twin(distilbert_start, dataset,
                                                                     tmp_path):
    import evaluate
    out = tmp_path / "eval"
    assert evaluate.main([str(distilbert_start), f"random:{distilbert_start}",
                          "--task-dir", f"toy={dataset}", "--tasks", "toy", "--budgets", "16",
                          "--seeds", "1", "--epochs", "1", "--lr", "1e-3", "--batch-size", "8",
                          "--max-seq-length", "12", "--output-dir", str(out)]) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert {(r["start"], r["kind"]) for r in runs} >= {
        (str(distilbert_start), "finetune"), (f"random:{distilbert_start}", "finetune"),
        (str(distilbert_start), "probe")}
    configs = [json.loads(p.read_text()) for p in out.glob("runs/**/config.json")]
    assert configs and all(c["model_type"] == "distilbert" for c in configs)


def test_finetune_distilbert_question_answering_and_export(distilbert_start, tmp_path):
    from helpers import run_ft
    hf_dir = tmp_path / "exported"
    assert run_ft("--task", "question-answering", "--init", distilbert_start,
                  "--output-dir", tmp_path / "qa", "--max-steps", 1, "--batch-size", 4,
                  "--max-seq-length", 32, "--doc-stride", 4, "--max-query-length", 8,
                  "--max-train-examples", 8, "--export-hf", hf_dir) == 0
    ref = transformers.AutoModelForQuestionAnswering.from_pretrained(hf_dir)
    assert type(ref).__name__ == "DistilBertForQuestionAnswering"


def test_freezing_embeddings_and_lower_layers_keeps_the_other_gradients():
    config = DistilBertConfig(vocab_size=30, dim=8, n_layers=3, n_heads=2, hidden_dim=12,
                              max_position_embeddings=12, num_labels=3)
    ids = np.random.default_rng(0).integers(1, 30, (2, 6))
    labels = np.array([0, 2])
    full = DistilBertForSequenceClassification(config, seed=1, dtype=np.float64).eval()
    full(ids, labels=labels)
    full.zero_grad()
    full.backward()
    part = DistilBertForSequenceClassification(config, seed=1, dtype=np.float64).eval()
    part.freeze(embeddings=True, layers=2)
    part(ids, labels=labels)
    part.zero_grad()
    part.backward()
    ref = dict(full.named_parameters())
    for name, p in part.named_parameters():
        frozen = name.startswith(("distilbert.embeddings.", "distilbert.transformer.layer.0.",
                                  "distilbert.transformer.layer.1."))
        assert p.requires_grad != frozen, name
        np.testing.assert_array_equal(p.grad, 0 if frozen else ref[name].grad, err_msg=name)


@settings(max_examples=4, deadline=None)
@given(data=st.data(), seed=seeds, width=st.sampled_from([4, 8]))
def test_distilbert_student_gradients_of_the_distillation_loss(data, seed, width):
    """A DistilBERT student of a BERT teacher (minibert.distillation, Sanh et al. 2019):
    every parameter and the projection W_h (student narrower than the teacher) against
    central differences of the weighted total (soft targets, MLM, cosine, pooled cosine,
    attention transfer), with fixed dropout masks; token types reach the teacher only."""
    from helpers import assert_student_gradients
    from minibert import BertConfig, BertForPreTraining
    from minibert.distillation import DistillationWeights, Teacher, student_class
    from minibert.distillation.model import DistilBertDistillationModel
    from minibert.testing import token_batches
    tcfg = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=12, max_position_embeddings=8)
    config = DistilBertConfig(vocab_size=20, dim=width, n_layers=2, n_heads=2, hidden_dim=6,
                              max_position_embeddings=8, dropout=0.2, attention_dropout=0.2)
    assert student_class(config) is DistilBertDistillationModel
    rng = np.random.default_rng(seed)
    teacher = BertForPreTraining(tcfg, seed=seed % 997, dtype=np.float64,
                                 seq_relationship_head=False)
    weights = DistillationWeights(alpha_ce=1.3, alpha_mlm=0.7, alpha_cos=1.1, alpha_att=0.9,
                                  alpha_pooled=0.8)
    model = DistilBertDistillationModel(config, Teacher(teacher), weights, seed=seed % 1000,
                                        dtype=np.float64, seq_relationship_head=False)
    assert hasattr(model, "hidden_projection") == (width != 8)
    batch = data.draw(token_batches(tcfg, max_batch=2))
    kw = {k: v for k, v in batch.model_inputs().items() if k != "next_sentence_label"}
    jitter_biases(model, rng)
    assert_student_gradients(model, kw, teacher, rng, seed, "DistilBERT student")


@settings(max_examples=8, deadline=None)
@given(data=st.data(), seed=seeds)
def test_a_bert_under_distilbert_names_computes_the_same(data, seed):
    """distilbert_state_from_bert (token-type row 0 folded into the positions) and
    distilbert_config_from_bert: a DistilBertForMaskedLM with a BERT's weights gives that
    BERT's MLM logits on one-segment inputs, to round-off, with padding; and with every
    other layer, the paper's student starts as the BERT's layers 0, 2, ..."""
    from minibert import BertForPreTraining
    from minibert.distilbert import distilbert_config_from_bert, distilbert_state_from_bert
    from minibert.distillation import every_other_layer_config, every_other_layer_state
    from minibert.testing import bert_configs
    bert_config = data.draw(bert_configs(max_hidden=8, max_layers=2, max_positions=8))
    if bert_config.norm_position != "post":
        with pytest.raises(ValueError, match="post-LN"):
            distilbert_config_from_bert(bert_config)
        return
    bert = BertForPreTraining(bert_config, seed=seed % 1000, dtype=np.float64,
                              seq_relationship_head=False).eval()
    ours = DistilBertForMaskedLM(distilbert_config_from_bert(bert_config),
                                 dtype=np.float64).eval()
    state = distilbert_state_from_bert(bert.state_dict())
    if bert_config.position_embedding_type != "absolute":
        return    # BERT's fixed table is a buffer, not a weight: nothing to fold into
    assert set(state) == set(ours.state_dict())
    ours.load_state_dict(state, strict=False)
    ids, mask = data.draw(batches(bert_config, max_len=bert_config.max_position_embeddings))
    np.testing.assert_allclose(ours(ids, attention_mask=mask).prediction_logits,
                               bert(ids, attention_mask=mask).prediction_logits,
                               rtol=1e-10, atol=1e-12)
    half = DistilBertForMaskedLM(distilbert_config_from_bert(
        every_other_layer_config(bert_config)), dtype=np.float64)
    half.load_state_dict(distilbert_state_from_bert(every_other_layer_state(
        bert.state_dict())), strict=False)
    np.testing.assert_array_equal(half.distilbert.transformer.layer[0].attention.q_lin.weight.data,
                                  bert.bert.encoder.layer[0].attention.self.query.weight.data)
