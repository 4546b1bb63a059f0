"""``python -m minibert explain``, the explanation page, ``Pipeline.explain`` and the PNG.

The models are tiny Hugging Face directories with random weights (written by
minibert.hf.save_hf_directory): a sentiment classifier with labels neg / pos, a masked
LM, a tagger, an encoder without a head and a question-answering model.
"""
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert import BertConfig
from minibert.__main__ import main
from minibert.attribution import AttributionError
from minibert.explain_page import render_page
from minibert.heads import (BertForQuestionAnswering, BertForSequenceClassification,
                            BertForTokenClassification)
from minibert.hf import save_hf_directory
from minibert.modeling import BertForPreTraining, BertModel
from minibert.pipelines import pipeline

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from helpers import WORDS  # noqa: E402

TEXT = "the acting was good , the plot was dull ."


def config(**kw):
    return BertConfig(vocab_size=5 + len(WORDS), hidden_size=16, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=32, max_position_embeddings=32,
                      initializer_range=0.3, **kw)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    made = {}
    for name, model, labels in (
            ("classifier", BertForSequenceClassification(config(), seed=1), {0: "neg", 1: "pos"}),
            ("tagger", BertForTokenClassification(config(num_labels=3), seed=2),
             {0: "O", 1: "B-X", 2: "I-X"}),
            ("mlm", BertForPreTraining(config(), seed=3, seq_relationship_head=False), None),
            ("encoder", BertModel(config(), seed=4), None),
            ("qa", BertForQuestionAnswering(config(), seed=5), None)):
        made[name] = save_hf_directory(model, root / name, vocab, id2label=labels)
    return made


def run(*argv) -> int:
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


def test_page_of_a_classifier(models, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert run("explain", models["classifier"], TEXT, "--output", out, "--steps", 16) == 0
    page = out.read_text(encoding="utf-8")
    assert "completeness gap" in capsys.readouterr().err
    for piece in ["[CLS]", "acting", "good", "plot", "dull", "[SEP]"]:
        assert f">{piece}</span>" in page
    assert 'id="attention-view"' in page and 'id="rollout-view"' in page
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)   # nothing loaded
    assert "http://" not in page and "https://" not in page
    data = json.loads(re.search(r'id="explanation-data">(.*?)</script>', page, re.S).group(1))
    assert data["tokens"][0] == "[CLS]" and len(data["attentions"]) == 2


def test_methods_targets_and_png(models, tmp_path):
    for method in ("grad-x-input", "rollout"):
        assert run("explain", models["classifier"], TEXT, "--method", method, "--target", "neg",
                   "--output", tmp_path / f"{method}.html") == 0
        assert "Why the model said neg" in (tmp_path / f"{method}.html").read_text()
    png = tmp_path / "page.png"
    assert run("explain", models["classifier"], TEXT, "--format", "png", "--steps", 8,
               "--output", png) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run("explain", models["mlm"], "the plot was [MASK] .", "--target", "dull",
               "--steps", 8, "--output", tmp_path / "mlm.html") == 0
    assert run("explain", models["tagger"], TEXT, "--position", 2, "--steps", 8,
               "--output", tmp_path / "tag.html") == 0


@pytest.mark.parametrize("argv,message", [
    (["classifier", TEXT, "--target", "happy"], "unknown label 'happy'; the model's labels are "
                                                "neg, pos"),
    (["classifier", "  "], "the text is empty"),
    (["mlm", "the plot was dull"], r"one \[MASK\] prediction: the text has none"),
    (["encoder", TEXT], "neither a fine-tuned classifier nor a masked LM"),
    (["qa", TEXT], "a question-answering model; explain needs"),
    (["classifier", TEXT, "--steps", "1"], "--steps: expected an integer >= 2"),
    (["classifier", TEXT, "--method", "shap"], "--method: invalid choice"),
    (["tagger", TEXT, "--position", "40"], r"position must be a word piece in \[1, "),
])
def test_bad_input_is_one_error_line(models, tmp_path, capsys, argv, message):
    argv[0] = models[argv[0]]
    assert run("explain", *argv, "--output", tmp_path / "p.html") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert re.search(message, err[-1]) and [e for e in err if "error:" in e] == err[-1:]
    assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "p.html").exists()


def test_pipeline_explain(models):
    pipe = pipeline("text-classification", models["classifier"])
    e = pipe.explain(TEXT, steps=32)
    assert e.target_label == pipe(TEXT)[0]["label"]
    assert e.probability == pytest.approx(pipe(TEXT)[0]["score"], abs=1e-5)
    assert abs(e.gap) < 1e-3 and e.scores.dtype == np.float64
    assert e.words == TEXT.split() and len(e.word_scores) == len(e.words)
    with pytest.raises(AttributionError, match="has no head to explain"):
        pipeline("feature-extraction", models["classifier"]).explain(TEXT)
    with pytest.raises(AttributionError, match="one text"):
        pipe.explain([TEXT])


def test_page_escapes_the_text(models):
    pipe = pipeline("text-classification", models["classifier"])
    e = pipe.explain("the plot </script><b>was</b> good", method="rollout")
    page = render_page(e)
    assert "</script><b>" not in page and "&lt;/script&gt;" in page


def test_finetune_writes_pages_for_dev_rows(dataset, pretrained_run, tmp_path, capsys):
    import finetune
    out = tmp_path / "ft"
    assert finetune.main(["--init", str(pretrained_run), "--data", str(dataset),
                          "--output-dir", str(out), "--max-steps", "2", "--batch-size", "8",
                          "--max-seq-length", "16", "--no-progress", "--explain-dev", "2"]) == 0
    pages = sorted((out / "explain").glob("*.html"))
    assert [p.name for p in pages] == ["dev-1.html", "dev-2.html"]
    assert "integrated gradients" in pages[0].read_text(encoding="utf-8")
    assert "wrote " + str(pages[0]) in capsys.readouterr().out
    with pytest.raises(SystemExit):
        finetune.main(["--init", str(pretrained_run), "--data", str(dataset), "--task",
                       "token-classification", "--explain-dev", "1"])
    assert "--explain-dev: pages of dev rows" in capsys.readouterr().err
