"""BertTokenizer / BasicTokenizer / WordpieceTokenizer: parity with transformers' Python
tokenizer on sample lines, API behaviour, errors, and hypothesis properties.

The full-corpus parity runs are in test_tokenization_full.py (marked slow).
"""

from __future__ import annotations

import functools
import hashlib
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibert.tokenization import BasicTokenizer, BertTokenizer, VocabError, WordpieceTokenizer, load_vocab
from minibert.tokenization.vocab import read_vocab_tokens, write_vocab

HERE = Path(__file__).resolve().parent
SAMPLES = HERE / "data" / "tokenization"  # provenance and licences in its README.md
EN_VOCAB = SAMPLES / "bert-base-uncased-vocab.txt"
ZH_VOCAB = SAMPLES / "bert-base-chinese-vocab.txt"


def reference_class():
    """transformers' pure-Python BERT tokenizer (BertTokenizerLegacy in v5, BertTokenizer in v4)."""
    import transformers  # a test dependency: fail, never skip, when it is missing

    transformers.logging.set_verbosity_error()  # its "overflowing tokens" notice on every pair
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

        return BertTokenizerLegacy
    except ImportError:
        from transformers import BertTokenizer as Ref

        return Ref


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def en_pair():
    return BertTokenizer(EN_VOCAB), reference_class()(str(EN_VOCAB))


@functools.lru_cache(maxsize=None)
def en_pair_with(lower: bool, strip_accents: bool | None):
    """(ours, reference) on the English vocab with these switches; built once per pair."""
    kw = dict(do_lower_case=lower, strip_accents=strip_accents)
    return BertTokenizer(EN_VOCAB, **kw), reference_class()(str(EN_VOCAB), **kw)


@pytest.fixture(scope="module", params=[True, False], ids=["zh-lower", "zh-cased"])
def zh_pair(request):
    lc = request.param
    return BertTokenizer(ZH_VOCAB, do_lower_case=lc), reference_class()(str(ZH_VOCAB), do_lower_case=lc)


@pytest.fixture()
def tiny_vocab(tmp_path):
    toks = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "aff", "able",
            "the", "cat", "sat", ".", ",", "!", "'", "s", "##s", "a", "##b", "##c", "x", "中", "国", "é"]
    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t in toks), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- parity
def test_en_sample_parity_tokenize_and_encode(en_pair):
    ours, ref = en_pair
    lines = read_lines(SAMPLES / "en_sample.txt")
    assert len(lines) > 400
    for line in lines:
        assert ours.tokenize(line) == ref.tokenize(line), line
        assert ours.encode(line) == ref.encode(line), line


def test_zh_sample_parity_tokenize_and_encode(zh_pair):
    ours, ref = zh_pair
    lines = read_lines(SAMPLES / "zh_sample.txt")
    assert len(lines) > 300
    for line in lines:
        assert ours.tokenize(line) == ref.tokenize(line), line
        assert ours.encode(line) == ref.encode(line), line


TRICKY = [
    "",
    "   ",
    "Hello[SEP]world [cls] [CLS]x [MASK]ed",
    "[CL\x00S] stays whole once the NUL is cleaned",
    "naïve café Ωmega ΟΔΟΣ İstanbul ǅ straße ﬁne",
    "tab\tnew\nline\rcr\u00a0nbsp\u2028ls\u2029ps\u3000ideo\x85nel",
    "ctrl\x01\x7f\u200b\u200dzwj\ufffd\ufeff",
    "emoji 😀👍🏽 flags 🇫🇷 keycap 1️⃣",
    "中文，English混合。日本語のテキスト한국어",
    "\uf900\ufa6a compat ideographs \U00020000 ext-b",
    "e\u0301 combining \u0301\u0301 only marks",
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101,
    "$5.00 ^caret `tick` ~tilde |pipe| <tag> {brace} @at #hash",
    "don't won't it's rock'n'roll",
    "\u0300leading mark",
]


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_parity(en_pair, text):
    ours, ref = en_pair
    assert ours.tokenize(text) == ref.tokenize(text)
    assert ours.encode(text) == ref.encode(text)
    assert ours.basic_tokenizer.tokenize(text) == ref.basic_tokenizer.tokenize(text)


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_parity_zh_cased(text):
    ours = BertTokenizer(ZH_VOCAB, do_lower_case=False)
    ref = reference_class()(str(ZH_VOCAB), do_lower_case=False)
    assert ours.tokenize(text) == ref.tokenize(text)


# Final sigma: Python's str.lower() writes a capital sigma that ends a word (a cased letter
# before it, none after it, case-ignorable characters such as ' and combining marks
# skipped) as ς and every other one as σ. transformers' Python tokenizer and
# google-research/bert call str.lower() on each whitespace-separated word, and so do we.
# (The Rust `tokenizers` backend, transformers 5's default BertTokenizer and v4's
# BertTokenizerFast, lower-cases one character at a time and always writes σ; see
# docs/tokenization.md.)
SIGMA_TEXTS = [
    "AΣ", "ΑΣ ΒΣ", "Σ", "ΟΔΥΣΣΕΥΣ", "ΣΑ", "ΑΣΑ", "ΑΣ.", "ΑΣ-ΒΣ", "ΑΣ's", "ΑΣ'", "ΑΣ\u0301", "ΆΣ", "ὈΔΥΣΣΕΎΣ",
    "ΑΣ1", "1Σ", "ΑΣ\u200bΒ", "ΑΣ\u00ad", "ΑΣ[SEP]ΒΣ", "Α[SEP]Σ", "ΑΣ[CL\x00S]", "ς σ Σ", "aΣ b", "ǅΣ",
]


def test_final_sigma_is_python_str_lower():
    ours = BertTokenizer(EN_VOCAB)
    assert ours.tokenize("AΣ") == ["a", "##ς"]
    assert ours.tokenize("ΟΔΥΣΣΕΥΣ ΣΑ") == ["ο", "##δ", "##υ", "##σ", "##σ", "##ε", "##υ", "##ς", "σ", "##α"]
    assert ours.tokenize("ΑΣ's") == ["α", "##σ", "'", "s"]  # ' is case-ignorable: a cased letter follows


@pytest.mark.parametrize("strip_accents", [None, True, False])
@pytest.mark.parametrize("lower", [True, False])
def test_final_sigma_parity(lower, strip_accents):
    ours, ref = en_pair_with(lower, strip_accents)
    for text in SIGMA_TEXTS:
        assert ours.tokenize(text) == ref.tokenize(text), text
        assert ours.basic_tokenizer.tokenize(text) == ref.basic_tokenizer.tokenize(text), text


greek_text = st.lists(
    st.one_of(
        st.characters(min_codepoint=0x370, max_codepoint=0x3FF),  # Greek and Coptic
        st.characters(min_codepoint=0x1F00, max_codepoint=0x1FFF),  # Greek Extended (accented)
        st.sampled_from(list("ΣΣΣσς .'-1aZ\u0301\u0308\u0345\u200b\u00ad") + ["[SEP]", "[CL\x00S]"]),
    ),
    max_size=30,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=greek_text, lower=st.booleans(), strip_accents=st.sampled_from([None, True, False]))
def test_hypothesis_greek_matches_reference(text, lower, strip_accents):
    ours, ref = en_pair_with(lower, strip_accents)
    assert ours.tokenize(text) == ref.tokenize(text)


NORMALISED_INTO_NEVER_SPLIT = ["\u0301[CL\x00S]", "a \u0301[CL\x00S] b", "[CL\x00S]\u0308",
                               "\u0301[FOO]", "x\u0301[FOO]\u0308 y", "[FO\u0301O]", "[foo]"]


@pytest.mark.parametrize("strip_accents", [None, True, False])
@pytest.mark.parametrize("lower", [True, False])
def test_word_that_normalises_into_never_split_stays_whole(strip_accents, lower):
    # hypothesis found "\u0301[CL\x00S]": with accents stripped the word becomes "[CLS]",
    # which the reference keeps whole (it checks never_split again before the punctuation split)
    kw = dict(do_lower_case=lower, strip_accents=strip_accents, never_split=["[FOO]"])
    ours, ref = BertTokenizer(EN_VOCAB, **kw), reference_class()(str(EN_VOCAB), **kw)
    plain = BasicTokenizer(do_lower_case=lower, strip_accents=strip_accents)
    for text in NORMALISED_INTO_NEVER_SPLIT:
        assert ours.tokenize(text) == ref.tokenize(text), text
        assert ours.text_to_ids(text) == ref.convert_tokens_to_ids(ref.tokenize(text)), text
        # a never_split given for one call only
        assert plain.tokenize(text, never_split=["[FOO]"]) == \
            ref.basic_tokenizer.tokenize(text, never_split=["[FOO]"]), text


@pytest.mark.parametrize("strip_accents", [None, True, False])
@pytest.mark.parametrize("lower", [True, False])
def test_basic_tokenizer_switches_parity(strip_accents, lower):
    Ref = reference_class()
    ours = BasicTokenizer(do_lower_case=lower, strip_accents=strip_accents)
    ref = Ref(str(EN_VOCAB), do_lower_case=lower, strip_accents=strip_accents).basic_tokenizer
    for text in TRICKY:
        assert ours.tokenize(text) == ref.tokenize(text), text


def test_pairs_truncation_padding_parity(en_pair):
    ours, ref = en_pair
    lines = [l for l in read_lines(SAMPLES / "en_sample.txt") if l][:40]
    firsts, seconds = lines[0::2], lines[1::2]
    short_firsts = [" ".join(l.split()[:4]) for l in firsts]  # only_second must be able to reach max_length
    for strategy, a_texts in [("longest_first", firsts), ("only_second", short_firsts)]:
        for max_length in [16, 32, 64]:
            kw = dict(truncation=strategy, max_length=max_length, padding="max_length", return_token_type_ids=True)
            got = ours(a_texts, seconds, **kw)
            want = ref(a_texts, seconds, **kw)
            assert got["input_ids"] == want["input_ids"]
            assert got["token_type_ids"] == want["token_type_ids"]
            assert got["attention_mask"] == want["attention_mask"]
    # one example, a pair, longest padding in a batch, no truncation
    a, b = lines[0], lines[1]
    assert ours(a, b)["input_ids"] == ref(a, b)["input_ids"]
    assert ours(a, b)["token_type_ids"] == ref(a, b, return_token_type_ids=True)["token_type_ids"]
    got = ours(lines[:6], padding=True)
    want = ref(lines[:6], padding=True)
    assert got["input_ids"] == want["input_ids"] and got["attention_mask"] == want["attention_mask"]
    assert ours.encode(a, b, truncation=True, max_length=20) == ref.encode(a, b, truncation=True, max_length=20)
    assert ours.encode(a, truncation=True, max_length=7) == ref.encode(a, truncation=True, max_length=7)


def test_decode_parity(en_pair):
    ours, ref = en_pair
    for line in read_lines(SAMPLES / "en_sample.txt")[:100]:
        ids = ours.encode(line)
        assert ours.decode(ids) == ref.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
        assert ours.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)


def test_special_token_ids_and_len(en_pair):
    ours, ref = en_pair
    assert len(ours) == len(ref) == 30522
    assert (ours.pad_token_id, ours.unk_token_id, ours.cls_token_id, ours.sep_token_id, ours.mask_token_id) == (
        0, 100, 101, 102, 103,
    )
    assert ours.vocab == dict(ref.vocab)


# ----------------------------------------------------------------------------- vocab files
def test_chinese_vocab_keeps_line_separator_tokens():
    tokens = read_vocab_tokens(ZH_VOCAB)
    assert len(tokens) == 21128
    assert tokens[343] == "\u2028" and tokens[13502] == "##\u2028"
    assert load_vocab(ZH_VOCAB)["\u2028"] == 343


# sha256 of the files as published (tests/data/tokenization/README.md gives their source)
SHIPPED_VOCABS = {
    EN_VOCAB: "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    ZH_VOCAB: "45bbac6b341c319adc98a532532882e91a9cefc0329aa57bac9ae761c27b291c",
}


@pytest.mark.parametrize("path", list(SHIPPED_VOCABS), ids=lambda p: p.name)
def test_shipped_vocab_is_the_published_file(path):
    # an editor that strips U+2028 or converts line ends would break the parity tests obscurely
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHIPPED_VOCABS[path]


def test_missing_vocab_file_names_it(tmp_path):
    missing = tmp_path / "nope" / "vocab.txt"
    with pytest.raises(FileNotFoundError, match="nope"):
        BertTokenizer(missing)
    with pytest.raises(IsADirectoryError, match=f"{tmp_path.name}'? is a directory"):
        load_vocab(tmp_path)


@pytest.mark.parametrize("content", [b"", b"\n", b"\r\n"], ids=["0-bytes", "LF", "CRLF"])
def test_empty_vocab_file(tmp_path, content):
    p = tmp_path / "my-vocab.txt"
    p.write_bytes(content)
    with pytest.raises(VocabError, match=r"my-vocab\.txt'? is empty"):
        load_vocab(p)


@pytest.mark.parametrize(
    "content,line",
    [
        (b"\xff[PAD]\n", 1),
        (b"[PAD]\n[UNK]\nca\xe9t\n[SEP]\n", 3),
        (b"[PAD]\r\n[UNK]\r\n\r\nx\xc3\n", 4),  # CRLF lines and an empty line count once each
        (b"a\rb\r\x80", 3),  # a lone CR ends a line too (universal newlines, as the reference reads it)
    ],
)
def test_non_utf8_vocab_names_file_and_line(tmp_path, content, line):
    p = tmp_path / "vocab.txt"
    p.write_bytes(content)
    with pytest.raises(VocabError, match=rf"vocab\.txt:{line}: not valid UTF-8 "):
        load_vocab(p)


def test_duplicate_vocab_token_names_token_and_lines(tmp_path):
    p = tmp_path / "vocab.txt"
    # "the" on lines 6 and 8: the dict would keep one id and the last id (8) would be >= len (7)
    p.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\nthe\n", encoding="utf-8")
    message = r"vocab\.txt'?: duplicate token 'the' on lines 6 and 8 "
    with pytest.raises(VocabError, match=message):
        load_vocab(p)
    with pytest.raises(VocabError, match=message):
        BertTokenizer(p)


def test_many_duplicate_vocab_tokens_are_summarised(tmp_path):
    p = tmp_path / "vocab.txt"
    tokens = ["x", "a", "x"] + [f"t{i}" for i in range(7)] * 2 + ["x"]  # x on lines 1, 3 and 18
    p.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    with pytest.raises(VocabError) as info:
        read_vocab_tokens(p)
    msg = str(info.value)
    assert "duplicate token 'x' on lines 1, 3 and 18; duplicate token 't0' on lines 4 and 11;" in msg
    assert "'t3' on lines 7 and 14; and 3 more duplicated tokens" in msg and "'t4'" not in msg


def test_write_vocab_refuses_duplicates(tmp_path):
    with pytest.raises(VocabError, match="duplicate token 'a' on lines 1 and 3"):
        write_vocab(["a", "b", "a"], tmp_path / "v.txt")
    assert not (tmp_path / "v.txt").exists()


def test_missing_special_token_is_named(tmp_path):
    p = tmp_path / "vocab.txt"
    p.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"mask_token='\[MASK\]'"):
        BertTokenizer(p)


def test_save_vocabulary_roundtrip_is_atomic(tiny_vocab, tmp_path):
    tok = BertTokenizer(tiny_vocab)
    out_dir = tmp_path / "saved"
    out_dir.mkdir()
    (path,) = tok.save_vocabulary(out_dir)
    assert Path(path).read_bytes() == tiny_vocab.read_bytes()
    assert [p.name for p in out_dir.iterdir()] == ["vocab.txt"]  # no temp file left behind
    (path2,) = tok.save_vocabulary(out_dir, filename_prefix="x")
    assert Path(path2).name == "x-vocab.txt"


def test_write_vocab_rejects_newline_token(tmp_path):
    with pytest.raises(ValueError, match="line break"):
        write_vocab(["a", "b\nc"], tmp_path / "v.txt")
    assert not (tmp_path / "v.txt").exists()


def test_crlf_vocab_reads_like_reference(tmp_path):
    p = tmp_path / "vocab.txt"
    p.write_bytes(b"[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[MASK]\r\nhi\r\n")
    assert load_vocab(p) == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "hi": 5}


# ----------------------------------------------------------------------------- behaviour
def test_wordpiece_greedy_longest_match(tiny_vocab):
    wp = WordpieceTokenizer(load_vocab(tiny_vocab))
    assert wp.tokenize("unaffable") == ["un", "##aff", "##able"]
    assert wp.tokenize("unaffablez") == ["[UNK]"]  # one uncoverable char: the whole word
    assert wp.tokenize("abc cats dogs") == ["a", "##b", "##c", "cat", "##s", "[UNK]"]
    assert wp.tokenize("x" * 101) == ["[UNK]"]
    assert WordpieceTokenizer({"x": 0, "##x": 1}, max_input_chars_per_word=3).tokenize("xxx xxxx") == [
        "x", "##x", "##x", "[UNK]",
    ]


def test_never_split_and_specials(tiny_vocab):
    tok = BertTokenizer(tiny_vocab, never_split=["[FOO]"])
    assert tok.tokenize("The [FOO] cat[SEP]sat") == ["the", "[FOO]", "cat", "[SEP]", "sat"]
    assert tok.convert_tokens_to_ids(["[FOO]", "cat"]) == [tok.unk_token_id, 11]


def test_call_shapes_and_numpy(tiny_vocab):
    tok = BertTokenizer(tiny_vocab)
    single = tok("the cat", return_special_tokens_mask=True)
    assert single["input_ids"] == [2, 10, 11, 3]
    assert single["special_tokens_mask"] == [1, 0, 0, 1]
    batch = tok(["the cat sat", "the"], padding=True, return_tensors="np")
    assert batch["input_ids"].shape == (2, 5) and batch["input_ids"].dtype == np.int64
    assert batch["attention_mask"].tolist() == [[1] * 5, [1, 1, 1, 0, 0]]
    pairs = tok([("the", "cat"), ("sat", "the cat")], padding="max_length", max_length=8)
    assert pairs["token_type_ids"][1] == [0, 0, 0, 1, 1, 1, 0, 0]
    assert tok("the cat", padding="max_length", max_length=8, pad_to_multiple_of=6)["input_ids"][-1] == 0
    assert len(tok("the cat", padding="max_length", max_length=8, pad_to_multiple_of=6)["input_ids"]) == 12


def test_bad_options_raise_clear_errors(tiny_vocab):
    tok = BertTokenizer(tiny_vocab)
    with pytest.raises(ValueError, match="only_second"):
        tok.encode("the cat sat", truncation="only_second", max_length=3)
    with pytest.raises(ValueError, match="second sequence has only 1"):
        tok.encode("the cat sat", "cat", truncation="only_second", max_length=4)
    with pytest.raises(ValueError, match="max_length"):
        tok("the", padding="max_length")
    with pytest.raises(ValueError, match="truncation must be"):
        tok.encode("the", truncation="sideways", max_length=4)
    with pytest.raises(ValueError, match="equal lengths"):
        tok(["the", "the cat"], return_tensors="np")
    with pytest.raises(ValueError, match="same length"):
        tok(["the", "cat"], ["sat"])
    with pytest.raises(TypeError, match="str"):
        tok.tokenize(b"bytes")


def test_inputs_not_mutated(tiny_vocab):
    tok = BertTokenizer(tiny_vocab)
    texts = ["the cat", "sat"]
    pair = ["cat", "the"]
    tok(texts, pair, truncation=True, max_length=4, padding=True)
    assert texts == ["the cat", "sat"] and pair == ["cat", "the"]


def test_cache_does_not_change_results(tiny_vocab):
    a = BertTokenizer(tiny_vocab)
    text = "The cat sat, unaffable! Ünaffable"
    first = a.tokenize(text)
    assert a.tokenize(text) == first
    assert a.text_to_ids(text) == a.convert_tokens_to_ids(first)


# ----------------------------------------------------------------------------- hypothesis
unicode_text = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()),
    max_size=60,
)
mixed_text = st.one_of(
    unicode_text,
    st.lists(
        st.sampled_from(["the", "cat", "a", "é", "中", "[SEP]", "[CLS]", "\u0301", "😀", "\x00", "\u2028",
                         "\t", " ", "ΟΔΟΣ", "x" * 120, "İ", "ﬁ", "\ufffd", "[", "]", "##", "Ǆ"]),
        max_size=12,
    ).map("".join),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mixed_text)
def test_hypothesis_matches_reference_on_arbitrary_unicode(en_pair, text):
    ours, ref = en_pair
    assert ours.tokenize(text) == ref.tokenize(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mixed_text)
def test_hypothesis_never_raises_and_tokens_in_vocab(en_pair, text):
    ours, _ = en_pair
    toks = ours.tokenize(text)
    assert all(t in ours.vocab for t in toks)
    ids = ours.encode(text)
    assert ids[0] == ours.cls_token_id and ids[-1] == ours.sep_token_id
    assert all(0 <= i < len(ours) for i in ids)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mixed_text)
def test_hypothesis_pieces_rebuild_basic_tokens(en_pair, text):
    ours, _ = en_pair
    for word in ours.basic_tokenizer.tokenize(text):
        pieces = ours.wordpiece_tokenizer.tokenize_word(word)
        if "[UNK]" not in pieces:
            assert pieces[0] + "".join(p[2:] for p in pieces[1:]) == word
            assert all(p.startswith("##") for p in pieces[1:])


vocab_words = st.lists(st.sampled_from(["the", "cat", "sat", "a", "unaffable", "aff", "able", "x", ".", ",",
                                        "!", "中", "国", "s", "The", "CAT"]), min_size=0, max_size=15)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=vocab_words, seps=st.lists(st.sampled_from([" ", "  ", "\t", "\n", " \u3000"]), min_size=15, max_size=15))
def test_hypothesis_decode_encode_roundtrip(tiny_vocab, words, seps):
    tok = BertTokenizer(tiny_vocab)
    text = "".join(w + s for w, s in zip(words, seps))
    ids = tok.encode(text)
    normalised = " ".join(tok.basic_tokenizer.tokenize(text))
    assert tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) == normalised


def test_basic_tokenizer_output_is_nfc_and_clean():
    bt = BasicTokenizer(do_lower_case=False)
    out = bt.tokenize("e\u0301t\u00e9\x00\u200b a\u3000b")
    assert out == ["ét\u00e9", "a", "b"]
    assert all(unicodedata.is_normalized("NFC", t) for t in out)
