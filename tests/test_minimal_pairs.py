"""Minimal-pair evaluation: the BLiMP-format reader, the accuracy roll-up and its standard
error, the unigram and Kneser-Ney trigram floors, our template pairs, BLiMP's development
set, and ``python -m minibert minimal-pairs``."""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert.__main__ import main as minibert_main
from minibert.evaluation.minimal_pairs import (MinimalPair, PairsError, accuracy,
                                               read_pairs, score_pairs_lm)
from minibert.evaluation import blimp
from minibert.evaluation.ngram import AddKUnigram, KneserNeyTrigram
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
    terms = {"a": "t1", "b": "t2", "c": "t2"}
    pairs = [MinimalPair("g", "b", u, f, terms[u], i) for i, (u, f) in
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
    assert r["phenomena"] == pytest.approx({"t1": par["a"], "t2": (par["b"] + par["c"]) / 2})
    assert r["macro"] == pytest.approx(np.mean(list(par.values())))
    assert r["pairs"] == len(pairs)
    # the macro's standard error: each paradigm's outcome variance over its pairs
    var = sum(np.var(v) / len(v) for v in right.values())
    assert r["se"] == pytest.approx(100 * np.sqrt(var) / 3)


def test_the_standard_error_is_the_spread_of_the_macro_over_fresh_draws():
    """Draw the pairs of 20 paradigms again and again from generators of known odds (right,
    tie, wrong): the macro's spread over the draws is what one draw's ``se`` says."""
    rng = np.random.default_rng(1)
    odds = rng.dirichlet([2.0, 0.5, 1.0], size=20)
    sizes = rng.integers(20, 60, size=20)
    pairs = [MinimalPair("g", "b", f"u{p}", "f", "t", i)
             for p, n in enumerate(sizes) for i in range(n)]
    macros, ses = [], []
    for _ in range(400):
        outcome = np.concatenate([rng.choice([1.0, 0.0, -1.0], size=n, p=o)
                                  for o, n in zip(odds, sizes)])
        r = accuracy(pairs, outcome, np.zeros_like(outcome))
        macros.append(r["macro"])
        ses.append(r["se"])
    assert np.std(macros) == pytest.approx(np.mean(ses), rel=0.15)


def test_add_k_unigram_is_a_distribution_and_ties_word_orders():
    text = ["the dog barks .", "the dogs bark loudly .", "a cat sleeps ."] * 2
    lm = AddKUnigram(0.1).fit(text)
    assert lm.counts["the"] == 4 and lm.counts["</s>"] == 6
    unseen = lm.k / lm.denominator
    assert sum((c + lm.k) / lm.denominator for c in lm.counts.values()) + unseen == \
        pytest.approx(1.0, abs=1e-12)
    assert math.log(unseen) == pytest.approx(lm.sentence_logprob("zebras") -
                                             lm.sentence_logprob(""))
    # the same words in another order tie to the bit, however the terms are summed
    words = "the dog barks loudly . a cat the dogs sleeps bark".split()
    for seed in range(20):
        shuffled = list(np.random.default_rng(seed).permutation(words))
        assert lm.sentence_logprob(" ".join(shuffled)) == lm.sentence_logprob(" ".join(words))
    pairs = [MinimalPair("the dog barks .", "the barks dog .", "u", "f", "t", 1),
             MinimalPair("a cat sleeps .", "a cat zebra .", "u", "f", "t", 2)]
    assert score_pairs_lm(lm, pairs)["macro"] == 75.0     # a tie half, the other right
    with pytest.raises(ValueError, match="k must be > 0"):
        AddKUnigram(0.0)


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
    assert set(res["results"]) == {str(run), "random weights", "trigram (KN, own corpus)",
                                   "unigram (add-0.1, own corpus)"}
    for r in res["results"].values():
        assert set(r["paradigms"]) == set(by_uid) and 0 <= r["macro"] <= 100
        assert r["macro"] == pytest.approx(np.mean(list(r["paradigms"].values())))
        assert 0 < r["se"] < 10
    counted = [l for l in corpus.read_text().splitlines() if l.strip()]
    pairs = read_pairs(small)
    for name, lm in (("unigram (add-0.1, own corpus)", AddKUnigram(0.1)),
                     ("trigram (KN, own corpus)", KneserNeyTrigram())):
        want = score_pairs_lm(lm.fit(counted), pairs)
        assert res["results"][name]["paradigms"] == pytest.approx(want["paradigms"])
    assert "macro (paradigms)" in printed and "standard error" in printed
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_minimal_pairs_blimp_scores_the_development_set_and_counts_the_runs_text(
        tmp_path, capsys, monkeypatch):
    """``--blimp`` adds BLiMP's development file (here two pairs a paradigm of it); the
    floors count the run's own corpus less the documents its run left out."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = ["The dogs bark .\nThe dog barks .", "Kept out of the run entirely .\nZyx zyx ."]
    (corpus / "c.txt").write_text("\n\n".join(docs * 60) + "\n")
    from minibert.pretraining.exclusion import document_digest
    left_out = tmp_path / "left_out.tsv"
    left_out.write_text(f"{document_digest(docs[1].splitlines())}\tthe second\n")
    run = tiny_mlm_run(tmp_path / "pretrain", corpus=[str(corpus)],
                       exclude_documents=[str(left_out)])
    dev = tmp_path / "dev.jsonl"
    rows = [json.loads(l) for l in blimp.BLIMP_DEV.read_text().splitlines()]
    dev.write_text("".join(json.dumps(r) + "\n" for r in rows
                           if int(r["pairID"]) < blimp.HELD_OUT + 2))
    monkeypatch.setattr(blimp, "BLIMP_DEV", dev)
    out = tmp_path / "b.json"
    assert minibert_main(["minimal-pairs", str(run), "--blimp", "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["pairs"] == 134 and res["files"] == [str(dev)]
    model = res["results"][str(run)]
    assert len(model["paradigms"]) == 67 and len(model["phenomena"]) == 12
    assert set(model["fields"]) == {"morphology", "semantics", "syntax", "syntax_semantics"}
    counted = ["The dogs bark .", "The dog barks ."] * 60
    want = score_pairs_lm(AddKUnigram(0.1).fit(counted), read_pairs(dev))
    assert res["results"]["unigram (add-0.1, own corpus)"]["paradigms"] == pytest.approx(
        want["paradigms"])
    printed = capsys.readouterr().out
    assert "island_effects" in printed and "134 pairs, 67 paradigms" in printed


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


def test_the_shipped_blimp_development_set_holds_no_held_out_pair():
    """67 paradigms of 200 pairs, pairIDs 100-299 only (0-99 are held out), BLiMP's 12
    phenomena and four fields, every pair two different sentences but two of the source's
    own (principle_A_case_2, pairIDs 105 and 287: a tie, half right, for every system)."""
    pairs = read_pairs(blimp.BLIMP_DEV)
    rows = [json.loads(l) for l in blimp.BLIMP_DEV.read_text().splitlines()]
    ids: dict = {}
    for r in rows:
        ids.setdefault(r["UID"], []).append(int(r["pairID"]))
    assert len(ids) == 67 and len(pairs) == 67 * 200
    assert all(v == list(range(blimp.HELD_OUT, blimp.HELD_OUT + 200)) for v in ids.values())
    assert len({p.term for p in pairs}) == 12
    assert {p.field for p in pairs} == {"morphology", "semantics", "syntax", "syntax_semantics"}
    same = [(p.uid, rows[i]["pairID"]) for i, p in enumerate(pairs) if p.good == p.bad]
    assert same == [("principle_A_case_2", "105"), ("principle_A_case_2", "287")]


def test_cut_dev_keeps_the_development_ids_and_nothing_of_the_held_out(tmp_path, capsys):
    source = tmp_path / "blimp"
    source.mkdir()
    for uid, field, term in (("p_one", "syntax/semantics", "binding"),
                             ("p_two", "syntax", "s-selection")):
        (source / f"{uid}.jsonl").write_text("".join(json.dumps(
            {"sentence_good": f"good {uid} {i} .", "sentence_bad": f"bad {uid} {i} .",
             "field": field, "linguistics_term": term, "UID": uid, "pairID": str(i),
             "lexically_identical": True}) + "\n" for i in range(1000)))
    out = tmp_path / "dev.jsonl"
    assert blimp.main(["--source", str(source), "--output", str(out),
                       "--per-paradigm", "30"]) == 0
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert [int(r["pairID"]) for r in rows] == list(range(100, 130)) * 2
    assert all(set(r) == set(blimp.KEPT_FIELDS) for r in rows)
    assert {(r["field"], r["linguistics_term"]) for r in rows} == {
        ("syntax_semantics", "binding"), ("syntax", "argument_structure")}
    assert all(int(w) >= 100 for r in rows for w in r["sentence_good"].split()
               if w.isdigit())
    for argv, msg in ((["--first", "99"], "must lie in [100, 1000); got [99, 299)"),
                      (["--first", "900", "--per-paradigm", "200"], "got [900, 1100)"),
                      (["--source", str(tmp_path / "none")], "no *.jsonl files")):
        with pytest.raises(SystemExit) as e:
            blimp.main(["--source", str(source), "--output", str(out), *argv])
        err = capsys.readouterr().err
        assert e.value.code == 2 and msg in err and "Traceback" not in err, err
    lines = (source / "p_two.jsonl").read_text().splitlines()
    lines_b = (source / "p_two.jsonl").read_bytes().splitlines(keepends=True)
    (source / "p_two.jsonl").write_text("\n".join(lines[:150] + lines[151:]) + "\n")
    with pytest.raises(SystemExit):
        blimp.main(["--source", str(source), "--output", str(out)])
    assert "p_two.jsonl: pairID 150 is missing" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 60       # the earlier file is kept
    (source / "p_two.jsonl").write_bytes(b"".join(lines_b[:3]) + b"\xff\xfe{}\n")
    with pytest.raises(SystemExit):
        blimp.main(["--source", str(source), "--output", str(out)])
    err = capsys.readouterr().err
    assert "p_two.jsonl:4: not valid UTF-8" in err and "Traceback" not in err, err
    assert len(out.read_text().splitlines()) == 60


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
