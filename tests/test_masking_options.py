"""The masking options of issue 41: the replacement rule (--mask-replace-prob,
--random-replace-prob), the masking-rate schedule (--masked-lm-prob-end) and line-by-line
sequences (--line-by-line), in minibert.pretraining's masking and batches."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.stats import chisquare

from helpers import position_store, unmasked, word_vocab
from minibert.pretraining import (create_masked_lm_predictions,
                                  iterate_batches, make_eval_batches)
from minibert.pretraining.masking import check_replacement, keep_share
from minibert.pretraining.schedule import BatchSteps, masked_lm_prob_at

PAD, UNK, CLS, SEP, MASK = range(5)


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(5)
    docs = [list(rng.integers(1, 40, size=int(rng.integers(1, 10)))) for _ in range(50)]
    store = position_store(docs)
    return store, word_vocab(store.num_tokens + 20), docs


def predicted(batch):
    """(input id, original id) at every predicted position of a batch: two (N,) arrays."""
    rows, slots = np.nonzero(batch.masked_lm_weights > 0)
    return (batch.input_ids[rows, batch.masked_lm_positions[rows, slots]],
            batch.masked_lm_ids[rows, slots])


# ------------------------------------------------------------------ the replacement rule


def outcome_counts(m, r, seed, n_seq=400, L=100):
    """[MASK] / kept / other counts over the chosen positions of n_seq drawn sequences,
    and the expected shares: a random id equals the original with probability 1/R."""
    vi = word_vocab(2000)
    rng = np.random.default_rng(seed)
    counts = np.zeros(3, dtype=np.int64)
    for _ in range(n_seq):
        ids = vi.random_ids[rng.integers(0, len(vi.random_ids), L)]
        out, pos, labels = create_masked_lm_predictions(ids, vi, 0.5, L, rng,
                                                        mask_replace_prob=m, random_replace_prob=r)
        got = out[pos]
        counts += [(got == MASK).sum(), (got == labels).sum(),
                   ((got != MASK) & (got != labels)).sum()]
    R = len(vi.random_ids)
    keep = max(0.0, 1.0 - m - r)
    expected = np.array([m, keep + r / R, r * (1 - 1 / R)])
    return counts, expected


def chi_square_p(counts, expected):
    """The p-value of counts against shares ``expected`` (categories of share 0 must be
    empty and are left out)."""
    zero = expected == 0
    assert not counts[zero].any(), (counts, expected)
    if (~zero).sum() < 2:
        return 1.0
    f_exp = expected[~zero] / expected[~zero].sum() * counts[~zero].sum()
    return chisquare(counts[~zero], f_exp).pvalue


@pytest.mark.parametrize("m, r", [(0.8, 0.1), (1.0, 0.0), (0.9, 0.1), (0.5, 0.25), (0.0, 1.0),
                                  (0.0, 0.0), (0.6, 0.0)])
def test_replacement_shares_pass_a_chi_square_test(m, r):
    counts, expected = outcome_counts(m, r, seed=int(m * 100 + r * 10))
    assert chi_square_p(counts, expected) > 1e-3, (counts, expected)


@settings(max_examples=8, deadline=None, derandomize=True)  # a fixed set: no flaky p-values
@given(m=st.floats(0.0, 1.0), r_share=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 1))
def test_drawn_replacement_rules_pass_a_chi_square_test(m, r_share, seed):
    m = round(m, 3)
    r = round((1.0 - m) * r_share, 3)
    counts, expected = outcome_counts(m, r, seed, n_seq=150)
    assert chi_square_p(counts, expected) > 1e-4, (m, r, counts, expected)


def test_the_chi_square_test_tells_80_10_10_from_90_10_0():
    counts, _ = outcome_counts(0.8, 0.1, seed=3)
    _, other = outcome_counts(0.9, 0.1, seed=3, n_seq=1)
    # the 90/10/0 shares leave nothing kept, but 80/10/10 keeps about a tenth
    assert other[1] < 0.001 and counts[1] > 0.08 * counts.sum()
    _, half = outcome_counts(0.7, 0.1, seed=3, n_seq=1)
    assert chi_square_p(counts, half) < 1e-6


def reference_masking(ids, vi, prob, max_pred, seed):
    """google-research/bert's 80/10/10 from the same draws, in the order the code made them
    before the rule was an option: candidates' permutation, u, keep, random ids."""
    rng = np.random.default_rng(seed)
    ids = np.asarray(ids)
    cand = np.flatnonzero((ids != CLS) & (ids != SEP) & (ids != PAD))
    n = min(max_pred, max(1, int(round(len(ids) * prob))))
    pos = cand[rng.permutation(len(cand))[:n]]
    u, keep = rng.random(len(pos)), rng.random(len(pos))
    rand = vi.random_ids[rng.integers(0, len(vi.random_ids), size=len(pos))]
    out = ids.astype(np.int32).copy()
    for p, ui, ki, ri in zip(pos, u, keep, rand):
        out[p] = MASK if ui < 0.8 else (ids[p] if ki < 0.5 else ri)
    order = np.argsort(pos)
    return out, pos[order], ids[pos[order]]


@settings(max_examples=30, deadline=None)
@given(L=st.integers(3, 80), prob=st.floats(0.05, 1.0), seed=st.integers(0, 2**31 - 1),
       explicit=st.booleans())
def test_the_default_rule_gives_the_same_arrays_as_before(L, prob, seed, explicit):
    vi = word_vocab(300)
    ids = np.concatenate([[CLS], np.random.default_rng(seed).integers(5, 300, L - 2), [SEP]])
    kw = dict(mask_replace_prob=0.8, random_replace_prob=0.1) if explicit else {}
    got = create_masked_lm_predictions(ids, vi, prob, L, np.random.default_rng(seed), **kw)
    for a, b in zip(got, reference_masking(ids, vi, prob, L, seed)):
        np.testing.assert_array_equal(a, b)


def test_keep_share_is_exact_where_floating_point_is_not():
    assert (1 - 0.8 - 0.1) / (1 - 0.8) != 0.5           # why keep_share works on decimals
    assert keep_share(0.8, 0.1) == 0.5 and keep_share(0.9, 0.1) == 0.0
    assert keep_share(1.0, 0.0) == 0.0 and keep_share(0.0, 0.0) == 1.0
    assert keep_share(0.5, 0.25) == 0.5
    check_replacement(0.7, 0.3)                          # 0.7 + 0.3 is 1 as written
    for m, r in ((0.95, 0.1), (1.0, 0.01), (1.5, 0.0), (0.5, -0.1)):
        with pytest.raises(ValueError):
            check_replacement(m, r)


EVERY_PATH = [dict(objective="mlm+nsp"), dict(objective="mlm+sop"), dict(objective="mlm"),
              dict(objective="electra"), dict(objective="mlm", whole_word_mask=True),
              dict(objective="mlm+sop", max_ngram=3), dict(objective="mlm", masking="static"),
              dict(objective="mlm", line_by_line=True),
              dict(objective="mlm+nsp", batch_masked_lm_prob=lambda k: 0.3)]


@pytest.mark.parametrize("kw", EVERY_PATH, ids=lambda kw: "-".join(f"{k}" for k in kw.items()))
def test_every_masking_path_honours_the_rule(corpus, kw):
    store, vi, _ = corpus
    for m, r in ((1.0, 0.0), (0.0, 0.0)):
        batches = list(itertools.islice(iterate_batches(
            store, vi, 8, 32, epoch=1, seed=2, mask_replace_prob=m, random_replace_prob=r,
            **kw), 6))
        got, original = map(np.concatenate, zip(*map(predicted, batches)))
        assert len(got) > 20
        if m == 1.0:
            assert (got == MASK).all()               # BabyBERTa: never left as itself
        else:
            np.testing.assert_array_equal(got, original)   # nothing replaced
    for line_by_line in (False, True):
        if line_by_line and kw["objective"] not in ("mlm", "electra"):
            continue
        ev = make_eval_batches(store, vi, 8, 32, seed=3, objective=kw["objective"],
                               mask_replace_prob=1.0, random_replace_prob=0.0,
                               line_by_line=line_by_line)
        assert (np.concatenate([predicted(b)[0] for b in ev]) == MASK).all()


# ------------------------------------------------------------------ the rate schedule


def test_masked_lm_prob_at_is_gpt_bert_linear_formula():
    assert masked_lm_prob_at(0, 0.3, 0.15, 100) == 0.3
    assert masked_lm_prob_at(50, 0.3, 0.15, 100) == pytest.approx(0.225)
    assert masked_lm_prob_at(100, 0.3, 0.15, 100) == pytest.approx(0.15)
    assert masked_lm_prob_at(400, 0.3, 0.15, 100) == pytest.approx(0.15)
    assert masked_lm_prob_at(7, 0.2, None, 100) == 0.2
    with pytest.raises(ValueError):
        masked_lm_prob_at(0, 0.2, 0.1, 0)


class FakeWorkload:
    """Batches named (epoch, index), epochs of the given sizes."""

    def __init__(self, sizes):
        self.sizes = sizes

    def batches(self, epoch, start):
        return ((epoch, k) for k in range(start, self.sizes[epoch % len(self.sizes)]))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4), k=st.integers(1, 4),
       ramp=st.integers(0, 6), resume_after=st.integers(0, 12))
def test_batch_steps_follow_the_training_loops_grouping(sizes, k, ramp, resume_after):
    from minibert.training import TrainingConfig, TrainState, step_batches
    cfg = TrainingConfig(max_steps=30, lr=0.0, gradient_accumulation_steps=k,
                         batch_size_ramp_steps=ramp)
    work = FakeWorkload(sizes)
    state = TrainState()
    loop = []                                 # (epoch, index, step) as the loop groups them
    positions = {0: (0, 0)}                   # after s steps: the next batch's position
    for step, micro in zip(range(25), step_batches(work, cfg, state)):
        loop += [(e, i, step) for e, i in micro]
        positions[step + 1] = (state.epoch, state.batch_in_epoch)
    start = min(resume_after, 24)
    expected = [x for x in loop if x[2] >= start]
    epoch, batch = positions[start]
    counter = BatchSteps(start, epoch, batch, k, ramp)
    ours = []
    while len(ours) < len(expected):
        counter.start_epoch(epoch, batch)
        ours += [(e, i, counter.next_batch()) for e, i in work.batches(epoch, batch)]
        counter.end_epoch()
        epoch, batch = epoch + 1, 0
    assert ours[:len(expected)] == expected
    with pytest.raises(ValueError, match="schedule"):
        counter.start_epoch(epoch + 1, 0)


def test_a_scheduled_epoch_masks_each_batch_at_its_rate_and_resumes(corpus):
    store, vi, _ = corpus
    rates = [0.4, 0.35, 0.3, 0.25, 0.2, 0.15]
    kw = dict(batch_size=4, max_seq_length=32, epoch=2, seed=9, shuffle_buffer=30,
              objective="mlm+nsp", max_predictions_per_seq=13)
    asked = []
    sched = list(itertools.islice(iterate_batches(
        store, vi, batch_masked_lm_prob=lambda k: asked.append(k) or rates[k % 6], **kw), 12))
    plain = list(itertools.islice(iterate_batches(store, vi, **kw), 12))
    assert asked == list(range(12))
    for k, (a, b) in enumerate(zip(sched, plain)):
        assert a.masked_lm_prob == rates[k % 6] and b.masked_lm_prob is None
        # the same sequences, in the same order; only the masks differ
        np.testing.assert_array_equal(unmasked(a), unmasked(b))
        lengths = a.attention_mask.sum(1)
        want = np.minimum(13, np.maximum(1, [round(L * rates[k % 6]) for L in lengths]))
        np.testing.assert_array_equal(a.masked_lm_weights.sum(1), want)
    resumed = list(itertools.islice(iterate_batches(
        store, vi, start_batch=5, batch_masked_lm_prob=lambda k: rates[k % 6], **kw), 7))
    for a, b in zip(resumed, sched[5:]):
        for name in ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_the_default_max_predictions_covers_the_larger_rate():
    from minibert.pretraining import PretrainingConfig
    assert PretrainingConfig(masked_lm_prob=0.3, masked_lm_prob_end=0.15).with_defaults() \
        .max_predictions_per_seq == 10                   # ceil(32 * 0.3)
    assert PretrainingConfig(masked_lm_prob=0.1, masked_lm_prob_end=0.4).with_defaults() \
        .max_predictions_per_seq == 13                   # ceil(32 * 0.4)
    assert PretrainingConfig().with_defaults().max_predictions_per_seq == 5


# ------------------------------------------------------------------ line by line


def lines_of(batch):
    """(first token id, tokens) of the line in each row: no row may hold two lines."""
    out = []
    for row in unmasked(batch):
        L = int((row != PAD).sum())
        assert row[0] == CLS and row[L - 1] == SEP and not np.isin(row[1:L - 1], [CLS, SEP]).any()
        body = row[1:L - 1]
        np.testing.assert_array_equal(np.diff(body), 1)  # consecutive ids: one line
        out.append((int(body[0]), len(body)))
    return out


def expected_lines(docs, T, first_id=10):
    """(first token id, tokens kept) of every line of the corpus, truncated to T - 2."""
    out, nxt = [], first_id
    for doc in docs:
        for n in doc:
            out.append((nxt, min(int(n), T - 2)))
            nxt += int(n)
    return sorted(out)


@pytest.mark.parametrize("T", [8, 16, 48])
def test_line_by_line_holds_each_line_once_per_epoch_in_its_own_row(corpus, T):
    store, vi, docs = corpus
    for epoch in (0, 1):
        batches = list(iterate_batches(store, vi, 8, T, epoch=epoch, seed=4, objective="mlm",
                                       line_by_line=True, drop_last=False))
        got = sorted(x for b in batches for x in lines_of(b))
        assert got == expected_lines(docs, T)
        for b in batches:
            Tb = b.input_ids.shape[1]
            assert Tb <= T and Tb == b.attention_mask.sum(1).max()     # its longest line
            assert b.masked_lm_positions.shape[1] == max(1, b.masked_lm_weights.sum(1).max())
            assert b.next_sentence_label is None
    first = [lines_of(b) for b in iterate_batches(store, vi, 8, T, epoch=0, seed=4,
                                                 objective="mlm", line_by_line=True)]
    other = [lines_of(b) for b in iterate_batches(store, vi, 8, T, epoch=1, seed=4,
                                                 objective="mlm", line_by_line=True)]
    assert first != other                                # a new order every epoch


def test_line_by_line_pads_less_than_one_line_per_batch_in_random_order(corpus):
    store, vi, docs = corpus
    T = 48
    batches = list(iterate_batches(store, vi, 8, T, epoch=0, seed=4, objective="mlm",
                                   line_by_line=True, drop_last=False))
    grouped = sum(b.attention_mask.size - b.attention_mask.sum() for b in batches)
    lengths = np.array([n + 2 for _, n in expected_lines(docs, T)])
    real = lengths.sum()
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(lengths)
    naive = sum(len(c) * c.max() for c in np.array_split(shuffled, np.arange(8, len(lengths), 8)))
    assert grouped / (grouped + real) < 0.5 * (naive - real) / naive
    assert grouped / (grouped + real) < (len(lengths) * T - real) / (len(lengths) * T)


def test_line_by_line_resumes_at_any_batch_and_refuses_sentence_pairs(corpus):
    store, vi, _ = corpus
    kw = dict(batch_size=4, max_seq_length=24, epoch=3, seed=7, objective="electra",
              line_by_line=True, masked_lm_prob=0.3)
    full = list(iterate_batches(store, vi, **kw))
    for start in (0, 3, len(full) - 1):
        for a, b in zip(iterate_batches(store, vi, start_batch=start, **kw), full[start:]):
            for name in ("input_ids", "attention_mask", "masked_lm_positions", "masked_lm_ids"):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    with pytest.raises(ValueError, match="line_by_line"):
        next(iterate_batches(store, vi, 4, 24, epoch=0, seed=0, objective="mlm+nsp",
                             line_by_line=True))


def test_line_by_line_eval_batches_are_fixed_and_capped(corpus):
    store, vi, docs = corpus
    a = make_eval_batches(store, vi, 8, 32, seed=1, objective="mlm", max_instances=40,
                          line_by_line=True)
    b = make_eval_batches(store, vi, 8, 32, seed=1, objective="mlm", max_instances=40,
                          line_by_line=True)
    assert sum(len(x.input_ids) for x in a) == 40
    assert sorted(x for bb in a for x in lines_of(bb)) == expected_lines(docs, 32)[:40]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.input_ids, y.input_ids)
