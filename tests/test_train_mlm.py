"""End-to-end checks of train_mlm.py on a small slice of the embedded corpus."""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import train_mlm  # noqa: E402
from minibert.checkpoint import load_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The first 40 chapters of Moby-Dick from data/, as its own corpus file."""
    text = (ROOT / "data" / "pretrain" / "en" / "moby_dick.txt").read_text(encoding="utf-8")
    docs = text.split("\n\n")[:40]
    path = tmp_path_factory.mktemp("corpus") / "moby40.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def args_for(corpus, out, *extra):
    return ["--corpus", str(corpus), "--output-dir", str(out), "--vocab-size", "400",
            "--preset", "tiny", "--hidden-size", "32", "--num-hidden-layers", "2",
            "--max-seq-length", "32", "--batch-size", "4", "--max-steps", "8",
            "--log-every", "1", "--eval-every", "4", "--save-every", "4",
            "--eval-fraction", "0.1", "--eval-instances", "16", "--no-progress", *extra]


def records(out, kind):
    lines = (Path(out) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


CURVE_KEYS = ("step", "epoch", "lr", "loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc",
              "grad_norm")


def curve(out):
    return [{k: r[k] for k in CURVE_KEYS} for r in records(out, "train")]


def test_runs_and_writes_everything(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_mlm.main(args_for(corpus, out)) == 0
    for name in ("vocab.txt", "checkpoint.npz", "metrics.jsonl", "summary.json", "config.json"):
        assert (out / name).is_file(), name
    train = records(out, "train")
    assert [r["step"] for r in train] == list(range(1, 9))
    assert all(math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 for r in train)
    evals = records(out, "eval")
    assert [r["step"] for r in evals] == [4, 8]
    assert all(0 <= r["mlm_acc"] <= 1 and 0 <= r["nsp_acc"] <= 1 for r in evals)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["eval_mlm_loss"] == evals[-1]["mlm_loss"]
    assert 0.5 <= summary["nsp_majority"] <= 1
    assert all(r["nsp_majority"] == summary["nsp_majority"] for r in evals)
    ckpt = load_checkpoint(out / "checkpoint.npz")
    assert ckpt["trainer"]["step"] == 8 and ckpt["config"].hidden_size == 32
    assert "unigram baseline" in capsys.readouterr().out


def test_resume_after_a_crash_continues_the_same_curve(corpus, tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    assert train_mlm.main(args_for(corpus, straight)) == 0

    crashed = tmp_path / "crashed"
    real_save = train_mlm.save_checkpoint

    def save_then_crash(path, model, optimizer, state):
        real_save(path, model, optimizer, state)
        if state["step"] == 4:
            raise KeyboardInterrupt("simulated crash after the step-4 checkpoint")

    monkeypatch.setattr(train_mlm, "save_checkpoint", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        train_mlm.main(args_for(corpus, crashed))
    monkeypatch.setattr(train_mlm, "save_checkpoint", real_save)
    assert train_mlm.main(args_for(corpus, crashed, "--resume")) == 0

    assert curve(crashed) == curve(straight)
    a, b = load_checkpoint(straight / "checkpoint.npz"), load_checkpoint(crashed / "checkpoint.npz")
    for k, v in a["model"].items():
        np.testing.assert_array_equal(v, b["model"][k], err_msg=k)


def test_resume_refuses_a_different_model_or_data_setting(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_mlm.main(args_for(corpus, out)) == 0
    with pytest.raises(SystemExit) as e:
        train_mlm.main(args_for(corpus, out, "--resume", "--hidden-size", "64"))
    assert e.value.code == 2
    assert "another model config: hidden_size: checkpoint has 32, this run has 64" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_mlm.main(args_for(corpus, out, "--resume", "--batch-size", "8"))
    assert "--batch-size: checkpoint 4, now 8" in capsys.readouterr().err


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(
        corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    real_forward = train_mlm.BertForPreTraining.forward
    calls = {"n": 0}

    def forward(self, *a, **kw):
        result = real_forward(self, *a, **kw)
        if self.training:
            calls["n"] += 1
            if calls["n"] == 6:  # the 6th training step (step index 5)
                result.loss = result.loss * np.nan
        return result

    monkeypatch.setattr(train_mlm.BertForPreTraining, "forward", forward)
    with pytest.raises(SystemExit) as e:
        train_mlm.main(args_for(corpus, out))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "loss is nan at step 5" in err and "checkpoint.npz" in err
    assert load_checkpoint(out / "checkpoint.npz")["trainer"]["step"] == 4


@pytest.mark.parametrize("content, message", [
    (None, "not found"),
    ("", "empty"),
    ("One sentence.\nAnother sentence.\n", "blank line"),
    (b"Fine line.\n\nBad \xff byte here.\n", ":3"),
])
def test_bad_corpus_gets_a_clear_error(tmp_path, capsys, content, message):
    path = tmp_path / "corpus.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as e:
        train_mlm.main(["--corpus", str(path), "--output-dir", str(tmp_path / "out"),
                        "--vocab-size", "100", "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err.lower() or message in err, err
    if content is not None:
        assert "corpus.txt" in err


def test_a_corpus_of_one_sentence_documents_gets_an_nsp_warning(corpus, tmp_path, capsys):
    assert train_mlm.main(args_for(corpus, tmp_path / "docs")) == 0
    assert "single sentence" not in capsys.readouterr().err
    # The same sentences, each made its own document.
    lines = [l for l in corpus.read_text(encoding="utf-8").splitlines() if l.strip()]
    split = tmp_path / "one_sentence_docs.txt"
    split.write_text("\n\n".join(lines[:400]) + "\n", encoding="utf-8")
    assert train_mlm.main(args_for(split, tmp_path / "sentences")) == 0
    err = capsys.readouterr().err
    assert "warning: 100% of the" in err and "single sentence" in err


def test_sequence_longer_than_positions_is_rejected(corpus, tmp_path, capsys):
    with pytest.raises(SystemExit):
        train_mlm.main(args_for(corpus, tmp_path / "o", "--max-seq-length", "600"))
    assert "--max-seq-length 600 exceeds max_position_embeddings 512" in capsys.readouterr().err


def test_help_lists_presets(capsys):
    with pytest.raises(SystemExit) as e:
        train_mlm.main(["--help"])
    assert e.value.code == 0
    assert "mini (4 layers x 256 hidden)" in capsys.readouterr().out


def test_without_held_out_documents_training_still_runs(corpus, tmp_path):
    out = tmp_path / "run"
    assert train_mlm.main(args_for(corpus, out, "--eval-fraction", "0")) == 0
    assert records(out, "eval") == [] and len(records(out, "train")) == 8
    assert "eval_mlm_loss" not in json.loads((out / "summary.json").read_text())


def test_a_given_vocab_is_copied_into_the_run(corpus, tmp_path):
    first = tmp_path / "first"
    assert train_mlm.main(args_for(corpus, first, "--max-steps", "1")) == 0
    given = tmp_path / "given_vocab.txt"
    given.write_bytes((first / "vocab.txt").read_bytes())
    second = tmp_path / "second"
    assert train_mlm.main(args_for(corpus, second, "--max-steps", "1", "--vocab", str(given))) == 0
    assert (second / "vocab.txt").read_bytes() == given.read_bytes()


def test_init_checkpoint_starts_a_new_run_from_trained_weights(corpus, tmp_path, capsys):
    first = tmp_path / "first"
    assert train_mlm.main(args_for(corpus, first, "--max-steps", "2")) == 0
    trained = load_checkpoint(first / "checkpoint.npz")
    # lr 0: the new run's weights stay what it loaded; the architecture options given here
    # (hidden size 32 by args_for) are the checkpoint's, and the vocab comes from beside it
    second = tmp_path / "second"
    assert train_mlm.main(args_for(corpus, second, "--max-steps", "1", "--lr", "0",
                                   "--init-checkpoint", str(first))) == 0
    again = load_checkpoint(second / "checkpoint.npz")
    assert again["trainer"]["step"] == 1
    for k, v in trained["model"].items():
        np.testing.assert_array_equal(again["model"][k], v, err_msg=k)
    assert (second / "vocab.txt").read_bytes() == (first / "vocab.txt").read_bytes()
    # such a run resumes with the same arguments
    assert train_mlm.main(args_for(corpus, second, "--max-steps", "1", "--lr", "0",
                                   "--init-checkpoint", str(first), "--resume")) == 0
    with pytest.raises(SystemExit):
        train_mlm.main(args_for(corpus, tmp_path / "third", "--init-checkpoint", str(first),
                                "--no-lowercase"))
    assert "trained with lowercase=True" in capsys.readouterr().err
    # writing the new run over the one it starts from is refused, nothing is touched
    before = {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()}
    with pytest.raises(SystemExit):
        train_mlm.main(args_for(corpus, first, "--init-checkpoint", str(first)))
    assert "would overwrite it" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()} == before
    # another vocab of the same size would misalign the embeddings
    other = tmp_path / "other_vocab.txt"
    lines = (first / "vocab.txt").read_text(encoding="utf-8").split("\n")
    lines[10], lines[11] = lines[11], lines[10]
    other.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(SystemExit):
        train_mlm.main(args_for(corpus, tmp_path / "fourth", "--init-checkpoint", str(first),
                                "--vocab", str(other)))
    assert "differs from" in capsys.readouterr().err
