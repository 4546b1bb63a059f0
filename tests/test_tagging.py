"""Token classification data and metrics (minibert.finetuning.tagging): CoNLL reading and
its errors, word-piece label alignment against transformers' fast tokenizer with HF
run_ner.py's rule, windows for long sentences, decoding back to words, entity metrics
against seqeval, and the most-frequent-tag baseline. Reads only files the repository
ships (data/tag, tests/data/tokenization)."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert.finetuning import DatasetError, choose_labels, pad_batch
from minibert.finetuning.tagging import (MostFrequentTagBaseline, TaggedSentence,
                                         check_tags, continuation_ids, decode_tags,
                                         encode_tagging, entity_metrics, get_entities,
                                         is_entity_tagset, read_conll, sort_tags, tag_list,
                                         tag_occurrences,
                                         tagging_metrics, token_accuracy, warn_long_sentences,
                                         word_windows)
from minibert.tokenization import BertTokenizer

ROOT = Path(__file__).resolve().parent.parent
BROWN = ROOT / "data" / "tag" / "en" / "brown_pos"
NER = ROOT / "data" / "tag" / "zh" / "peoples_daily_ner"
VOCABS = ROOT / "tests" / "data" / "tokenization"
EN_VOCAB = VOCABS / "bert-base-uncased-vocab.txt"
ZH_VOCAB = VOCABS / "bert-base-chinese-vocab.txt"


@functools.lru_cache(maxsize=None)
def tokenizers(vocab: Path):
    """(ours, transformers' fast BertTokenizer) on one vocab file."""
    import transformers  # a test dependency: fail, never skip, when it is missing

    transformers.logging.set_verbosity_error()
    return BertTokenizer(vocab), transformers.BertTokenizerFast(str(vocab), do_lower_case=True)


@functools.lru_cache(maxsize=None)
def sample(path: Path):
    return read_conll(path)


def write(tmp_path, text: str | bytes, name="split.tsv") -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return p


# --------------------------------------------------------------------------- reading
def test_read_conll_sentences_and_lines(tmp_path):
    p = write(tmp_path, "\ufeffJohn\tB-PER\r\nlives\tO\n\n\n\nin\tO\nParis\tB-LOC \n\n")
    s = read_conll(p)
    assert [x.words for x in s] == [["John", "lives"], ["in", "Paris"]]
    assert [x.tags for x in s] == [["B-PER", "O"], ["O", "B-LOC"]]
    assert [x.line for x in s] == [1, 6] and s[0].path == str(p)


def test_real_samples_read():
    for split, n in (("train", 1000), ("dev", 200), ("test", 200)):
        assert len(sample(BROWN / f"{split}.tsv")) == n
    for split, n in (("train", 800), ("dev", 150), ("test", 150)):
        assert len(sample(NER / f"{split}.tsv")) == n
    assert tag_list(sample(BROWN / "train.tsv")) == [
        ".", "ADJ", "ADP", "ADV", "CONJ", "DET", "NOUN", "NUM", "PRON", "PRT", "VERB", "X"]
    assert tag_list(sample(NER / "train.tsv")) == [
        "O", "B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER"]
    for split in ("dev", "test"):  # every dev/test tag was seen in train
        check_tags(sample(BROWN / f"{split}.tsv"), tag_list(sample(BROWN / "train.tsv")))
        check_tags(sample(NER / f"{split}.tsv"), tag_list(sample(NER / "train.tsv")))


@pytest.mark.parametrize("text, line, what", [
    ("a\tO\nb O\n", 2, "no tab"),
    ("a\tO\n\nb\tO\tX\n", 3, "2 tabs"),
    ("a\tO\n\tO\n", 2, "empty word"),
    (" \tO\n", 1, "empty word"),
    ("a\tO\nb\t \n", 2, "empty tag"),
    ("", 1, "no sentence"),
    ("\n\n  \n", 1, "no sentence"),
])
def test_read_conll_errors_name_file_and_line(tmp_path, text, line, what):
    p = write(tmp_path, text)
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(p))}:{line}: .*{what}"):
        read_conll(p)


def test_read_conll_not_utf8_and_missing(tmp_path):
    p = write(tmp_path, b"a\tO\n\nb\xff\tO\n")
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(p))}:3: not valid UTF-8"):
        read_conll(p)
    with pytest.raises(DatasetError, match="no such file"):
        read_conll(tmp_path / "missing.tsv")


def test_unknown_dev_tag_names_file_and_line(tmp_path):
    train = read_conll(write(tmp_path, "a\tO\nb\tB-PER\n", "train.tsv"))
    dev = read_conll(write(tmp_path, "x\tO\n\ny\tO\nz\tB-LOC\n", "dev.tsv"))
    with pytest.raises(DatasetError, match=r"dev.tsv:4: tag 'B-LOC' \(word 'z'\) is not in "
                                           r"the train split's tags"):
        check_tags(dev, tag_list(train))
    tok, _ = tokenizers(EN_VOCAB)
    with pytest.raises(DatasetError, match=r"dev.tsv:4:"):
        encode_tagging(tok, dev, 16, tag_list(train))


def test_tag_set_from_all_splits_reports_tags_train_lacks(tmp_path):
    train = read_conll(write(tmp_path, "a\tO\nb\tB-PER\n", "train.tsv"))
    dev = read_conll(write(tmp_path, "x\tO\n\ny\tI-PER\nz\tB-LOC\nw\tB-LOC\n", "dev.tsv"))
    assert tag_occurrences(dev) == {"O": f"{tmp_path / 'dev.tsv'}:1",
                                    "I-PER": f"{tmp_path / 'dev.tsv'}:3",
                                    "B-LOC": f"{tmp_path / 'dev.tsv'}:4"}
    found = {"train": tag_occurrences(train), "dev": tag_occurrences(dev)}
    chosen = choose_labels(found, sort_tags, unit="tag")
    assert chosen.labels == ["O", "B-LOC", "B-PER", "I-PER"]
    assert list(chosen.unseen["dev"]) == ["I-PER", "B-LOC"]
    check_tags(dev, chosen.labels)                    # encodes without an error now
    f = write(tmp_path, "O\nB-PER\nI-PER\n", "tags.txt")
    with pytest.raises(DatasetError, match=r"dev.tsv:4: tag 'B-LOC' is not in --labels "
                                           r".*tags.txt \(3 in it: O B-PER I-PER\)"):
        choose_labels(found, sort_tags, f, unit="tag")


# --------------------------------------------------------------------------- alignment
def hf_reference(ref, sentences, tags, max_len, label_all_tokens):
    """HF run_ner.py's tokenize_and_align_labels with the fast tokenizer."""
    index = {t: i for i, t in enumerate(tags)}
    b_to_i = continuation_ids(tags)
    enc = ref([s.words for s in sentences], is_split_into_words=True, truncation=True,
              max_length=max_len)
    labels = []
    for i, s in enumerate(sentences):
        prev, row = None, []
        for w in enc.word_ids(i):
            if w is None:
                row.append(-100)
            elif w != prev:
                row.append(index[s.tags[w]])
            else:
                row.append(b_to_i[index[s.tags[w]]] if label_all_tokens else -100)
            prev = w
        labels.append(row)
    return enc, labels


@pytest.mark.parametrize("path, vocab", [(BROWN / "dev.tsv", EN_VOCAB), (NER / "dev.tsv", ZH_VOCAB)])
@pytest.mark.parametrize("label_all_tokens", [False, True])
def test_alignment_equals_hf_run_ner(path, vocab, label_all_tokens):
    ours, ref = tokenizers(vocab)
    sentences = sample(path)
    tags = tag_list(sample(path.with_name("train.tsv")))
    max_len = 512
    split = encode_tagging(ours, sentences, max_len, tags, label_all_tokens=label_all_tokens)
    enc, labels = hf_reference(ref, sentences, tags, max_len, label_all_tokens)
    assert split.n_windowed == 0 and len(split) == len(sentences)
    assert split.input_ids == enc["input_ids"]
    assert split.token_type_ids == enc["token_type_ids"]
    assert split.labels == labels
    assert split.word_ids == [enc.word_ids(i) for i in range(len(sentences))]


def test_alignment_by_hand():
    tok, _ = tokenizers(EN_VOCAB)
    s = TaggedSentence(["Johanson", "lives", "here"], ["B-PER", "O", "O"], 1)
    tags = ["O", "B-PER", "I-PER"]
    pieces = tok.tokenize("Johanson")
    assert len(pieces) > 1
    n = len(pieces)
    split = encode_tagging(tok, [s], 32, tags)
    assert split.labels[0] == [-100, 1] + [-100] * (n - 1) + [0, 0, -100]
    split = encode_tagging(tok, [s], 32, tags, label_all_tokens=True)
    assert split.labels[0] == [-100, 1] + [2] * (n - 1) + [0, 0, -100]  # B-PER -> I-PER
    assert split.word_ids[0] == [None] + [0] * n + [1, 2, None]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=40), st.integers(1, 9))
def test_word_windows_property(pieces_per_word, budget):
    word_ids = [w for w, n in enumerate(pieces_per_word) for _ in range(n)]
    windows = word_windows(word_ids, budget)
    covered = []
    for lo, hi in windows:
        assert 0 < hi - lo <= budget
        assert lo == 0 or word_ids[lo] != word_ids[lo - 1]  # starts at a word's first piece
        covered += range(lo, hi)
    assert covered == sorted(set(covered))
    kept_words = {word_ids[t] for t in covered}
    assert kept_words == set(word_ids)  # every word with a piece keeps its first piece
    for t in set(range(len(word_ids))) - set(covered):  # only tails of over-long words
        assert pieces_per_word[word_ids[t]] > budget


def test_round_trip_with_windows_and_wordless_words():
    tok, _ = tokenizers(EN_VOCAB)
    sentences = list(sample(BROWN / "dev.tsv")[:60])
    long_word = "antidisestablishmentarianism" * 2
    sentences.append(TaggedSentence(["a", long_word, "\x00", "b"], ["DET", "NOUN", "X", "NOUN"], 1))
    tags = tag_list(sample(BROWN / "train.tsv"))
    for label_all_tokens in (False, True):
        split = encode_tagging(tok, sentences, 8, tags, label_all_tokens=label_all_tokens)
        assert split.n_windowed > 10 and split.n_words_without_pieces == 1
        assert split.n_pieces_dropped > 0
        assert all(len(r) <= 8 for r in split.input_ids)
        assert all(len(l) == len(r) for l, r in zip(split.labels, split.input_ids))
        # gold labels as predictions (ids, then one-hot logits): every word gets its tag back
        preds = [np.where(np.array(l) < 0, 0, l) for l in split.labels]
        decoded = decode_tags(split, preds, tags, fill_tag="X")
        assert decoded == [s.tags for s in sentences]
        logits = [np.eye(len(tags))[p] for p in preds]
        assert decode_tags(split, logits, tags, fill_tag="X") == decoded
    with pytest.warns(UserWarning, match="cut into several windows"):
        assert "1 word(s) gave no WordPiece" in warn_long_sentences(split, 8, "dev")


def test_decode_padded_array_and_errors():
    tok, _ = tokenizers(EN_VOCAB)
    s = [TaggedSentence(["the", "dog"], ["DET", "NOUN"], 1), TaggedSentence(["run"], ["VERB"], 4)]
    tags = ["DET", "NOUN", "VERB"]
    split = encode_tagging(tok, s, 16, tags)
    batch = pad_batch(split, [0, 1])
    assert batch.labels.tolist() == [[-100, 0, 1, -100], [-100, 2, -100, -100]]
    logits = np.zeros((2, 4, 3))
    logits[0, 1, 1] = logits[0, 2, 2] = logits[1, 1, 0] = 1
    assert decode_tags(split, logits, tags) == [["NOUN", "VERB"], ["DET"]]
    with pytest.raises(ValueError, match="one prediction per row"):
        decode_tags(split, logits[:1], tags)
    with pytest.raises(ValueError, match="row 0"):
        decode_tags(split, np.zeros((2, 2), dtype=int), tags)
    with pytest.raises(ValueError, match="max_seq_length must be >= 3"):
        encode_tagging(tok, s, 2, tags)
    unlabelled = encode_tagging(tok, s, 16)
    assert unlabelled.labels is None and pad_batch(unlabelled, [0]).labels is None


# --------------------------------------------------------------------------- metrics
TAGS = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"]
sentences_st = st.lists(st.lists(st.sampled_from(TAGS), min_size=1, max_size=12),
                        min_size=1, max_size=6)


def seqeval_scores(gold, pred):
    import seqeval.metrics as sm  # a test dependency: fail, never skip, when it is missing

    report = sm.classification_report(gold, pred, output_dict=True, zero_division=0)
    return {"precision": sm.precision_score(gold, pred, zero_division=0),
            "recall": sm.recall_score(gold, pred, zero_division=0),
            "f1": sm.f1_score(gold, pred, zero_division=0),
            "accuracy": sm.accuracy_score(gold, pred),
            "per_type": {t: v for t, v in report.items() if not t.endswith(" avg")}}


def assert_same_as_seqeval(gold, pred):
    ours = tagging_metrics(gold, pred, TAGS)
    ref = seqeval_scores(gold, pred)
    for k in ("precision", "recall", "f1", "accuracy"):
        assert ours[k] == pytest.approx(ref[k], abs=1e-12), k
    assert set(ours["per_type"]) == set(ref["per_type"])
    for t, row in ours["per_type"].items():
        for k in ("precision", "recall", "f1"):
            ref_k = "f1-score" if k == "f1" else k
            assert row[k] == pytest.approx(ref["per_type"][t][ref_k], abs=1e-12), (t, k)
        assert row["support"] == ref["per_type"][t]["support"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TAGS), max_size=30))
def test_get_entities_equals_seqeval(tags):
    from seqeval.metrics.sequence_labeling import get_entities as ref

    assert get_entities(tags) == ref(list(tags))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_entity_metrics_equal_seqeval_random(data):
    gold = data.draw(sentences_st)
    pred = [data.draw(st.lists(st.sampled_from(TAGS), min_size=len(g), max_size=len(g)))
            for g in gold]
    if not any(get_entities(g) for g in gold) and not any(get_entities(p) for p in pred):
        return  # seqeval's report has no rows then; both give 0
    assert_same_as_seqeval(gold, pred)


def test_entity_metrics_equal_seqeval_on_real_ner():
    train, dev = sample(NER / "train.tsv"), sample(NER / "dev.tsv")
    gold = [s.tags for s in dev]
    pred = MostFrequentTagBaseline().fit(train).predict(dev)  # real, imperfect predictions
    assert_same_as_seqeval(gold, pred)
    rng = np.random.default_rng(0)
    tags = tag_list(train)
    noisy = [[t if rng.random() < 0.9 else tags[rng.integers(len(tags))] for t in g] for g in gold]
    assert_same_as_seqeval(gold, noisy)
    assert entity_metrics(gold, gold)["f1"] == 1.0


def test_entity_metrics_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["I-LOC", "I-LOC", "O"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-LOC", "I-LOC", "B-PER"]]
    m = entity_metrics(gold, pred)
    # gold: PER(0,1), LOC(3,3), LOC(0,1) (I- after O starts a chunk); pred: PER(0,1), LOC(0,1), PER(2,2)
    assert (m["n_gold"], m["n_pred"], m["n_correct"]) == (3, 3, 2)
    assert m["per_type"]["LOC"] == {"precision": 1.0, "recall": 0.5, "f1": 2 / 3, "support": 2}
    assert m["per_type"]["PER"]["precision"] == 0.5
    assert get_entities(["S-LOC", "B-LOC", "E-LOC", "I-PER", "E-LOC"]) == [
        ("LOC", 0, 0), ("LOC", 1, 2), ("PER", 3, 3), ("LOC", 4, 4)]
    assert entity_metrics([["O"]], [["O"]])["f1"] == 0.0  # no entity anywhere: 0, not NaN
    assert is_entity_tagset(TAGS) and not is_entity_tagset(["NOUN", "BEZ", "O"])
    with pytest.raises(ValueError, match="not an entity tag"):
        get_entities(["NOUN"])
    with pytest.raises(ValueError, match="sentence 0"):
        entity_metrics([["O"]], [["O", "O"]])


def test_token_accuracy_and_pos_metrics():
    gold = [["DET", "NOUN"], ["VERB"]]
    assert token_accuracy(gold, [["DET", "VERB"], ["VERB"]]) == 2 / 3
    m = tagging_metrics(gold, [["DET", "VERB"], ["VERB"]], ["DET", "NOUN", "VERB"])
    assert m == {"accuracy": 2 / 3, "n_words": 3}  # no entity metrics for POS tags


def test_most_frequent_tag_baseline():
    train = [TaggedSentence(["the", "run", "run"], ["DET", "NOUN", "VERB"], 1),
             TaggedSentence(["run", "the", "dog"], ["VERB", "DET", "NOUN"], 5),
             TaggedSentence(["a"], ["DET"], 9)]
    b = MostFrequentTagBaseline().fit(train)
    # run: VERB 2 > NOUN 1; unseen words: DET (3) is the most frequent tag overall
    assert b.predict([["run", "the", "cat"]]) == [["VERB", "DET", "DET"]]
    assert MostFrequentTagBaseline().fit(train[:1]).predict([["run"]]) == [["NOUN"]]  # tie: first seen
    acc = MostFrequentTagBaseline().fit(sample(BROWN / "train.tsv")).score(sample(BROWN / "dev.tsv"))
    assert 0.80 < acc["accuracy"] < 0.97 and acc["n_words"] == 4847
    with pytest.raises(ValueError):
        MostFrequentTagBaseline().predict([["a"]])
