"""minibert.torchbin: pytorch_model.bin read without torch, checked against torch.save."""
import pickle
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import BertForSequenceClassification
from minibert.hf import load_hf_directory, load_pretrained_weights
from minibert.torchbin import TorchBinError, load_torch_state_dict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int8, torch.uint8, torch.bool]


def expected(t):
    return (t.float() if t.dtype == torch.bfloat16 else t).contiguous().numpy()


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    t = (torch.randn(shape, generator=g) * 50).to(dtype)
    view = draw(st.sampled_from(["plain", "transpose", "slice"]))
    if view == "transpose" and t.dim() >= 2:
        t = t.transpose(0, 1)
    elif view == "slice" and t.dim() >= 1 and t.shape[0] > 1:
        t = t[1:]  # a view with a storage offset
    return t


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.text("abc.", min_size=1, max_size=6), tensors(), min_size=1,
                       max_size=5))
def test_matches_torch_save(tmp_path_factory, state):
    path = tmp_path_factory.mktemp("bin") / "pytorch_model.bin"
    torch.save(state, path)
    got = load_torch_state_dict(path)
    assert sorted(got) == sorted(state)
    for k, t in state.items():
        want = expected(t)
        assert got[k].shape == want.shape and got[k].dtype == want.dtype, k
        np.testing.assert_array_equal(got[k], want)


def test_shared_storage_and_parameters(tmp_path):
    w = torch.nn.Parameter(torch.randn(4, 3))
    state = {"a": w, "tied": w, "row": w.data[2], "t": w.data.t()}
    torch.save(state, tmp_path / "m.bin")
    got = load_torch_state_dict(tmp_path / "m.bin")
    np.testing.assert_array_equal(got["a"], w.detach().numpy())
    np.testing.assert_array_equal(got["tied"], w.detach().numpy())
    np.testing.assert_array_equal(got["row"], w.detach().numpy()[2])
    np.testing.assert_array_equal(got["t"], w.detach().numpy().T)


class _Evil:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.target}",))


def test_hostile_pickle_is_refused_without_running_it(tmp_path):
    target = tmp_path / "pwned"
    path = tmp_path / "evil.bin"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"x": _Evil(target)}, protocol=2))
    with pytest.raises(TorchBinError, match=r"refusing to unpickle the global (posix|os|nt)\.system"):
        load_torch_state_dict(path)
    assert not target.exists()


def test_legacy_format_and_non_state_dict_are_refused(tmp_path):
    torch.save({"a": torch.ones(2)}, tmp_path / "old.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(TorchBinError, match="torch < 1.6"):
        load_torch_state_dict(tmp_path / "old.bin")
    torch.save([torch.ones(2)], tmp_path / "list.bin")
    with pytest.raises(TorchBinError, match="expected a dict of tensors"):
        load_torch_state_dict(tmp_path / "list.bin")


def test_hf_directory_with_pytorch_model_bin_gives_transformers_logits(tmp_path):
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=16,
                                  max_position_embeddings=16, num_labels=3)
    torch.manual_seed(0)
    ref = transformers.BertForSequenceClassification(cfg).eval()
    # what transformers < 5 wrote by default (5 writes safetensors only)
    ref.config.save_pretrained(tmp_path)
    torch.save(ref.state_dict(), tmp_path / "pytorch_model.bin")
    (tmp_path / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]))
    assert (tmp_path / "pytorch_model.bin").is_file()
    assert not (tmp_path / "model.safetensors").exists()
    ck = load_hf_directory(tmp_path)
    model = BertForSequenceClassification(ck.config).eval()
    assert load_pretrained_weights(model, ck.state)["new"] == []
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 40, (3, 7))
    mask = (np.arange(7)[None] < np.array([7, 4, 1])[:, None]).astype(np.int64)
    with torch.no_grad():
        want = ref(input_ids=torch.from_numpy(ids * mask),
                   attention_mask=torch.from_numpy(mask)).logits.numpy()
    got = model(ids * mask, np.zeros_like(ids), mask).logits
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def _zip_pickle(path, payload: bytes):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", payload)
        z.writestr("archive/data/0", b"")


class _FakeStorage:
    pass


class _FakeTensor:
    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, (_FakeStorage(),) + self.args)


def _hostile_bin(path, obj, storage: bytes = b""):
    """A torch-format zip whose data.pkl holds ``obj``; _FakeStorage -> storage key 0."""
    import io
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=2)
    p.persistent_id = lambda o: (("storage", torch.FloatStorage, "0", "cpu", len(storage) // 4)
                                 if isinstance(o, _FakeStorage) else None)
    p.dump(obj)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/data/0", storage)


def test_malformed_files_raise_torchbin_errors(tmp_path):
    # a scalar whose offset is past its (empty) storage: no read outside the buffer
    _hostile_bin(tmp_path / "scalar.bin", {"x": _FakeTensor(5, (), (), False, None)},
                 storage=np.ones(2, np.float32).tobytes())
    with pytest.raises(TorchBinError, match=r"scalar\.bin: .*runs past its storage"):
        load_torch_state_dict(tmp_path / "scalar.bin")
    # more elements than the storage holds (a stride-0 blow-up)
    _hostile_bin(tmp_path / "big.bin", {"x": _FakeTensor(0, (10**6, 10**6), (0, 0), False, None)},
                 storage=np.ones(2, np.float32).tobytes())
    with pytest.raises(TorchBinError, match="more elements than its storage"):
        load_torch_state_dict(tmp_path / "big.bin")
    # a storage whose byte length is not a whole number of floats
    _hostile_bin(tmp_path / "odd.bin", {"x": _FakeTensor(0, (1,), (1,), False, None)},
                 storage=b"\x00" * 6)
    with pytest.raises(TorchBinError, match="not a multiple of its item size"):
        load_torch_state_dict(tmp_path / "odd.bin")
    # setting an attribute on an allowed constructor (pickle BUILD) is refused
    build = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n}X\x0c\x00\x00\x00__defaults__"
             b"K\x07sb.")
    _zip_pickle(tmp_path / "build.bin", build)
    with pytest.raises(TorchBinError):
        load_torch_state_dict(tmp_path / "build.bin")
    # a truncated download
    torch.save({"a": torch.ones(3)}, tmp_path / "ok.bin")
    data = (tmp_path / "ok.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(TorchBinError, match="truncated or not a torch file"):
        load_torch_state_dict(tmp_path / "cut.bin")
