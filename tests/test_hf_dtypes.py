"""Hugging Face checkpoints in any float type (issue 42, item 1): bfloat16 and float16
weights in ``model.safetensors`` and ``pytorch_model.bin`` load into minibert's float32 and
fill masks as transformers' pipeline does on the same (upcast) weights; ``save_hf_directory``
writes float16 / bfloat16 that transformers reads back with equal weights."""
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert import pipeline
from minibert.hf import (bfloat16_to_float32, float32_to_bfloat16, load_hf_directory,
                         read_safetensors, save_hf_directory, write_safetensors)
from minibert.pipelines import load_pipeline_model
from minibert.untrusted import UntrustedFileError

sys.path.insert(0, str(Path(__file__).parent))
from helpers import UNCASED_VOCAB  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["the man went to the [MASK] .", "[MASK] is the capital of france ."]


def tiny_bert(seed=0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=64, initializer_range=0.3)
    return transformers.BertForMaskedLM(config).eval()


@pytest.fixture(scope="module")
def hf_tokenizer():
    return transformers.BertTokenizer(str(UNCASED_VOCAB))


def same_fills(ours, theirs):
    assert [r["token"] for r in ours] == [r["token"] for r in theirs]
    assert [r["sequence"] for r in ours] == [r["sequence"] for r in theirs]
    np.testing.assert_allclose([r["score"] for r in ours], [r["score"] for r in theirs],
                               atol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_half_precision_checkpoints_fill_masks_as_transformers(dtype, safe, hf_tokenizer,
                                                               tmp_path):
    model = tiny_bert().to(getattr(torch, dtype))
    model.save_pretrained(tmp_path)
    if not safe:       # what save_pretrained(safe_serialization=False) wrote (transformers < 5)
        (tmp_path / "model.safetensors").unlink()
        torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    hf_tokenizer.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_bytes(UNCASED_VOCAB.read_bytes())   # transformers 5: none
    assert (tmp_path / ("model.safetensors" if safe else "pytorch_model.bin")).is_file()
    ck = load_hf_directory(tmp_path)
    upcast = model.to(torch.float32)                     # exact: every half value is a float32
    for name, t in upcast.state_dict().items():
        if name in ck.state:
            assert ck.state[name].dtype == np.float32, name
            np.testing.assert_array_equal(ck.state[name], t.numpy(), err_msg=name)
    theirs = transformers.pipeline("fill-mask", model=upcast, tokenizer=hf_tokenizer,
                                   device="cpu")
    ours = pipeline("fill-mask", tmp_path)
    for text in TEXTS:
        same_fills(ours(text, top_k=5), theirs(text, top_k=5))
    fill_model, _, _ = load_pipeline_model("fill-mask", tmp_path)
    assert all(p.data.dtype == np.float32 for _, p in fill_model.named_parameters())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_export_dtype_is_read_back_by_transformers_with_equal_weights(dtype, hf_tokenizer,
                                                                      tmp_path):
    tiny_bert(seed=1).save_pretrained(tmp_path / "src")
    hf_tokenizer.save_pretrained(tmp_path / "src")
    (tmp_path / "src" / "vocab.txt").write_bytes(UNCASED_VOCAB.read_bytes())
    model, _, _ = load_pipeline_model("fill-mask", tmp_path / "src")
    out = save_hf_directory(model, tmp_path / "out", UNCASED_VOCAB, dtype=dtype)
    back = transformers.BertForMaskedLM.from_pretrained(str(out), dtype=getattr(torch, dtype))
    theirs = back.state_dict()
    for name, p in model.named_parameters():
        want = torch.from_numpy(np.asarray(p.data, dtype=np.float32)).to(getattr(torch, dtype))
        assert theirs[name].dtype == getattr(torch, dtype), name
        assert torch.equal(theirs[name], want), name     # torch's rounding, bit for bit
    # and minibert reads its own export back to the same (rounded) weights
    ck = load_hf_directory(out)
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(ck.state[name], theirs[name].float().numpy())


def test_bfloat16_widening_and_rounding_match_torch():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10_000).astype(np.float32) * 10.0 ** rng.integers(
        -30, 30, 10_000), np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, 3.3895e38],
                                   dtype=np.float32)]).astype(np.float32)
    t = torch.from_numpy(x).to(torch.bfloat16)
    bits = float32_to_bfloat16(x)
    np.testing.assert_array_equal(bits, t.view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(bfloat16_to_float32(bits), t.float().numpy())
    assert np.isnan(bfloat16_to_float32(float32_to_bfloat16(np.array([np.nan], np.float32))))


def test_a_damaged_bfloat16_file_is_refused_from_its_header(tmp_path):
    blob = write_safetensors({"a": np.ones((4, 3), np.float32), "b": np.zeros(5, np.int64)},
                             "bfloat16")
    path = tmp_path / "w.safetensors"
    path.write_bytes(blob)
    got = read_safetensors(path)
    assert got["a"].dtype == np.float32 and got["b"].dtype == np.int64
    np.testing.assert_array_equal(got["a"], np.ones((4, 3)))
    path.write_bytes(blob[:-3])                          # truncated
    with pytest.raises(UntrustedFileError, match="tensors end at byte"):
        read_safetensors(path)
    path.write_bytes(blob.replace(b'"BF16"', b'"F8_E4M3"'))   # same width, not read
    with pytest.raises(UntrustedFileError, match="F8_E4M3"):
        read_safetensors(path)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_albert_half_precision_checkpoints_fill_masks_as_transformers(dtype, hf_tokenizer,
                                                                      tmp_path):
    """Every family reads the same weights reader: an ALBERT directory in half precision."""
    torch.manual_seed(2)
    config = transformers.AlbertConfig(vocab_size=30522, embedding_size=16, hidden_size=32,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, max_position_embeddings=64,
                                       initializer_range=0.3)
    model = transformers.AlbertForMaskedLM(config).eval().to(getattr(torch, dtype))
    model.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_bytes(UNCASED_VOCAB.read_bytes())
    upcast = model.to(torch.float32)
    ck = load_hf_directory(tmp_path)
    assert all(v.dtype == np.float32 for v in ck.state.values() if v.dtype.kind == "f")
    theirs = transformers.pipeline("fill-mask", model=upcast, tokenizer=hf_tokenizer,
                                   device="cpu")
    ours = pipeline("fill-mask", tmp_path)
    for text in TEXTS:
        same_fills(ours(text, top_k=5), theirs(text, top_k=5))
