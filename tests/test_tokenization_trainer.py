"""The WordPiece trainer: merges checked by hand and against a naive recount-everything
trainer, alphabet and drop reporting, errors, the CLI, and loading the result in
transformers' BertTokenizer."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert.tokenization import BertTokenizer, load_vocab, train_wordpiece

HERE = Path(__file__).resolve().parent
SAMPLES = HERE / "data" / "tokenization"
ROOT = HERE.parent
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def corpus(counts: dict[str, int]) -> list[str]:
    """Lines holding each word ``count`` times."""
    return [" ".join([w] * c) for w, c in counts.items()]


def test_wordpiece_merges_by_hand():
    # a=4 (ab x3, ac x1), c=2, ##b=3, ##c=1, ##d=2
    # scores: (c,##d) 2/(2*2)=.5 ; (a,##b) 3/(4*3)=.25 ; (a,##c) 1/(4*1)=.25
    # 1. cd (.5)  2. ab (ties .25 with ac, higher count 3)  3. ac (a=1 now: 1/(1*1)=1)
    v = train_wordpiece(iter(corpus({"ab": 3, "cd": 2, "ac": 1})), 13, min_frequency=1, show_progress=False)
    assert v == SPECIALS + ["a", "c", "##b", "##c", "##d"] + ["cd", "ab", "ac"]
    assert v.report.n_merges == 3 and v.report.stopped_early is False


def test_bpe_merges_by_hand():
    # raw pair counts: ab 3, cd 2, ac 1
    v = train_wordpiece(iter(corpus({"ab": 3, "cd": 2, "ac": 1})), 13, min_frequency=1, algorithm="bpe",
                        show_progress=False)
    assert v[-3:] == ["ab", "cd", "ac"]


def test_tie_break_then_updated_scores():
    # a=4, ##b=2, ##c=2, x=10 (xy x3 + x x7), ##y=3
    # (a,##b) 2/(4*2)=.25 ties (a,##c) .25 at count 2: ##b was created first -> ab;
    # now a=2 so (a,##c) = 2/(2*2) = .5 -> ac; last (x,##y) = 3/(10*3) = .1 -> xy
    v = train_wordpiece(iter(corpus({"ab": 2, "ac": 2, "xy": 3, "x": 7})), 13, min_frequency=1,
                        show_progress=False)
    assert v[len(SPECIALS) + 5:] == ["ab", "ac", "xy"]


def naive_train(words: Counter, n_merges: int, min_frequency: int, algorithm: str) -> list[str]:
    """Recount every pair and symbol from scratch before each merge (the slow, obvious way)."""
    heads = sorted({w[0] for w in words})
    tails = sorted({"##" + ch for w in words for ch in w[1:]})
    syms = heads + tails
    ids = {s: i for i, s in enumerate(syms)}
    segs = {w: [w[0]] + ["##" + ch for ch in w[1:]] for w in words}
    out = []
    for _ in range(n_merges):
        pc, sc = Counter(), Counter()
        for w, f in words.items():
            s = segs[w]
            for x in s:
                sc[x] += f
            for x, y in zip(s, s[1:]):
                pc[(x, y)] += f
        cands = [(p, c) for p, c in pc.items() if c >= max(min_frequency, 1)]
        if not cands:
            break

        def key(pc_):
            (x, y), c = pc_
            score = c / (sc[x] * sc[y]) if algorithm == "wordpiece" else c
            return (-score, -c, ids[x], ids[y])

        (x, y), _ = min(cands, key=key)
        new = x + y[2:]
        if new not in ids:
            ids[new] = len(ids)
            out.append(new)
        for w, s in segs.items():
            r, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and s[j] == x and s[j + 1] == y:
                    r.append(new)
                    j += 2
                else:
                    r.append(s[j])
                    j += 1
            segs[w] = r
    return out


@settings(max_examples=60, deadline=None)
@given(
    words=st.dictionaries(st.text(alphabet="abcd", min_size=1, max_size=7), st.integers(1, 9), min_size=1,
                          max_size=25),
    n_new=st.integers(1, 30),
    min_frequency=st.sampled_from([1, 2, 3]),
    algorithm=st.sampled_from(["wordpiece", "bpe"]),
)
def test_incremental_trainer_equals_naive_recount(words, n_new, min_frequency, algorithm):
    chars = Counter()
    for w, c in words.items():
        for ch in w:
            chars[ch] += c
    kept = Counter({w: c for w, c in words.items() if all(chars[ch] >= min_frequency for ch in w)})
    if not kept:
        return
    heads = {w[0] for w in kept}
    tails = {ch for w in kept for ch in w[1:]}
    alphabet = len(heads) + len(tails)
    # characters are kept on their corpus count, so a char of a dropped word may still be in the alphabet
    v = train_wordpiece(iter(corpus(words)), len(SPECIALS) + 8 + n_new, min_frequency=min_frequency,
                        algorithm=algorithm, show_progress=False)
    got_alphabet = v[len(SPECIALS):len(SPECIALS) + v.report.alphabet_size]
    merged = v[len(SPECIALS) + v.report.alphabet_size:]
    assert set(got_alphabet) >= {*heads, *("##" + t for t in tails)}
    assert merged == naive_train(kept, len(merged) + 50, min_frequency, algorithm)[: len(merged)]
    want = naive_train(kept, 10_000, min_frequency, algorithm)
    assert merged == want[: len(SPECIALS) + 8 + n_new - len(SPECIALS) - len(got_alphabet)]
    assert alphabet <= len(got_alphabet)


def test_alphabet_keeps_every_frequent_char_and_reports_dropped(caplog):
    lines = ["hello world", "hello there", "naïve ζ"]  # w, d, ζ ... occur once
    v = train_wordpiece(iter(lines), 200, min_frequency=2, show_progress=False)
    r = v.report
    assert "ζ" in r.dropped_chars and r.dropped_chars["ζ"] == 1
    assert "w" in r.dropped_chars and not any("w" in t for t in v)
    for ch in "helor":
        assert ch in v or "##" + ch in v
    assert r.n_words_with_dropped_chars >= 1
    assert "ζ" in caplog.text  # logged, not silent
    assert "dropped" in r.summary()


def test_cjk_chars_are_single_words():
    v = train_wordpiece(iter(["中国人民 中国", "人民日报 中国"]), 100, min_frequency=1, show_progress=False)
    assert {"中", "国", "人", "民", "日", "报"} <= set(v)
    assert not any(len(t) > 1 and not t.startswith("[") for t in v)  # nothing to merge across CJK words


def test_deterministic_regardless_of_line_order():
    lines = (SAMPLES / "en_sample.txt").read_text(encoding="utf-8").split("\n")
    a = train_wordpiece(iter(lines), 600, show_progress=False)
    random.Random(0).shuffle(lines)
    b = train_wordpiece(iter(lines), 600, show_progress=False)
    assert a == b and len(set(a)) == len(a) == 600


def test_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        train_wordpiece([tmp_path / "missing.txt"], 100, show_progress=False)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty corpus.*empty\.txt"):
        train_wordpiece(empty, 100, show_progress=False)
    with pytest.raises(ValueError, match=r"vocab_size=8 is too small.*5 special tokens.*need 9;"):
        train_wordpiece(iter(["abc abd"]), 8, min_frequency=1, show_progress=False)
    with pytest.raises(ValueError, match="algorithm"):
        train_wordpiece(iter(["abc"]), 100, algorithm="unigram", show_progress=False)
    with pytest.raises(TypeError, match="item 1"):
        train_wordpiece(iter(["abc", 3]), 100, show_progress=False)
    with pytest.raises(ValueError, match="distinct"):
        train_wordpiece(iter(["abc"]), 100, special_tokens=["[PAD]", "[PAD]"], show_progress=False)


def test_output_written_atomically_and_loadable(tmp_path):
    out = tmp_path / "sub" / "vocab.txt"
    v = train_wordpiece(SAMPLES / "en_sample.txt", 500, output=out, show_progress=False)
    assert list(load_vocab(out)) == list(v)
    assert [p.name for p in out.parent.iterdir()] == ["vocab.txt"]
    tok = BertTokenizer(out)
    assert tok.tokenize("the whale") and tok.unk_token_id == 1


def test_trained_vocab_loads_in_transformers_and_tokenizers_agree(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as Ref
    except ImportError:
        from transformers import BertTokenizer as Ref
    lines = (SAMPLES / "en_sample.txt").read_text(encoding="utf-8").split("\n")
    train, held_out = lines[: len(lines) * 9 // 10], lines[len(lines) * 9 // 10:]
    out = tmp_path / "vocab.txt"
    train_wordpiece(iter(train), 1500, output=out, show_progress=False)
    ours, ref = BertTokenizer(out), Ref(str(out))
    assert len(ref) == 1500
    for line in held_out:
        assert ours.tokenize(line) == ref.tokenize(line)
        assert ours.encode(line) == ref.encode(line)


def test_cli_help_and_train(tmp_path):
    res = subprocess.run([sys.executable, "-m", "minibert.tokenization", "train", "--help"], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 0 and "--vocab-size" in res.stdout and "--algorithm" in res.stdout
    out = tmp_path / "v.txt"
    res = subprocess.run([sys.executable, "-m", "minibert.tokenization", "train", "--files",
                          str(SAMPLES / "en_sample.txt"), "--vocab-size", "300", "--output", str(out)],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "merging" in res.stderr  # the tqdm bar
    assert len(load_vocab(out)) == 300
    res = subprocess.run([sys.executable, "-m", "minibert.tokenization", "train", "--files",
                          str(tmp_path / "nope.txt"), "--vocab-size", "300", "--output", str(out)],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "nope.txt" in res.stderr
