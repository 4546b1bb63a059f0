"""Minimal-pair evaluation: the BLiMP-format reader, the accuracy roll-up, the Kneser-Ney
trigram floor, our template pairs, and ``python -m minibert minimal-pairs``."""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert.__main__ import main as minibert_main
from minibert.evaluation.minimal_pairs import (MinimalPair, PairsError, accuracy,
                                               read_pairs)
from minibert.evaluation.ngram import KneserNeyTrigram
from minibert.evaluation.pair_templates import PARADIGMS, Lexicon, corpus_counts, generate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import tiny_mlm_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT / "data" / "minimal_pairs" / "en" / "pairs.jsonl"
CORPUS = ROOT / "data" / "pretrain" / "en"


def test_reader_names_file_line_and_field(tmp_path):
    good = {"sentence_good": "a b", "sentence_bad": "a c", "UID": "u", "field": "f",
            "linguistics_term": "t"}
    p = tmp_path / "p.jsonl"
    for bad_line, msg in ((json.dumps({k: v for k, v in good.items() if k != "UID"}),
                           "field 'UID' is missing"),
                          (json.dumps({**good, "sentence_bad": "  "}),
                           "field 'sentence_bad' is not a non-empty string"),
                          (json.dumps({**good, "field": 3}), "field 'field' is not"),
                          ("[1, 2]", "expected a JSON object, got list"),
                          ("{oops", "not JSON")):
        p.write_text(json.dumps(good) + "\n\n" + bad_line + "\n")
        with pytest.raises(PairsError, match=rf"{p}:3: .*{msg}"):
            read_pairs(p)
    p.write_text("\n")
    with pytest.raises(PairsError, match="no pairs"):
        read_pairs(p)
    p.write_bytes(b"\xff\xfe\n")
    with pytest.raises(PairsError, match="not valid UTF-8"):
        read_pairs(p)
    p.write_text(json.dumps(good) + "\n")
    assert read_pairs(p)[0] == MinimalPair("a b", "a c", "u", "f", "t", 1, str(p))


def test_accuracy_rolls_up_paradigms_fields_and_macro():
    rng = np.random.default_rng(0)
    uids = {"a": "x", "b": "x", "c": "y"}
    pairs = [MinimalPair("g", "b", u, f, "", i) for i, (u, f) in
             enumerate([(u, f) for u, f in uids.items() for _ in range(int(rng.integers(3, 9)))])]
    good, bad = rng.normal(size=len(pairs)), rng.normal(size=len(pairs))
    good[0] = bad[0]                                              # a tie counts half
    r = accuracy(pairs, good, bad)
    right = {u: [] for u in uids}
    for p, g, b in zip(pairs, good, bad):
        right[p.uid].append(1.0 if g > b else 0.5 if g == b else 0.0)
    par = {u: 100 * np.mean(v) for u, v in right.items()}
    assert r["paradigms"] == pytest.approx(par)
    assert r["fields"] == pytest.approx({"x": (par["a"] + par["b"]) / 2, "y": par["c"]})
    assert r["macro"] == pytest.approx(np.mean(list(par.values())))
    assert r["pairs"] == len(pairs)


def test_kneser_ney_trigram_is_a_distribution_and_learns_agreement():
    text = ["the dog barks .", "the dogs bark .", "a dog barks loudly .", "dogs bark .",
            "the dog sleeps .", "the dogs sleep ."] * 3
    lm = KneserNeyTrigram().fit(text)
    vocab = list(lm.uni_cont)
    for ctx in (("the", "dog"), ("<s>", "<s>"), ("never", "seen"), ("dogs", "bark")):
        total = sum(lm.prob(*ctx, w) for w in vocab) + lm.prob(*ctx, "an-unknown-word")
        assert total == pytest.approx(1.0, abs=1e-12)
    assert lm.sentence_logprob("The dogs bark.") > lm.sentence_logprob("The dogs barks.")
    assert 0 < lm.d3 < 1 and math.isfinite(lm.sentence_logprob("zebras fly"))


def test_template_pairs_differ_in_one_word_use_corpus_words_and_are_reproducible(tmp_path):
    counts = corpus_counts(l for f in sorted(CORPUS.glob("*.txt"))
                           for l in f.read_text(encoding="utf-8").splitlines())
    pairs = generate(Lexicon(counts, 5), 250, seed=0)
    shipped = [json.loads(l) for l in PAIRS.read_text().splitlines()]
    assert pairs == shipped                          # the shipped file is this generator's
    assert {p["UID"] for p in pairs} == {u for u, *_ in PARADIGMS}
    for p in pairs:
        g, b = p["sentence_good"].split(), p["sentence_bad"].split()
        assert len(g) == len(b) and sum(x != y for x, y in zip(g, b)) == 1, p
        assert all(counts[w.lower()] >= 5 for w in g + b if w.isalpha()), p
    assert len({(p["sentence_good"], p["sentence_bad"]) for p in pairs}) == len(pairs)
    with pytest.raises(ValueError, match="lower --min-count"):
        Lexicon(counts, 10 ** 9)


def test_minimal_pairs_command_scores_models_and_floors(tmp_path, capsys):
    run = tiny_mlm_run(tmp_path / "pretrain")
    lines = PAIRS.read_text().splitlines()
    small = tmp_path / "small.jsonl"
    by_uid: dict = {}
    for l in lines:
        by_uid.setdefault(json.loads(l)["UID"], []).append(l)
    small.write_text("\n".join(l for v in by_uid.values() for l in v[:3]) + "\n")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((CORPUS / "moby_dick.txt").read_text(encoding="utf-8")[:200_000])
    out, png = tmp_path / "mp.json", tmp_path / "mp.png"
    assert minibert_main(["minimal-pairs", str(run), str(small), "--corpus", str(corpus),
                          "--output", str(out), "--plot", str(png), "--method", "pll"]) == 0
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["pairs"] == 3 * len(by_uid) and res["method"] == "pll"
    assert set(res["results"]) == {str(run), "random weights", "trigram (KN, own corpus)"}
    for r in res["results"].values():
        assert set(r["paradigms"]) == set(by_uid) and 0 <= r["macro"] <= 100
        assert r["macro"] == pytest.approx(np.mean(list(r["paradigms"].values())))
    assert "macro (paradigms)" in printed and png.read_bytes()[:4] == b"\x89PNG"


def test_minimal_pairs_command_bad_input_is_an_error_line(tmp_path, capsys):
    run = tiny_mlm_run(tmp_path / "pretrain")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"sentence_good": "a", "sentence_bad": "b", "UID": "u",
                               "field": "f"}) + "\n")
    for argv, msg in (([str(run), str(bad)], f"{bad}:1: field 'linguistics_term' is missing"),
                      ([str(run)], "at least one model and one .jsonl"),
                      ([str(PAIRS)], "at least one model and one .jsonl")):
        with pytest.raises(SystemExit) as e:
            minibert_main(["minimal-pairs", *argv, "--no-floors"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and msg in err and "Traceback" not in err, err


def test_pairs_probe_drops_what_cannot_be_scored_and_scores_the_rest(tmp_path):
    """A pair with an only-[UNK] sentence or one longer than the positions is dropped and
    counted; the rest score as score_pairs_mlm scores them."""
    from minibert.evaluation.minimal_pairs import PairsProbe, score_pairs_mlm
    from minibert.pipelines import load_pipeline_model
    model, tok, _ = load_pipeline_model("fill-mask", str(tiny_mlm_run(tmp_path / "run")))
    ok = [MinimalPair("the cat sat .", "the cat sit .", "u1", "f", "t", 1),
          MinimalPair("a dog ran .", "a dog run .", "u2", "f", "t", 2)]
    long = MinimalPair("the cat sat on the mat today .", "the cat sat on the mat now .",
                       "u1", "f", "t", 3)
    unk = MinimalPair("the cat sat .", "ʬʬʬ", "u2", "f", "t", 4)
    probe = PairsProbe(ok + [long, unk], tok, max_length=8)
    assert probe.pairs == ok and probe.dropped == 2
    assert probe(model.eval()) == pytest.approx(score_pairs_mlm(model, tok, ok)["macro"])
