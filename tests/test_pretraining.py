"""Tests for minibert.pretraining: corpus errors, token store, NSP pairs, masking, batches.

The objectives other than NSP (SOP, RoBERTa full sentences) are tested in test_objectives.py.
"""

from __future__ import annotations

import collections
import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minibert.pretraining import (
    IGNORE_INDEX,
    CorpusError,
    VocabInfo,
    build_or_load_store,
    build_store,
    collate,
    count_instances,
    create_instances_from_document,
    create_masked_lm_predictions,
    default_max_predictions,
    iter_documents,
    iterate_batches,
    iterate_instances,
    load_store,
    make_eval_batches,
    resolve_corpus_files,
    save_store,
    split_documents,
    token_counts,
    truncate_seq_pair,
    unigram_cross_entropy,
)
from helpers import position_store, unmasked, word_vocab
from minibert.objectives import get_objective
from minibert.pretraining.batches import Instance

VOCAB_FILE = Path(__file__).resolve().parent / "data" / "tokenization" / "bert-base-uncased-vocab.txt"

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(5)


class StandInTokenizer:
    """A tiny whitespace + greedy longest-match WordPiece tokenizer for tests."""

    def __init__(self, words):
        self.vocab = {t: i for i, t in enumerate(SPECIALS + list(words))}
        self.ids_to_tokens = {i: t for t, i in self.vocab.items()}
        self.calls = 0

    def tokenize(self, text):
        self.calls += 1
        out = []
        for word in text.lower().split():
            start, pieces = 0, []
            while start < len(word):
                end = len(word)
                while end > start:
                    piece = word[start:end] if start == 0 else "##" + word[start:end]
                    if piece in self.vocab:
                        break
                    end -= 1
                if end == start:
                    pieces = ["[UNK]"]
                    break
                pieces.append(piece)
                start = end
            out.extend(pieces)
        return out

    def convert_tokens_to_ids(self, tokens):
        return [self.vocab.get(t, self.vocab["[UNK]"]) for t in tokens]


WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "play", "##ing", "##ed", "un", "##do", "a", "."]


@pytest.fixture
def tok():
    return StandInTokenizer(WORDS)


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode("utf-8")
    path.write_bytes(text)
    return path


def random_position_store(rng, n_docs=40, max_sents=12, min_len=1, max_len=12):
    return position_store(
        [list(rng.integers(min_len, max_len + 1, size=int(rng.integers(1, max_sents + 1)))) for _ in range(n_docs)]
    )


def doc_of_token(store, ids):
    """Underlying document index of each (position-encoded) token id."""
    tok_pos = np.asarray(ids) - store.tokens[0]
    sent = np.searchsorted(store.sentence_offsets, tok_pos, side="right") - 1
    return np.searchsorted(store.document_offsets, sent, side="right") - 1


def dense_labels(batch):
    """(B, T) original id at predicted positions, IGNORE_INDEX elsewhere."""
    labels = np.full(batch.input_ids.shape, IGNORE_INDEX)
    rows, slots = np.nonzero(batch.masked_lm_weights > 0)
    labels[rows, batch.masked_lm_positions[rows, slots]] = batch.masked_lm_ids[rows, slots]
    return labels


# ------------------------------------------------------------------ reading errors


def test_missing_file_is_named(tmp_path):
    with pytest.raises(CorpusError, match="not found.*nope.txt"):
        resolve_corpus_files([tmp_path / "nope.txt"])


def test_empty_corpus(tmp_path, tok):
    f = write(tmp_path / "empty.txt", "")
    with pytest.raises(CorpusError, match="empty.*empty.txt"):
        build_store([f], tok, show_progress=False)
    g = write(tmp_path / "blank.txt", "\n\n  \n")
    with pytest.raises(CorpusError, match="empty"):
        build_store([g], tok, show_progress=False)


def test_no_document_break(tmp_path, tok):
    f = write(tmp_path / "one.txt", "the cat sat .\nthe dog ran .\na mat .\n")
    with pytest.raises(CorpusError, match=r"1 document.*blank line") as e:
        build_store([f], tok, show_progress=False, min_documents=2)
    assert "one.txt" in str(e.value)
    assert isinstance(e.value, ValueError)
    assert build_store([f], tok, show_progress=False).num_documents == 1  # enough for MLM / SOP
    with pytest.raises(CorpusError, match=r"1 document"):
        build_or_load_store([f], tok, tmp_path / "cache", show_progress=False, min_documents=2)
    build_or_load_store([f], tok, tmp_path / "cache", show_progress=False)  # cached for 1 ...
    with pytest.raises(CorpusError, match=r"1 document"):  # ... and still refused for 2
        build_or_load_store([f], tok, tmp_path / "cache", show_progress=False, min_documents=2)


def test_bad_utf8_names_file_and_line(tmp_path, tok):
    f = write(tmp_path / "bad.txt", b"the cat .\n\nthe dog .\nplay\xff\xfeing\n")
    with pytest.raises(CorpusError, match=r"bad\.txt:4: not valid UTF-8"):
        build_store([f], tok, show_progress=False)


def test_directory_expansion_sorted_and_empty_dir(tmp_path):
    write(tmp_path / "d" / "b.txt", "x\n")
    write(tmp_path / "d" / "a.txt", "x\n")
    write(tmp_path / "d" / "c.md", "x\n")
    one = write(tmp_path / "z.txt", "x\n")
    files = resolve_corpus_files([one, tmp_path / "d"])
    assert [f.name for f in files] == ["z.txt", "a.txt", "b.txt"]
    (tmp_path / "e").mkdir()
    with pytest.raises(CorpusError, match="no \\*.txt"):
        resolve_corpus_files(tmp_path / "e")


# ------------------------------------------------------------------ the store


def test_iter_documents_format(tmp_path):
    f = write(tmp_path / "a.txt", "\ufeffone two\r\n  three \r\n\r\n\r\nfour\n\nfive\nsix")
    g = write(tmp_path / "b.txt", "seven\n")
    assert list(iter_documents([f, g])) == [["one two", "three"], ["four"], ["five", "six"], ["seven"]]


def test_build_store_structure(tmp_path, tok):
    text = "the cat sat .\nplaying undo\n\n\nthe dog ran\n???\na mat\n\n!!!\n\nthe end"
    f = write(tmp_path / "c.txt", text)
    store = build_store([f], tok, show_progress=False)
    # "???" tokenizes to [UNK] (kept); "!!!" too. Lines whose tokenization is empty are
    # dropped: none here, so 3 + 1 + 1 + ... documents:
    docs = [[tok.convert_tokens_to_ids(tok.tokenize(s)) for s in d] for d in iter_documents([f])]
    assert store.num_documents == len(docs) == 4
    for d, want in enumerate(docs):
        assert [list(s) for s in store.document(d)] == want
    assert store.tokens.dtype == np.int32
    assert store.sentence_offsets.dtype == np.int64 and store.document_offsets.dtype == np.int64
    assert tok.vocab["##ing"] in store.tokens


def test_lines_without_tokens_are_dropped(tmp_path, tok):
    class Dropper(StandInTokenizer):
        def tokenize(self, text):
            return [] if text == "skip" else super().tokenize(text)

    t = Dropper(WORDS)
    f = write(tmp_path / "c.txt", "the cat\nskip\n\nskip\n\nthe dog\n")
    store = build_store([f], t, show_progress=False)
    assert store.num_documents == 2 and store.num_sentences == 2


def test_save_load_roundtrip_mmap(tmp_path):
    store = random_position_store(np.random.default_rng(0))
    save_store(store, tmp_path / "s")
    back = load_store(tmp_path / "s")
    assert isinstance(back.tokens, np.memmap)
    for a, b in [(store.tokens, back.tokens), (store.sentence_offsets, back.sentence_offsets),
                 (store.document_offsets, back.document_offsets)]:
        np.testing.assert_array_equal(a, b)
    # A view saves as a compact store with the same documents.
    view = store.subset([5, 1, 7])
    save_store(view, tmp_path / "v")
    vb = load_store(tmp_path / "v", mmap=False)
    assert vb.num_documents == 3
    for d in range(3):
        assert [list(s) for s in vb.document(d)] == [list(s) for s in view.document(d)]
    (tmp_path / "v" / "tokens.npy").unlink()
    with pytest.raises(CorpusError, match="tokens.npy"):
        load_store(tmp_path / "v")


def test_build_or_load_store_caches(tmp_path, tok):
    f = write(tmp_path / "c.txt", "the cat\n\nthe dog\n")
    s1 = build_or_load_store([f], tok, tmp_path / "cache", show_progress=False)
    calls = tok.calls
    s2 = build_or_load_store([f], tok, tmp_path / "cache", show_progress=False)
    assert tok.calls == calls + 1  # only the fingerprint probe, no re-tokenization
    np.testing.assert_array_equal(s1.tokens, s2.tokens)
    write(f, "the cat\n\nthe dog ran ran\n")
    s3 = build_or_load_store([f], tok, tmp_path / "cache", show_progress=False)
    assert s3.num_tokens == s1.num_tokens + 2


def test_listed_documents_are_left_out_and_the_rest_kept(tmp_path, tok):
    from minibert.pretraining.exclusion import (DocumentExclusion, document_digest,
                                                read_document_list)
    f = write(tmp_path / "c.txt", "the cat\nsat .\n\n  the dog \nran\n\nthe bird\n\nthe dog\nran\n")
    listed = write(tmp_path / "x.tsv", "# a comment\n\n"
                   f"{document_digest(['the dog', 'ran'])}\tdog story\n"
                   f"{document_digest(['not in the corpus'])}\tother\n")
    ex = DocumentExclusion.read([listed])
    assert list(iter_documents([f], exclude=ex)) == [["the cat", "sat ."], ["the bird"]]
    assert ex.left_out == {document_digest(["the dog", "ran"]): 2}     # both copies, counted once
    assert ex.describe() == (f"corpus: left out 1 of the 2 documents listed in {listed} "
                             "(2 sentences; --exclude-documents none keeps them): dog story")
    assert ex.record()["left_out"] == [{"name": "dog story", "sentences": 2,
                                        "sha256": document_digest(["the dog", "ran"])}]
    # the token store: built without it; a cached store brings back what was left out
    full = build_store([f], tok, show_progress=False)
    ex = DocumentExclusion.read([listed])
    store = build_or_load_store([f], tok, tmp_path / "cache", show_progress=False, exclude=ex)
    assert store.num_documents == full.num_documents - 2 == 2
    assert [list(store.document(1)[0])] == [list(full.document(2)[0])]
    again = DocumentExclusion.read([listed])
    calls = tok.calls
    build_or_load_store([f], tok, tmp_path / "cache", show_progress=False, exclude=again)
    assert tok.calls == calls + 1 and again.left_out == ex.left_out       # cache reused
    none = DocumentExclusion.read(["none"])
    assert build_or_load_store([f], tok, tmp_path / "cache", show_progress=False,
                               exclude=none).num_documents == 4          # other key: rebuilt
    assert none.describe() == "" and not none.left_out
    # nothing listed is in the corpus: said so
    ex = DocumentExclusion.read([write(tmp_path / "y.tsv", f"{'0' * 64}\tghost\n")])
    assert len(list(iter_documents([f], exclude=ex))) == 4
    assert "left out no document (none of the 1 listed in" in ex.describe()
    # bad lists: one line naming file and line
    with pytest.raises(CorpusError, match=r"z\.tsv:2: expected 'SHA256<TAB>NAME'"):
        read_document_list(write(tmp_path / "z.tsv", "# ok\nABC\tname\n"))
    with pytest.raises(CorpusError, match="no such file"):
        DocumentExclusion.read([tmp_path / "missing.tsv"])
    with pytest.raises(CorpusError, match="'none' leaves nothing out"):
        DocumentExclusion.read(["none", listed])


def test_shipped_exclusion_list_names_the_pos_sample_documents():
    """data/tag/en/brown_pos/pretrain_exclude.tsv: 36 Brown documents of data/pretrain/en,
    which hold every sentence of the shipped POS dev and test samples and none of train."""
    from minibert.finetuning import read_conll
    from minibert.pretraining.exclusion import DocumentExclusion
    root = Path(__file__).resolve().parents[1]
    ex = DocumentExclusion.read([root / "data/tag/en/brown_pos/pretrain_exclude.tsv"])
    files = resolve_corpus_files(root / "data/pretrain/en")
    squash = lambda s: "".join(s.replace("``", '"').replace("''", '"').split())  # noqa: E731
    kept = {squash(s) for doc in iter_documents(files, exclude=ex) for s in doc}
    assert len(ex.left_out) == len(ex.listed) == 36
    gone = {squash(s) for doc in iter_documents(files) for s in doc} - kept
    for split in ("dev", "test", "train"):
        sentences = [squash(" ".join(s.words))
                     for s in read_conll(root / f"data/tag/en/brown_pos/{split}.tsv")]
        if split == "train":
            assert not any(s in gone for s in sentences)
        else:   # every sentence is gone but a one-word or two-word one ('.', 'He asked.')
            left = [s for s in sentences if s in kept]
            assert len(left) <= 1 and all(len(s) < 10 for s in left), left
            assert all(s in gone or s in kept for s in sentences)


def test_the_log_line_names_the_first_documents_left_out_and_counts_the_rest(tmp_path):
    from minibert.pretraining.exclusion import SHOWN, DocumentExclusion, document_digest
    n = SHOWN + 3
    f = write(tmp_path / "c.txt", "".join(f"doc {i}\n\n" for i in range(n + 1)))
    listed = write(tmp_path / "x.tsv", "".join(f"{document_digest([f'doc {i}'])}\tname{i}\n"
                                               for i in range(n)))
    ex = DocumentExclusion.read([listed])
    assert list(iter_documents([f], exclude=ex)) == [[f"doc {n}"]]
    line = ex.describe()
    assert f"left out {n} of the {n} documents" in line and f"({n} sentences;" in line
    assert f"name{SHOWN - 1} and 3 more" in line and f"name{SHOWN}" not in line
    assert line.endswith("and 3 more (summary.json names them all)")
    assert [r["name"] for r in ex.record()["left_out"]] == [f"name{i}" for i in range(n)]


def test_shipped_chinese_ner_exclusion_list_reads():
    """data/tag/zh/peoples_daily_ner/pretrain_exclude.tsv (paragraphs of the shared People's
    Daily corpus, which the repository does not ship): well formed, one line per distinct
    paragraph, each named after the sample split it serves."""
    from minibert.pretraining.exclusion import DocumentExclusion, read_document_list
    path = Path(__file__).resolve().parents[1] / "data/tag/zh/peoples_daily_ner/pretrain_exclude.tsv"
    listed = read_document_list(path)
    lines = [ln for ln in path.read_text("utf-8").splitlines() if ln and not ln.startswith("#")]
    assert len(listed) == len(lines) == 149
    assert all(n.startswith("peoples_daily_199801 paragraph") and n.endswith(("(dev)", "(test)"))
               for n in listed.values())
    assert DocumentExclusion.read([path]).listed == listed


def test_split_documents():
    store = random_position_store(np.random.default_rng(1), n_docs=50)
    tr, ev = split_documents(store, eval_fraction=0.1, seed=3)
    assert ev.num_documents == 5 and tr.num_documents == 45
    assert set(tr.doc_ids).isdisjoint(ev.doc_ids) and set(tr.doc_ids) | set(ev.doc_ids) == set(range(50))
    tr2, ev2 = split_documents(store, eval_fraction=0.1, seed=3)
    np.testing.assert_array_equal(ev.doc_ids, ev2.doc_ids)
    _, ev3 = split_documents(store, eval_documents=5, seed=4)
    assert not np.array_equal(ev.doc_ids, ev3.doc_ids)
    assert tr.num_tokens + ev.num_tokens == store.num_tokens
    with pytest.raises(CorpusError, match="at least 2"):
        split_documents(position_store([[3], [4], [5]]), eval_documents=2, min_documents=2)
    with pytest.raises(CorpusError, match="at least 2"):
        split_documents(position_store([[3], [4], [5]]), eval_documents=1, min_documents=2)
    tr1, ev1 = split_documents(position_store([[3], [4], [5]]), eval_documents=2)  # min 1
    assert (tr1.num_documents, ev1.num_documents) == (1, 2)
    with pytest.raises(ValueError):
        split_documents(store, eval_fraction=0.1, eval_documents=3)


# ------------------------------------------------------------------ NSP instances


def reference_truncate_seq_pair(len_a, len_b, max_num_tokens, rng):
    """google-research/bert truncate_seq_pair, one token and one coin at a time, on lengths."""
    a0, a1, b0, b1 = 0, len_a, 0, len_b
    while (a1 - a0) + (b1 - b0) > max_num_tokens:
        front = rng.random() < 0.5
        if (a1 - a0) > (b1 - b0):
            a0, a1 = (a0 + 1, a1) if front else (a0, a1 - 1)
        else:
            b0, b1 = (b0 + 1, b1) if front else (b0, b1 - 1)
    return a0, a1, b0, b1


@settings(max_examples=300, deadline=None)
@given(la=st.integers(0, 300), lb=st.integers(0, 300), m=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_truncate_seq_pair_matches_the_reference_loop(la, lb, m, seed):
    fast, slow = np.random.default_rng(seed), np.random.default_rng(seed)
    assert truncate_seq_pair(la, lb, m, fast) == reference_truncate_seq_pair(la, lb, m, slow)
    # The generator is left where k single draws would leave it.
    assert fast.bit_generator.state == slow.bit_generator.state
    assert fast.random() == slow.random()


@settings(max_examples=50, deadline=None)
@given(k=st.integers(0, 200), seed=st.integers(0, 2**32 - 1))
def test_one_vector_draw_equals_scalar_draws(k, seed):
    # What the vectorised truncate_seq_pair relies on: NumPy's Generator.random(k) gives the
    # values, and leaves the state, of k calls of Generator.random().
    one, many = np.random.default_rng(seed), np.random.default_rng(seed)
    np.testing.assert_array_equal(one.random(k), [many.random() for _ in range(k)])
    assert one.bit_generator.state == many.bit_generator.state


@settings(max_examples=200, deadline=None)
@given(la=st.integers(1, 60), lb=st.integers(1, 60), m=st.integers(2, 60), seed=st.integers(0, 2**32 - 1))
def test_truncate_seq_pair(la, lb, m, seed):
    a0, a1, b0, b1 = truncate_seq_pair(la, lb, m, np.random.default_rng(seed))
    na, nb = a1 - a0, b1 - b0
    assert 0 <= a0 <= a1 <= la and 0 <= b0 <= b1 <= lb
    assert na + nb == min(la + lb, m)
    assert na >= 1 and nb >= 1
    # Lengths are deterministic: one token at a time comes off the longer side (B on a tie);
    # only front vs back is random.
    ea, eb = la, lb
    while ea + eb > m:
        if ea > eb:
            ea -= 1
        else:
            eb -= 1
    assert (na, nb) == (ea, eb)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), max_seq_length=st.integers(5, 40), short=st.sampled_from([0.0, 0.1, 1.0]))
def test_instances_structure_and_nsp_provenance(seed, max_seq_length, short):
    rng = np.random.default_rng(seed)
    store = random_position_store(rng, n_docs=8)
    produced = 0
    for d in range(store.num_documents):
        for ids, types, label in create_instances_from_document(store, d, max_seq_length, short, rng, CLS, SEP):
            produced += 1
            L = len(ids)
            assert L <= max_seq_length
            seps = np.flatnonzero(ids == SEP)
            assert ids[0] == CLS and len(seps) == 2 and seps[1] == L - 1
            a, b = ids[1 : seps[0]], ids[seps[0] + 1 : L - 1]
            assert len(a) >= 1 and len(b) >= 1
            np.testing.assert_array_equal(types, np.r_[np.zeros(len(a) + 2), np.ones(len(b) + 1)])
            # A and B are each one contiguous run of the corpus (truncation only trims ends).
            assert np.all(np.diff(a) == 1) and np.all(np.diff(b) == 1)
            assert set(doc_of_token(store, a)) == {d}
            db = set(doc_of_token(store, b))
            assert len(db) == 1
            if label == 0:  # IsNext: B comes after A in the same document
                assert db == {d} and b[0] > a[-1]
            else:
                assert db != {d}
    assert produced > 0, "no instance from any document: the checks above ran on nothing"


def test_nsp_is_about_half_random():
    rng = np.random.default_rng(0)
    store = random_position_store(rng, n_docs=800, max_sents=20, min_len=3, max_len=8)
    labels = [lab for d in range(store.num_documents)
              for _, _, lab in create_instances_from_document(store, d, 64, 0.1, rng, CLS, SEP)]
    # Slightly above 1/2: chunks of a single sentence always take a random B, as in the reference.
    assert len(labels) > 1000
    assert 0.47 < np.mean(labels) < 0.6


def test_random_next_puts_back_unused_sentences():
    # With sequences too long to ever truncate, the A segments and the IsNext B segments of
    # a document partition its tokens: when B is random, the chunk's unused sentences are
    # put back and start the next chunk instead of being lost (reference behaviour).
    rng = np.random.default_rng(5)
    store = random_position_store(rng, n_docs=40, max_sents=20, min_len=1, max_len=3)
    n_random = 0
    for d in range(store.num_documents):
        used = []
        for ids, _, lab in create_instances_from_document(store, d, 1000, 1.0, rng, CLS, SEP):
            sep = int(np.flatnonzero(ids == SEP)[0])
            used.extend(ids[1:sep].tolist())
            if lab == 0:
                used.extend(ids[sep + 1 : -1].tolist())
            n_random += lab
        t0, t1 = store.token_range(d)
        assert sorted(used) == store.tokens[t0:t1].tolist()
    assert n_random > 20


def test_nsp_pairs_pinned():
    # The pairs of the single-module implementation (before the objectives were split out),
    # pinned. Store: doc 0 = sentences 10-12 | 13-14 | 15-18 | 19; doc 1 = 20-21 | 22-26;
    # doc 2 = 27-28 | 29-30 | 31-32 | 33-35. max_seq_length 10: target 7 tokens, no short
    # targets. Doc 0, generator seed 0: the first chunk is 3 sentences (9 >= 7 tokens); A =
    # its first 2 (10-14); B is random: doc 2 from sentence 31-32, until 7 - 5 = 2 tokens;
    # the chunk's third sentence goes back and starts the next chunk, 15-18 | 19 (document
    # end): A = 15-18, B = 19, IsNext. Doc 2: A = 27-28, B = 29-35 trimmed by 2 (B is longer:
    # it loses both, here 29 at the front and 35 at the back).
    store = position_store([[3, 2, 4, 1], [2, 5], [2, 2, 2, 3]])
    want = {
        0: [([2, 10, 11, 12, 13, 14, 3, 31, 32, 3], [0] * 7 + [1] * 3, 1),
            ([2, 15, 16, 17, 18, 3, 19, 3], [0] * 6 + [1] * 2, 0)],
        1: [([2, 20, 21, 3, 22, 23, 24, 25, 26, 3], [0] * 4 + [1] * 6, 0)],
        2: [([2, 27, 28, 3, 30, 31, 32, 33, 34, 3], [0] * 4 + [1] * 6, 0)],
    }
    for d, pairs in want.items():
        got = create_instances_from_document(store, d, 10, 0.0, np.random.default_rng(d), 2, 3)
        assert [(ids.tolist(), types.tolist(), lab) for ids, types, lab in got] == pairs
        assert all(ids.dtype == np.int32 and types.dtype == np.int8 for ids, types, _ in got)


def test_nsp_epoch_pinned():
    # A whole masked epoch (pairs, masks, shuffle) hashed; the digest was computed with the
    # single-module implementation, so the split changed no instance for the same seed.
    store = random_position_store(np.random.default_rng(42), n_docs=60, max_sents=15, max_len=14)
    h = hashlib.sha256()
    for x in iterate_instances(store, word_vocab(store.num_tokens + 20), 32, 3, 7,
                               max_predictions_per_seq=20, shuffle_buffer=50):
        for a in (x.input_ids, x.token_type_ids, x.masked_lm_positions, x.masked_lm_labels):
            h.update(np.asarray(a, np.int64).tobytes())
        h.update(bytes([x.sentence_label]))
    assert h.hexdigest() == "0f209853cdd5023d6cf53163fe8e59edbc1e40152bb8fb8908aff1d6febed5a9"


class CountingRng:
    """Wraps a numpy Generator and counts the calls made to it."""

    def __init__(self, seed):
        self._rng = np.random.default_rng(seed)
        self.calls = 0

    def __getattr__(self, name):
        method = getattr(self._rng, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return method(*args, **kwargs)

        return counted


@pytest.mark.parametrize("objective", ["mlm+nsp", "mlm+sop"])
def test_rng_calls_per_document_do_not_grow_with_sentence_length(objective):
    # A one-line document of n tokens (plus a short second document for random B): the
    # number of generator calls to cut it into pairs must not depend on n (the reference
    # draws one coin per truncated token).
    obj = get_objective(objective)
    calls = {}
    for n in (50, 5_000, 500_000):
        store = position_store([[n], [3, 4]])
        rngs = [CountingRng(seed) for seed in range(20)]
        for r in rngs:
            pairs = obj.document_pairs(store, 0, 32, 0.1, r, CLS, SEP)
            assert len(pairs) == 1 and len(pairs[0][0]) == 32
        calls[n] = [r.calls for r in rngs]
    assert calls[50] == calls[5_000] == calls[500_000]


# ------------------------------------------------------------------ masking


@settings(max_examples=200, deadline=None)
@given(L=st.integers(3, 128), prob=st.sampled_from([0.05, 0.15, 0.5]), max_pred=st.integers(1, 30),
       seed=st.integers(0, 2**32 - 1), wwm=st.booleans())
def test_masking_positions_and_counts(L, prob, max_pred, seed, wwm):
    vi = word_vocab(5000)
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vi.vocab_size, size=L)
    ids[0] = CLS
    ids[rng.integers(1, L)] = SEP
    ids[-1] = SEP
    before = ids.copy()
    out, pos, labels = create_masked_lm_predictions(ids, vi, prob, max_pred, rng, whole_word_mask=wwm)
    np.testing.assert_array_equal(ids, before)  # input not mutated
    n_cand = int(np.sum((ids != CLS) & (ids != SEP)))
    want = min(max_pred, max(1, int(round(L * prob))))
    assert len(pos) == min(want, n_cand)  # no ## pieces in this vocab: groups are single tokens
    assert np.all(np.diff(pos) > 0)
    assert not np.isin(ids[pos], [CLS, SEP, PAD]).any()
    np.testing.assert_array_equal(labels, ids[pos])
    rest = np.setdiff1d(np.arange(L), pos)
    np.testing.assert_array_equal(out[rest], ids[rest])
    assert out.dtype == np.int32 and pos.dtype == np.int32 and labels.dtype == np.int32


def test_mask_keep_random_proportions():
    vi = word_vocab(20000)
    rng = np.random.default_rng(0)
    n_mask = n_keep = n_rand = 0
    specials_seen = 0
    for _ in range(1500):
        ids = np.r_[CLS, rng.integers(5, vi.vocab_size, size=126), SEP].astype(np.int64)
        out, pos, labels = create_masked_lm_predictions(ids, vi, 0.15, 20, rng)
        new = out[pos]
        n_mask += int(np.sum(new == MASK))
        n_keep += int(np.sum(new == labels))
        r = (new != MASK) & (new != labels)
        n_rand += int(np.sum(r))
        specials_seen += int(np.sum(new[r] < 5))
    total = n_mask + n_keep + n_rand
    assert total == 1500 * 19  # round(128 * 0.15) = 19
    # sd of each share is <= 0.003 on 28500 draws; 0.015 is 5 sd.
    assert abs(n_mask / total - 0.8) < 0.015
    assert abs(n_keep / total - 0.1) < 0.015
    assert abs(n_rand / total - 0.1) < 0.015
    assert specials_seen == 0


def test_random_replacements_cover_exactly_the_allowed_ids():
    vocab = {t: i for i, t in enumerate(SPECIALS + ["a", "b", "c", "d", "e"])}
    for exclude, allowed in ((True, set(range(5, 10))), (False, set(range(10)))):
        vi = VocabInfo.from_vocab(vocab, exclude_special_from_random=exclude)
        rng = np.random.default_rng(0)
        seen = collections.Counter()
        ids = np.array([CLS] + [5] * 18 + [SEP])
        for _ in range(2000):
            out, pos, _ = create_masked_lm_predictions(ids, vi, 0.15, 20, rng)
            new = out[pos]
            seen.update(new[(new != MASK) & (new != 5)].tolist())
        # The "random" draws that differ from the original (id 5) are every other allowed id.
        # ([MASK] drawn as a "random" token is indistinguishable from the 80% case: left out.)
        assert set(seen) == allowed - {5, MASK}


def test_whole_word_masking_masks_every_piece():
    tok = StandInTokenizer(WORDS)
    vi = VocabInfo.from_tokenizer(tok)
    rng = np.random.default_rng(0)
    words = ["playing", "played", "undo", "the", "cat", "undoing"]
    saw_partial_word = False
    for trial in range(300):
        sent = " ".join(rng.choice(words, size=12))
        pieces = tok.tokenize(sent)
        ids = np.array([CLS] + tok.convert_tokens_to_ids(pieces) + [SEP])
        # word index of every position (CLS/SEP: -1)
        word_of, w = [-1], -1
        for p in pieces:
            if not p.startswith("##"):
                w += 1
            word_of.append(w)
        word_of = np.array(word_of + [-1])
        for wwm in (True, False):
            _, pos, _ = create_masked_lm_predictions(ids, vi, 0.15, 20, rng, whole_word_mask=wwm)
            masked = np.zeros(len(ids), bool)
            masked[pos] = True
            complete = all(masked[word_of == word_of[p]].all() for p in pos)
            if wwm:
                assert complete
                assert len(pos) <= min(20, max(1, round(len(ids) * 0.15)))
            elif not complete:
                saw_partial_word = True
    assert saw_partial_word  # without whole-word masking, pieces are masked independently


def test_whole_word_group_does_not_cross_sep():
    tok = StandInTokenizer(WORDS)
    vi = VocabInfo.from_tokenizer(tok)
    # [CLS] play [SEP] ##ing [SEP]: num_to_predict = max(1, round(5 * 0.15)) = 1. If ##ing joined
    # "play" across the [SEP] the only group would have 2 pieces and be skipped (nothing masked).
    ids = np.array([CLS, tok.vocab["play"], SEP, tok.vocab["##ing"], SEP])
    for seed in range(20):
        _, pos, _ = create_masked_lm_predictions(ids, vi, 0.15, 20, np.random.default_rng(seed), whole_word_mask=True)
        assert len(pos) == 1 and pos[0] in (1, 3)
    # Inside a segment the word is one group: 2 pieces > 1 prediction, so it is skipped.
    ids = np.array([CLS, tok.vocab["play"], tok.vocab["##ing"], SEP, SEP])
    _, pos, _ = create_masked_lm_predictions(ids, vi, 0.15, 20, np.random.default_rng(0), whole_word_mask=True)
    assert len(pos) == 0


def test_short_seq_prob_shortens_targets():
    rng = np.random.default_rng(0)
    store = position_store([list(rng.integers(2, 7, size=60)) for _ in range(60)])  # ~240 tokens each

    def lengths(p):
        r = np.random.default_rng(1)
        return np.array([len(ids) for d in range(store.num_documents)
                         for ids, _, _ in create_instances_from_document(store, d, 64, p, r, CLS, SEP)])

    full, short = lengths(0.0), lengths(1.0)
    assert np.mean(full < 32) < 0.2  # mostly full sequences (a few document ends)
    assert np.mean(short < 32) > 0.4  # target uniform in [2, 61]
    assert short.min() <= 8


def test_vocab_info_real_vocab():
    lines = VOCAB_FILE.read_text(encoding="utf-8").split("\n")
    vocab = {t: i for i, t in enumerate(lines[:-1] if lines[-1] == "" else lines)}
    vi = VocabInfo.from_vocab(vocab)
    assert (vi.vocab_size, vi.pad_id, vi.unk_id, vi.cls_id, vi.sep_id, vi.mask_id) == (30522, 0, 100, 101, 102, 103)
    assert not np.isin([0, 100, 101, 102, 103], vi.random_ids).any()
    assert len(vi.random_ids) == 30522 - 5
    assert vi.is_continuation[vocab["##ing"]] and not vi.is_continuation[vocab["the"]]
    full = VocabInfo.from_vocab(vocab, exclude_special_from_random=False)
    assert len(full.random_ids) == 30522
    with pytest.raises(ValueError, match="MASK"):
        VocabInfo.from_vocab({t: i for t, i in vocab.items() if t != "[MASK]"})


# ------------------------------------------------------------------ epochs and batches


@pytest.fixture(scope="module")
def corpus():
    store = random_position_store(np.random.default_rng(42), n_docs=60, max_sents=15, max_len=14)
    return store, word_vocab(store.num_tokens + 20)


def test_batches_shapes_and_invariants(corpus):
    store, vi = corpus
    T = 32
    P = 5  # default_max_predictions(32, 0.15) = ceil(4.8)
    batches = list(iterate_batches(store, vi, 8, T, epoch=0, seed=1, whole_word_mask=False, short_seq_prob=0.5))
    assert len(batches) > 10
    for b in batches:
        for a in (b.input_ids, b.token_type_ids, b.attention_mask):
            assert a.shape == (8, T) and a.dtype == np.int64
        for a in (b.masked_lm_positions, b.masked_lm_ids):
            assert a.shape == (8, P) and a.dtype == np.int64
        assert b.masked_lm_weights.shape == (8, P) and b.masked_lm_weights.dtype == np.float32
        assert b.next_sentence_label.shape == (8,) and b.next_sentence_label.dtype == np.int64
        real = b.attention_mask == 1
        assert np.all(b.input_ids[~real] == PAD) and np.all(b.token_type_ids[~real] == 0)
        # padding is a suffix, in the token rows and in the prediction slots
        assert np.all(np.diff(b.attention_mask, axis=1) <= 0)
        assert np.all(np.diff(b.masked_lm_weights, axis=1) <= 0)
        assert set(np.unique(b.masked_lm_weights)) <= {0.0, 1.0}
        slot = b.masked_lm_weights > 0
        assert np.all(b.masked_lm_positions[~slot] == 0) and np.all(b.masked_lm_ids[~slot] == 0)
        # weights count the real predictions: round(L * 0.15), at least 1, at most P, per row
        lengths = b.attention_mask.sum(1)
        want = np.minimum(P, np.maximum(1, [round(L * 0.15) for L in lengths]))
        np.testing.assert_array_equal(b.masked_lm_weights.sum(1), want)
        rows = np.repeat(np.arange(8), P).reshape(8, P)
        pos = b.masked_lm_positions
        assert np.all(real[rows[slot], pos[slot]])  # predicted positions are real tokens ...
        assert np.all(np.diff(np.where(slot, pos, T + np.arange(P)), axis=1) > 0)  # ... increasing
        assert not np.isin(b.masked_lm_ids[slot], [CLS, SEP, PAD]).any()
        np.testing.assert_array_equal(unmasked(b)[rows[slot], pos[slot]], b.masked_lm_ids[slot])
        assert set(np.unique(b.next_sentence_label)) <= {0, 1}
    n = count_instances(store, T, epoch=0, seed=1, short_seq_prob=0.5)
    assert len(batches) == n // 8


def test_same_arguments_same_batches_and_resume(corpus):
    store, vi = corpus
    kw = dict(batch_size=4, max_seq_length=24, epoch=3, seed=7, shuffle_buffer=50)
    full = list(iterate_batches(store, vi, **kw))
    again = list(iterate_batches(store, vi, **kw))
    tail = list(iterate_batches(store, vi, start_batch=9, **kw))
    assert len(tail) == len(full) - 9
    for x, y in zip(full, again):
        np.testing.assert_array_equal(x.input_ids, y.input_ids)
        np.testing.assert_array_equal(x.masked_lm_ids, y.masked_lm_ids)
    for x, y in zip(full[9:], tail):
        assert x.model_inputs().keys() == y.model_inputs().keys()
        for f, a in x.model_inputs().items():
            np.testing.assert_array_equal(a, y.model_inputs()[f])
    # Batches are the instance stream cut into groups, from its very first instance.
    insts = list(iterate_instances(store, vi, 24, 3, 7, shuffle_buffer=50))
    assert len(full) == len(insts) // 4
    np.testing.assert_array_equal(full[0].input_ids[0, : len(insts[0].input_ids)], insts[0].input_ids)
    np.testing.assert_array_equal(full[-1].input_ids[-1, : len(insts[len(full) * 4 - 1].input_ids)],
                                  insts[len(full) * 4 - 1].input_ids)
    other_seed = next(iterate_batches(store, vi, **{**kw, "seed": 8}))
    assert not np.array_equal(full[0].input_ids, other_seed.input_ids)


def _instances_by_content(store, vi, epoch, **kw):
    """Map unmasked (ids) -> masked ids of every instance of an epoch."""
    out = {}
    for inst in iterate_instances(store, vi, 32, epoch, seed=3, **kw):
        orig = inst.input_ids.copy()
        orig[inst.masked_lm_positions] = inst.masked_lm_labels
        out[orig.tobytes()] = inst.input_ids.tobytes()
    return out


def test_dynamic_masking_changes_masks_each_epoch(corpus):
    store, vi = corpus
    e0 = _instances_by_content(store, vi, 0, masking="dynamic", dupe_factor=1)
    e1 = _instances_by_content(store, vi, 1, masking="dynamic", dupe_factor=1)
    assert e0.keys() == e1.keys()  # same pairs (dupe_factor=1) ...
    changed = np.mean([e0[k] != e1[k] for k in e0])
    assert changed > 0.9  # ... with fresh masks


def test_static_masking_cycles_dupe_factor(corpus):
    store, vi = corpus
    e0 = _instances_by_content(store, vi, 0, masking="static", dupe_factor=2)
    e1 = _instances_by_content(store, vi, 1, masking="static", dupe_factor=2)
    e2 = _instances_by_content(store, vi, 2, masking="static", dupe_factor=2)
    assert e0 == e2  # epoch 2 replays copy 0: same pairs, same masks
    assert e0 != e1
    order0 = [i.input_ids.tobytes() for i in iterate_instances(store, vi, 32, 0, 3, masking="static", dupe_factor=2)]
    order2 = [i.input_ids.tobytes() for i in iterate_instances(store, vi, 32, 2, 3, masking="static", dupe_factor=2)]
    assert order0 != order2 and sorted(order0) == sorted(order2)  # reshuffled each epoch


def test_epoch_covers_every_document_once_per_pass(corpus):
    store, vi = corpus
    docs = collections.Counter(i.document for i in iterate_instances(store, vi, 32, 0, 0, shuffle_buffer=7))
    assert set(docs) == set(range(store.num_documents))
    n = sum(docs.values())
    assert n == count_instances(store, 32, 0, 0)


def test_shuffle_buffer_of_one_keeps_documents_together(corpus):
    store, vi = corpus
    docs = [i.document for i in iterate_instances(store, vi, 32, 0, 0, shuffle_buffer=1)]
    runs = [d for k, d in enumerate(docs) if k == 0 or docs[k - 1] != d]
    assert len(runs) == store.num_documents  # each document's instances come out contiguously


def test_collate_fixed_shapes_and_errors():
    def inst(L, n, label):
        return Instance(np.arange(L, dtype=np.int32), np.zeros(L, np.int8),
                        np.arange(1, n + 1, dtype=np.int32), np.full(n, 7, np.int32), label)

    b = collate([inst(3, 1, 0), inst(6, 2, 1)], max_seq_length=8, max_predictions_per_seq=4, pad_id=PAD)
    assert b.input_ids.shape == (2, 8) and b.masked_lm_ids.shape == (2, 4)
    np.testing.assert_array_equal(b.masked_lm_weights, [[1, 0, 0, 0], [1, 1, 0, 0]])
    np.testing.assert_array_equal(b.masked_lm_positions, [[1, 0, 0, 0], [1, 2, 0, 0]])
    np.testing.assert_array_equal(b.masked_lm_ids, [[7, 0, 0, 0], [7, 7, 0, 0]])
    np.testing.assert_array_equal(b.next_sentence_label, [0, 1])
    assert list(b.model_inputs()) == ["input_ids", "token_type_ids", "attention_mask", "masked_lm_positions",
                                      "masked_lm_ids", "masked_lm_weights", "next_sentence_label"]
    nolabel = collate([inst(3, 1, None)], 8, 4, PAD)
    assert nolabel.next_sentence_label is None and "next_sentence_label" not in nolabel.model_inputs()
    with pytest.raises(ValueError, match="with and without"):
        collate([inst(3, 1, None), inst(3, 1, 0)], 8, 4, PAD)
    with pytest.raises(ValueError, match="9 tokens"):
        collate([inst(9, 1, 0)], 8, 4, PAD)
    with pytest.raises(ValueError, match="5 predictions"):
        collate([inst(8, 5, 0)], 8, 4, PAD)
    with pytest.raises(ValueError, match="empty"):
        collate([], 8, 4, PAD)


def test_masked_lm_prob_04(corpus):
    # Wettig et al. 2023 mask 40%: with the default P = ceil(T * 0.4) no row is capped.
    store, vi = corpus
    T = 32
    P = default_max_predictions(T, 0.4)
    assert P == 13
    n_rows = 0
    for b in iterate_batches(store, vi, 8, T, 0, 0, masked_lm_prob=0.4, short_seq_prob=0.3):
        assert b.masked_lm_ids.shape == (8, P)
        lengths = b.attention_mask.sum(1)
        np.testing.assert_array_equal(b.masked_lm_weights.sum(1), [round(L * 0.4) for L in lengths])
        n_rows += 8
    assert n_rows > 50
    # An explicit smaller P caps the predictions (the reference's behaviour).
    b = next(iterate_batches(store, vi, 8, T, 0, 0, masked_lm_prob=0.4, max_predictions_per_seq=5,
                             short_seq_prob=0.0))
    assert b.masked_lm_ids.shape == (8, 5) and np.all(b.masked_lm_weights.sum(1) <= 5)


def test_default_max_predictions_and_probability_checks(corpus):
    assert default_max_predictions(128, 0.15) == 20  # the reference's setting
    assert default_max_predictions(512, 0.15) == 77
    assert default_max_predictions(100, 0.07) == 7  # 100 * 0.07 = 7.000000000000001
    assert default_max_predictions(128, 0.4) == 52
    assert default_max_predictions(10, 0.0) == 1
    for T in range(1, 600):  # a row of L <= T tokens predicts round(L * p) <= round(T * p)
        for p in (0.1, 0.15, 0.2, 0.33, 0.4, 0.5, 1.0):
            assert round(T * p) <= default_max_predictions(T, p)
    with pytest.raises(ValueError, match="masked_lm_prob"):
        default_max_predictions(128, 1.5)
    store, vi = corpus
    ids = np.array([CLS, 7, 8, SEP])
    for bad in (-0.1, 1.01, float("nan")):
        with pytest.raises(ValueError, match=r"masked_lm_prob must be a probability in \[0, 1\]"):
            create_masked_lm_predictions(ids, vi, bad, 5, np.random.default_rng(0))
        with pytest.raises(ValueError, match="masked_lm_prob"):
            next(iterate_batches(store, vi, 2, 16, 0, 0, masked_lm_prob=bad))
        with pytest.raises(ValueError, match="short_seq_prob"):
            next(iterate_batches(store, vi, 2, 16, 0, 0, short_seq_prob=bad))
        with pytest.raises(ValueError, match="short_seq_prob"):
            make_eval_batches(store, vi, 2, 16, 0, short_seq_prob=bad)
    with pytest.raises(ValueError, match="max_predictions_per_seq"):
        next(iterate_batches(store, vi, 2, 16, 0, 0, max_predictions_per_seq=0))
    out, pos, _ = create_masked_lm_predictions(ids, vi, 1.0, 5, np.random.default_rng(0))
    assert pos.tolist() == [1, 2]  # every candidate; [CLS] and [SEP] never


def test_epoch_smaller_than_a_batch_is_an_error():
    store = position_store([[3, 4], [5], [2, 2]])  # 3 short documents: a few pairs
    vi = word_vocab(5000)
    n = count_instances(store, 64, 0, 0)
    assert 2 < n < 128
    # one rule, drop_last or not: an epoch of fewer sequences than one batch is refused
    for drop_last in (True, False):
        with pytest.raises(CorpusError, match=(
                rf"epoch 0 .*\(3 documents\) yields {n} sequences \(packed for mlm\+nsp\), "
                rf"fewer than one batch of --batch-size 128: lower --batch-size to at most "
                rf"{n}, or add text")):
            list(iterate_batches(store, vi, 128, 64, 0, 0, drop_last=drop_last))
    with pytest.raises(CorpusError, match="fewer than one batch"):  # also when resuming
        list(iterate_batches(store, vi, 128, 64, 0, 0, start_batch=2))
    for drop_last in (True, False):   # exactly one full batch is fine
        (one,) = iterate_batches(store, vi, n, 64, 0, 0, drop_last=drop_last)
        assert one.input_ids.shape == (n, 64)
    # a bigger epoch keeps its short last batch without drop_last
    rows = [len(b.input_ids) for b in iterate_batches(store, vi, n - 1, 64, 0, 0, drop_last=False)]
    assert rows == [n - 1, 1]
    # An epoch without any instance (here: SOP on one-token documents) is refused either way.
    tiny = position_store([[1], [1]])
    for drop_last in (True, False):
        with pytest.raises(CorpusError, match=r"yields 0 sequences .*: add text$"):
            list(iterate_batches(tiny, vi, 1, 64, 0, 0, objective="mlm+sop", drop_last=drop_last))


def test_line_by_line_epoch_smaller_than_a_batch_is_the_same_error():
    """One corpus line per sequence follows the packed rule: fewer lines than one batch is
    refused (it used to train on one short batch a step), exactly one batch runs."""
    store = position_store([[3, 4, 2], [5, 1, 1], [2, 2, 6]])  # 9 lines in 3 documents
    vi = word_vocab(5000)
    kw = dict(objective="mlm", line_by_line=True)
    for B, drop_last in ((128, False), (128, True), (10, False)):
        with pytest.raises(CorpusError, match=(
                rf"epoch 0 .*\(3 documents\) yields 9 sequences \(one per line\), fewer than "
                rf"one batch of --batch-size {B}: lower --batch-size to at most 9, or add text")):
            list(iterate_batches(store, vi, B, 16, 0, 0, drop_last=drop_last, **kw))
    for drop_last in (True, False):
        (one,) = iterate_batches(store, vi, 9, 16, 0, 0, drop_last=drop_last, **kw)
        assert one.input_ids.shape[0] == 9
    rows = [len(b.input_ids)
            for b in iterate_batches(store, vi, 8, 16, 0, 0, drop_last=False, **kw)]
    assert sorted(rows) == [1, 8]   # every line once: the short batch of a bigger epoch kept


def test_eval_batches_fixed_and_unigram_baseline(corpus):
    store, vi = corpus
    tr, ev = split_documents(store, eval_documents=10, seed=0)
    e1 = make_eval_batches(ev, vi, 16, 32, seed=5)
    e2 = make_eval_batches(ev, vi, 16, 32, seed=5)
    assert len(e1) == len(e2) > 0
    for a, b in zip(e1, e2):
        for f, x in a.model_inputs().items():
            np.testing.assert_array_equal(x, b.model_inputs()[f])
    # every batch (16, 32) and (16, P) but the last, which may hold fewer rows
    assert all(b.input_ids.shape == (16, 32) and b.masked_lm_ids.shape == (16, 5) for b in e1[:-1])
    assert e1[-1].input_ids.shape[1] == 32 and e1[-1].masked_lm_ids.shape[1] == 5
    assert sum(b.input_ids.shape[0] for b in make_eval_batches(ev, vi, 16, 32, seed=5, max_instances=21)) == 21
    # Held-out batches use only held-out documents (B sentences included).
    eval_docs = set(ev.doc_ids.tolist())
    for b in e1:
        toks = unmasked(b)[b.attention_mask == 1]
        toks = toks[(toks != CLS) & (toks != SEP)]
        assert set(doc_of_token(store, toks).tolist()) <= eval_docs
    counts = token_counts(tr, vi.vocab_size)
    assert counts.sum() == tr.num_tokens
    t0, t1 = tr.token_range(0)
    assert counts[store.tokens[t0]] == 1  # position-encoded tokens occur once
    # On its own tokens, with no smoothing, the cross-entropy is the entropy.
    c = np.array([5, 3, 2, 0], dtype=np.int64)
    lab = np.repeat(np.arange(4), c)
    p = c[:3] / c.sum()
    assert math.isclose(unigram_cross_entropy(c, lab, smoothing=0.0), float(-(p * np.log(p)).sum()))
    # Fixed-shape slots: padding slots (weight 0, id 0) are left out.
    ids, w = np.array([[0, 1, 0], [2, 0, 0]]), np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    logp = np.log((c + 1) / (c.sum() + 4))
    assert math.isclose(unigram_cross_entropy(c, ids, w), float(-(logp[0] + logp[1] + logp[2]) / 3))
    ce = unigram_cross_entropy(counts, [b.masked_lm_ids for b in e1], [b.masked_lm_weights for b in e1])
    assert np.isfinite(ce)
    assert math.isclose(ce, unigram_cross_entropy(counts, [dense_labels(b) for b in e1]))
    with pytest.raises(ValueError, match="2 label arrays but 1"):
        unigram_cross_entropy(c, [ids, ids], [w])


def test_single_document_store_is_refused():
    store = position_store([[3, 4, 5]])
    vi = word_vocab(5000)
    with pytest.raises(CorpusError, match="at least 2"):
        next(iterate_batches(store, vi, 2, 16, 0, 0))
    with pytest.raises(CorpusError, match="at least 2"):
        make_eval_batches(store, vi, 2, 16, 0)


def test_no_held_out_documents_gives_no_eval_batches():
    store = position_store([[3, 4], [5], [2, 2]])
    tr, ev = split_documents(store, eval_fraction=0.0)
    assert ev.num_documents == 0 and tr.num_documents == 3
    assert make_eval_batches(ev, word_vocab(5000), 2, 16, 0) == []


def test_negative_seed_is_refused():
    store = position_store([[3, 4], [5], [2, 2]])
    with pytest.raises(ValueError, match="seed"):
        next(iterate_batches(store, word_vocab(5000), 2, 16, 0, -1))


def test_real_tokenizer_end_to_end(tmp_path):
    from minibert.tokenization import BertTokenizer

    tok = BertTokenizer(str(VOCAB_FILE), do_lower_case=True)
    f = write(tmp_path / "c.txt", "The cat sat on the mat.\nIt was purring loudly.\n\nUnbelievable things happen.\nA second sentence!\n")
    store = build_store([f], tok, show_progress=False)
    vi = VocabInfo.from_tokenizer(tok)
    assert store.num_documents == 2
    assert list(store.document(0)[0]) == tok.convert_tokens_to_ids(tok.tokenize("The cat sat on the mat."))
    batches = list(iterate_batches(store, vi, 2, 32, 0, 0, drop_last=False))
    assert batches and all(b.input_ids.shape[1] == 32 for b in batches)


def test_truncation_side_is_random():
    fronts = backs = 0
    for seed in range(200):
        a0, a1, _, _ = truncate_seq_pair(10, 2, 9, np.random.default_rng(seed))
        fronts += a0 > 0
        backs += a1 < 10
    assert fronts > 20 and backs > 20
