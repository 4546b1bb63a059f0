"""finetune.py --task token-classification / question-answering, freezing and the [CLS]
attention view, end to end on tiny models with real vocabularies and the shipped samples
cut to a few sentences / questions (minibert.finetuning.tasks)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert import BertConfig, BertForPreTraining
from minibert.checkpoint import load_checkpoint, save_checkpoint
from minibert.finetuning import read_conll
from minibert.finetuning.tasks import task_for_model
from minibert.runs import load_start

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import (BROWN, SQUAD, cut_tagging, kill_when_checkpointed, records,  # noqa: E402
                     run_ft, train_losses)

VOCABS = ROOT / "tests" / "data" / "tokenization"
NER = ROOT / "data" / "tag" / "zh" / "peoples_daily_ner"


def tiny_run(path: Path, vocab: Path, layers=2) -> Path:
    """A train_mlm.py-like run directory: a tiny BERT on a real vocabulary."""
    path.mkdir(parents=True)
    (path / "vocab.txt").write_bytes(vocab.read_bytes())
    n = len(vocab.read_text(encoding="utf-8").splitlines())
    config = BertConfig(vocab_size=n, hidden_size=16, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    save_checkpoint(path / "checkpoint.npz", BertForPreTraining(config, seed=1),
                    trainer_state={"args": {"lowercase": True}, "step": 0})
    return path


@pytest.fixture(scope="module")
def en_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("en") / "pretrain",
                    VOCABS / "bert-base-uncased-vocab.txt")


@pytest.fixture(scope="module")
def zh_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("zh") / "pretrain",
                    VOCABS / "bert-base-chinese-vocab.txt", layers=1)


@pytest.fixture
def pos_data(tmp_path):
    return cut_tagging(BROWN, tmp_path / "pos", 24, 6)


@pytest.fixture
def qa_data(tmp_path):
    d = tmp_path / "qa"
    d.mkdir()
    for split, n in (("train", 12), ("dev", 6)):
        lines = (SQUAD / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()[:n]
        (d / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def fails(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        run_ft(*argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error:" in err and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------ token classification
def test_pos_tagging_end_to_end_and_model_predict(en_run, pos_data, tmp_path, capsys):
    out = tmp_path / "pos_run"
    text = "The jury said the election was fine ."
    assert run_ft("--task", "token-classification", "--init", en_run, "--data", pos_data,
                  "--output-dir", out, "--epochs", "2", "--batch-size", "8", "--lr", "3e-3",
                  "--max-seq-length", "48", "--log-every", "1", "--predict", text,
                  "--plot-attention", text) == 0
    printed = capsys.readouterr().out
    assert re.search(r"most-frequent-tag baseline .* on dev: accuracy 0\.\d{4}\n", printed)
    for f in ("checkpoint.npz", "best_model.npz", "labels.json", "summary.json",
              "predictions_dev.tsv", "predictions_test.tsv", "training_curves.png",
              "attention.png", "attention_cls.png"):
        assert (out / f).is_file(), f
    assert (out / "attention_cls.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((out / "summary.json").read_text())
    tags = json.loads((out / "labels.json").read_text())
    assert summary["task"] == "token-classification" and summary["labels"] == tags
    assert summary["metric"] == "accuracy"          # POS tags are no entity tags
    assert "f1" not in summary["dev"] and 0 <= summary["dev"]["accuracy"] <= 1
    base = summary["most_frequent_tag_baseline"]["dev"]
    dev = read_conll(pos_data / "dev.tsv")
    assert summary["dev"]["n_words"] == base["n_words"] == sum(len(s.words) for s in dev)
    train = records(out)
    steps = summary["steps"]
    assert len(train) == steps and all(0 <= r["accuracy"] <= 1 for r in train)
    assert [r["step"] for r in records(out, "eval")] == [steps // 2, steps]
    # predictions: CoNLL word, gold, predicted; sentences as in the dev file
    blocks = (out / "predictions_dev.tsv").read_text().strip("\n").split("\n\n")
    assert len(blocks) == len(dev)
    rows = [l.split("\t") for l in blocks[0].splitlines()]
    assert [r[0] for r in rows] == dev[0].words and [r[1] for r in rows] == dev[0].tags
    assert all(r[2] in tags for r in rows)
    # --predict: the token-classification pipeline's words (POS tags have no O: every
    # word, with its character span), the same from the saved model alone
    line = [l for l in printed.splitlines() if l.startswith("[")][0]
    words = json.loads(line)
    assert [w["word"] for w in words] == text.split()
    assert all(text[w["start"]:w["end"]] == w["word"] and w["entity"] in tags
               and 0 < w["score"] <= 1 for w in words)
    assert run_ft("--model", out, "--predict", text) == 0
    assert capsys.readouterr().out.strip() == line
    pre = load_start(out)
    assert pre.architecture == "BertForTokenClassification" and pre.labels == tags
    assert task_for_model(pre).name == "token-classification"


def test_chinese_ner_entity_metrics_char_predict_and_long_sentence_warning(zh_run, tmp_path,
                                                                          capsys):
    data = cut_tagging(NER, tmp_path / "ner", 30, 6)
    out = tmp_path / "ner_run"
    assert run_ft("--task", "token-classification", "--init", zh_run, "--data", data,
                  "--output-dir", out, "--epochs", "1", "--batch-size", "16", "--lr", "1e-2",
                  "--max-seq-length", "24", "--label-all-tokens") == 0
    cap = capsys.readouterr()
    # sentences longer than 22 characters are cut into windows: the line names the file
    assert re.search(rf"warning: {re.escape(str(data / 'train.tsv'))}: \d+ sentence\(s\) "
                     r"longer than max_seq_length=24 were cut", cap.err)
    assert "entity P" in cap.out                    # the baseline's entity scores
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric"] == "f1"                # auto: entity F1 for BIO tags
    for split in ("dev", "test"):
        m = summary[split]
        assert {"accuracy", "precision", "recall", "f1", "per_type"} <= set(m)
        assert set(m["per_type"]) <= {"PER", "LOC", "ORG"}
    assert json.loads((out / "args.json").read_text())["label_all_tokens"] is True
    assert run_ft("--model", out, "--predict", "江泽民在北京") == 0
    words = json.loads(capsys.readouterr().out)     # one tag per character, O left out
    assert all(w["end"] == w["start"] + 1 and "江泽民在北京"[w["start"]] == w["word"]
               and w["entity"] in summary["labels"] and w["entity"] != "O" for w in words)


# ------------------------------------------------------------------ question answering
def test_question_answering_end_to_end_and_model_predict(en_run, qa_data, tmp_path, capsys):
    out = tmp_path / "qa_run"
    assert run_ft("--task", "question-answering", "--init", en_run, "--data", qa_data,
                  "--output-dir", out, "--epochs", "1", "--batch-size", "8", "--lr", "1e-3",
                  "--max-seq-length", "64", "--doc-stride", "16", "--max-answer-length", "10",
                  "--export-hf", tmp_path / "hf") == 0
    printed = capsys.readouterr().out
    assert re.search(r"train 12 questions -> \d+ features, dev 6 -> \d+", printed)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "question-answering" and summary["labels"] is None
    assert summary["metric"] == "f1" and summary["test"] is None   # no test.jsonl
    assert set(summary["dev"]) >= {"exact_match", "f1", "n", "loss"}
    assert summary["dev"]["n"] == 6
    preds = json.loads((out / "predictions_dev.json").read_text())
    contexts = {r["id"]: r["context"] for r in map(json.loads, (qa_data / "dev.jsonl")
                                                   .read_text().splitlines())}
    assert set(preds) == set(contexts)
    assert all(p in contexts[k] for k, p in preds.items())      # spans of the context
    rows = (out / "predictions_dev.tsv").read_text().splitlines()
    assert rows[0] == "line\tid\tscore\texact_match\tf1\tpredicted\tgold" and len(rows) == 7
    assert {"start_accuracy", "end_accuracy", "span_accuracy"} <= set(records(out)[-1])
    # the saved model answers from a context; its settings (doc stride ...) came with it
    context = "The Normans were led by Rollo. They settled in Normandy in 911."
    assert run_ft("--model", out, "--predict", "Who led the Normans?", context) == 0
    answer = json.loads(capsys.readouterr().out)
    assert context[answer["start"]:answer["end"]] == answer["answer"]
    assert 0 <= answer["score"] <= 1
    assert load_start(tmp_path / "hf").architecture == "BertForQuestionAnswering"
    err = fails(capsys, "--model", out, "--predict", "Who led the Normans?")
    assert "QUESTION CONTEXT" in err


# ------------------------------------------------------------------ resume
def test_tagging_killed_and_resumed_reproduces_the_loss_curve(en_run, tmp_path):
    data = cut_tagging(BROWN, tmp_path / "pos", 48, 4)
    base = [sys.executable, str(ROOT / "finetune.py"), "--task", "token-classification",
            "--init", str(en_run), "--data", str(data), "--max-seq-length", "48",
            "--batch-size", "8", "--epochs", "3", "--log-every", "2", "--lr", "3e-3",
            "--no-progress", "--group-by-length"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    subprocess.run(base + ["--output-dir", str(full)], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert kill_when_checkpointed(base + ["--output-dir", str(cut)], cut / "checkpoint.npz"), \
        "the run finished before it could be killed"
    subprocess.run(base + ["--output-dir", str(cut), "--resume"], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert train_losses(cut / "metrics.jsonl") == train_losses(full / "metrics.jsonl")
    assert json.loads((cut / "summary.json").read_text())["dev"] == \
        json.loads((full / "summary.json").read_text())["dev"]


# ------------------------------------------------------------------ freezing
def test_freezing_keeps_frozen_weights_and_trains_the_rest(en_run, pos_data, tmp_path, capsys):
    out = tmp_path / "frozen"
    assert run_ft("--task", "token-classification", "--init", en_run, "--data", pos_data,
                  "--output-dir", out, "--epochs", "1", "--batch-size", "8", "--lr", "1e-2",
                  "--max-seq-length", "48", "--freeze-embeddings", "--freeze-layers", "1") == 0
    assert "(frozen: embeddings + layers 0-0;" in capsys.readouterr().out
    start = load_checkpoint(en_run / "checkpoint.npz")["model"]
    for name in ("best_model.npz", "checkpoint.npz"):
        trained = load_checkpoint(out / name)["model"]
        for k, v in trained.items():
            if k.startswith(("bert.embeddings.", "bert.encoder.layer.0.")):
                assert np.array_equal(v, start[k]), k                  # frozen: untouched
            elif k.startswith(("bert.encoder.layer.1.", "classifier.")) and "bias" not in k:
                assert not np.array_equal(v, start.get(k, np.zeros_like(v))), k  # trained
    summary = json.loads((out / "summary.json").read_text())
    assert summary["freeze_embeddings"] and summary["freeze_layers"] == 1
    n_layer = sum(v.size for k, v in start.items() if k.startswith("bert.encoder.layer.1."))
    n_head = sum(v.size for k, v in trained.items() if k.startswith("classifier."))
    assert summary["trainable_parameters"] == n_layer + n_head
    # freezing is part of the run: a resume with another value is refused
    err = fails(capsys, "--resume", out, "--freeze-layers", "0")
    assert "--freeze-layers: checkpoint 1, now 0" in err
    # more layers than the model has
    err = fails(capsys, "--task", "token-classification", "--init", en_run, "--data", pos_data,
                "--output-dir", tmp_path / "bad", "--freeze-layers", "3")
    assert "--freeze-layers 3: the model has 2 encoder layers; give 0 to 2" in err


# ------------------------------------------------------------------ bad input
def test_bad_input_gets_error_lines(en_run, pos_data, qa_data, tmp_path, capsys):
    tag = ("--task", "token-classification", "--init", en_run, "--output-dir", tmp_path / "o")
    # a dev tag that a --labels file does not have: data file and line, and the file
    lines = (pos_data / "dev.tsv").read_text().splitlines()
    lines[2] = lines[2].split("\t")[0] + "\tNEWTAG"
    (pos_data / "dev.tsv").write_text("\n".join(lines) + "\n")
    known = sorted({t for s in read_conll(pos_data / "train.tsv") for t in s.tags})
    (tmp_path / "tags.txt").write_text("\n".join(known) + "\n")
    err = fails(capsys, *tag, "--data", pos_data, "--labels", tmp_path / "tags.txt")
    assert re.search(r"dev\.tsv:3: tag 'NEWTAG' is not in --labels .*tags\.txt", err)
    # entity metrics for part-of-speech tags
    err = fails(capsys, *tag, "--data", BROWN, "--metric", "f1")
    assert "--metric f1: the tags" in err and "are not entity tags" in err
    err = fails(capsys, *tag, "--data", BROWN, "--metric", "exact_match")
    assert "--metric exact_match: token-classification reports accuracy" in err
    qa = ("--task", "question-answering", "--init", en_run, "--output-dir", tmp_path / "q",
          "--max-seq-length", "64", "--doc-stride", "16")
    good = (qa_data / "train.jsonl").read_text().splitlines()
    (qa_data / "train.jsonl").write_text("\n".join([good[0], good[1][:-5]] + good[2:]) + "\n")
    err = fails(capsys, *qa, "--data", qa_data)
    assert re.search(r"train\.jsonl:2:\d+: malformed JSON", err)
    rec = json.loads(good[1])
    rec["answers"]["answer_start"][0] += 1
    (qa_data / "train.jsonl").write_text("\n".join([good[0], json.dumps(rec)] + good[2:]) + "\n")
    err = fails(capsys, *qa, "--data", qa_data)
    assert re.search(r"train\.jsonl:2: \(id '\w+'\) answer 0: text .* does not match the "
                     r"context at answer_start", err)
    (qa_data / "train.jsonl").write_text("\n".join(good) + "\n")
    err = fails(capsys, *qa, "--data", qa_data, "--max-seq-length", "24")
    assert "doc_stride" in err                      # no room for windows: what to change
    err = fails(capsys, *qa, "--data", qa_data, "--predict", "only a question")
    assert "question-answering takes QUESTION CONTEXT" in err
    assert not (tmp_path / "q" / "checkpoint.npz").exists()


def test_a_tag_only_dev_has_is_reported_not_fatal(en_run, pos_data, tmp_path, capsys):
    """Small budgets: the tag set comes from all splits; a dev tag train never has gets a
    class id, a note on stderr and a record in summary.json. A --labels file sets the
    order."""
    lines = (pos_data / "dev.tsv").read_text().splitlines()
    lines[2] = lines[2].split("\t")[0] + "\tNEWTAG"
    (pos_data / "dev.tsv").write_text("\n".join(lines) + "\n")
    common = ("--task", "token-classification", "--init", en_run, "--data", pos_data,
              "--epochs", "1", "--batch-size", "8", "--max-seq-length", "48")
    out = tmp_path / "all"
    assert run_ft(*common, "--output-dir", out) == 0
    err = capsys.readouterr().err
    assert re.search(r"dev: tag\(s\) never in the train split, so never learnt: "
                     r"'NEWTAG' \(.*dev\.tsv:3\)", err)
    train_tags = {t for s in read_conll(pos_data / "train.tsv") for t in s.tags}
    labels = json.loads((out / "labels.json").read_text())
    assert labels == sorted(train_tags | {"NEWTAG"})
    summary = json.loads((out / "summary.json").read_text())
    assert summary["label_source"] == "all splits"
    assert summary["labels_unseen_in_train"] == {"dev": ["NEWTAG"]}
    assert summary["labels"] == labels
    # a labels file: its order, and its name in the summary
    order = ["NEWTAG", "ZZZ", *sorted(train_tags, reverse=True)]
    (tmp_path / "tags.txt").write_text("\n".join(order) + "\n\n")
    out = tmp_path / "file"
    assert run_ft(*common, "--output-dir", out, "--labels", tmp_path / "tags.txt") == 0
    assert json.loads((out / "labels.json").read_text()) == order
    summary = json.loads((out / "summary.json").read_text())
    assert summary["label_source"] == str(tmp_path / "tags.txt")
    # question answering has no label set
    with pytest.raises(SystemExit):
        run_ft("--task", "question-answering", "--init", en_run, "--labels", tmp_path / "x")
    assert "--labels: question-answering has no label set" in capsys.readouterr().err


# ------------------------------------------------------------------ starting points
def test_task_of_a_saved_model_and_head_reuse(en_run, tmp_path):
    from minibert.finetuning.models import model_from_start
    from minibert.heads import BertForSequenceClassification, BertForTokenClassification
    pre = load_start(en_run)
    assert pre.architecture is None and task_for_model(pre) is None   # a pretraining run
    clf, _ = model_from_start(pre, BertForSequenceClassification, ["a", "b"], seed=3)
    save_checkpoint(tmp_path / "old.npz", clf, trainer_state={"labels": ["a", "b"]})
    (tmp_path / "vocab.txt").write_bytes((en_run / "vocab.txt").read_bytes())
    old = load_start(tmp_path / "old.npz")     # written before the task was recorded
    assert old.architecture == "BertForSequenceClassification"
    assert task_for_model(old).name == "sequence-classification"
    # the same labels, another task: the sequence classifier's head is not reused
    tagger, report = model_from_start(old, BertForTokenClassification, ["a", "b"])
    assert "classifier.weight" in report["new"]
    again, report = model_from_start(old, BertForSequenceClassification, ["a", "b"])
    assert "classifier.weight" in report["loaded"]


def test_cls_attention_is_row_zero_averaged_over_heads(tmp_path):
    from minibert.viz import cls_attention, plot_cls_attention
    rng = np.random.default_rng(0)
    maps = [rng.dirichlet(np.ones(5), size=(1, 3, 5)) for _ in range(2)]   # (1, NH, T, T)
    cls = cls_attention(maps)
    assert cls.shape == (2, 5)
    np.testing.assert_allclose(cls[1], maps[1][0, :, 0, :].mean(0))
    np.testing.assert_allclose(cls.sum(1), 1.0)
    path = plot_cls_attention(maps, list("abcde"), tmp_path / "cls.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="4 tokens"):
        plot_cls_attention(maps, list("abcd"), tmp_path / "x.png")


def test_bench_transformers_peer_runs_the_same_recipe(en_run, pos_data, tmp_path, capsys):
    """bench/bench_finetune_tasks.py: transformers trained on the task's batches, evaluated
    with minibert's metric code (tiny model, one epoch)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from helpers import hf_copy, load_bench
    bench = load_bench("bench_finetune_tasks")
    hf_dir = hf_copy(en_run, tmp_path / "hf")
    assert bench.main(["--task", "token-classification", "--init", str(hf_dir), "--data",
                       str(pos_data), "--epochs", "1", "--batch-size", "8",
                       "--max-seq-length", "48", "--threads", "1"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["name"] == "transformers" and r["metric"] == "accuracy" and r["best_epoch"] == 1
    assert 0 <= r["dev"]["accuracy"] <= 1 and 0 <= r["test"]["accuracy"] <= 1
    assert r["baseline"]["dev"]["n_words"] == r["dev"]["n_words"]
