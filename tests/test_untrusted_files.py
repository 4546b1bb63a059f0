"""Untrusted model files are checked before memory is spent (minibert.untrusted): a fuzz
test over every file of every format, the memory bombs under a 3 GB address-space limit,
and the issue's examples (a config.json list, a vocab longer than vocab_size, NaN weights)."""
import io
import json
import math
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibert import BertConfig, BertForSequenceClassification, BertModel
from minibert.checkpoint import save_checkpoint
from minibert.hf import load_pretrained_weights, save_hf_directory
from minibert.runs import RunError, load_start
from minibert.tokenization import BertTokenizer
from minibert.untrusted import (UntrustedFileError, check_npz_members, parameter_count,
                                 safetensors_header)

ROOT = Path(__file__).resolve().parents[1]
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]
CONFIG = BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=16, max_position_embeddings=16, num_labels=3,
                    initializer_range=0.3)
LIMIT_AS = 3 << 30  # the issue's `ulimit -v` of 3 GB


def _model():
    return BertForSequenceClassification(CONFIG, seed=0)


def write_hf(directory: Path) -> Path:
    """A tiny classifier as a Hugging Face directory (our own export)."""
    vocab = directory.parent / "tokens.txt"
    vocab.write_text("\n".join(TOKENS) + "\n", encoding="utf-8")
    return save_hf_directory(_model(), directory, vocab, {0: "a", 1: "b", 2: "c"})


def write_bin(directory: Path) -> Path:
    """The same directory with pytorch_model.bin (torch.save) instead of safetensors."""
    torch = pytest.importorskip("torch")
    write_hf(directory)
    from safetensors.numpy import load_file
    state = load_file(str(directory / "model.safetensors"))
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()
    return directory


def write_run(directory: Path) -> Path:
    """A fine-tuning run directory: checkpoint.npz (save_checkpoint) and vocab.txt."""
    directory.mkdir(parents=True)
    (directory / "vocab.txt").write_text("\n".join(TOKENS) + "\n", encoding="utf-8")
    save_checkpoint(directory / "checkpoint.npz", _model(), None,
                    {"job": "finetune", "labels": ["a", "b", "c"],
                     "architecture": "BertForSequenceClassification"})
    return directory


def load(path: Path):
    """What a job does with a start: resolve it, build its tokenizer and load its weights
    into an encoder. Returns the encoder."""
    pre = load_start(path)
    BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    model = BertModel(pre.config, add_pooling_layer=False)
    report = load_pretrained_weights(model, pre.state, pre.source)
    assert not [k for k in report["new"] if "pooler" not in k]
    return model


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    return {"hf": write_hf(root / "hf"), "bin": write_bin(root / "bin"),
            "run": write_run(root / "run")}


# ---------------------------------------------------------------------------------------
# The fuzz test: a mutated file loads, or ends in a clean error that names it, in bounded
# time and memory
# ---------------------------------------------------------------------------------------

JSON_VALUES = st.one_of(
    st.integers(-2, 3), st.sampled_from([10**6, 10**9, 10**18, 2**64]), st.booleans(),
    st.none(), st.sampled_from([float("nan"), float("inf"), -1.5, 0.5, 1e300]),
    st.text(max_size=5), st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2))


@st.composite
def byte_mutation(draw, data: bytes) -> bytes:
    """One or a few of: a byte replaced, a range deleted, bytes inserted, a cut, the
    first 8 bytes (a safetensors header length) rewritten."""
    for _ in range(draw(st.integers(1, 3))):
        n = len(data)
        i = draw(st.integers(0, max(0, n - 1)))
        kind = draw(st.sampled_from(["byte", "delete", "insert", "cut", "length"]))
        if kind == "byte" and n:
            data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
        elif kind == "delete":
            data = data[:i] + data[i + draw(st.integers(1, 64)):]
        elif kind == "insert":
            data = data[:i] + draw(st.binary(min_size=1, max_size=16)) + data[i:]
        elif kind == "cut":
            data = data[:i]
        else:
            data = struct.pack("<Q", draw(st.sampled_from(
                [0, 1, 2, n, max(0, n - 8), 2**31, 2**40, 2**64 - 1]))) + data[8:]
    return data


@st.composite
def json_mutation(draw, data: bytes) -> bytes:
    """A field set to a drawn JSON value or removed, the document replaced by another
    JSON value, or a byte mutation."""
    d = json.loads(data)
    kind = draw(st.sampled_from(["set", "drop", "replace", "bytes"]))
    if kind == "bytes":
        return draw(byte_mutation(data))
    if kind == "replace":
        return json.dumps(draw(JSON_VALUES)).encode()
    key = draw(st.sampled_from(sorted(d)))
    if kind == "set":
        d[key] = draw(JSON_VALUES)
    else:
        del d[key]
    return json.dumps(d).encode()


@st.composite
def vocab_mutation(draw, data: bytes) -> bytes:
    """Lines appended, dropped or repeated, or a byte mutation."""
    lines = data.decode().split("\n")
    kind = draw(st.sampled_from(["append", "drop", "repeat", "bytes"]))
    if kind == "bytes":
        return draw(byte_mutation(data))
    i = draw(st.integers(0, len(lines) - 1))
    if kind == "append":
        lines += [f"x{j}" for j in range(draw(st.integers(1, 5)))]
    elif kind == "drop":
        del lines[i]
    else:
        lines.insert(i, lines[i])
    return "\n".join(lines).encode()


FILES = [("hf", "model.safetensors", byte_mutation), ("hf", "config.json", json_mutation),
         ("hf", "vocab.txt", vocab_mutation), ("hf", "tokenizer_config.json", json_mutation),
         ("bin", "pytorch_model.bin", byte_mutation), ("bin", "config.json", json_mutation),
         ("run", "checkpoint.npz", byte_mutation), ("run", "vocab.txt", vocab_mutation)]


@pytest.mark.parametrize("kind,name,mutation", FILES, ids=[f"{k}-{n}" for k, n, _ in FILES])
def test_mutated_files_load_or_fail_cleanly(pristine, kind, name, mutation):
    original = (pristine[kind] / name).read_bytes()
    load(pristine[kind])  # the pristine copy loads

    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(mutation(original))
    def check(mutated):
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(shutil.copytree(pristine[kind], Path(tmp) / kind))
            (d / name).write_bytes(mutated)
            tracemalloc.start()
            t0 = time.perf_counter()
            try:
                load(d)
            except ValueError as e:  # RunError, VocabError ...: the jobs' error lines
                assert str(d) in str(e), f"the error does not name the file: {e}"
            finally:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            assert time.perf_counter() - t0 < 5.0
            assert peak < 32 << 20, f"{peak:,} bytes allocated to load a {len(mutated)}-byte file"
    check()


# ---------------------------------------------------------------------------------------
# Memory bombs, each run as the real job under a 3 GB address-space limit
# ---------------------------------------------------------------------------------------

def _deflated_zeros(n_mib: int) -> bytes:
    """A raw deflate stream of n_mib MiB of zero bytes, about 1 KB per MiB: one
    compressed MiB repeated (a full flush resets the compressor, so the copies are the
    same bytes and need no history)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(bytes(1 << 20)) + c.flush(zlib.Z_FULL_FLUSH)
    return block * n_mib + c.flush()


def write_zip(path: Path, members: dict, bomb: tuple[str, bytes, int]) -> Path:
    """A zip archive of ``members`` (name -> bytes, stored) and one deflated member
    ``bomb`` = (name, raw deflate stream, size it inflates to), written by hand: zipfile
    cannot write a stream compressed elsewhere. The bomb's CRC is left 0 (nothing may
    read it)."""
    entries, out = [], bytearray()
    items = [(n, 0, d, zlib.crc32(d), len(d)) for n, d in members.items()]
    for name, method, data, crc, size in items + [(bomb[0], 8, bomb[1], 0, bomb[2])]:
        raw = name.encode()
        entries.append((raw, method, crc, len(data), size, len(out)))
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(data),
                           size, len(raw), 0) + raw + data
    start = len(out)
    for raw, method, crc, csize, size, offset in entries:
        out += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc,
                           csize, size, len(raw), 0, 0, 0, 0, 0, offset) + raw
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries),
                       len(out) - start, start, 0)
    path.write_bytes(bytes(out))
    return path


BOMB_MIB = 3500  # inflates past the 3 GB limit; about 3.6 MB on disk


def bin_bomb(d: Path, pristine) -> None:
    """pytorch_model.bin whose storage member inflates to 3.5 GiB."""
    import zipfile
    shutil.copytree(pristine["bin"], d)
    with zipfile.ZipFile(d / "pytorch_model.bin") as z:
        members = {n: z.read(n) for n in z.namelist()}
    victim = next(n for n in members if "/data/" in n)
    del members[victim]
    write_zip(d / "pytorch_model.bin", members,
              (victim, _deflated_zeros(BOMB_MIB), BOMB_MIB << 20))


def npz_bomb(d: Path, pristine) -> None:
    """checkpoint.npz with a weight member whose .npy inflates to 3.5 GiB (its header
    honest about the shape)."""
    import zipfile
    shutil.copytree(pristine["run"], d)
    with zipfile.ZipFile(d / "checkpoint.npz") as z:
        members = {n: z.read(n) for n in z.namelist()}
    name = "model/bert.embeddings.word_embeddings.weight.npy"
    del members[name]
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, np.float32))
    header["shape"] = ((BOMB_MIB << 20) // 4,)
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    stream = c.compress(buf.getvalue()) + c.flush(zlib.Z_FULL_FLUSH)
    write_zip(d / "checkpoint.npz", members,
              (name, stream + _deflated_zeros(BOMB_MIB), len(buf.getvalue()) + (BOMB_MIB << 20)))


def config_bomb(field, value):
    def make(d: Path, pristine) -> None:
        shutil.copytree(pristine["hf"], d)
        cfg = json.loads((d / "config.json").read_text())
        cfg[field] = value
        if field == "hidden_size":
            cfg["num_attention_heads"] = 1
        (d / "config.json").write_text(json.dumps(cfg))
    return make


def safetensors_bomb(d: Path, pristine) -> None:
    """model.safetensors whose header claims 2^40 bytes."""
    shutil.copytree(pristine["hf"], d)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + data[8:])


BOMBS = {"bin-inflates-to-3.5GiB": (bin_bomb, "pytorch_model.bin"),
         "npz-member-3.5GiB": (npz_bomb, "checkpoint.npz"),
         "config-1e6-layers": (config_bomb("num_hidden_layers", 1000000), "num_hidden_layers"),
         "config-hidden-1e9": (config_bomb("hidden_size", 1000000000), "hidden_size"),
         "safetensors-header-2^40": (safetensors_bomb, "header length")}


def _limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))


def run_limited(*argv, timeout=60):
    """A job script of the repo under the 3 GB address-space limit; one BLAS thread, so
    the limit measures the job and not thread stacks."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *map(str, argv)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout,
                          preexec_fn=_limit_address_space)
    return proc, time.perf_counter() - t0


@pytest.mark.parametrize("bomb", list(BOMBS))
def test_memory_bomb_is_an_error_line_under_3gb(pristine, tmp_path, bomb):
    make, named = BOMBS[bomb]
    start = tmp_path / "start"
    make(start, pristine)
    out = tmp_path / "out"
    proc, seconds = run_limited(ROOT / "finetune.py", "--init", start, "--output-dir", out)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("finetune.py: error: --init "), proc.stderr
    assert named in lines[0] and "Traceback" not in proc.stderr
    assert seconds < 30
    assert not out.exists()


def test_train_mlm_init_checkpoint_bomb_is_an_error_line(pristine, tmp_path):
    start = tmp_path / "start"
    npz_bomb(start, pristine)
    proc, _ = run_limited(ROOT / "train_mlm.py", "--init-checkpoint", start, "--output-dir",
                          tmp_path / "out", "--max-steps", "1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.startswith("train_mlm.py: error: --init-checkpoint ")
    assert "checkpoint.npz" in proc.stderr


# ---------------------------------------------------------------------------------------
# The examples and each check on its own
# ---------------------------------------------------------------------------------------

def _edit_config(d: Path, edit) -> None:
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(edit(cfg)))


def test_config_json_list_is_an_error_naming_the_file(pristine, tmp_path):
    d = Path(shutil.copytree(pristine["hf"], tmp_path / "hf"))
    (d / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(RunError, match=r"config\.json: expected a JSON object \{\.\.\.\}, "
                                       r"got a JSON list"):
        load_start(d)


@pytest.mark.parametrize("field,value,expected", [
    ("num_hidden_layers", "12", "expected an integer >= 1"),
    ("hidden_size", True, "expected an integer >= 1"),
    ("vocab_size", 0, "expected an integer >= 1"),
    ("hidden_dropout_prob", 1.0, r"expected a finite number in \[0, 1\)"),
    ("layer_norm_eps", float("nan"), r"expected a finite number in \(0, 1\)"),
    ("pad_token_id", 40, "expected less than vocab_size 40"),
    ("id2label", [0, 1], "expected an object whose keys are class ids"),
    ("hidden_act", 3, "expected a string")])
def test_config_fields_are_typed_and_ranged(pristine, tmp_path, field, value, expected):
    d = Path(shutil.copytree(pristine["hf"], tmp_path / "hf"))
    _edit_config(d, lambda c: {**c, field: value})
    with pytest.raises(RunError, match=rf"config\.json: field '{field}' is .*{expected}"):
        load_start(d)


def test_vocab_longer_than_vocab_size_is_refused(pristine, tmp_path):
    for kind in ("hf", "run"):
        d = Path(shutil.copytree(pristine[kind], tmp_path / kind))
        with open(d / "vocab.txt", "a", encoding="utf-8") as f:
            f.write("extra1\nextra2\n")
        with pytest.raises(RunError, match=r"vocab\.txt: 42 tokens, more than the vocab_size "
                                           r"40 of .*(config\.json|checkpoint\.npz)"):
            load_start(d)


def test_garbage_tokenizer_config_is_an_error(pristine, tmp_path):
    d = Path(shutil.copytree(pristine["hf"], tmp_path / "hf"))
    for text, expected in [(b"\xff\xfe{", "not valid UTF-8 JSON"),
                           (b'"lower"', "expected a JSON object"),
                           (b'{"do_lower_case": "yes"}', "field 'do_lower_case' is 'yes', "
                                                         "expected true or false")]:
        (d / "tokenizer_config.json").write_bytes(text)
        with pytest.raises(RunError, match=rf"tokenizer_config\.json: {expected}"):
            load_start(d)


def _nan_weight(d: Path, kind: str) -> None:
    if kind == "hf":
        from safetensors.numpy import load_file, save_file
        state = load_file(str(d / "model.safetensors"))
        state["bert.encoder.layer.1.output.dense.weight"][0, 3] = np.nan
        save_file(state, str(d / "model.safetensors"))
    else:
        model = _model()
        model.bert.encoder.layer[1].output.dense.weight.data[0, 3] = np.inf
        save_checkpoint(d / "checkpoint.npz", model, None, {"job": "finetune",
                                                            "labels": ["a", "b", "c"]})


@pytest.mark.parametrize("kind", ["hf", "run"])
def test_non_finite_weights_are_refused_naming_the_tensor(pristine, tmp_path, kind):
    d = Path(shutil.copytree(pristine[kind], tmp_path / kind))
    _nan_weight(d, kind)
    with pytest.raises(RunError, match=r"tensor bert\.encoder\.layer\.1\.output\.dense\.weight "
                                       r"holds 1 non-finite value"):
        load_start(d)


def test_nan_start_does_not_fine_tune_to_a_nan_model(pristine, tmp_path):
    """The issue's example: finetune.py from a start with a NaN weight exited 0 with a NaN
    best_model.npz; now it is one error line and writes nothing."""
    d = Path(shutil.copytree(pristine["hf"], tmp_path / "hf"))
    _nan_weight(d, "hf")
    out = tmp_path / "out"
    proc, _ = run_limited(ROOT / "finetune.py", "--init", d, "--output-dir", out)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "non-finite" in proc.stderr and "model.safetensors" in proc.stderr
    assert not (out / "best_model.npz").exists()


def _header(entries: dict) -> bytes:
    raw = json.dumps(entries).encode()
    return struct.pack("<Q", len(raw)) + raw


@pytest.mark.parametrize("entries,data,expected", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, 12, "starts at byte 4"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}}, 16, "starts at byte 12"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, 8, "needs 12"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 20, "holds 20 bytes"),
    ({"a": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}}, 8, "dtype 'X9'"),
    ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, 8, "non-negative"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, 8, "begin <= end")])
def test_safetensors_header_is_checked_as_the_spec_asks(tmp_path, entries, data, expected):
    path = tmp_path / "x.safetensors"
    path.write_bytes(_header(entries) + bytes(data))
    with pytest.raises(UntrustedFileError, match=expected):
        safetensors_header(path)


def test_safetensors_header_accepts_what_the_library_writes(tmp_path):
    from safetensors.numpy import save_file
    state = {"b": np.ones((2, 3), np.float32), "a": np.arange(5, dtype=np.int64),
             "e": np.zeros((0, 4), np.float16)}
    save_file(state, str(tmp_path / "x.safetensors"), metadata={"format": "pt"})
    header = safetensors_header(tmp_path / "x.safetensors")
    assert {k: v[1] for k, v in header.items()} == {k: v.shape for k, v in state.items()}


def test_npz_member_size_must_match_its_header(tmp_path):
    import zipfile
    path = tmp_path / "x.npz"
    np.savez(path, a=np.ones(4, np.float32))
    with zipfile.ZipFile(path) as z:
        raw = z.read("a.npy")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a.npy", raw + b"\0" * 8)  # 8 bytes more than shape (4,) float32
    with pytest.raises(UntrustedFileError, match=r"member a\.npy: declares .* needs"):
        check_npz_members(path)


def test_parameter_count_is_the_models(tmp_path):
    """The bound the memory check uses: BertForPreTraining plus a num_labels classifier,
    exactly, for learned and sinusoidal positions."""
    from minibert import BertForPreTraining
    for kw in ({}, {"position_embedding_type": "sinusoidal", "num_labels": 5}):
        config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3,
                            num_attention_heads=2, intermediate_size=24,
                            max_position_embeddings=20, **kw)
        want = BertForPreTraining(config).num_parameters() + config.num_labels * 17
        assert parameter_count(config) == want
    huge = BertConfig(vocab_size=30522, hidden_size=10**9, num_hidden_layers=1,
                      num_attention_heads=1, intermediate_size=1)
    assert parameter_count(huge) > 10**18 and math.isfinite(float(parameter_count(huge)))


def test_albert_weights_are_checked_against_embedding_size():
    """An ALBERT state (``albert.*``) is checked at its factorised width E: a word table of
    hidden_size columns contradicts embedding_size; the right shapes pass."""
    from minibert import AlbertConfig, AlbertForPreTraining
    from minibert.untrusted import check_state_matches_config
    config = AlbertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2,
                          num_attention_heads=2, intermediate_size=24, embedding_size=8,
                          max_position_embeddings=20)
    state = {n: p.data for n, p in AlbertForPreTraining(config).named_parameters()}
    check_state_matches_config(state, config, "ok")
    bad = dict(state, **{"albert.embeddings.word_embeddings.weight": np.zeros((40, 16))})
    with pytest.raises(UntrustedFileError, match=r"albert\.embeddings\.word_embeddings.*"
                       r"\(40, 16\).*\(40, 8\)"):
        check_state_matches_config(bad, config, "bad")
    ffn = "albert.encoder.albert_layer_groups.0.albert_layers.0.ffn.weight"
    with pytest.raises(UntrustedFileError, match="ffn.weight"):
        check_state_matches_config(dict(state, **{ffn: np.zeros((23, 16))}), config, "bad")
