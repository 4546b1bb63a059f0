"""The WordPiece trainer: merges checked by hand and against a naive recount-everything
trainer, alphabet and drop reporting, errors, the CLI, and loading the result in
transformers' BertTokenizer."""

from __future__ import annotations

import math
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert.tokenization import SPECIAL_TOKENS, BertTokenizer, load_vocab, train_wordpiece, write_vocab
from minibert.tokenization.__main__ import main as cli_main
from minibert.tokenization.trainer import likelihood_gain

HERE = Path(__file__).resolve().parent
SAMPLES = HERE / "data" / "tokenization"
ROOT = HERE.parent
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def corpus(counts: dict[str, int]) -> list[str]:
    """Lines holding each word ``count`` times."""
    return [" ".join([w] * c) for w, c in counts.items()]


def F(x: int) -> float:
    return x * math.log(x) if x else 0.0


def test_likelihood_merges_by_hand():
    # units a=20 (ab x10, a x10), c=6, q=2, ##b=10, ##d=6, ##z=2; n=46; F(x) = x ln x
    # dL(a,##b; m=10) = F(10)-F(20) + F(0)-F(10) + F(10) + F(46)-F(36) = 10.222
    # dL(c,##d; m=6)  = F(0)-F(6) + F(0)-F(6) + F(6) + F(46)-F(40)    = 17.812  <- 1. cd
    # dL(q,##z; m=2)  = F(0)-F(2) + F(0)-F(2) + F(2) + F(46)-F(44)    =  8.227
    # n=40: ab: F(10)-F(20) - F(10) + F(10) + F(40)-F(30) = 8.630 > qz: -F(2) + F(40)-F(38) = 7.941
    # -> 2. ab, 3. qz.  The ratio form picks qz first (2/(2*2) = .5), bpe picks ab (10).
    assert F(10) - F(20) + F(46) - F(36) == pytest.approx(10.222, abs=1e-3)
    assert -F(6) + F(46) - F(40) == pytest.approx(17.812, abs=1e-3)
    assert -F(2) + F(46) - F(44) == pytest.approx(8.227, abs=1e-3)
    assert F(10) - F(20) + F(40) - F(30) == pytest.approx(8.630, abs=1e-3)
    assert -F(2) + F(40) - F(38) == pytest.approx(7.941, abs=1e-3)
    lines = corpus({"ab": 10, "a": 10, "cd": 6, "qz": 2})
    got = {alg: train_wordpiece(iter(lines), 14, min_frequency=1, algorithm=alg, show_progress=False)[-3:]
           for alg in ("wordpiece", "wordpiece-ratio", "bpe")}
    assert got == {"wordpiece": ["cd", "ab", "qz"], "wordpiece-ratio": ["qz", "cd", "ab"],
                   "bpe": ["ab", "cd", "qz"]}
    v = train_wordpiece(iter(lines), 14, min_frequency=1, show_progress=False)
    assert v.report.algorithm == "wordpiece" and v == SPECIALS + ["a", "c", "q", "##b", "##d", "##z"] + got["wordpiece"]


def test_likelihood_self_pair_counts_non_overlapping_merges():
    # baaa x3, b x6: b=9, ##a=9, n=18. (##a,##a) occurs 6 times but a run of three
    # merges once, so m=3: ##a 9 -> 3, ##aa +3, n -> 15:
    #   dL = F(3)-F(9) + F(3) + F(18)-F(15) = -1.777
    # (b,##a), m=3: F(6)-F(9) + F(6)-F(9) + F(3) + F(18)-F(15) = -3.347  -> ##aa first.
    # Then b=9, ##aa=3, ##a=3, n=15: (##aa,##a) = F(0)-F(3) + F(0)-F(3) + F(3) + F(15)-F(12)
    # beats (b,##aa) = F(6)-F(9) + F(0)-F(3) + F(3) + F(15)-F(12) -> ##aaa, then baaa.
    assert F(3) - F(9) + F(3) + F(18) - F(15) == pytest.approx(-1.777, abs=1e-3)
    assert likelihood_gain(9, 9, 0, 3, 18, same=True) == pytest.approx(-1.777, abs=1e-3)
    assert likelihood_gain(9, 9, 0, 3, 18) == pytest.approx(-3.347, abs=1e-3)
    v = train_wordpiece(iter(corpus({"baaa": 3, "b": 6})), 10, min_frequency=1, show_progress=False)
    assert v[len(SPECIALS):] == ["b", "##a", "##aa", "##aaa", "baaa"]


def brute_force_log_likelihood(counts: Counter) -> float:
    n = sum(counts.values())
    return sum(c * math.log(c / n) for c in counts.values() if c)


@settings(max_examples=200, deadline=None)
@given(c_a=st.integers(1, 10**7), c_b=st.integers(1, 10**7), c_new=st.integers(0, 10**6),
       other=st.integers(0, 10**8), same=st.booleans(), frac=st.floats(0.0, 1.0))
def test_likelihood_gain_equals_recomputed_log_likelihood(c_a, c_b, c_new, other, same, frac):
    cap = c_a // 2 if same else min(c_a, c_b)
    if cap < 1:
        return
    m = max(1, int(frac * cap))
    before = Counter({"a": c_a, "new": c_new, "rest": other}) if same else \
        Counter({"a": c_a, "b": c_b, "new": c_new, "rest": other})
    after = before.copy()
    after["a"] -= 2 * m if same else m
    if not same:
        after["b"] -= m
    after["new"] += m
    n = sum(before.values())
    want = brute_force_log_likelihood(after) - brute_force_log_likelihood(before)
    got = likelihood_gain(c_a, 0 if same else c_b, c_new, m, n, same)
    # the brute force loses ~1e-16 * n log n to cancellation; likelihood_gain does not
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12 * (n * math.log(n) + 1))


def test_ratio_merges_by_hand():
    # a=4 (ab x3, ac x1), c=2, ##b=3, ##c=1, ##d=2
    # scores: (c,##d) 2/(2*2)=.5 ; (a,##b) 3/(4*3)=.25 ; (a,##c) 1/(4*1)=.25
    # 1. cd (.5)  2. ab (ties .25 with ac, higher count 3)  3. ac (a=1 now: 1/(1*1)=1)
    v = train_wordpiece(iter(corpus({"ab": 3, "cd": 2, "ac": 1})), 13, min_frequency=1,
                        algorithm="wordpiece-ratio", show_progress=False)
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
                        algorithm="wordpiece-ratio", show_progress=False)
    assert v[len(SPECIALS) + 5:] == ["ab", "ac", "xy"]


def _replace(s: list[str], x: str, y: str, new: str) -> tuple[list[str], int]:
    """Leftmost non-overlapping replacement of x y by new; -> (result, replacements)."""
    r, j, m = [], 0, 0
    while j < len(s):
        if j + 1 < len(s) and s[j] == x and s[j + 1] == y:
            r.append(new)
            j += 2
            m += 1
        else:
            r.append(s[j])
            j += 1
    return r, m


def naive_train(words: Counter, n_merges: int, min_frequency: int, algorithm: str) -> list[str]:
    """Recount every pair and symbol from scratch before each merge (the slow, obvious way).

    For ``wordpiece`` the merge count m of each pair is found by doing the replacement in
    every word; the gain itself is the trainer's ``likelihood_gain`` (checked against a
    recomputed log-likelihood above), so equal inputs give bit-equal scores and ties."""
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

        n = sum(sc.values())

        def key(pc_):
            (x, y), c = pc_
            if algorithm == "wordpiece":
                m = sum(f * _replace(segs[w], x, y, "")[1] for w, f in words.items())
                score = likelihood_gain(sc[x], sc[y], sc.get(x + y[2:], 0), m, n, x == y)
            elif algorithm == "wordpiece-ratio":
                score = c / (sc[x] * sc[y])
            else:
                score = c
            return (-score, -c, ids[x], ids[y])

        (x, y), _ = min(cands, key=key)
        new = x + y[2:]
        if new not in ids:
            ids[new] = len(ids)
            out.append(new)
        for w, s in segs.items():
            segs[w] = _replace(s, x, y, new)[0]
    return out


@settings(max_examples=150, deadline=None)
@given(
    words=st.dictionaries(st.text(alphabet="abcd", min_size=1, max_size=9), st.integers(1, 9), min_size=1,
                          max_size=25),
    n_new=st.integers(1, 30),
    min_frequency=st.sampled_from([1, 2, 3]),
    algorithm=st.sampled_from(["wordpiece", "wordpiece-ratio", "bpe"]),
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


def test_special_token_that_is_a_corpus_character(tmp_path):
    # "x" is both a special token and a character of the words "x", "box" and "fox": it is
    # listed once (as the special token) and still merges inside words.
    lines = ["x marks the box", "box fox x box"]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "x"]
    v = train_wordpiece(iter(lines), 40, special_tokens=specials, min_frequency=1,
                        show_progress=False)
    assert v.count("x") == 1 and v.index("x") == 5
    assert "box" in v and "##x" in v
    write_vocab(v, tmp_path / "vocab.txt")
    tok = BertTokenizer(tmp_path / "vocab.txt", never_split=["x"])
    assert tok.tokenize("x box fox") == ["x", "box", "fox"]


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
    import transformers  # a test dependency: fail, never skip, when it is missing

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


def test_special_tokens_are_the_default_and_come_first():
    assert SPECIAL_TOKENS == tuple(SPECIALS)
    v = train_wordpiece(iter(["ab ab ab"]), 8, min_frequency=1, show_progress=False)
    assert v[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)


def test_output_that_cannot_be_written_fails_before_training(tmp_path):
    def lines():  # training would consume this: it must not be reached
        raise AssertionError("read the corpus before checking output")
        yield

    with pytest.raises(IsADirectoryError, match=f"{tmp_path.name}'? is a directory"):
        train_wordpiece(lines(), 100, output=tmp_path, show_progress=False)
    blocker = tmp_path / "a_file"
    blocker.write_text("x", encoding="utf-8")
    with pytest.raises(NotADirectoryError, match="a_file'? is not a directory"):
        train_wordpiece(lines(), 100, output=blocker / "sub" / "vocab.txt", show_progress=False)


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """main(argv) in this process -> (exit status, stderr)."""
    try:
        status = cli_main(argv)
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr().err


def cli_train(tmp_path, **overrides) -> list[str]:
    args = {"--files": str(SAMPLES / "en_sample.txt"), "--vocab-size": "300", "--output": str(tmp_path / "v.txt")}
    args.update(overrides)
    return ["train", "--quiet"] + [x for k, v in args.items() for x in (k, v)]


@pytest.mark.parametrize(
    "option,value,message",
    [
        ("--output", "{tmp}", r"'?{tmp}'? is a directory"),  # an existing directory
        ("--output", "{tmp}/blocker/vocab.txt", r"'?{tmp}/blocker'? is not a directory"),
        ("--files", "{tmp}/nope.txt", r"'?{tmp}/nope.txt'?: no such file"),
        ("--files", "{tmp}", r"is a directory"),
        ("--vocab-size", "5", r"must be at least 6 \(the 5 special tokens and one more\), got 5"),
        ("--vocab-size", "0", r"expected an integer >= 1, got 0"),
        ("--vocab-size", "-3", r"expected an integer >= 1, got -3"),
        ("--vocab-size", "many", r"expected an integer, got 'many'"),
        ("--min-frequency", "-1", r"expected an integer >= 0, got -1"),
    ],
)
def test_cli_bad_train_arguments_exit_2_naming_the_option(tmp_path, capsys, option, value, message):
    (tmp_path / "blocker").write_text("x", encoding="utf-8")
    value, message = value.format(tmp=tmp_path), message.format(tmp=tmp_path)
    status, err = run_cli(cli_train(tmp_path, **{option: value}), capsys)
    assert status == 2
    lines = err.strip().split("\n")
    assert lines[0].startswith("usage: python -m minibert.tokenization train")
    assert re.fullmatch(rf"python -m minibert.tokenization train: error: argument {option}: .*{message}.*", lines[-1])
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]  # nothing written


def test_cli_vocab_size_below_the_alphabet(tmp_path, capsys):
    status, err = run_cli(cli_train(tmp_path, **{"--vocab-size": "6"}), capsys)
    assert status == 2 and "train: error: vocab_size=6 is too small" in err and "Traceback" not in err


def test_cli_tokenize_bad_vocab_exit_2(tmp_path, capsys):
    dup = tmp_path / "dup.txt"
    dup.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nthe\n", encoding="utf-8")
    for vocab, message in [(tmp_path / "nope.txt", "nope.txt'? not found"),
                           (dup, "duplicate token 'the' on lines 6 and 7")]:
        status, err = run_cli(["tokenize", "--vocab", str(vocab), "hello"], capsys)
        assert status == 2 and "Traceback" not in err
        assert re.search(rf"tokenize: error: argument --vocab: .*{message}", err), err


def test_cli_existing_directory_output_in_a_subprocess(tmp_path):
    argv = cli_train(tmp_path, **{"--output": str(tmp_path)})
    res = subprocess.run([sys.executable, "-m", "minibert.tokenization", *argv], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and res.stdout == ""
    assert "train: error: argument --output:" in res.stderr and "Traceback" not in res.stderr
