"""A Hugging Face directory with ``tokenizer.json`` and no ``vocab.txt`` (issue 42, item 2):
the same tokenizer as transformers' BertTokenizerFast on that file, and one ``error:`` line
for a tokenizer.json that is not WordPiece BERT (BPE, Unigram)."""
import json
import sys
from pathlib import Path

import pytest

from minibert.__main__ import main as minibert_main
from minibert.hf import load_hf_directory
from minibert.runs import RunError, load_start
from minibert.tokenization import BertTokenizer

sys.path.insert(0, str(Path(__file__).parent))
from helpers import ROOT, UNCASED_VOCAB  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

CORPUS = ROOT / "data" / "pretrain" / "en" / "brown.txt"


def corpus_lines(n=1000):
    lines = [l for l in CORPUS.read_text(encoding="utf-8").split("\n") if l.strip()]
    return lines[:n]


def tiny_model_dir(path: Path, vocab_size=30522) -> Path:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=64)
    transformers.BertForMaskedLM(config).save_pretrained(path)
    return path


def tokenizer_json_dir(path: Path, keep_config=True, **kw) -> Path:
    """A model directory whose tokenizer is BertTokenizerFast's tokenizer.json only."""
    tiny_model_dir(path)
    transformers.BertTokenizerFast(str(UNCASED_VOCAB), **kw).save_pretrained(path)
    (path / "vocab.txt").unlink(missing_ok=True)          # transformers 4 writes one too
    if not keep_config:
        (path / "tokenizer_config.json").unlink()
    assert (path / "tokenizer.json").is_file() and not (path / "vocab.txt").exists()
    return path


@pytest.mark.parametrize("kw,keep_config", [
    ({}, True), ({}, False), ({"do_lower_case": False}, False),
    ({"strip_accents": False}, False), ({"tokenize_chinese_chars": False}, True)],
    ids=["uncased", "json-only", "cased", "keep-accents", "no-chinese"])
def test_tokenizer_json_encodes_as_bert_tokenizer_fast(kw, keep_config, tmp_path):
    d = tokenizer_json_dir(tmp_path / "m", keep_config, **kw)
    pre = load_start(d)
    ours = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    theirs = transformers.BertTokenizerFast(tokenizer_file=str(d / "tokenizer.json"))
    assert pre.vocab_file.read_text(encoding="utf-8") == UNCASED_VOCAB.read_text(encoding="utf-8")
    assert ours.get_vocab() == theirs.get_vocab()
    lines = corpus_lines() + ["Ünïcödé ÇAFÉ 中文字 naïve", "straße [MASK] [SEP] x"]
    for line in lines:
        assert ours.encode(line) == theirs(line)["input_ids"], line
        assert ours.encode(line, lines[0]) == theirs(line, lines[0])["input_ids"], line


def test_a_run_from_a_tokenizer_json_start_holds_a_vocab_txt(tmp_path):
    """The vocab file a start resolves to is a real file (a run copies it as vocab.txt);
    the options come from tokenizer.json when there is no tokenizer_config.json."""
    d = tokenizer_json_dir(tmp_path / "m", keep_config=False, do_lower_case=False,
                           strip_accents=True)
    ck = load_hf_directory(d)
    assert ck.vocab_file.name == "vocab.txt" and ck.vocab_file.is_file()
    assert ck.tokenizer_options["do_lower_case"] is False
    assert ck.tokenizer_options["strip_accents"] is True


def bpe_json(path: Path) -> Path:
    tok = tokenizers.ByteLevelBPETokenizer()
    tok.train_from_iterator(corpus_lines(200), vocab_size=300, show_progress=False)
    tok.save(str(path))
    return path


def unigram_json(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(corpus_lines(200), trainers.UnigramTrainer(
        vocab_size=100, show_progress=False, special_tokens=["<unk>"], unk_token="<unk>"))
    tok.save(str(path))
    return path


@pytest.mark.parametrize("make,says", [
    (bpe_json, "tokenizer.json holds a BPE model (RoBERTa/GPT-2 byte-level BPE); minibert "
               "reads WordPiece BERT tokenizers only"),
    (unigram_json, "tokenizer.json holds a Unigram model (SentencePiece")])
def test_other_tokenizers_are_refused_with_one_error_line(make, says, tmp_path, capsys):
    d = tiny_model_dir(tmp_path / "m")
    make(d / "tokenizer.json")
    with pytest.raises(RunError, match="WordPiece BERT tokenizers only"):
        load_start(d)
    with pytest.raises(SystemExit) as e:
        minibert_main(["predict", "fill-mask", str(d), "a [MASK]"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    assert len([l for l in err.splitlines() if "error:" in l]) == 1 and says in err, err


def test_a_wordpiece_tokenizer_json_that_is_not_bert_is_refused(tmp_path):
    d = tokenizer_json_dir(tmp_path / "m")
    j = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFD"}]}
    (d / "tokenizer.json").write_text(json.dumps(j), encoding="utf-8")
    with pytest.raises(RunError, match="not BertNormalizer"):
        load_start(d)
    j = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    del j["normalizer"]
    j["model"]["vocab"]["[UNK]"] = 0                       # two tokens with id 0
    (d / "tokenizer.json").write_text(json.dumps(j), encoding="utf-8")
    with pytest.raises(RunError):
        load_start(d)


def test_finetune_from_a_bfloat16_tokenizer_json_start_and_export_bfloat16(
        dataset, pretrained_run, tmp_path, capsys):
    """finetune.py end to end from a directory transformers wrote in bfloat16 with only a
    tokenizer.json: the run holds a vocab.txt (the start's vocabulary), and --export-hf with
    --export-dtype bfloat16 is read back by transformers as bfloat16 with the run's weights
    rounded to nearest even."""
    import numpy as np

    from helpers import hf_copy, run_ft
    src = hf_copy(pretrained_run, tmp_path / "f32")
    start = tmp_path / "bf16"
    transformers.BertForPreTraining.from_pretrained(src).to(torch.bfloat16).save_pretrained(start)
    transformers.BertTokenizerFast(str(src / "vocab.txt")).save_pretrained(start)
    (start / "vocab.txt").unlink(missing_ok=True)
    out, export = tmp_path / "ft", tmp_path / "export"
    assert run_ft("--init", start, "--data", dataset, "--output-dir", out, "--epochs", "1",
                  "--batch-size", "16", "--max-seq-length", "16", "--test", "none",
                  "--export-hf", export, "--export-dtype", "bfloat16") == 0
    assert (out / "vocab.txt").read_bytes() == (src / "vocab.txt").read_bytes()
    back = transformers.BertForSequenceClassification.from_pretrained(export,
                                                                       dtype=torch.bfloat16)
    theirs = back.state_dict()
    best = load_start(out)
    for name, value in best.state.items():
        if name in theirs:
            want = torch.from_numpy(np.asarray(value, dtype=np.float32)).to(torch.bfloat16)
            assert theirs[name].dtype == torch.bfloat16 and torch.equal(theirs[name], want), name


def test_added_tokens_beyond_the_special_ones_are_refused(tmp_path):
    """transformers never splits an added token; minibert keeps only the five special
    tokens whole, so a tokenizer.json with another added token would tokenize differently."""
    d = tiny_model_dir(tmp_path / "m")
    fast = transformers.BertTokenizerFast(str(UNCASED_VOCAB))
    fast.add_tokens(["hello"])                         # in the vocabulary, but kept whole
    fast.save_pretrained(d)
    (d / "vocab.txt").unlink(missing_ok=True)
    with pytest.raises(RunError, match="added token 'hello'"):
        load_start(d)


# -- max_length from the tokenizer files (model_max_length / truncation.max_length) -----
LONG = " ".join(corpus_lines(40))         # some 900 tokens: longer than every bound below


def vocab_txt_dir(path: Path, model_max_length) -> Path:
    """vocab.txt + tokenizer_config.json (what a slow BertTokenizer's save_pretrained
    writes), no tokenizer.json."""
    tiny_model_dir(path)
    (path / "vocab.txt").write_bytes(UNCASED_VOCAB.read_bytes())
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizer", "do_lower_case": True,
         "model_max_length": model_max_length}), encoding="utf-8")
    return path


def python_bert_tokenizer():
    """transformers' pure-Python BERT tokenizer (BertTokenizerLegacy in v5)."""
    return getattr(transformers, "BertTokenizerLegacy", transformers.BertTokenizer)


@pytest.mark.parametrize("model_max_length", [13, 40, int(1e30), 1e30])
@pytest.mark.parametrize("files", ["vocab.txt", "tokenizer.json"])
def test_model_max_length_bounds_truncation_as_transformers(files, model_max_length, tmp_path):
    """tokenizer_config.json's model_max_length is the length ``truncation=True`` cuts to
    when no max_length is given, as transformers' tokenizers loaded from the same
    directory; its sentinel 1e30 (int or float) means no limit."""
    d = tmp_path / "m"
    if files == "vocab.txt":
        vocab_txt_dir(d, model_max_length)
        theirs = [python_bert_tokenizer().from_pretrained(d),
                  transformers.BertTokenizerFast.from_pretrained(d)]
    else:
        tokenizer_json_dir(d, model_max_length=model_max_length)
        theirs = [transformers.BertTokenizerFast.from_pretrained(d)]
    pre = load_start(d)
    ours = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    bounded = model_max_length < 1e20
    assert ours.model_max_length == (int(model_max_length) if bounded else None)
    for t in theirs:
        for args in [(LONG,), (LONG, corpus_lines(3)[2])]:
            want = t(*args, truncation=True)["input_ids"]
            assert ours(*args, truncation=True)["input_ids"] == want
            assert ours.encode(*args, truncation=True) == want
            assert (len(want) == model_max_length) if bounded else len(want) > 500
        if bounded:   # padding to max_length pads to it; an explicit max_length wins
            short = ours("a b", padding="max_length")["input_ids"]
            assert short == t("a b", padding="max_length")["input_ids"]
            assert len(short) == model_max_length
        assert ours(LONG, truncation=True, max_length=20)["input_ids"] == t(
            LONG, truncation=True, max_length=20)["input_ids"]


def test_tokenizer_json_truncation_max_length_is_read(tmp_path):
    """A tokenizer.json-only directory whose tokenizers file truncates (truncation.max_length)
    gives that length, as the tokenizers library applies it (transformers' __call__ goes by
    tokenizer_config.json only); tokenizer_config.json's model_max_length wins over it, and
    its 1e30 sentinel leaves it standing."""
    d = tokenizer_json_dir(tmp_path / "m", keep_config=False)
    j = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    j["truncation"] = {"direction": "Right", "max_length": 17, "strategy": "LongestFirst",
                       "stride": 0}
    (d / "tokenizer.json").write_text(json.dumps(j), encoding="utf-8")
    ref = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    for text in (LONG, "a short one"):
        ours = BertTokenizer(**{"vocab_file": load_start(d).vocab_file,
                                **load_start(d).tokenizer_options})
        assert ours.model_max_length == 17
        assert ours.encode(text, truncation=True) == ref.encode(text).ids
    for config, want in [({"model_max_length": 9}, 9), ({"model_max_length": 1e30}, 17)]:
        (d / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        assert load_start(d).tokenizer_options["model_max_length"] == want


@pytest.mark.parametrize("where,value", [
    ("tokenizer_config.json", "512"), ("tokenizer_config.json", -1),
    ("tokenizer_config.json", 12.5), ("tokenizer_config.json", True),
    ("tokenizer.json", 0)])
def test_a_bad_max_length_is_one_error_line(where, value, tmp_path, capsys):
    d = tokenizer_json_dir(tmp_path / "m")
    j = json.loads((d / where).read_text(encoding="utf-8"))
    if where == "tokenizer.json":
        j["truncation"] = {"direction": "Right", "max_length": value,
                           "strategy": "LongestFirst", "stride": 0}
    else:
        j["model_max_length"] = value
    (d / where).write_text(json.dumps(j), encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        minibert_main(["predict", "fill-mask", str(d), "a [MASK]"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    lines = [l for l in err.splitlines() if "error:" in l]
    assert len(lines) == 1 and where in lines[0] and "max_length" in lines[0], err


def test_pipelines_and_finetuning_default_to_the_tokenizer_length(tmp_path):
    """The default length of the pipelines and of finetune.py is the tokenizer's
    model_max_length, capped at the model's 64 positions; an explicit length wins."""
    from minibert.finetuning.config import FinetuningConfig
    from minibert.finetuning.job import read_data
    from minibert.pipelines import pipeline
    for mml, want in [(13, 13), (100, 64), (int(1e30), 64)]:
        d = vocab_txt_dir(tmp_path / f"m{mml}", mml)
        assert pipeline("fill-mask", d).max_length == want
        assert pipeline("feature-extraction", d, max_length=20).max_length == 20
        pre = load_start(d)
        tok = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
        cfg = FinetuningConfig(task="sequence-classification", init=str(d),
                               max_train_examples=8)
        assert read_data(cfg, pre, tok)[2] == min(want, 128)
        cfg = FinetuningConfig(task="sequence-classification", init=str(d),
                               max_train_examples=8, max_seq_length=40)
        assert read_data(cfg, pre, tok)[2] == 40
    # a classifier transformers saved: no recorded length, so the tokenizer's bounds it
    d = vocab_txt_dir(tmp_path / "cls", 13)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(transformers.BertConfig.from_pretrained(
        d, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})).save_pretrained(d)
    assert pipeline("text-classification", d).max_length == 13
    (d / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    assert pipeline("text-classification", d).max_length == 64     # its positions


def test_a_sentencepiece_only_directory_is_refused_naming_its_model(tmp_path):
    """ALBERT's own checkpoints (albert-base-v2) ship spiece.model, a SentencePiece
    Unigram model, and no WordPiece vocabulary."""
    d = tiny_model_dir(tmp_path / "m")
    (d / "spiece.model").write_bytes(b"\x0a\x05hello")
    with pytest.raises(RunError, match="spiece.model is a SentencePiece model"):
        load_start(d)
