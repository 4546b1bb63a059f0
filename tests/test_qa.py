"""Extractive QA data and metrics (minibert.finetuning.qa): SQuAD reading and its errors,
features against transformers' fast tokenizer doing HF run_qa.py's preparation on the
shipped SQuAD sample, answer extraction on constructed logits, and SQuAD v1.1 EM / F1 on
worked examples. Reads only files the repository ships (data/qa, tests/data/tokenization).

No reference implementation of the SQuAD metric installs offline (the ``evaluate`` /
``datasets`` squad metric is a script fetched from the Hugging Face Hub), so EM and F1 are
checked on examples worked out by hand from the definition in the official
``evaluate-v1.1.py``.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from minibert.finetuning import DatasetError, pad_batch
from minibert.finetuning.qa import (QAExample, answer_token_span, exact_match_score, f1_score,
                                    normalize_answer, postprocess_qa_predictions,
                                    prepare_qa_features, read_squad, squad_metrics)
from minibert.tokenization import BertTokenizer

ROOT = Path(__file__).resolve().parent.parent
SQUAD = ROOT / "data" / "qa" / "en" / "squad_v1"
EN_VOCAB = ROOT / "tests" / "data" / "tokenization" / "bert-base-uncased-vocab.txt"


@functools.lru_cache(maxsize=None)
def tokenizers():
    """(ours, transformers' fast BertTokenizer) on the uncased vocab."""
    import transformers  # a test dependency: fail, never skip, when it is missing

    transformers.logging.set_verbosity_error()
    return BertTokenizer(EN_VOCAB), transformers.BertTokenizerFast(str(EN_VOCAB), do_lower_case=True)


@functools.lru_cache(maxsize=None)
def sample(split: str):
    return read_squad(SQUAD / f"{split}.jsonl")


def record(**kw) -> dict:
    r = {"id": "q1", "title": "T", "context": "The cat sat on the mat.", "question": "Who sat?",
         "answers": {"text": ["The cat"], "answer_start": [0]}}
    r.update(kw)
    return r


def write_lines(tmp_path, records, name="split.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records),
                 encoding="utf-8")
    return p


def nested(examples) -> dict:
    """The examples in the original nested SQuAD layout (one paragraph per context)."""
    data: dict = {}
    for e in examples:
        paras = data.setdefault(e.title, {})
        paras.setdefault(e.context, []).append(
            {"id": e.id, "question": e.question,
             "answers": [{"text": t, "answer_start": s} for t, s in zip(e.answers, e.answer_starts)]})
    return {"version": "1.1", "data": [
        {"title": t, "paragraphs": [{"context": c, "qas": q} for c, q in paras.items()]}
        for t, paras in data.items()]}


# --------------------------------------------------------------------------- reading
def test_samples_read():
    train, dev = sample("train"), sample("dev")
    assert len(train) == 256 and len(dev) == 78
    assert {e.title for e in train}.isdisjoint({e.title for e in dev})
    assert all(len(e.answers) == 1 for e in train) and sum(len(e.answers) for e in dev) == 233
    e = dev[0]
    assert e.line == 1 and e.context[e.answer_starts[0]:][:len(e.answers[0])] == e.answers[0]


def test_nested_format_reads_the_same(tmp_path):
    dev = sample("dev")
    p = tmp_path / "dev-v1.1.json"
    p.write_text(json.dumps(nested(dev), indent=1), encoding="utf-8")
    again = read_squad(p)
    key = lambda e: (e.id, e.title, e.context, e.question, e.answers, e.answer_starts)
    assert [key(e) for e in again] == [key(e) for e in dev]
    text = p.read_text(encoding="utf-8").split("\n")
    assert all(f'"{e.id}"' in text[e.line - 1] for e in again)  # line of the id


@pytest.mark.parametrize("records, line, what", [
    ([record(), "{not json"], 2, r"2: malformed JSON"),
    ([record(), record(id="q2", context=None)], 2, "field 'context' must be a string"),
    ([record(question="  ")], 1, "field 'question' is empty"),
    ([{k: v for k, v in record().items() if k != "id"}], 1, "missing field 'id'"),
    ([record(answers={"text": ["cat"]})], 1, "'answers' must be an object"),
    ([record(answers={"text": ["cat"], "answer_start": [0, 4]})], 1, "1 answer texts but 2"),
    ([record(answers={"text": [], "answer_start": []})], 1, "no answer"),
    ([record(answers={"text": ["cat"], "answer_start": ["4"]})], 1, "answer_start must be an int"),
    ([record(), record(id="q2", answers={"text": ["cat"], "answer_start": [3]})], 2,
     (r"\(id 'q2'\) answer 0: text 'cat' does not match the context at answer_start=3, "
      r"which reads ' ca'")),
    ([record(), record()], 2, r"question id given twice \(first on line 1\)"),
    (["[1, 2]"], 1, "a JSON array"),
])
def test_read_errors_name_file_and_line(tmp_path, records, line, what):
    p = write_lines(tmp_path, records)
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(p))}:{line}:.*{what}"):
        read_squad(p)


def test_read_errors_files_and_nested(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        read_squad(tmp_path / "missing.jsonl")
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(p))}:1: no question"):
        read_squad(p)
    p.write_bytes(json.dumps(record()).encode() + b"\n" + b'{"id": "\xff"}\n')
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(p))}:2: not valid UTF-8"):
        read_squad(p)
    bad = nested([QAExample("x1", "T", "abc def", "q?", ["def"], [4])])
    bad["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 3
    p.write_text(json.dumps(bad, indent=1), encoding="utf-8")
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(p))}:\d+: \(id 'x1'\) data\[0\]\.paragraphs\[0\]"
                                           rf"\.qas\[0\]: answer 0: text 'def' does not match"):
        read_squad(p)
    p.write_text('{"data": [\n{"title": "T",\n "paragraphs": [}\n]}', encoding="utf-8")
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(p))}:3:\d+: malformed JSON"):
        read_squad(p)
    p = write_lines(tmp_path, [{k: v for k, v in record().items() if k != "answers"}])
    assert read_squad(p, require_answers=False)[0].answers == []
    with pytest.raises(DatasetError, match="missing field 'answers'"):
        read_squad(p)


# --------------------------------------------------------------------------- features
def hf_features(ref, examples, max_len, stride):
    """HF run_qa.py's prepare_train_features / prepare_validation_features with the fast
    tokenizer; answer positions as the HF course (the scan bounded to the context)."""
    enc = ref([e.question.lstrip() for e in examples], [e.context for e in examples],
              truncation="only_second", max_length=max_len, stride=stride,
              return_overflowing_tokens=True, return_offsets_mapping=True)
    starts, ends, offsets = [], [], []
    for i, offs in enumerate(enc["offset_mapping"]):
        seq = enc.sequence_ids(i)
        e = examples[enc["overflow_to_sample_mapping"][i]]
        start_char = e.answer_starts[0]
        end_char = start_char + len(e.answers[0])
        idx = 0
        while seq[idx] != 1:
            idx += 1
        context_start = idx
        while seq[idx] == 1:
            idx += 1
        context_end = idx - 1
        if offs[context_start][0] > start_char or offs[context_end][1] < end_char:
            starts.append(0)
            ends.append(0)
        else:
            idx = context_start
            while idx <= context_end and offs[idx][0] <= start_char:
                idx += 1
            starts.append(idx - 1)
            idx = context_end
            while idx >= context_start and offs[idx][1] >= end_char:
                idx -= 1
            ends.append(idx + 1)
        offsets.append([list(o) if seq[k] == 1 else [-1, -1] for k, o in enumerate(offs)])
    return enc, starts, ends, offsets


@pytest.mark.parametrize("split, max_len, stride", [("train", 128, 32), ("dev", 384, 128),
                                                    ("dev", 64, 16)])
def test_features_equal_hf_run_qa(split, max_len, stride):
    ours, ref = tokenizers()
    examples = sample(split)
    feats = prepare_qa_features(ours, examples, max_len, stride, max_query_length=None)
    enc, starts, ends, offsets = hf_features(ref, examples, max_len, stride)
    assert len(feats) >= len(examples)
    assert max_len == 384 or len(feats) > len(examples)  # at 128 / 64 some need several windows
    assert feats.input_ids == enc["input_ids"]
    assert feats.token_type_ids == enc["token_type_ids"]
    assert feats.example_index.tolist() == list(enc["overflow_to_sample_mapping"])
    assert feats.example_ids == [examples[k].id for k in enc["overflow_to_sample_mapping"]]
    assert feats.labels[:, 0].tolist() == starts and feats.labels[:, 1].tolist() == ends
    assert [o.tolist() for o in feats.offsets] == offsets
    # the labelled spans cover the answer: [offsets[start].start, offsets[end].end) holds it
    inside = 0
    for f, (s, e) in enumerate(feats.labels):
        ex = examples[feats.example_index[f]]
        a, b = ex.answer_starts[0], ex.answer_starts[0] + len(ex.answers[0])
        if s == 0:
            continue
        inside += 1
        o = feats.offsets[f]
        assert s <= e and o[s, 0] <= a and o[e, 1] >= b and o[s, 1] > a and o[e, 0] < b
    assert inside >= len(examples) * 0.9


def test_feature_batches_and_query_cut():
    ours, _ = tokenizers()
    examples = sample("dev")[:5]
    feats = prepare_qa_features(ours, examples, 64, 16)
    b = pad_batch(feats, [0, 1, 2])
    assert b.labels.shape == (3, 2) and b.input_ids.shape[0] == 3
    long_q = QAExample("long", "", "a b c d e f", " ".join(["why"] * 100) + "?", ["c"], [4])
    f = prepare_qa_features(ours, [long_q], 128, 16, max_query_length=10)
    assert f.input_ids[0][:12] == [ours.cls_token_id] + ours.text_to_ids("why") * 10 + [ours.sep_token_id]
    assert f.labels.tolist() == [[14, 14]]  # [CLS] + 10 + [SEP] + "a b" -> "c" at 14
    with pytest.raises(ValueError, match=r"\(id 'long'\) cannot make windows of max_seq_length=64"):
        prepare_qa_features(ours, [long_q], 64, 16, max_query_length=None)


def test_answer_token_span_by_hand():
    #       [CLS]   q      [SEP]   ctx "ab" "cd" "ef"              [SEP]
    offs = [(0, 0), (0, 1), (0, 0), (0, 2), (3, 5), (6, 8), (0, 0)]
    seq = [None, 0, None, 1, 1, 1, None]
    assert answer_token_span(offs, seq, 3, 5) == (4, 4)
    assert answer_token_span(offs, seq, 0, 8) == (3, 5)
    assert answer_token_span(offs, seq, 4, 7) == (4, 5)   # partial tokens: the tokens holding them
    assert answer_token_span(offs, seq, 6, 9) == (0, 0)   # ends past the window
    assert answer_token_span([(0, 0), (5, 7), (0, 0)], [None, 1, None], 2, 3) == (0, 0)


# --------------------------------------------------------------------------- answers
def toy_features():
    """One example, a context of 4 words, in two windows: [CLS] q [SEP] w0 w1 [SEP] and
    [CLS] q [SEP] w1 w2 w3 [SEP] (offsets by hand)."""
    ours, _ = tokenizers()
    ex = QAExample("e1", "", "aa bb cc dd", "q?", ["cc"], [6])
    feats = prepare_qa_features(ours, [ex], 16, 0)
    assert len(feats) == 1
    # build a two-window feature set by hand
    o1 = np.array([[-1, -1], [-1, -1], [-1, -1], [-1, -1], [0, 2], [3, 5], [-1, -1]])
    o2 = np.array([[-1, -1], [-1, -1], [-1, -1], [-1, -1], [3, 5], [6, 8], [9, 11], [-1, -1]])
    feats.input_ids = [[0] * 7, [0] * 8]
    feats.token_type_ids = [[0] * 7, [0] * 8]
    feats.offsets = [o1, o2]
    feats.example_index = np.array([0, 0])
    feats.example_ids = ["e1", "e1"]
    return feats


def test_postprocess_picks_best_valid_span_across_windows():
    feats = toy_features()
    s1, e1 = np.full(7, -5.0), np.full(7, -5.0)
    s2, e2 = np.full(8, -5.0), np.full(8, -5.0)
    s1[1] = e1[1] = 20.0          # question token: never an answer
    s1[5], e1[4] = 9.0, 9.0        # end before start: skipped; "aa" and "bb" score 4
    s2[5], e2[6] = 4.0, 4.0        # "cc dd", score 8: the best valid span, second window
    p = postprocess_qa_predictions(feats, [s1, s2], [e1, e2])["e1"]
    assert (p.text, p.score, p.start, p.end, p.feature) == ("cc dd", 8.0, 6, 11, 1)
    assert postprocess_qa_predictions(feats, [s1, s2], [e1, e2], max_answer_length=1)["e1"].text in (
        "aa", "bb", "cc", "dd")
    assert postprocess_qa_predictions(feats, [s1, s2], [e1, e2], max_answer_length=1)["e1"].score < 8
    # n_best_size=1: only the top start and top end of each window are tried
    p = postprocess_qa_predictions(feats, [s1, s2], [e1, e2], n_best_size=1)["e1"]
    assert p.text == "cc dd"
    s2[4] = 5.0  # now the top start of window 2 is "bb" (4), with the top end "dd": "bb cc dd"
    p = postprocess_qa_predictions(feats, [s1, s2], [e1, e2], n_best_size=1)["e1"]
    assert (p.text, p.score) == ("bb cc dd", 9.0)
    # padded (F, T) logits work the same; positions past a feature's length are ignored
    S = np.full((2, 10), 50.0)
    E = np.full((2, 10), 50.0)
    S[0, :7], S[1, :8], E[0, :7], E[1, :8] = s1, s2, e1, e2
    assert postprocess_qa_predictions(feats, S, E, n_best_size=1)["e1"].text == "bb cc dd"


def test_postprocess_no_valid_span_and_errors():
    feats = toy_features()
    s = [np.zeros(7), np.zeros(8)]
    s[0][1] = s[1][1] = 10  # only the question token scores
    p = postprocess_qa_predictions(feats, s, s, n_best_size=1)["e1"]
    assert (p.text, p.score, p.start, p.feature) == ("", float("-inf"), -1, -1)
    with pytest.raises(ValueError, match="one logit row per feature"):
        postprocess_qa_predictions(feats, s[:1], s)


def test_postprocess_recovers_gold_answers_from_labels():
    ours, _ = tokenizers()
    examples = sample("train")
    feats = prepare_qa_features(ours, examples, 128, 32)
    T = max(map(len, feats.input_ids))
    S = np.zeros((len(feats), T))
    E = np.zeros((len(feats), T))
    for f, (s, e) in enumerate(feats.labels):
        if s:
            S[f, s] = E[f, e] = 10.0
    preds = postprocess_qa_predictions(feats, S, E)
    m = squad_metrics(examples, preds)
    assert m["n"] == 256 and m["missing"] == 0 and m["exact_match"] > 95 and m["f1"] > 95


# --------------------------------------------------------------------------- metrics
def test_normalize_answer():
    assert normalize_answer("The  Cat!") == "cat"
    assert normalize_answer("  An apple, a day. ") == "apple day"
    assert normalize_answer("theatre anthem") == "theatre anthem"  # articles only as words
    assert normalize_answer("U.S.-based") == "usbased"              # punctuation deleted, not spaced
    assert normalize_answer("the-end") == "theend"                  # ... so "the" is no longer a word
    assert normalize_answer("Café – 1,000") == "café – 1000"        # only ASCII punctuation goes
    assert normalize_answer("A") == ""


def test_em_f1_worked_examples():
    assert exact_match_score("the Eiffel Tower.", "Eiffel tower") == 1.0
    assert exact_match_score("Eiffel", "Eiffel Tower") == 0.0
    # pred "eiffel", gold "eiffel tower": P = 1, R = 1/2, F1 = 2/3
    assert f1_score("Eiffel", "Eiffel Tower") == pytest.approx(2 / 3)
    # pred "in 1889 in paris" (4), gold "1889 paris" (2): common 2, P = 1/2, R = 1, F1 = 2/3
    assert f1_score("in 1889, in Paris", "1889 Paris") == pytest.approx(2 / 3)
    # tokens count as a multiset: "x x y" vs "x y y" have x and y in common: P = R = 2/3
    assert f1_score("x x y", "x y y") == pytest.approx(2 / 3)
    assert f1_score("the", "a") == 0.0  # both empty after normalisation: 0 in v1.1
    assert f1_score("cat", "dog") == 0.0
    refs = {"q1": ["Denver Broncos", "The Denver Broncos"], "q2": ["Santa Clara, California", "Levi's Stadium"],
            "q3": ["gold"], "q4": ["1889"]}
    preds = {"q1": "Denver Broncos", "q2": "Levi's Stadium in Santa Clara", "q3": "golden", "extra": "x"}
    m = squad_metrics(refs, preds)
    # q1: EM 1, F1 1. q2: vs "levis stadium" P 2/5 R 1 F1 4/7; vs "santa clara california"
    # P 2/5 R 2/3 F1 1/2 -> 4/7. q3: 0. q4: missing, 0.
    assert m == {"exact_match": pytest.approx(25.0), "f1": pytest.approx(100 * (1 + 4 / 7) / 4),
                 "n": 4, "missing": 1}
    with pytest.raises(ValueError, match="no gold answer"):
        squad_metrics({"q": []}, {"q": "x"})
