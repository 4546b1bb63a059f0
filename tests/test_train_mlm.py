"""End-to-end checks of train_mlm.py on a small slice of the embedded corpus."""
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
import train_mlm  # noqa: E402
from minibert.checkpoint import load_checkpoint  # noqa: E402
from minibert.modeling import BertForPreTraining  # noqa: E402
from helpers import records  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The first 40 chapters of Moby-Dick from data/, as its own corpus file."""
    text = (ROOT / "data" / "pretrain" / "en" / "moby_dick.txt").read_text(encoding="utf-8")
    docs = text.split("\n\n")[:40]
    path = tmp_path_factory.mktemp("corpus") / "moby40.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def args_for(corpus, out, *extra):
    """A small run's options; BERT's sentence pairs with NSP unless ``extra`` names another
    ``--objective`` (the last one given counts)."""
    return ["--objective", "mlm+nsp", "--corpus", str(corpus), "--output-dir", str(out),
            "--vocab-size", "400",
            "--preset", "tiny", "--hidden-size", "32", "--num-hidden-layers", "2",
            "--max-seq-length", "32", "--batch-size", "4", "--max-steps", "8",
            "--log-every", "1", "--eval-every", "4", "--save-every", "4",
            "--eval-fraction", "0.1", "--eval-instances", "16", "--eval-pairs-per-paradigm",
            "2", "--eval-blimp-per-paradigm", "1", "--no-progress", *extra]


CURVE_KEYS = ("step", "epoch", "lr", "loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc",
              "grad_norm")


def curve(out):
    return [{k: r[k] for k in CURVE_KEYS} for r in records(out, "train")]


def crash_after_checkpoint(monkeypatch, run, step=4):
    """Run ``run()`` with a Ctrl-C right after the checkpoint of ``step`` is saved (the
    job ends with exit status 130); the real save is put back afterwards."""
    from minibert import training
    real_save = training.save_checkpoint

    def save_then_crash(path, model, optimizer, state, **kw):
        real_save(path, model, optimizer, state, **kw)
        if state["step"] == step:
            raise KeyboardInterrupt(f"simulated crash after the step-{step} checkpoint")

    monkeypatch.setattr(training, "save_checkpoint", save_then_crash)
    with pytest.raises(SystemExit, match="130"):  # Ctrl-C's exit status
        run()
    monkeypatch.setattr(training, "save_checkpoint", real_save)


def straight_and_resumed(corpus, tmp_path, monkeypatch, *extra):
    """Two runs with the options ``extra``: one straight through, one stopped by a Ctrl-C
    after its step-4 checkpoint and resumed. Returns their directories."""
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    assert train_mlm.main(args_for(corpus, straight, *extra)) == 0
    crash_after_checkpoint(monkeypatch,
                           lambda: train_mlm.main(args_for(corpus, crashed, *extra)))
    assert train_mlm.main(args_for(corpus, crashed, *extra, "--resume")) == 0
    return straight, crashed


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
    printed = capsys.readouterr().out
    assert "unigram baseline" in printed
    # samples: the same held-out sentences at each evaluation, their masked word guessed
    samples = records(out, "samples")
    assert [r["step"] for r in samples] == [4, 8]
    texts = [s["text"] for s in samples[0]["samples"]]
    assert len(texts) == 3 and texts == [s["text"] for s in samples[1]["samples"]]
    for s in samples[-1]["samples"]:
        assert s["text"].count("[MASK]") == 1 and s["answer"].isalpha()
        probs = [p for _, p in s["top"]]
        assert len(probs) == 3 and probs == sorted(probs, reverse=True) and 0 < probs[0] <= 1
        assert f"(was: {s['answer']})" in printed
    # minimal pairs, ours and BLiMP dev: the model's macro accuracy at each evaluation,
    # the unigram and trigram floors on the training text once
    assert all(0 <= r["pairs_acc"] <= 100 and 0 <= r["blimp_acc"] <= 100 for r in evals)
    for probe in ("pairs", "blimp"):
        for floor in ("unigram", "trigram"):
            assert 0 <= summary[f"{probe}_{floor}_acc"] <= 100
            assert f"{probe} {floor} acc" in printed
    from minibert.evaluation.blimp import BLIMP_DEV
    from minibert.evaluation.minimal_pairs import PairsProbe, first_per_paradigm, read_pairs
    from minibert.pipelines import load_pipeline_model
    model, tok, _ = load_pipeline_model("fill-mask", out)
    for probe, path, n in (("pairs", ROOT / "data/minimal_pairs/en/pairs.jsonl", 24),
                           ("blimp", BLIMP_DEV, 67)):
        pairs = first_per_paradigm(read_pairs(path), n // 12 if probe == "pairs" else 1)
        assert len(pairs) == n
        assert summary[f"eval_{probe}_acc"] == pytest.approx(
            PairsProbe(pairs, tok)(model.eval()), abs=1e-9)
    # the last samples are what the saved model's fill-mask pipeline answers
    from minibert import pipeline
    filled = pipeline("fill-mask", out)(texts, top_k=3)
    assert [[t for t, _ in s["top"]] for s in samples[-1]["samples"]] == \
        [[r["token_str"] for r in f] for f in filled]


# a weight average and the warmup-stable-decay schedule, whose decay starts at step 7 of 8
EMA_WSD = ("--ema-decay", "0.9", "--lr-scheduler-type", "warmup_stable_decay")
# line-by-line sequences, a masking-rate schedule, no unmasking, two micro-batches a step
MASKING = ("--objective", "mlm", "--line-by-line", "--masked-lm-prob", "0.3",
           "--masked-lm-prob-end", "0.15", "--mask-replace-prob", "1",
           "--random-replace-prob", "0", "--gradient-accumulation-steps", "2")


def assert_same_checkpoints(a, b, name="checkpoint.npz"):
    """Every array of the two runs' checkpoints (weights, optimizer, raw weights and
    average) and their trainer records but the clock are equal."""
    a, b = load_checkpoint(a / name), load_checkpoint(b / name)
    for group in ("model", "optim", "train", "ema"):
        assert a[group].keys() == b[group].keys(), group
        for k, v in a[group].items():
            np.testing.assert_array_equal(v, b[group][k], err_msg=f"{group}/{k}")
    from minibert.runs import INVOCATION_ARGS
    ta, tb = ({**t["trainer"], "elapsed_s": 0, "args": {k: v for k, v in t["trainer"][
        "args"].items() if k not in INVOCATION_ARGS}} for t in (a, b))
    assert ta == tb


@pytest.mark.parametrize("extra", [(), EMA_WSD], ids=["default", "ema+wsd"])
def test_resume_after_a_crash_continues_the_same_curve(corpus, tmp_path, monkeypatch, extra):
    straight, crashed = straight_and_resumed(corpus, tmp_path, monkeypatch, *extra)
    assert curve(crashed) == curve(straight)
    assert [r["mlm_loss"] for r in records(crashed, "eval")] == \
        [r["mlm_loss"] for r in records(straight, "eval")]
    assert_same_checkpoints(straight, crashed)
    if extra:
        assert_same_checkpoints(straight, crashed, "checkpoint-stable.npz")
        assert load_checkpoint(crashed / "checkpoint-stable.npz")["trainer"]["step"] == 7


def test_resume_refuses_a_different_model_or_data_setting(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_mlm.main(args_for(corpus, out)) == 0
    with pytest.raises(SystemExit) as e:
        train_mlm.main(args_for(corpus, out, "--resume", "--hidden-size", "64"))
    assert e.value.code == 2
    assert "--hidden-size: checkpoint 32, now 64" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_mlm.main(args_for(corpus, out, "--resume", "--batch-size", "8"))
    assert "--batch-size: checkpoint 4, now 8" in capsys.readouterr().err


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(
        corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    real_forward = BertForPreTraining.forward
    calls = {"n": 0}

    def forward(self, *a, **kw):
        result = real_forward(self, *a, **kw)
        if self.training:
            calls["n"] += 1
            if calls["n"] >= 6:  # every training step from the 6th on
                result.loss = result.loss * np.nan
        return result

    monkeypatch.setattr(BertForPreTraining, "forward", forward)
    with pytest.raises(SystemExit) as e:
        train_mlm.main(args_for(corpus, out, "--max-nonfinite-steps", "2"))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "not finite in 2 steps in a row since step 6" in err and "checkpoint.npz (step 4)" in err
    assert load_checkpoint(out / "checkpoint.npz")["trainer"]["step"] == 4
    # the skipped steps left the parameters alone: the log shows them skipped, loss finite
    train = records(out, "train")
    assert [r["skipped_steps"] for r in train] == [0, 0, 0, 0, 0, 1]
    assert all(math.isfinite(r["loss"]) for r in train[:5]) and train[5]["loss"] is None


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
    with pytest.raises(SystemExit) as e:   # (NSP: the objective that needs 2 documents)
        train_mlm.main(["--corpus", str(path), "--output-dir", str(tmp_path / "out"),
                        "--vocab-size", "100", "--no-progress", "--objective", "mlm+nsp"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err.lower() or message in err, err
    if content is not None:
        assert "corpus.txt" in err


def test_a_one_document_corpus_gets_an_error_line_with_the_way_out(tmp_path, capsys):
    """The default recipe (one line per sequence) holds out whole documents too: a corpus
    without a blank line is one document, and the error says how to go on."""
    path = tmp_path / "corpus.txt"
    path.write_text("One sentence.\nAnother sentence.\n")
    with pytest.raises(SystemExit) as e:
        train_mlm.main(["--corpus", str(path), "--output-dir", str(tmp_path / "out"),
                        "--vocab-size", "100", "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("train_mlm.py: error: the corpus has 1 documents")
    assert "blank line" in err and "--eval-fraction 0" in err and "Traceback" not in err


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
    assert "was trained with lowercase=True" in capsys.readouterr().err
    # writing the new run over the one it starts from is refused, nothing is touched
    before = {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()}
    for overwrite in ((), ("--overwrite",)):  # refused for being its input, before all else
        with pytest.raises(SystemExit):
            train_mlm.main(args_for(corpus, first, "--init-checkpoint", str(first), *overwrite))
        assert f"is an input of this job (--init-checkpoint {first})" in capsys.readouterr().err
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


# ---------------------------------------------------------------- objectives, defects
@pytest.mark.parametrize("objective, task", [("mlm", None), ("mlm+sop", "sop")])
def test_other_objectives_pretrain_and_report_their_own_metrics(corpus, tmp_path, objective,
                                                                task):
    out = tmp_path / objective
    assert train_mlm.main(args_for(corpus, out, "--objective", objective)) == 0
    train = records(out, "train")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["objective"] == objective
    assert not any("nsp" in k for r in train for k in r) and not any("nsp" in k for k in summary)
    if task:
        assert f"{task}_acc" in train[-1] and f"eval_{task}_acc" in summary
    else:
        assert not any(k.endswith(("sop_acc",)) for k in summary)
    names = load_checkpoint(out / "checkpoint.npz")["model"]
    assert ("cls.seq_relationship.weight" in names) == (task is not None)


def test_masked_lm_prob_04_gives_wider_batches(corpus, tmp_path):
    out = tmp_path / "run"
    assert train_mlm.main(args_for(corpus, out, "--masked-lm-prob", "0.4")) == 0
    args = json.loads((out / "args.json").read_text())
    assert args["max_predictions_per_seq"] == 13  # ceil(32 * 0.4)


def test_too_few_instances_for_the_batch_is_an_error_not_a_hang(tmp_path, capsys):
    """Packed NSP pairs fewer than one batch: an error line (the rule of every mode, see
    test_a_corpus_smaller_than_one_batch_is_refused_in_every_mode)."""
    corpus = tmp_path / "short.txt"
    corpus.write_text("".join(f"doc {i} first line.\ndoc {i} second line.\n\n" for i in range(4)))
    with pytest.raises(SystemExit) as e:
        train_mlm.main(["--corpus", str(corpus), "--output-dir", str(tmp_path / "o"),
                        "--vocab-size", "60", "--batch-size", "128", "--eval-fraction", "0",
                        "--no-progress", "--objective", "mlm+nsp"])
    assert e.value.code == 2
    assert "fewer than one batch of --batch-size 128" in capsys.readouterr().err


def nine_lines(tmp_path):
    """A corpus of nine lines: three documents of three lines."""
    corpus = tmp_path / "nine_lines.txt"
    corpus.write_text("\n".join("".join(f"doc {d} line {i} of three.\n" for i in range(3))
                                for d in range(3)), encoding="utf-8")
    return corpus


@pytest.mark.parametrize("mode, kind", [([], "one per line"),
                                        (["--objective", "mlm"], "packed for mlm")])
def test_a_corpus_smaller_than_one_batch_is_refused_in_every_mode(tmp_path, capsys, mode,
                                                                   kind):
    """Line by line (the default recipe) and packed, one rule: a training split of fewer
    sequences than --batch-size is one error line naming both counts and the way out; a
    --batch-size of the count it names runs."""
    corpus = nine_lines(tmp_path)

    def run(name, *extra):
        return train_mlm.main(["--corpus", str(corpus), "--output-dir", str(tmp_path / name),
                               "--vocab-size", "60", "--hidden-size", "16",
                               "--num-hidden-layers", "1", "--num-attention-heads", "2",
                               "--intermediate-size", "32", "--max-seq-length", "16",
                               "--no-progress", *mode, *extra])

    def refused(*extra) -> str:
        with pytest.raises(SystemExit) as e:
            run("refused", "--overwrite", *extra)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("error:") == 1, err
        return err.strip().splitlines()[-1]

    line = refused("--batch-size", "128", "--eval-fraction", "0")
    m = re.fullmatch(r"train_mlm\.py: error: epoch 0 of the training documents \(3 documents\) "
                     rf"yields (\d+) sequences \({kind}\), fewer than one batch of --batch-size "
                     r"128: lower --batch-size to at most \1, or add text", line)
    assert m, line
    n = int(m[1])
    assert n == 9 if not mode else 0 < n < 9   # packed: several lines a sequence
    # the count is of the training split, after the held-out document is set aside
    held = refused("--batch-size", "128")
    assert "(2 documents)" in held, held
    assert mode or "yields 6 sequences (one per line)" in held, held
    assert run("fits", "--batch-size", str(n), "--eval-fraction", "0", "--max-steps", "1") == 0
    assert json.loads((tmp_path / "fits" / "summary.json").read_text())["steps"] == 1


def test_resume_of_a_finished_run_keeps_its_summary(corpus, tmp_path):
    out = tmp_path / "run"
    assert train_mlm.main(args_for(corpus, out)) == 0
    before = json.loads((out / "summary.json").read_text())
    # a bare --resume DIR: every setting comes from the run itself
    assert train_mlm.main(["--resume", str(out), "--no-progress"]) == 0
    after = json.loads((out / "summary.json").read_text())
    for k, v in before.items():
        if k.startswith("eval_"):
            assert after[k] == pytest.approx(v), k


def test_resume_when_saves_and_logs_do_not_line_up(corpus, tmp_path, monkeypatch):
    """--save-every 4 with --log-every 3: the record at step 6 spans the checkpoint at 4."""
    straight, crashed = straight_and_resumed(corpus, tmp_path, monkeypatch, "--log-every", "3")
    assert [r["step"] for r in records(crashed, "train")] == [3, 6, 8]
    assert curve(crashed) == curve(straight)


@pytest.mark.parametrize("argv, option", [
    (["--max-seq-length", "4"], "--max-seq-length"), (["--max-seq-length", "0"], "--max-seq-length"),
    (["--max-seq-length", "-1"], "--max-seq-length"), (["--batch-size", "0"], "--batch-size"),
    (["--lr", "-1"], "--lr"), (["--lr", "inf"], "--lr"), (["--save-every", "0"], "--save-every"),
    (["--log-every", "0"], "--log-every"), (["--masked-lm-prob", "1.5"], "--masked-lm-prob"),
    (["--gradient-accumulation-steps", "0"], "--gradient-accumulation-steps"),
    (["--batch-size-ramp", "1"], "--batch-size-ramp"),
    (["--batch-size-ramp", "-0.1"], "--batch-size-ramp"),
    (["--ema-decay", "1"], "--ema-decay"), (["--ema-decay", "-0.1"], "--ema-decay"),
    (["--decay-ratio", "0"], "--decay-ratio"), (["--decay-ratio", "1"], "--decay-ratio"),
    (["--lr-scheduler-type", "cosine"], "--lr-scheduler-type"),
])
def test_bad_options_get_an_error_line_naming_the_option(corpus, tmp_path, capsys, argv, option):
    with pytest.raises(SystemExit) as e:
        train_mlm.main(args_for(corpus, tmp_path / "o", *argv))
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {option}:" in err and "Traceback" not in err


def test_the_batch_ramp_reaches_the_loop_and_needs_accumulation(corpus, tmp_path, capsys,
                                                                monkeypatch):
    from minibert.pretraining import job as pretraining_job
    seen = []
    real = pretraining_job.train

    def spy(model, optimizer, task, cfg, state, **kw):
        seen.append(cfg)
        return real(model, optimizer, task, cfg, state, **kw)

    monkeypatch.setattr(pretraining_job, "train", spy)
    assert train_mlm.main(args_for(corpus, tmp_path / "r", "--max-steps", "4",
                                   "--gradient-accumulation-steps", "3",
                                   "--batch-size-ramp", "0.5")) == 0
    assert (seen[0].batch_size_ramp_steps, seen[0].gradient_accumulation_steps) == (2, 3)
    with pytest.raises(SystemExit) as e:
        train_mlm.main(args_for(corpus, tmp_path / "o", "--batch-size-ramp", "0.5"))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--batch-size-ramp 0.5 ramps" in err and "Traceback" not in err
    assert not (tmp_path / "o" / "checkpoint.npz").exists()


def test_unusable_output_dirs_get_an_error_line(corpus, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    for target, message in ((afile, "is a file"), (afile / "sub", "cannot be created")):
        with pytest.raises(SystemExit) as e:
            train_mlm.main(args_for(corpus, target))
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"--output-dir {target}: {message}" in err
    assert afile.read_text() == "keep me"


def test_a_new_run_refuses_an_existing_run_unless_overwrite(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_mlm.main(args_for(corpus, out, "--max-steps", "2")) == 0
    before = (out / "checkpoint.npz").read_bytes()
    with pytest.raises(SystemExit):
        train_mlm.main(args_for(corpus, out, "--max-steps", "2"))
    assert "--resume" in capsys.readouterr().err
    assert (out / "checkpoint.npz").read_bytes() == before
    (out / "checkpoint.npz.x1y2.tmp").write_bytes(b"torn")  # a killed write
    (out / "checkpoint-stable.npz").write_bytes(before)     # the old run's, as if WSD
    assert train_mlm.main(args_for(corpus, out, "--max-steps", "3", "--overwrite")) == 0
    assert load_checkpoint(out / "checkpoint.npz")["trainer"]["step"] == 3
    assert not (out / "checkpoint-stable.npz").exists()     # gone with the run it belonged to
    assert not list(out.glob("*.tmp"))
    assert [r["step"] for r in records(out, "train")] == [1, 2, 3]


def test_files_honour_the_umask(corpus, tmp_path):
    import os
    old = os.umask(0o022)
    try:
        out = tmp_path / "run"
        assert train_mlm.main(args_for(corpus, out, "--max-steps", "1")) == 0
    finally:
        os.umask(old)
    for name in ("checkpoint.npz", "summary.json", "vocab.txt", "config.json", "metrics.jsonl"):
        assert (out / name).stat().st_mode & 0o777 == 0o644, name


@pytest.mark.parametrize("extra", [(), EMA_WSD, MASKING], ids=["default", "ema+wsd", "masking"])
def test_killed_and_resumed_reproduces_the_loss_curve(corpus, tmp_path, extra):
    from helpers import kill_when_checkpointed, train_losses
    import subprocess
    base = [sys.executable, str(ROOT / "train_mlm.py"), *args_for(corpus, "X", "--max-steps",
                                                                  "24", "--save-every", "3",
                                                                  *extra)]
    cmd = lambda out, *more: [str(out) if a == "X" else a for a in base] + list(more)
    full, cut = tmp_path / "full", tmp_path / "cut"
    subprocess.run(cmd(full), check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    assert kill_when_checkpointed(cmd(cut), cut / "checkpoint.npz")
    subprocess.run(cmd(cut, "--resume"), check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    assert train_losses(cut / "metrics.jsonl") == train_losses(full / "metrics.jsonl")
    assert not list(cut.glob("*.tmp"))
    assert_same_checkpoints(full, cut)


# ---------------------------------------------------------------- runs that can go on
WSD = ("--lr-scheduler-type", "warmup_stable_decay", "--warmup-steps", "2", "--ema-decay",
       "0.9", "--save-every", "5")


@pytest.fixture(scope="module")
def planned(corpus, tmp_path_factory):
    """A warmup-stable-decay run planned for 24 steps from the start (decay from step 21)."""
    out = tmp_path_factory.mktemp("planned") / "run"
    assert train_mlm.main(args_for(corpus, out, *WSD, "--max-steps", "24")) == 0
    return out


def assert_same_run(a, b):
    """Same train records (loss, lr ...), evaluations, samples and final checkpoint."""
    assert curve(a) == curve(b)
    for kind in ("eval", "samples"):
        strip = lambda r: {k: v for k, v in r.items() if k != "elapsed_s"}
        assert [strip(r) for r in records(a, kind)] == [strip(r) for r in records(b, kind)]
    assert_same_checkpoints(a, b)


@pytest.mark.parametrize("when", ["finished", "before its decay"])
def test_an_extended_run_is_the_run_planned_for_the_longer_schedule(
        corpus, tmp_path, monkeypatch, planned, when):
    """12 steps (decay from step 10) extended to 24: finished, the run goes back to its
    step-10 stable-phase checkpoint (its records after step 10 are dropped); interrupted at
    step 5, it goes on from there. Either way every step sees the same batch, masks,
    dropout and rate as in the run planned for 24 (same warmup), so the records, the
    weights, the average and the optimizer state are equal to the last bit."""
    short = tmp_path / "short"
    if when == "finished":
        assert train_mlm.main(args_for(corpus, short, *WSD, "--max-steps", "12")) == 0
        assert load_checkpoint(short / "checkpoint-stable.npz")["trainer"]["step"] == 10
        assert max(r["step"] for r in records(short)) == 12
    else:
        crash_after_checkpoint(monkeypatch, lambda: train_mlm.main(
            args_for(corpus, short, *WSD, "--max-steps", "12")), step=5)
        assert not (short / "checkpoint-stable.npz").exists()
    assert train_mlm.main(["--resume", str(short), "--max-steps", "24", "--no-progress"]) == 0
    assert_same_run(short, planned)
    assert json.loads((short / "summary.json").read_text())["steps"] == 24
    assert load_checkpoint(short / "checkpoint-stable.npz")["trainer"]["step"] == 21
    # the saved weights other tools load are the average, not the raw training weights
    ckpt = load_checkpoint(short / "checkpoint.npz")
    for name, v in ckpt["ema"].items():
        np.testing.assert_array_equal(ckpt["model"][name], v)
    assert any(not np.array_equal(v, ckpt["train"][k]) for k, v in ckpt["model"].items())


def test_an_extension_interrupted_after_going_back_goes_on_exactly(corpus, tmp_path,
                                                                  monkeypatch, planned):
    """Going back to the stable phase writes it as checkpoint.npz at once, with the new
    --max-steps: a crash in the extended run before its next checkpoint leaves no
    checkpoint past the records kept, and a plain --resume (the command the
    interruption's message names) finishes the run planned for 24 steps."""
    short = tmp_path / "short"
    assert train_mlm.main(args_for(corpus, short, *WSD, "--max-steps", "12")) == 0
    from minibert import training
    monkeypatch.setattr(training, "train_step", _crash_at_step(training.train_step, 14))
    with pytest.raises(SystemExit, match="130"):
        train_mlm.main(["--resume", str(short), "--max-steps", "24", "--no-progress"])
    monkeypatch.undo()
    trainer = load_checkpoint(short / "checkpoint.npz")["trainer"]
    assert (trainer["step"], trainer["args"]["max_steps"]) == (10, 24)
    assert not (short / "summary.json").exists()
    assert train_mlm.main(["--resume", str(short), "--no-progress"]) == 0
    assert_same_run(short, planned)


def _crash_at_step(real, at):
    def step(model, optimizer, workload, micro, step, *a, **kw):
        if step == at:
            raise KeyboardInterrupt
        return real(model, optimizer, workload, micro, step, *a, **kw)
    return step


def test_what_cannot_go_on_gets_an_error_line(corpus, tmp_path, capsys):
    linear, wsd = tmp_path / "linear", tmp_path / "wsd"
    assert train_mlm.main(args_for(corpus, linear)) == 0
    assert train_mlm.main(args_for(corpus, wsd, *WSD, "--max-steps", "12")) == 0
    before = (wsd / "checkpoint.npz").read_bytes(), (wsd / "metrics.jsonl").read_bytes()
    cases = [
        (linear, ["--max-steps", "16"], "--max-steps 16: the run's learning rate decays "
         "linearly to 0 at step 8"),
        (wsd, ["--max-steps", "10"], "--max-steps 10: the run is planned for 12 steps"),
        (wsd, ["--max-steps", "24", "--ema-decay", "0.5"],
         "--ema-decay: checkpoint 0.9, now 0.5"),
        (wsd, ["--max-steps", "24", "--decay-ratio", "0.2"],
         "--decay-ratio: checkpoint 0.1, now 0.2"),
        (linear, ["--lr-scheduler-type", "warmup_stable_decay"],
         "--lr-scheduler-type: checkpoint 'linear', now 'warmup_stable_decay'"),
    ]
    for run, argv, message in cases:
        with pytest.raises(SystemExit) as e:
            train_mlm.main(["--resume", str(run), "--no-progress", *argv])
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and "Traceback" not in err, err
    (wsd / "checkpoint-stable.npz").unlink()
    with pytest.raises(SystemExit):
        train_mlm.main(["--resume", str(wsd), "--no-progress", "--max-steps", "24"])
    err = capsys.readouterr().err
    assert "is in its decay phase (step 12 of 12)" in err and "no such file" in err
    assert ((wsd / "checkpoint.npz").read_bytes(), (wsd / "metrics.jsonl").read_bytes()) == before


RATES = ("--objective", "mlm", "--masked-lm-prob", "0.3", "--masked-lm-prob-end", "0.15")


def test_an_extended_rate_schedule_keeps_the_first_runs_horizon(corpus, tmp_path,
                                                                 monkeypatch):
    """A 12-step warmup-stable-decay run (decay from step 10) with the masking rate going
    from 0.3 to 0.15, extended to 24: the rate still reaches 0.15 at step 12 and holds
    it, so the extended run agrees with the 12-step run wherever that run's learning rate
    does (steps 1-10: rates, losses) and masks steps 11-12 as it did. ``cut`` stops
    after its step-5 checkpoint, which is made to look older (no recorded horizon), is
    extended, stops again at step 8 (its checkpoint now says --max-steps 24) and goes on
    with a plain --resume; ``done`` is extended finished, from its step-10 stable
    checkpoint. Both end the same, to the last bit."""
    first, cut, done = tmp_path / "first", tmp_path / "cut", tmp_path / "done"
    argv = lambda out: args_for(corpus, out, *WSD, *RATES, "--max-steps", "12")
    for run in (first, done):
        assert train_mlm.main(argv(run)) == 0
    crash_after_checkpoint(monkeypatch, lambda: train_mlm.main(argv(cut)), step=5)
    ckpt = cut / "checkpoint.npz"
    trainer = load_checkpoint(ckpt)["trainer"]
    assert trainer["masked_lm_prob_steps"] == 12
    from minibert.checkpoint import rewrite_checkpoint
    rewrite_checkpoint(ckpt, ckpt, {k: v for k, v in trainer.items()
                                    if k != "masked_lm_prob_steps"})
    from minibert import training
    monkeypatch.setattr(training, "train_step", _crash_at_step(training.train_step, 8))
    with pytest.raises(SystemExit, match="130"):
        train_mlm.main(["--resume", str(cut), "--max-steps", "24", "--no-progress"])
    monkeypatch.undo()
    trainer = load_checkpoint(ckpt)["trainer"]
    assert (trainer["step"], trainer["args"]["max_steps"], trainer["masked_lm_prob_steps"]) \
        == (5, 24, 12)
    assert train_mlm.main(["--resume", str(cut), "--no-progress"]) == 0
    assert train_mlm.main(["--resume", str(done), "--max-steps", "24", "--no-progress"]) == 0

    keys = ("step", "lr", "loss", "mlm_loss", "masked_lm_prob", "mlm_acc", "grad_norm")
    short = [{k: r[k] for k in keys} for r in records(first)]
    # the record of step s holds the rate of step s - 1: 0.3 down to 0.15 at step 12
    assert [r["masked_lm_prob"] for r in short] == pytest.approx(
        [0.3 - 0.15 * (s - 1) / 12 for s in range(1, 13)])
    for run in (cut, done):
        long = [{k: r[k] for k in keys} for r in records(run)]
        assert [r["step"] for r in long] == list(range(1, 25))
        assert long[:10] == short[:10]
        assert long[11]["lr"] > short[11]["lr"]        # the decay is planned again
        assert [r["masked_lm_prob"] for r in long[10:12]] == \
            [r["masked_lm_prob"] for r in short[10:]]
        assert [r["masked_lm_prob"] for r in long[12:]] == pytest.approx([0.15] * 12)
        assert load_checkpoint(run / "checkpoint.npz")["trainer"]["masked_lm_prob_steps"] == 12
    assert [{k: r[k] for k in keys} for r in records(cut)] == \
        [{k: r[k] for k in keys} for r in records(done)]
    assert_same_checkpoints(cut, done)


def test_line_by_line_with_a_rate_schedule_and_no_unmasking_resumes_exactly(
        corpus, tmp_path, monkeypatch):
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    assert train_mlm.main(args_for(corpus, straight, *MASKING)) == 0
    crash_after_checkpoint(monkeypatch,
                           lambda: train_mlm.main(args_for(corpus, crashed, *MASKING)))
    assert train_mlm.main(["--resume", str(crashed), "--no-progress"]) == 0
    keys = ("step", "loss", "mlm_loss", "grad_norm", "masked_lm_prob")
    a, b = records(straight, "train"), records(crashed, "train")
    assert [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]
    # the record of step s holds the rate of step s - 1: 0.3 down to 0.15 over 8 steps
    assert [r["masked_lm_prob"] for r in a] == pytest.approx(
        [0.3 - 0.15 * (s - 1) / 8 for s in range(1, 9)])
    assert all("masked_lm_prob" not in r for r in records(straight, "eval"))
    ca = load_checkpoint(straight / "checkpoint.npz")
    cb = load_checkpoint(crashed / "checkpoint.npz")
    for k, v in ca["model"].items():
        np.testing.assert_array_equal(v, cb["model"][k], err_msg=k)
    assert json.loads((straight / "args.json").read_text())["line_by_line"] is True


@pytest.mark.parametrize("argv, message", [
    (["--mask-replace-prob", "0.95"],
     "--mask-replace-prob 0.95 + --random-replace-prob 0.1 is over 1"),
    (["--line-by-line"], "--line-by-line gives one line per sequence; --objective mlm+nsp"),
    (["--line-by-line", "--objective", "mlm+sop"], "--objective mlm+sop needs sentence pairs"),
    (["--masked-lm-prob-end", "0"], "argument --masked-lm-prob-end: expected a number in (0, 1]"),
    (["--random-replace-prob", "1.5"], "argument --random-replace-prob:"),
])
def test_masking_options_that_do_not_fit_get_an_error_line(corpus, tmp_path, capsys, argv,
                                                            message):
    with pytest.raises(SystemExit) as e:
        train_mlm.main(args_for(corpus, tmp_path / "o", *argv))
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "o" / "checkpoint.npz").exists()


def test_a_run_from_before_the_masking_options_resumes_as_it_was(corpus, tmp_path,
                                                                   monkeypatch, capsys):
    """args.json and the checkpoint of an older run lack the new fields: they resume with
    the defaults (80/10/10, a constant rate, packed sequences), and refuse a change."""
    straight, old = tmp_path / "straight", tmp_path / "old"
    assert train_mlm.main(args_for(corpus, straight)) == 0
    crash_after_checkpoint(monkeypatch, lambda: train_mlm.main(args_for(corpus, old)))
    new = ("mask_replace_prob", "random_replace_prob", "masked_lm_prob_end", "line_by_line")
    ckpt = old / "checkpoint.npz"
    with np.load(ckpt) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["meta"].tobytes())
    for name in new:
        del meta["trainer"]["args"][name]
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(ckpt, **arrays)
    saved = json.loads((old / "args.json").read_text())
    (old / "args.json").write_text(json.dumps({k: v for k, v in saved.items() if k not in new}))
    with pytest.raises(SystemExit):
        train_mlm.main(["--resume", str(old), "--no-progress", "--mask-replace-prob", "0.9"])
    assert "--mask-replace-prob: checkpoint 0.8, now 0.9" in capsys.readouterr().err
    assert train_mlm.main(["--resume", str(old), "--no-progress"]) == 0
    assert curve(old) == curve(straight)
