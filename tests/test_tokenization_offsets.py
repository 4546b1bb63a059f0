"""Character offsets, word ids and stride windows of BertTokenizer, exact against
transformers' fast BERT tokenizer (``tokenizers``) on the same vocab files.

The ids stay those of transformers' Python tokenizer (tests/test_tokenization.py). Where
the two HF tokenizers give different tokens the offsets cannot be compared token by
token, so the drawn text avoids the known causes (docs/tokenization.md, "Offsets"): a
capital sigma (Python's final-sigma rule), code points the interpreter's Unicode tables
and those of ``tokenizers`` classify differently (unassigned ones, and about 760 newer
characters: checked one by one against the reference below), a special token that only
appears once control characters are removed, and, with accents kept, text that NFC
would change. Everything read is in tests/data/tokenization.
"""

from __future__ import annotations

import functools
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from minibert.tokenization import BertTokenizer
from minibert.tokenization.basic import BasicTokenizer, is_control

HERE = Path(__file__).resolve().parent
SAMPLES = HERE / "data" / "tokenization"
EN_VOCAB = SAMPLES / "bert-base-uncased-vocab.txt"
ZH_VOCAB = SAMPLES / "bert-base-chinese-vocab.txt"
SPECIALS = ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")


def fast_class():
    """transformers' Rust-backed BERT tokenizer (``BertTokenizerFast``; in v5 the default
    ``BertTokenizer`` is the same class)."""
    import transformers  # a test dependency: fail, never skip, when it is missing

    transformers.logging.set_verbosity_error()
    return transformers.BertTokenizerFast


@functools.lru_cache(maxsize=None)
def pair_for(vocab: Path, lower: bool = True):
    """(ours, fast reference) on ``vocab``; built once."""
    ref = fast_class()(str(vocab), do_lower_case=lower)  # positional: v4 names it vocab_file, v5 vocab
    ours = BertTokenizer(vocab, do_lower_case=lower)
    assert ref.is_fast and len(ref) == len(ours) and ref.cls_token_id == ours.cls_token_id
    return ours, ref


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


@functools.lru_cache(maxsize=None)
def same_char_rules(c: str, lower: bool) -> bool:
    """True if the reference (``BertNormalizer`` + ``BertPreTokenizer``) and our
    ``BasicTokenizer`` treat ``c`` alike between two letters (deleted, whitespace,
    punctuation, CJK, or what lower-casing / accent stripping make of it)."""
    _, ref = pair_for(EN_VOCAB, lower)
    backend = ref.backend_tokenizer
    text = "a" + c + "a"
    theirs = [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(text))]
    return theirs == BasicTokenizer(do_lower_case=lower).tokenize(text)


def cleaned(text: str) -> str:
    """``text`` without the characters BERT's cleaning deletes."""
    return "".join(c for c in text if not (c in "\x00\ufffd" or is_control(c)))


def comparable(text: str, lower: bool) -> bool:
    """Text on which the Python and the Rust tokenizer are meant to agree (module docstring)."""
    if "Σ" in text:
        return False
    clean = cleaned(text)
    if any(s in clean and s not in text for s in SPECIALS):  # "[CL\x00S]"
        return False
    if not lower and not unicodedata.is_normalized("NFC", clean):
        return False
    return all(same_char_rules(c, lower) for c in set(text))


# ----------------------------------------------------------------------------- strategies
WORDS = [
    "the", "cat", "Hello", "unaffable", "DON'T", "naïve", "café", "cafe\u0301", "e\u0301te", "Straße", "İstanbul",
    "ﬁne", "Ωmega", "ǅemal", "Ångström", "A\u030angstro\u0308m", "n\u0303", "中", "文", "日本語", "中文字", "한국어",
    "のテキスト", "😀", "👍🏽", "x" * 99, "y" * 100, "z" * 101, "Z" * 150, "supercalifragilisticexpialidocious",
    "[SEP]", "[CLS]", "[MASK]", "[UNK]", "[PAD]", "$5.00", "rock'n'roll", "e-mail", "U.S.A.", "1,000", "ℌ",
    "\u0e01\u0e34", "\u0915\u093f", "\u0627\u064b", "ᾳ", "ΐ", "ŉ", "ẞ", "K", "ﬀ", "\u0345",
]
PUNCT = list(",.!?;:-()[]{}'\"/\\@#$%^&*_+=<>|~`") + ["…", "«", "»", "、", "。", "，", "“", "”", "—", "¿", "¡"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2028", "\u2029", "\u2009", "\u1680", "\x85"]
CONTROLS = ["\x00", "\x01", "\x1f", "\x7f", "\u200b", "\u200d", "\ufeff", "\ufffd", "\u00ad", "\u2067", "\ue000"]
MARKS = ["\u0301", "\u0323", "\u0308", "\u0303", "\u0345"]

any_char = st.characters(exclude_categories=("Cs", "Cn"))
piece = st.one_of(
    st.sampled_from(WORDS),
    st.sampled_from(PUNCT),
    st.sampled_from(SPACES),
    st.sampled_from(CONTROLS),
    st.sampled_from(MARKS),
    any_char,
    st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=1, max_size=4),
)
texts = st.lists(piece, max_size=24).map("".join)


def assert_same(ours_enc, ref_enc, rows: int | None = None):
    """Same keys and values, and the same word_ids / sequence_ids for every row."""
    assert set(ours_enc) == set(ref_enc)
    for key in ref_enc:
        want, got = ref_enc[key], ours_enc[key]
        if isinstance(want, np.ndarray):
            assert isinstance(got, np.ndarray) and got.dtype == want.dtype, key
            np.testing.assert_array_equal(got, want, err_msg=key)
        else:
            assert got == want, key
    for i in range(rows if rows is not None else 1):
        assert ours_enc.word_ids(i) == ref_enc.word_ids(i), i
        assert ours_enc.sequence_ids(i) == ref_enc.sequence_ids(i), i


# ----------------------------------------------------------------------------- single texts
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(text=texts)
def test_offsets_and_word_ids_match_fast_uncased(text):
    assume(comparable(text, lower=True))
    ours, ref = pair_for(EN_VOCAB)
    got = ours(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    want = ref(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    assert_same(got, want)
    for (s, e), tid in zip(got["offset_mapping"], got["input_ids"]):
        assert 0 <= s <= e <= len(text)
        if tid not in (ours.cls_token_id, ours.sep_token_id):
            assert s < e  # every real token covers at least one character


@pytest.mark.parametrize("lower", [True, False], ids=["lower", "cased"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(text=texts)
def test_offsets_and_word_ids_match_fast_chinese_vocab(lower, text):
    assume(comparable(text, lower))
    ours, ref = pair_for(ZH_VOCAB, lower)
    kw = dict(return_offsets_mapping=True, add_special_tokens=False)
    assert_same(ours(text, **kw), ref(text, **kw))


@pytest.mark.parametrize("vocab,lower", [(EN_VOCAB, True), (ZH_VOCAB, True), (ZH_VOCAB, False)],
                         ids=["en", "zh-lower", "zh-cased"])
def test_sample_lines_match_fast(vocab, lower):
    ours, ref = pair_for(vocab, lower)
    lines = read_lines(SAMPLES / ("en_sample.txt" if vocab == EN_VOCAB else "zh_sample.txt"))
    checked = 0
    for line in lines:
        if not comparable(line, lower):
            continue
        checked += 1
        got = ours(line, return_offsets_mapping=True)
        want = ref(line, return_offsets_mapping=True)
        assert (got["input_ids"], got["offset_mapping"], got.word_ids()) == (
            want["input_ids"], want["offset_mapping"], want.word_ids()
        ), line
    assert checked > 0.95 * len(lines)


def test_batch_matches_fast_with_padding_and_arrays():
    ours, ref = pair_for(EN_VOCAB)
    lines = [l for l in read_lines(SAMPLES / "en_sample.txt") if l][:24] + ["", "中文 [SEP] café\u0301"]
    # (no return_length: the fast tokenizer reports padded lengths, ours and the Python one unpadded)
    kw = dict(return_offsets_mapping=True, padding=True, return_tensors="np", return_special_tokens_mask=True)
    assert_same(ours(lines, **kw), ref(lines, **kw), rows=len(lines))
    assert ours(lines, **kw)["offset_mapping"].shape == (len(lines), ours(lines, **kw)["input_ids"].shape[1], 2)


# The cases the module docstring of alignment.py describes, spelled out (no reference needed).
@pytest.mark.parametrize(
    "text,tokens,offsets,words",
    [
        ("ab\x00cd", ["abc", "##d"], [(0, 4), (4, 5)], [0, 0]),  # deleted inside a word: inside the span
        ("cafe\u0301 x", ["cafe", "x"], [(0, 4), (6, 7)], [0, 1]),  # stripped accent at the edge: outside
        ("Café!", ["cafe", "!"], [(0, 4), (4, 5)], [0, 1]),
        ("İstanbul", ["istanbul"], [(0, 8)], [0]),  # İ -> i + U+0307 -> i
        ("ﬁne", ["ﬁ", "##ne"], [(0, 1), (1, 3)], [0, 0]),
        ("中文x", ["中", "文", "x"], [(0, 1), (1, 2), (2, 3)], [0, 1, 2]),
        ("Hello[SEP]world", ["hello", "[SEP]", "world"], [(0, 5), (5, 10), (10, 15)], [0, 1, 2]),
        ("x" * 101 + "\x00 y", ["[UNK]", "y"], [(0, 101), (103, 104)], [0, 1]),
        ("\x00 \u200b", [], [], []),
    ],
)
def test_documented_alignment_cases(text, tokens, offsets, words):
    ours, ref = pair_for(EN_VOCAB)
    aligned = ours.text_to_ids_with_offsets(text)
    assert ours.convert_ids_to_tokens(aligned.ids) == tokens
    assert aligned.offsets == offsets and aligned.word_ids == words
    assert aligned.ids == ours.text_to_ids(text)
    want = ref(text, add_special_tokens=False, return_offsets_mapping=True)
    assert (want["input_ids"], want["offset_mapping"], want.word_ids()) == (aligned.ids, offsets, words)


def test_known_divergences_keep_sensible_offsets():
    ours, ref = pair_for(EN_VOCAB)
    # final sigma: our token is ##ς (Python's str.lower), the reference's ##σ; same spans
    got, want = ours("AΣ x", return_offsets_mapping=True), ref("AΣ x", return_offsets_mapping=True)
    assert ours.convert_ids_to_tokens(got["input_ids"])[2] == "##ς"
    assert ref.convert_ids_to_tokens(want["input_ids"])[2] == "##σ"
    assert got["offset_mapping"] == want["offset_mapping"] and got.word_ids() == want.word_ids()
    # a special token spelled with a control character inside: one token over the whole word
    got = ours.text_to_ids_with_offsets("[CL\x00S] y")
    assert got == ([ours.cls_token_id, ours.vocab["y"]], [(0, 6), (7, 8)], [0, 1])
    # accents kept and NFC-composed (the reference has no NFC step): composed pair spans both chars
    cased = BertTokenizer(EN_VOCAB, do_lower_case=False)
    got = cased.text_to_ids_with_offsets("e\u0301 x")
    assert cased.basic_tokenizer.tokenize("e\u0301 x") == ["\u00e9", "x"]
    assert got.ids == cased.text_to_ids("e\u0301 x") and got.offsets == [(0, 2), (3, 4)]
    # never_split words are one token spanning the word
    ns = BertTokenizer(EN_VOCAB, never_split=["[FOO]"])
    got = ns.text_to_ids_with_offsets("a [FOO] b")
    assert got.offsets == [(0, 1), (2, 7), (8, 9)] and got.word_ids == [0, 1, 2]


def test_without_basic_tokenization_words_are_whitespace_pieces():
    tok = BertTokenizer(EN_VOCAB, do_basic_tokenize=False)
    got = tok.text_to_ids_with_offsets("unaffable  dogs\u3000[SEP]x")
    assert got.ids == tok.convert_tokens_to_ids(tok.tokenize("unaffable  dogs\u3000[SEP]x"))
    assert tok.convert_ids_to_tokens(got.ids) == ["una", "##ffa", "##ble", "dogs", "[SEP]", "x"]
    assert got.offsets == [(0, 3), (3, 6), (6, 9), (11, 15), (16, 21), (21, 22)]
    assert got.word_ids == [0, 0, 0, 1, 2, 3]


# ----------------------------------------------------------------------------- pre-split words
word_lists = st.lists(
    st.one_of(
        st.sampled_from(WORDS),
        st.sampled_from(PUNCT),
        st.lists(piece, min_size=0, max_size=4).map("".join),  # may hold spaces, controls, or be empty
    ),
    max_size=14,
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(words=word_lists, pair=st.none() | word_lists.filter(bool))
def test_pre_split_words_match_fast(words, pair):
    # (an empty pair list, like an empty pair string, is no pair at all to the fast tokenizer;
    # ours, like the Python one, adds its [SEP]: see docs/tokenization.md)
    assume(all(comparable(w, True) for w in words + (pair or [])))
    ours, ref = pair_for(EN_VOCAB)
    kw = dict(is_split_into_words=True, return_offsets_mapping=True)
    assert_same(ours(words, pair, **kw), ref(words, pair, **kw))


def test_pre_split_batch_and_word_ids_for_labels():
    ours, ref = pair_for(EN_VOCAB)
    batch = [["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
             ["Peter", "unaffable", "Blackburn"], ["naïve", "", "a b", "[SEP]x"]]
    kw = dict(is_split_into_words=True, return_offsets_mapping=True, padding="max_length", max_length=24)
    got = ours(batch, **kw)
    assert_same(got, ref(batch, **kw), rows=3)
    assert got.word_ids(0)[:11] == [None, *range(9), None]
    assert got.word_ids(1)[:7] == [None, 0, 1, 1, 1, 2, None]  # una ##ffa ##ble: label the first piece only
    assert got.word_ids(2)[:7] == [None, 0, 2, 2, 3, 3, None]  # the empty word 1 has no token


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(words=word_lists, max_length=st.integers(3, 20), data=st.data())
def test_pre_split_windows_match_fast(words, max_length, data):
    """Long sentences for token classification: windows over a single pre-split sequence."""
    assume(all(comparable(w, True) for w in words))
    ours, ref = pair_for(EN_VOCAB)
    stride = data.draw(st.integers(0, max_length - 3), label="stride")
    kw = dict(is_split_into_words=True, truncation=True, max_length=max_length, stride=stride,
              return_overflowing_tokens=True, return_offsets_mapping=True)
    got = ours(words, **kw)
    assert_same(got, ref(words, **kw), rows=len(got["input_ids"]))


# ----------------------------------------------------------------------------- question + context windows
questions = st.one_of(
    st.sampled_from(["Who wrote it?", "When did the café open?", "中文是什么？", "What is 5.00$?", "why"]),
    texts.filter(lambda t: len(t) < 40),
)
contexts = st.one_of(
    st.lists(st.sampled_from(read_lines(SAMPLES / "en_sample.txt")[:200]), min_size=1, max_size=4).map(" ".join),
    texts,
    st.tuples(texts, st.sampled_from(read_lines(SAMPLES / "en_sample.txt")[:50]), texts).map("\n".join),
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(question=questions, context=contexts, data=st.data())
def test_only_second_stride_windows_match_fast(question, context, data):
    assume(context and comparable(question, True) and comparable(context, True))  # "" is no pair to HF fast
    ours, ref = pair_for(EN_VOCAB)
    n_q = len(ours.text_to_ids(question))
    max_length = data.draw(st.integers(n_q + 4, n_q + 40), label="max_length")
    stride = data.draw(st.integers(0, max_length - n_q - 4), label="stride")
    kw = dict(truncation="only_second", max_length=max_length, stride=stride, return_overflowing_tokens=True,
              return_offsets_mapping=True, return_special_tokens_mask=True)
    if data.draw(st.booleans(), label="padded"):
        kw.update(padding="max_length", return_tensors="np")
    else:
        kw.update(return_length=True)  # (the fast tokenizer's length is the padded one)
    got = ours(question, context, **kw)
    want = ref(question, context, **kw)
    assert_same(got, want, rows=len(want["input_ids"]))
    # without return_overflowing_tokens: the first window only, unbatched
    kw.pop("return_overflowing_tokens")
    kw.pop("return_tensors", None)
    kw.pop("return_length", None)  # unbatched, the fast tokenizer gives [n], ours and the Python one n
    assert_same(ours(question, context, **kw), ref(question, context, **kw))


def test_squad_style_batch_matches_fast():
    ours, ref = pair_for(EN_VOCAB)
    lines = [l for l in read_lines(SAMPLES / "en_sample.txt") if l]
    qs = ["What did he say?", "Who?", "Where is the café located, exactly?"]
    cs = [" ".join(lines[0:6]), lines[7], " ".join(lines[10:13])]
    kw = dict(truncation="only_second", max_length=48, stride=16, return_overflowing_tokens=True,
              return_offsets_mapping=True, padding="max_length", return_tensors="np")
    got = ours(qs, cs, **kw)
    want = ref(qs, cs, **kw)
    assert_same(got, want, rows=len(want["input_ids"]))
    assert len(set(got["overflow_to_sample_mapping"].tolist())) == 3 and len(got["input_ids"]) > 3
    # each window's context spans lie in its own context, in order, and windows overlap by the stride
    for row, sample in enumerate(got["overflow_to_sample_mapping"]):
        spans = [tuple(o) for o, s in zip(got["offset_mapping"][row].tolist(), got.sequence_ids(row)) if s == 1]
        assert all(0 <= a < b <= len(cs[sample]) for a, b in spans)
        assert all(p[1] <= q[0] for p, q in zip(spans, spans[1:]))


@pytest.mark.parametrize("max_length,stride", [(12, 2), (10, 0), (11, 3)])
def test_only_first_windows_of_a_pair_match_fast(max_length, stride):
    ours, ref = pair_for(EN_VOCAB)
    a, b = "one two three four five six seven eight nine ten eleven twelve", "who is it?"
    kw = dict(truncation="only_first", max_length=max_length, stride=stride, return_overflowing_tokens=True,
              return_offsets_mapping=True)
    got = ours(a, b, **kw)
    assert_same(got, ref(a, b, **kw), rows=len(got["input_ids"]))
    assert len(got["input_ids"]) > 1


# ----------------------------------------------------------------------------- windows and errors
@pytest.mark.parametrize(
    "length,max_len,stride,windows",
    [
        (5, 8, 2, [(0, 5)]),
        (8, 8, 7, [(0, 8)]),
        (12, 5, 2, [(0, 5), (3, 8), (6, 11), (9, 12)]),
        (10, 5, 0, [(0, 5), (5, 10)]),
        (11, 5, 0, [(0, 5), (5, 10), (10, 11)]),
        (6, 5, 4, [(0, 5), (1, 6)]),
    ],
)
def test_overflow_windows(length, max_len, stride, windows):
    assert BertTokenizer.overflow_windows(length, max_len, stride) == windows


def test_window_errors_are_clear():
    ours, _ = pair_for(EN_VOCAB)
    q, c = "who is it?", "one two three four five six seven eight nine ten"
    with pytest.raises(ValueError, match="stride=7 must be smaller than the window length 7"):
        ours(q, c, truncation="only_second", max_length=14, stride=7, return_overflowing_tokens=True)
    with pytest.raises(ValueError, match="stride=7 must be smaller"):  # also without overflow, as HF
        ours(q, c, truncation="only_second", max_length=14, stride=7)
    with pytest.raises(ValueError, match="second sequence has only 10"):
        ours(q, c, truncation="only_second", max_length=7, return_overflowing_tokens=True)
    with pytest.raises(ValueError, match="longest_first"):
        ours(q, c, truncation=True, max_length=10, return_overflowing_tokens=True)
    with pytest.raises(ValueError, match="needs a text pair"):
        ours(c, truncation="only_second", max_length=5, return_overflowing_tokens=True)
    with pytest.raises(ValueError, match="stride must be an int >= 0"):
        ours(q, stride=-1)
    with pytest.raises(ValueError, match="needs text"):
        ours([101, 2000, 102], return_offsets_mapping=True)
    with pytest.raises(TypeError, match="list of words"):
        ours("a b", is_split_into_words=True)
    with pytest.raises(TypeError, match="word 1"):
        ours.text_to_ids_with_offsets(["a", 3], is_split_into_words=True)
    enc = ours(q)
    with pytest.raises(IndexError, match="out of range"):
        enc.word_ids(1)
    with pytest.raises(ValueError, match="token ids"):
        ours([2000, 2001]).word_ids()


def test_plain_call_is_unchanged_and_still_a_dict():
    ours, ref = pair_for(EN_VOCAB)
    enc = ours("Hello world", "again")
    assert isinstance(enc, dict) and set(enc) == {"input_ids", "token_type_ids", "attention_mask"}
    assert enc == {"input_ids": [101, 7592, 2088, 102, 2153, 102], "token_type_ids": [0, 0, 0, 0, 1, 1],
                   "attention_mask": [1] * 6}
    assert enc.word_ids() == ref("Hello world", "again").word_ids() == [None, 0, 1, None, 0, None]
    assert enc.sequence_ids() == [None, 0, 0, None, 1, None]
