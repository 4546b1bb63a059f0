"""Task distillation (finetune.py --teacher): the soft-label loss against its definition and
torch, its float64 gradient check, mean pooling end to end, and runs that show the student
follows the teacher's soft labels (a teacher trained on flipped labels flips the student)."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert.distillation import read_transfer, soft_label_loss_backward, soft_label_loss_forward
from minibert.finetuning import DatasetError
from minibert.gradcheck import rel_error
from minibert.testing import seeds

from helpers import make_rows, run_ft, write  # noqa: E402


def draw_case(data, seed):
    B = data.draw(st.integers(1, 6))
    K = data.draw(st.integers(2, 5))
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((B, K)) * 2
    t = rng.standard_normal((B, K)) * 2
    y = rng.integers(0, K, B)
    y[rng.random(B) < 0.3] = -100                                  # transfer-set rows
    alpha = data.draw(st.sampled_from([0.0, 0.3, 1.0]))
    T = data.draw(st.sampled_from([0.5, 1.0, 2.0, 4.0]))
    return rng, s, t, y, alpha, T


@settings(max_examples=25, deadline=None)
@given(data=st.data(), seed=seeds)
def test_soft_label_loss_gradient_float64(data, seed):
    rng, s, t, y, alpha, T = draw_case(data, seed)
    g = rng.standard_normal()                                      # random upstream
    _, cache = soft_label_loss_forward(s, y, t, alpha, T)
    analytic = soft_label_loss_backward(g, cache)
    numeric = np.zeros_like(s)
    h = 1e-6
    for idx in np.ndindex(*s.shape):
        plus, minus = s.copy(), s.copy()
        plus[idx] += h
        minus[idx] -= h
        numeric[idx] = g * (float(soft_label_loss_forward(plus, y, t, alpha, T)[0])
                            - float(soft_label_loss_forward(minus, y, t, alpha, T)[0])) / (2 * h)
    assert analytic.dtype == np.float64
    assert rel_error(analytic, numeric) < 1e-6


@settings(max_examples=15, deadline=None)
@given(data=st.data(), seed=seeds)
def test_soft_label_loss_matches_torch(data, seed):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    _, s, t, y, alpha, T = draw_case(data, seed)
    ours, _ = soft_label_loss_forward(s, y, t, alpha, T)
    S, Tt = torch.tensor(s), torch.tensor(t)
    ce = F.cross_entropy(S, torch.tensor(y), ignore_index=-100) if (y >= 0).any() else 0.0
    kl = F.kl_div(F.log_softmax(S / T, -1), F.softmax(Tt / T, -1), reduction="batchmean")
    expect = (1 - alpha) * ce + alpha * T * T * kl
    assert float(ours) == pytest.approx(float(expect), rel=1e-10, abs=1e-12)


def test_soft_label_loss_checks_alpha():
    with pytest.raises(ValueError, match="alpha"):
        soft_label_loss_forward(np.zeros((2, 2)), np.zeros(2, int), np.zeros((2, 2)), 1.5, 1.0)


def test_read_transfer_rows_and_errors(tmp_path):
    rows = read_transfer(write(tmp_path / "t.txt", "a good film\n\nthe plot\tis dull\n"))
    assert [(r.text_a, r.text_b, r.line) for r in rows] == [("a good film", None, 1),
                                                             ("the plot", "is dull", 3)]
    for text, msg in (("", "no rows"), ("a\tb\tc\n", "3 columns"), ("a\t \n", "empty")):
        with pytest.raises(DatasetError, match=msg):
            read_transfer(write(tmp_path / "bad.txt", text))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(DatasetError, match="UTF-8"):
        read_transfer(tmp_path / "bin.txt")


def last_dev_accuracy(out):
    """The dev accuracy of the final model (summary.json holds the best dev model's, which
    the gold dev labels pick)."""
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "eval"][-1]["dev_accuracy"]


def train_args(data, out, *extra):
    return ["--data", data, "--output-dir", out, "--epochs", "10", "--batch-size", "8",
            "--lr", "1e-2", "--max-seq-length", "16", "--test", "none", *extra]


@pytest.fixture
def flipped_teacher(tmp_path, pretrained_run):
    """A classifier fine-tuned on rows whose labels are swapped: it calls "good" neg."""
    rng = np.random.default_rng(5)
    d = tmp_path / "flipped"
    d.mkdir()
    for split, n in (("train", 64), ("dev", 16)):
        write(d / f"{split}.tsv", "label\tsentence\n"
              + "\n".join(make_rows(n, rng, names=("pos", "neg"))) + "\n")
    out = tmp_path / "teacher"
    assert run_ft("--init", pretrained_run, *train_args(d, out)) == 0
    return out


def test_the_student_follows_the_teachers_soft_labels(dataset, pretrained_run,
                                                      flipped_teacher, tmp_path, capsys):
    accuracy = {}
    for alpha in ("0", "1"):
        out = tmp_path / f"student{alpha}"
        assert run_ft("--init", pretrained_run, *train_args(dataset, out), "--random-init",
                      "--teacher", flipped_teacher, "--distill-alpha", alpha,
                      "--temperature", "2") == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["teacher"] == str(flipped_teacher)
        accuracy[alpha] = last_dev_accuracy(out)
    printed = capsys.readouterr().out
    assert "soft labels for 48 train rows (0 from --transfer-data)" in printed
    # gold labels alone learn the task; the flipped teacher's soft labels alone unlearn it
    assert accuracy["0"] >= 0.75 and accuracy["1"] <= 0.25, accuracy


def test_transfer_rows_are_labelled_by_the_teacher_only(dataset, pretrained_run,
                                                        flipped_teacher, tmp_path, capsys):
    rng = np.random.default_rng(9)
    transfer = write(tmp_path / "transfer.txt",
                     "\n".join(r.split("\t")[1] for r in make_rows(40, rng)) + "\n")
    out = tmp_path / "student"
    assert run_ft("--init", pretrained_run, *train_args(dataset, out), "--random-init",
                  "--max-train-examples", "4", "--teacher", flipped_teacher,
                  "--distill-alpha", "0.5", "--transfer-data", transfer) == 0
    printed = capsys.readouterr().out
    assert "soft labels for 44 train rows (40 from --transfer-data)" in printed
    # 4 gold rows against 44 flipped soft labels: the teacher wins
    assert last_dev_accuracy(out) <= 0.25


def test_distillation_options_are_checked(dataset, pretrained_run, tmp_path,
                                          capsys):
    cases = [(["--distill-alpha", "0.5"], "--distill-alpha goes with --teacher"),
             (["--transfer-data", "x.txt"], "--transfer-data goes with --teacher"),
             (["--teacher", "x", "--distill-alpha", "1.5"], "argument --distill-alpha"),
             (["--teacher", "x", "--temperature", "0"], "argument --temperature"),
             (["--teacher", "x", "--task", "token-classification"], "task distillation is for"),
             (["--pooling", "mean", "--task", "question-answering"], "--pooling: for")]
    for extra, msg in cases:
        with pytest.raises(SystemExit) as e:
            run_ft("--init", pretrained_run, *train_args(dataset, tmp_path / "o"), *extra)
        err = capsys.readouterr().err
        assert e.value.code == 2 and msg in err and "Traceback" not in err, (extra, err)
    # a teacher that is no classifier, or has other labels: an error line, nothing trained
    other = tmp_path / "other"
    other.mkdir()
    for split in ("train", "dev"):
        write(other / f"{split}.tsv", "label\tsentence\n"
              + "\n".join(make_rows(16, np.random.default_rng(2), names=("a", "b"))) + "\n")
    assert run_ft("--init", pretrained_run, *train_args(other, tmp_path / "t2"),
                  "--epochs", "1") == 0
    for teacher, msg in ((pretrained_run, "not a fine-tuned sequence classifier"),
                         (tmp_path / "t2", "differ from the train split's"),
                         (tmp_path / "missing", "--teacher")):
        with pytest.raises(SystemExit) as e:
            run_ft("--init", pretrained_run, *train_args(dataset, tmp_path / "o3"),
                   "--teacher", teacher)
        err = capsys.readouterr().err
        assert e.value.code == 2 and msg in err and "Traceback" not in err, (teacher, err)
    empty = write(tmp_path / "empty.txt", "")
    with pytest.raises(SystemExit):
        run_ft("--init", pretrained_run, *train_args(dataset, tmp_path / "o4"),
               "--teacher", tmp_path / "t2", "--transfer-data", empty)
    assert "error:" in capsys.readouterr().err


def test_mean_pooling_end_to_end(dataset, pretrained_run, tmp_path, capsys):
    out = tmp_path / "mean"
    assert run_ft("--init", pretrained_run, *train_args(dataset, out), "--pooling", "mean",
                  "--predict", "very good film") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pooling"] == "mean" and summary["dev"]["accuracy"] >= 0.75
    assert json.loads((out / "config.json").read_text())["classifier_pooling"] == "mean"
    # the saved model is rebuilt mean-pooled and predicts the same
    printed = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[{")]
    assert run_ft("--model", out, "--predict", "very good film") == 0
    again = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[{")]
    assert printed == again and len(printed) == 1
    assert {s["label"] for s in json.loads(printed[0])} == {"neg", "pos"}



def test_split_logits_in_length_sorted_batches_equal_one_row_at_a_time():
    from minibert import BertConfig, BertForSequenceClassification
    from minibert.finetuning import EncodedSplit
    from minibert.finetuning.models import split_logits
    rng = np.random.default_rng(3)
    config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=16, num_labels=3)
    model = BertForSequenceClassification(config, dtype=np.float64)
    rows = [list(rng.integers(1, 30, int(n))) for n in rng.integers(2, 12, 13)]
    split = EncodedSplit(rows, [[0] * len(r) for r in rows], None)
    got = split_logits(model, split, batch_size=4)
    model.eval()
    for i, r in enumerate(rows):
        one = model(np.array([r]), np.zeros((1, len(r)), int), np.ones((1, len(r)), int))
        np.testing.assert_allclose(got[i], one.logits[0], rtol=1e-5, atol=1e-6)
    assert model.training is False   # it was in eval mode before the call, and still is
