"""Pseudo-log-likelihood scoring against a direct computation with transformers'
BertForMaskedLM on the same weights, both variants, a batch of mixed lengths."""
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert.pipelines import load_pipeline_model
from minibert.scoring import ScoringError, masked_copies, score_texts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import tiny_mlm_run  # noqa: E402

TEXTS = ["the dogs near the house bark .", "the dogs near the house barks .",
         "unsurveyed hinterlands stretched northward", "a cat", "she slept ."]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_mlm_run(tmp_path_factory.mktemp("score") / "pretrain", seed=3)


def reference_pll(hf, tok, text: str, word_l2r: bool) -> tuple[float, list[float]]:
    """One masked copy at a time through transformers' BertForMaskedLM (no batching)."""
    import torch
    enc = tok(text)
    ids, wids = enc["input_ids"], enc.word_ids()
    scores = []
    for t, w in enumerate(wids):
        if w is None:
            continue
        row = list(ids)
        row[t] = tok.mask_token_id
        if word_l2r:
            u = t + 1
            while u < len(ids) and wids[u] == w:
                row[u] = tok.mask_token_id
                u += 1
        with torch.no_grad():
            logits = hf(torch.tensor([row])).logits[0, t].double()
        scores.append(float(torch.log_softmax(logits, -1)[ids[t]]))
    return sum(scores), scores


@pytest.mark.parametrize("method", ["pll", "pll-word-l2r"])
def test_pll_equals_transformers_masked_lm(run, method, tmp_path):
    transformers = pytest.importorskip("transformers")
    from minibert.hf import save_hf_directory
    model, tok, _ = load_pipeline_model("fill-mask", run)
    d = save_hf_directory(model, tmp_path / "hf", run / "vocab.txt")
    hf = transformers.BertForMaskedLM.from_pretrained(str(d)).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(d))
    got = score_texts(model, tok, TEXTS, method=method, batch_size=7, per_token=True)
    for text, g in zip(TEXTS, got):
        total, per = reference_pll(hf, hf_tok, text, method == "pll-word-l2r")
        assert g["score"] == pytest.approx(total, abs=1e-4)
        assert g["tokens"] == len(per)
        np.testing.assert_allclose([s for _, s in g["token_scores"]], per, atol=1e-5)
        assert [p for p, _ in g["token_scores"]] == hf_tok.tokenize(text)


def test_word_l2r_masks_the_later_pieces_of_the_same_word_only():
    ids = [2, 10, 11, 12, 13, 3]                    # [CLS] w0 w1a w1b w1c [SEP]
    wids = [None, 0, 1, 1, 1, None]
    rows = masked_copies(ids, wids, 4, "pll-word-l2r")
    assert [t for _, t in rows] == [1, 2, 3, 4]
    assert rows[1][0] == [2, 10, 4, 4, 4, 3]        # w1's first piece: its later pieces too
    assert rows[2][0] == [2, 10, 11, 4, 4, 3]
    assert rows[3][0] == [2, 10, 11, 12, 4, 3]      # the last piece: itself only
    assert [r for r, _ in masked_copies(ids, wids, 4, "pll")][1] == [2, 10, 4, 12, 13, 3]


def test_a_sentence_that_cannot_be_scored_is_an_error(run):
    model, tok, _ = load_pipeline_model("fill-mask", run)
    with pytest.raises(ScoringError, match=r"text 2: .* gives no token"):
        score_texts(model, tok, ["a cat", "   "])
    with pytest.raises(ScoringError, match="only \\[UNK\\]"):
        score_texts(model, tok, ["\u2603\u2603"])
    with pytest.raises(ScoringError, match="unknown method"):
        score_texts(model, tok, ["a cat"], method="ppl")
    with pytest.raises(ScoringError, match="more than the 64 allowed"):
        score_texts(model, tok, ["word " * 70])


def test_score_command_writes_json_lines_and_refuses_bad_input(run, tmp_path, capsys):
    import json
    from minibert.__main__ import main
    model, tok, _ = load_pipeline_model("fill-mask", run)
    src = tmp_path / "s.txt"
    src.write_text("\n".join(TEXTS[:3]) + "\n\n")
    out = tmp_path / "scores.jsonl"
    assert main(["score", str(run), "--input", str(src), "--output", str(out), "--method",
                 "pll", "--no-progress"]) == 0
    got = [json.loads(l) for l in out.read_text().splitlines()]
    want = score_texts(model, tok, TEXTS[:3], method="pll")
    assert [g["text"] for g in got] == TEXTS[:3]
    np.testing.assert_allclose([g["score"] for g in got], [w["score"] for w in want],
                               atol=1e-6)
    for argv, msg in ((["score", str(run), "  "], "gives no token"),
                      (["score", str(run)], "give TEXT arguments or --input"),
                      (["score", str(tmp_path / "none"), "a cat"], "not a Hugging Face")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and msg in err and "Traceback" not in err, err


def test_albert_pll_equals_transformers_masked_lm(tmp_path):
    transformers = pytest.importorskip("transformers")
    from minibert.albert import AlbertConfig, AlbertForPreTraining
    from minibert.hf import save_hf_directory
    from helpers import UNCASED_VOCAB as VOCAB
    config = AlbertConfig(vocab_size=30522, embedding_size=8, hidden_size=16,
                          num_hidden_layers=2, num_hidden_groups=2, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=64)
    d = save_hf_directory(AlbertForPreTraining(config, seed=4), tmp_path / "albert", VOCAB)
    model, tok, _ = load_pipeline_model("fill-mask", d)
    hf = transformers.AlbertForMaskedLM.from_pretrained(str(d)).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(d))
    for g, text in zip(score_texts(model, tok, TEXTS[:3], batch_size=5), TEXTS[:3]):
        assert g["score"] == pytest.approx(reference_pll(hf, hf_tok, text, True)[0], abs=1e-4)
