"""Tests for minibert.objectives: the registry, each objective's segments, batches per
objective (fixed shapes, resumption), and the batches driving BertForPreTraining.

NSP's own pair properties are in test_pretraining.py. Stores here are position-encoded:
token ids are consecutive integers in corpus order, so every id says where it came from.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helpers import position_store
from minibert.modeling import BertConfig, BertForPreTraining
from minibert.objectives import OBJECTIVES, Objective, get_objective
from minibert.pretraining import (CorpusError, VocabInfo, count_instances,
                                  default_max_predictions, iterate_batches, make_eval_batches)

PAD, UNK, CLS, SEP, MASK = range(5)
FIRST_ID = 10  # the first token id of helpers.position_store


def random_store(rng, n_docs=30, max_sents=10, max_len=12):
    return position_store([list(rng.integers(1, max_len + 1, size=int(rng.integers(1, max_sents + 1))))
                           for _ in range(n_docs)])


def vocab_for(store):
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])}
    vocab.update({f"w{i}": i for i in range(5, FIRST_ID + store.num_tokens)})
    return VocabInfo.from_vocab(vocab)


def where(store, ids):
    """(document, sentence) of each position-encoded token id."""
    pos = np.asarray(ids) - FIRST_ID
    sent = np.searchsorted(store.sentence_offsets, pos, side="right") - 1
    return np.searchsorted(store.document_offsets, sent, side="right") - 1, sent


def segments(name, store, T, order=None, short=0.1, seed=0, copy=0):
    order = range(store.num_documents) if order is None else order
    return list(get_objective(name).segments(store, order, T, short_seq_prob=short, seed=seed,
                                             copy=copy, cls_id=CLS, sep_id=SEP))


def split_pair(ids):
    seps = np.flatnonzero(ids == SEP)
    assert ids[0] == CLS and len(seps) == 2 and seps[1] == len(ids) - 1
    return ids[1 : seps[0]], ids[seps[0] + 1 : -1]


# ------------------------------------------------------------------ the registry


def test_registry():
    assert set(OBJECTIVES) == {"mlm", "mlm+nsp", "mlm+sop", "electra"}
    for name, obj in OBJECTIVES.items():
        assert isinstance(obj, Objective) and obj.name == name and get_objective(name) is obj
        assert get_objective(obj) is obj
    assert [OBJECTIVES[n].sentence_task for n in ("mlm", "mlm+nsp", "mlm+sop")] == [None, "nsp", "sop"]
    assert [OBJECTIVES[n].min_documents for n in ("mlm", "mlm+nsp", "mlm+sop")] == [1, 2, 1]
    with pytest.raises(ValueError, match="unknown objective 'bogus'.*electra, mlm, mlm\\+nsp, mlm\\+sop"):
        get_objective("bogus")


# ------------------------------------------------------------------ mlm: RoBERTa FULL-SENTENCES


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(3, 40))
def test_full_sentences_packing(seed, T):
    rng = np.random.default_rng(seed)
    store = random_store(rng, n_docs=int(rng.integers(1, 12)), max_len=15)
    order = rng.permutation(store.num_documents)
    segs = segments("mlm", store, T, order=order)
    again = segments("mlm", store, T, order=order, short=1.0, seed=seed, copy=3)  # no random draws
    assert [s.input_ids.tolist() for s in segs] == [s.input_ids.tolist() for s in again]
    budget = T - 2
    content = []
    for k, seg in enumerate(segs):
        ids = seg.input_ids
        assert ids.dtype == np.int32 and seg.token_type_ids.dtype == np.int8
        assert 3 <= len(ids) <= T and ids[0] == CLS and ids[-1] == SEP
        assert seg.label is None and not seg.token_type_ids.any()
        body = ids[1:-1]
        toks = body[body != SEP]
        assert len(toks) and body[0] != SEP and body[-1] != SEP
        doc, sent = where(store, toks)
        assert seg.document == doc[0]
        # An inner [SEP] exactly where one document ends and the next begins.
        n_sep_between = np.diff(np.flatnonzero(body != SEP)) - 1
        np.testing.assert_array_equal(n_sep_between, (np.diff(doc) != 0).astype(int))
        # Full sentences, unless a sentence longer than the budget was cut into pieces.
        first, last = int(toks[0]) - FIRST_ID, int(toks[-1]) - FIRST_ID + 1
        so = store.sentence_offsets
        long_first = so[sent[0] + 1] - so[sent[0]] > budget
        long_last = so[sent[-1] + 1] - so[sent[-1]] > budget
        assert first == so[sent[0]] or long_first
        assert last == so[sent[-1] + 1] or long_last
        # Greedy: the next segment's first sentence (with its [SEP] when a document begins)
        # would not have fitted.
        if k + 1 < len(segs) and not (long_last and last != so[sent[-1] + 1]):
            nxt = segs[k + 1].input_ids[1:-1]
            ndoc, nsent = where(store, nxt[:1])
            n_next = so[nsent[0] + 1] - so[nsent[0]]
            assert len(body) + (ndoc[0] != doc[-1]) + n_next > budget
        content.extend(toks.tolist())
    # No text lost, nothing repeated: the documents' tokens in the visiting order.
    assert content == [int(x) for d in order for x in store.tokens[slice(*store.token_range(int(d)))]]


def test_full_sentences_examples():
    # docs: [3 | 4] and [2]; T = 9 -> budget 7: [CLS] 10 11 12 13 14 15 16 [SEP] then
    # the second document alone (its [SEP] would not fit).
    store = position_store([[3, 4], [2]])
    got = [s.input_ids.tolist() for s in segments("mlm", store, 9)]
    assert got == [[CLS, 10, 11, 12, 13, 14, 15, 16, SEP], [CLS, 17, 18, SEP]]
    # budget 10: the document boundary inside one sequence, marked by an extra [SEP]
    got = [s.input_ids.tolist() for s in segments("mlm", store, 12)]
    assert got == [[CLS, 10, 11, 12, 13, 14, 15, 16, SEP, 17, 18, SEP]]
    # visiting order decides the packing
    got = [s.input_ids.tolist() for s in segments("mlm", store, 12, order=[1, 0])]
    assert got == [[CLS, 17, 18, SEP, 10, 11, 12, 13, 14, 15, 16, SEP]]
    # a sentence longer than the budget is cut into full pieces; the rest packs on
    store = position_store([[2], [9, 1]])
    got = [(s.input_ids.tolist(), s.document) for s in segments("mlm", store, 6)]
    assert got == [([CLS, 10, 11, SEP], 0), ([CLS, 12, 13, 14, 15, SEP], 1),
                   ([CLS, 16, 17, 18, 19, SEP], 1), ([CLS, 20, 21, SEP], 1)]
    with pytest.raises(ValueError, match="at least 3"):
        segments("mlm", store, 2)


# ------------------------------------------------------------------ mlm+sop: ALBERT


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(5, 40), short=st.sampled_from([0.0, 0.1, 1.0]))
def test_sop_pairs_are_consecutive_segments(seed, T, short):
    store = random_store(np.random.default_rng(seed), n_docs=8)
    produced = 0
    for seg in segments("mlm+sop", store, T, short=short, seed=seed):
        produced += 1
        ids = seg.input_ids
        assert len(ids) <= T and seg.label in (0, 1)
        a, b = split_pair(ids)
        assert len(a) >= 1 and len(b) >= 1
        np.testing.assert_array_equal(seg.token_type_ids, np.r_[np.zeros(len(a) + 2), np.ones(len(b) + 1)])
        # Both segments contiguous runs of the same document (trimming only cuts ends) ...
        assert np.all(np.diff(a) == 1) and np.all(np.diff(b) == 1)
        assert set(where(store, a)[0]) == set(where(store, b)[0]) == {seg.document}
        # ... in document order (label 0) or swapped (label 1).
        if seg.label == 0:
            assert a[-1] < b[0]
        else:
            assert b[-1] < a[0]
    assert produced > 0, "segments() gave no pair: the checks above ran on nothing"


def test_sop_swapped_pairs_are_the_document_in_order():
    # Sequences long enough never to trim: B A (label 1) or A B (label 0) is one contiguous run
    # of the document, and the runs of a document cover it exactly, in order, except a final
    # one-token chunk, which is dropped.
    rng = np.random.default_rng(3)
    store = random_store(rng, n_docs=200, max_sents=8, max_len=6)
    labels, dropped = [], 0
    by_doc: dict[int, list[int]] = {}
    for seg in segments("mlm+sop", store, 1000, short=1.0):
        a, b = split_pair(seg.input_ids)
        run = np.r_[b, a] if seg.label == 1 else np.r_[a, b]
        assert np.all(np.diff(run) == 1)
        by_doc.setdefault(seg.document, []).extend(run.tolist())
        labels.append(seg.label)
    for d in range(store.num_documents):
        t0, t1 = store.token_range(d)
        got = by_doc.get(d, [])
        assert got == list(range(FIRST_ID + t0, FIRST_ID + t0 + len(got)))
        missing = t1 - t0 - len(got)
        assert missing in (0, 1)
        if missing:  # the last sentence, of one token
            s0, s1 = store.sentence_range(d)
            assert store.sentence_offsets[s1] - store.sentence_offsets[s1 - 1] == 1
            dropped += 1
    assert dropped > 0
    assert 0.43 < np.mean(labels) < 0.57  # a fair coin on ~500 pairs (sd 0.022)


def test_sop_single_sentence_chunks():
    # A one-sentence chunk is cut inside the sentence at a drawn point (untrimmed here) ...
    sop = get_objective("mlm+sop")
    sentence = np.arange(100, 140, dtype=np.int32)
    cuts = set()
    for seed in range(60):
        a, b, label, put_back = sop.split_chunk([sentence], 29, None, 0, np.random.default_rng(seed))
        first, second = (b, a) if label else (a, b)
        np.testing.assert_array_equal(np.r_[first, second], sentence)
        assert len(first) >= 1 and len(second) >= 1 and put_back == 0
        cuts.add(len(first))
    assert len(cuts) > 15 and cuts <= set(range(1, 40))
    # ... and a one-token chunk gives no pair.
    assert sop.split_chunk([sentence[:1]], 29, None, 0, np.random.default_rng(0)) is None
    # In a document: one 40-token sentence (target 29 tokens) makes one pair, trimmed to 29
    # tokens; the final 1-token sentence is a chunk of its own, dropped.
    store = position_store([[40, 1]])
    for seed in range(20):
        segs = segments("mlm+sop", store, 32, short=0.0, seed=seed)
        assert len(segs) == 1
        a, b = split_pair(segs[0].input_ids)
        first, second = (b, a) if segs[0].label else (a, b)
        assert len(first) + len(second) == 29 and first[-1] < second[0]
        assert second[-1] < FIRST_ID + 40  # nothing from the dropped one-token sentence
    assert segments("mlm+sop", position_store([[1]]), 32) == []
    with pytest.raises(ValueError, match="at least 5"):
        segments("mlm+sop", store, 4)


def test_sop_and_mlm_need_one_document_nsp_two():
    store = position_store([[5, 6, 7, 4]])
    for name in ("mlm", "mlm+sop"):
        batches = list(iterate_batches(store, vocab_for(store), 1, 16, 0, 0, objective=name))
        assert batches
    with pytest.raises(CorpusError, match="'mlm\\+nsp' needs at least 2: next-sentence prediction"):
        next(iterate_batches(store, vocab_for(store), 1, 16, 0, 0, objective="mlm+nsp"))
    empty = store.subset([])
    with pytest.raises(CorpusError, match="0 document"):
        next(iterate_batches(empty, vocab_for(store), 1, 16, 0, 0, objective="mlm"))
    assert make_eval_batches(empty, vocab_for(store), 1, 16, 0, objective="mlm") == []


# ------------------------------------------------------------------ batches, per objective


@pytest.fixture(scope="module")
def corpus():
    store = random_store(np.random.default_rng(7), n_docs=40, max_sents=12, max_len=10)
    return store, vocab_for(store)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
@pytest.mark.parametrize("prob", [0.15, 0.4])
def test_fixed_shapes(corpus, name, prob):
    store, vi = corpus
    B, T = 4, 24
    P = default_max_predictions(T, prob)
    task = get_objective(name).sentence_task
    batches = list(iterate_batches(store, vi, B, T, 1, 3, objective=name, masked_lm_prob=prob,
                                   short_seq_prob=0.3))
    assert len(batches) == count_instances(store, T, 1, 3, objective=name, short_seq_prob=0.3) // B > 5
    for b in batches:
        for a in (b.input_ids, b.token_type_ids, b.attention_mask):
            assert a.shape == (B, T) and a.dtype == np.int64
        for a in (b.masked_lm_positions, b.masked_lm_ids):
            assert a.shape == (B, P) and a.dtype == np.int64
        assert b.masked_lm_weights.shape == (B, P) and b.masked_lm_weights.dtype == np.float32
        lengths = b.attention_mask.sum(1)
        np.testing.assert_array_equal(b.masked_lm_weights.sum(1), [max(1, round(L * prob)) for L in lengths])
        slot = b.masked_lm_weights > 0
        assert np.all(b.masked_lm_positions[~slot] == 0) and np.all(b.masked_lm_ids[~slot] == 0)
        assert np.all(b.masked_lm_positions[slot] > 0)  # never [CLS]
        if task is None:
            assert b.next_sentence_label is None and not b.token_type_ids.any()
            assert "next_sentence_label" not in b.model_inputs()
        else:
            assert b.next_sentence_label.shape == (B,) and set(np.unique(b.next_sentence_label)) <= {0, 1}


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_resumption(corpus, name, masking):
    store, vi = corpus
    kw = dict(batch_size=3, max_seq_length=20, epoch=4, seed=11, objective=name, masking=masking,
              dupe_factor=3, shuffle_buffer=25)
    full = list(iterate_batches(store, vi, **kw))
    assert len(full) > 12
    for k in (1, 7, len(full) - 1, len(full)):
        tail = list(iterate_batches(store, vi, start_batch=k, **kw))
        assert len(tail) == len(full) - k
        for x, y in zip(full[k:], tail):
            xi, yi = x.model_inputs(), y.model_inputs()
            assert xi.keys() == yi.keys()
            for f in xi:
                np.testing.assert_array_equal(xi[f], yi[f])
    other = next(iterate_batches(store, vi, **{**kw, "epoch": 5}))
    assert not np.array_equal(other.input_ids, full[0].input_ids)


# ------------------------------------------------------------------ driving the model


# the BERT objectives (ELECTRA's model and sums: tests/test_electra.py)
BERT_OBJECTIVES = sorted(n for n in OBJECTIVES if n != "electra")


@pytest.mark.parametrize("name", BERT_OBJECTIVES)
def test_batches_drive_the_model(corpus, name):
    store, vi = corpus
    obj = get_objective(name)
    config = BertConfig(vocab_size=vi.vocab_size, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    model = obj.build_model(config, seed=0)
    assert isinstance(model, BertForPreTraining)
    assert model.has_seq_relationship_head == (obj.sentence_task is not None)
    model.set_dropout_rng(np.random.default_rng(1))
    totals: dict[str, float] = {}
    batches = list(iterate_batches(store, vi, 4, 24, 0, 0, objective=name))[:3]
    for b in batches:
        inputs = b.model_inputs()
        model.zero_grad()
        out = model(**inputs)
        model.backward()
        assert all(np.isfinite(p.grad).all() for p in model.parameters())
        assert any(np.abs(p.grad).sum() > 0 for p in model.parameters())
        stats = obj.stats(out, inputs)
        assert all(isinstance(v, np.ndarray) and v.ndim == 0 for v in stats.values())
        # the sums, recomputed here from the outputs
        w = b.masked_lm_weights > 0
        pred = out.prediction_logits.argmax(-1)
        assert int(stats["mlm_count"]) == int(w.sum())
        assert int(stats["mlm_correct"]) == int(((pred == b.masked_lm_ids) & w).sum())
        assert math.isclose(float(stats["mlm_loss_sum"]), float(out.mlm_loss) * w.sum(), rel_tol=1e-6)
        task = obj.sentence_task
        if task:
            assert int(stats[f"{task}_count"]) == 4
            assert int(stats[f"{task}_correct"]) == int(
                (out.seq_relationship_logits.argmax(-1) == b.next_sentence_label).sum())
            assert math.isclose(float(stats[f"{task}_loss_sum"]), 4 * float(out.seq_relationship_loss),
                                rel_tol=1e-6)
        else:
            assert out.seq_relationship_logits is None and set(stats) == {"mlm_loss_sum", "mlm_correct", "mlm_count"}
        for k, v in stats.items():
            totals[k] = totals.get(k, 0.0) + float(v)
    summary = obj.summarize(totals)
    keys = {"mlm_loss", "mlm_acc"} | ({f"{obj.sentence_task}_loss", f"{obj.sentence_task}_acc"}
                                      if obj.sentence_task else set())
    assert set(summary) == keys
    assert math.isclose(summary["mlm_loss"], totals["mlm_loss_sum"] / totals["mlm_count"])
    assert 0 <= summary["mlm_acc"] <= 1
    # random weights: about log V nats per prediction
    assert abs(summary["mlm_loss"] - math.log(vi.vocab_size)) < 1.0
    empty = {k: 0.0 for k in totals}
    assert all(math.isnan(v) for v in obj.summarize(empty).values())


@pytest.mark.parametrize("name", BERT_OBJECTIVES)
def test_stats_count_only_real_slots(name):
    # Crafted outputs: slot 2 of row 0 and slots 1-2 of row 1 are padding (id 0, weight 0) and
    # their logits predict id 0, which must not count as correct.
    obj = get_objective(name)
    ids = np.array([[5, 6, 0], [7, 0, 0]])
    weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    predicted = np.array([[5, 9, 0], [7, 0, 0]])
    logits = np.eye(10)[predicted]                                          # (2, 3, 10)
    out = type("Out", (), dict(mlm_loss=np.float64(2.0), prediction_logits=logits,
                               seq_relationship_loss=np.float64(0.5),
                               seq_relationship_logits=np.array([[1.0, 0.0], [1.0, 0.0]])))
    inputs = dict(masked_lm_ids=ids, masked_lm_weights=weights, next_sentence_label=np.array([0, 1]))
    stats = {k: float(v) for k, v in obj.stats(out, inputs).items()}
    want = dict(mlm_loss_sum=6.0, mlm_correct=2.0, mlm_count=3.0)
    if obj.sentence_task:
        t = obj.sentence_task
        want.update({f"{t}_loss_sum": 1.0, f"{t}_correct": 1.0, f"{t}_count": 2.0})
    assert stats == want
    summary = obj.summarize(stats)
    assert summary["mlm_loss"] == 2.0 and summary["mlm_acc"] == 2 / 3
    if obj.sentence_task:
        assert summary[f"{obj.sentence_task}_loss"] == 0.5 and summary[f"{obj.sentence_task}_acc"] == 0.5


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_metric_tasks_name_the_summarized_means(name):
    obj = get_objective(name)
    want = {"mlm+nsp": ("mlm", "nsp"), "mlm+sop": ("mlm", "sop"), "mlm": ("mlm",),
            "electra": ("mlm", "rtd")}[name]
    assert obj.metric_tasks == want
    # each task's mean is its own sum over its own count
    totals = {}
    for i, t in enumerate(want):
        totals |= {f"{t}_loss_sum": 6.0 * (i + 1), f"{t}_correct": 2.0, f"{t}_count": 4.0}
    totals["rtd_replaced"] = 1.0                       # ELECTRA's extra sum (others ignore it)
    summary = obj.summarize(totals)
    for i, t in enumerate(want):
        assert summary[f"{t}_loss"] == 1.5 * (i + 1) and summary[f"{t}_acc"] == 0.5
    extra = {"rtd_replaced"} if name == "electra" else set()
    assert set(summary) == {f"{t}_{m}" for t in want for m in ("loss", "acc")} | extra
