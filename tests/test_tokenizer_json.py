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
