"""finetune.py and minibert.finetuning: TSV errors naming file and line, metrics, dynamic
padding, and tiny end-to-end runs from a minibert checkpoint and from a HF directory."""
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert.finetuning import (DatasetError, EncodedSplit, choose_labels,
                                 classification_metrics, encode_split, iterate_batches,
                                 label_ids, label_list, label_occurrences, read_label_file,
                                 read_tsv, sort_labels)
from minibert.runs import load_start
from minibert.tokenization import BertTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import finetune  # noqa: E402
from helpers import (NEG, POS, ROOT, WORDS, hf_copy, kill_when_checkpointed,  # noqa: E402
                     load_bench, make_rows, run_ft, train_losses, write)


# ------------------------------------------------------------------ TSV errors
def test_missing_column_names_file_and_line(tmp_path):
    p = write(tmp_path / "train.tsv", "label\tsentence\npos\tgood film\nneg\n")
    with pytest.raises(DatasetError, match=rf"{p}:3: .*missing column\(s\) sentence"):
        read_tsv(p)
    p = write(tmp_path / "pairs.tsv", "label\tsentence_a\tsentence_b\npos\ta\tb\npos\ta\n")
    with pytest.raises(DatasetError, match=rf"{p}:3: .*sentence_b"):
        read_tsv(p)
    p = write(tmp_path / "empty_field.tsv", "label\tsentence\n\tgood film\n")
    with pytest.raises(DatasetError, match=rf"{p}:2: empty label"):
        read_tsv(p)


def test_bad_header_and_empty_splits(tmp_path):
    with pytest.raises(DatasetError, match=r":1: header must be"):
        read_tsv(write(tmp_path / "h.tsv", "sentence\tlabel\ngood\tpos\n"))
    with pytest.raises(DatasetError, match=rf"{tmp_path / 'e.tsv'}:2: empty split"):
        read_tsv(write(tmp_path / "e.tsv", "label\tsentence\n\n"))
    with pytest.raises(DatasetError, match=rf"{tmp_path / 'z.tsv'}:1: empty split"):
        read_tsv(write(tmp_path / "z.tsv", ""))
    with pytest.raises(DatasetError, match="no such file"):
        read_tsv(tmp_path / "missing.tsv")


def test_unknown_label_names_file_and_line(tmp_path):
    train = read_tsv(write(tmp_path / "train.tsv", "label\tsentence\n10\ta\n2\tb\n2\tc\n"))
    labels = label_list(train)
    assert labels == ["2", "10"]  # numeric order when every label is an integer
    dev = read_tsv(write(tmp_path / "dev.tsv", "label\tsentence\n2\ta\n3\tb\n"))
    with pytest.raises(DatasetError, match=rf"{tmp_path / 'dev.tsv'}:3: unknown label '3'"):
        label_ids(dev, labels)


def test_label_set_from_all_splits_or_a_file(tmp_path):
    train = read_tsv(write(tmp_path / "train.tsv", "label\tsentence\n10\ta\n2\tb\n"))
    dev = read_tsv(write(tmp_path / "dev.tsv", "label\tsentence\n2\ta\n3\tb\n3\tc\n"))
    test = read_tsv(write(tmp_path / "test.tsv", "label\tsentence\n1\ta\n"))
    found = {"train": label_occurrences(train), "dev": label_occurrences(dev),
             "test": label_occurrences(test)}
    chosen = choose_labels(found, sort_labels)
    assert chosen.labels == ["1", "2", "3", "10"] and chosen.source == "all splits"
    assert chosen.unseen == {"dev": {"3": f"{tmp_path / 'dev.tsv'}:3"},
                             "test": {"1": f"{tmp_path / 'test.tsv'}:2"}}
    assert chosen.record()["labels_unseen_in_train"] == {"dev": ["3"], "test": ["1"]}
    assert "'3' (" in chosen.notes()[0] and chosen.notes()[1].startswith("test: ")
    label_ids(dev, chosen.labels)                     # every label has an id now
    f = write(tmp_path / "labels.txt", "10\n 3 \n\n2\n1\n")
    chosen = choose_labels(found, sort_labels, f)
    assert chosen.labels == ["10", "3", "2", "1"] and chosen.source == str(f)
    write(f, "10\n2\n3\n")
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(tmp_path / 'test.tsv'))}:2: "
                                           rf"label '1' is not in --labels {re.escape(str(f))}"):
        choose_labels(found, sort_labels, f)


@pytest.mark.parametrize("content,pattern", [
    (None, r"labels\.txt: no such file"),
    (b"", r"labels\.txt: no label \(the file is empty"),
    (b"\n  \n", r"labels\.txt: no label"),
    (b"neg\npo\xffs\n", r"labels\.txt:2: not valid UTF-8"),
    (b"neg\npos\nneg\n", r"labels\.txt:3: label 'neg' is already on line 1"),
])
def test_bad_labels_file_is_one_error_line(tmp_path, content, pattern):
    f = tmp_path / "labels.txt"
    if content is not None:
        f.write_bytes(content)
    with pytest.raises(DatasetError, match=pattern):
        read_label_file(f)


@pytest.mark.parametrize("split,content,pattern", [
    ("dev", "label\tsentence\nneg\tgood\nmaybe\tfilm\n",
     r"dev\.tsv:3: class 'maybe' is not in --labels .*labels\.txt \(2 in it: neg pos\)"),
    ("test", "label\tsentence\n", r"test\.tsv:2: empty split"),
    ("train", "label\tsentence\npos\tgood film\nneg\n", r"train\.tsv:3: .*missing column"),
])
def test_cli_rejects_bad_splits(dataset, pretrained_run, tmp_path, capsys, split, content,
                                pattern):
    write(dataset / f"{split}.tsv", content)
    labels = write(tmp_path / "labels.txt", "neg\npos\n")
    with pytest.raises(SystemExit) as e:
        finetune.main(["--init", str(pretrained_run), "--data", str(dataset),
                       "--output-dir", str(tmp_path / "out"), "--no-progress",
                       "--labels", str(labels)])
    assert e.value.code == 2
    import re
    assert re.search(pattern, capsys.readouterr().err)


def test_cli_missing_init_is_explained(dataset, tmp_path, capsys):
    with pytest.raises(SystemExit):
        finetune.main(["--init", str(tmp_path / "nothing"), "--data", str(dataset),
                       "--output-dir", str(tmp_path / "out")])
    assert "not a Hugging Face BERT directory" in capsys.readouterr().err


# ------------------------------------------------------------------ metrics, batches
def test_metrics_by_hand_and_against_sklearn():
    gold = np.array([0, 0, 1, 1, 1, 2])
    pred = np.array([0, 1, 1, 1, 0, 2])
    m = classification_metrics(gold, pred, 3)
    assert m["accuracy"] == pytest.approx(4 / 6)
    # F1: class 0 tp1 fp1 fn1 -> 1/2; class 1 tp2 fp1 fn1 -> 2/3; class 2 -> 1
    assert m["macro_f1"] == pytest.approx((0.5 + 2 / 3 + 1) / 3)
    assert classification_metrics(np.array([0, 1]), np.array([0, 0]), 2)["mcc"] == 0.0
    assert classification_metrics(np.array([0, 1]), np.array([1, 0]), 2)["mcc"] == -1.0
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for k in (2, 3, 5):
        g, p = rng.integers(0, k, 200), rng.integers(0, k, 200)
        p[:120] = g[:120]
        m = classification_metrics(g, p, k)
        assert m["macro_f1"] == pytest.approx(
            sk.f1_score(g, p, average="macro", labels=list(range(k)), zero_division=0))
        assert m["mcc"] == pytest.approx(sk.matthews_corrcoef(g, p))


def test_dynamic_padding(pretrained_run, dataset):
    tok = BertTokenizer(pretrained_run / "vocab.txt")
    ex = read_tsv(dataset / "train.tsv")
    split = encode_split(tok, ex, 8, label_list(ex))
    assert max(len(r) for r in split.input_ids) <= 8
    seen = []
    for b in iterate_batches(split, 5, tok.pad_token_id, seed=0, epoch=1):
        lengths = [len(split.input_ids[i]) for i in b.index]
        assert b.input_ids.shape == (len(b.index), max(lengths))
        assert (b.attention_mask.sum(1) == lengths).all()
        assert (b.input_ids[b.attention_mask == 0] == tok.pad_token_id).all()
        seen.extend(b.index.tolist())
    assert sorted(seen) == list(range(len(split)))


# ------------------------------------------------------------------ length-grouped batches
def varied_split(n, seed=0, low=3, high=120):
    """An EncodedSplit of ``n`` rows whose lengths spread over [low, high] tokens, long-
    tailed as real sentences (most short, a few long); token id = row, for checks."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(3.0, 0.6, n)), low, high).astype(int)
    ids = [[i] * int(m) for i, m in enumerate(lengths)]
    return EncodedSplit(ids, [[0] * len(r) for r in ids], rng.integers(0, 2, n))


def epoch_batches(split, bs, **kw):
    return [b.index.tolist() for b in iterate_batches(split, bs, 0, **kw)]


def padding_fraction(split, bs, **kw):
    real = padded = 0
    for b in iterate_batches(split, bs, 0, **kw):
        real, padded = real + b.attention_mask.sum(), padded + b.attention_mask.size
    return 1 - real / padded


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 400), bs=st.integers(1, 40), seed=st.integers(0, 2**31),
       epoch=st.integers(0, 5))
def test_group_by_length_yields_every_row_once_per_epoch(n, bs, seed, epoch):
    split = varied_split(n, seed % 1000)
    batches = list(iterate_batches(split, bs, 0, seed=seed, epoch=epoch, group_by_length=True))
    seen = np.concatenate([b.index for b in batches])
    assert sorted(seen.tolist()) == list(range(n))
    sizes = [len(b.index) for b in batches]
    assert len(batches) == -(-n // bs) and all(s == bs for s in sizes[:-1]) and sizes[-1] <= bs
    for b in batches:  # padded rows are still the rows of the split
        lengths = [len(split.input_ids[i]) for i in b.index]
        assert b.input_ids.shape == (len(b.index), max(lengths))
        assert (b.attention_mask.sum(1) == lengths).all()
        assert (b.input_ids[b.attention_mask == 1] == np.repeat(b.index, lengths)).all()
        assert (b.labels == split.labels[b.index]).all()


def test_group_by_length_removes_most_padding():
    split = varied_split(3200)  # 100 batches of 32: mega-batches of 25 batches (HF's rule)
    plain = padding_fraction(split, 32, seed=0, epoch=0)
    grouped = padding_fraction(split, 32, seed=0, epoch=0, group_by_length=True)
    assert plain > 0.5 and grouped < 0.15 and grouped < plain / 5, (plain, grouped)
    # mega-batches of 50 batches (the cap), as on a larger split: closer still
    from minibert.finetuning import length_grouped_batches
    lengths = np.array([len(r) for r in split.input_ids])
    b50 = length_grouped_batches(lengths, 32, np.random.default_rng(0), mega_batch_mult=50)
    assert 1 - lengths.sum() / sum(len(b) * lengths[b].max() for b in b50) < grouped


def test_group_by_length_is_random_but_reproducible():
    split = varied_split(1000)
    run = lambda seed, epoch: epoch_batches(split, 16, seed=seed, epoch=epoch,  # noqa: E731
                                            group_by_length=True)
    assert run(3, 1) == run(3, 1)                   # (seed, epoch) decide the epoch
    assert run(3, 1) != run(3, 2) and run(3, 1) != run(4, 1)
    assert [set(b) for b in run(3, 1)] != [set(b) for b in run(3, 2)]  # not just reordered
    lengths = np.array([len(r) for r in split.input_ids])
    longest = [int(lengths[b].max()) for b in run(3, 1)]
    assert longest[0] == lengths.max()              # the longest batch first (as HF)
    # then a random batch order: sorted within a mega-batch (15 batches here) would rise
    # only where a new mega-batch starts (4 times); shuffled, about every second batch
    rises = sum(a < b for a, b in zip(longest[1:-1], longest[2:-1]))
    assert rises > 15, longest
    # the order without grouping is untouched: runs started before the option resume alike
    perm = np.random.default_rng([3, 1]).permutation(1000)
    assert epoch_batches(split, 16, seed=3, epoch=1) == [perm[s:s + 16].tolist()
                                                         for s in range(0, 1000, 16)]


@pytest.mark.parametrize("group_by_length", [False, True])
def test_start_batch_resumes_the_same_epoch(group_by_length):
    split = varied_split(203)  # 13 batches of 16, the last one of 11 rows
    full = epoch_batches(split, 16, seed=7, epoch=2, group_by_length=group_by_length)
    assert len(full) == 13
    for k in (0, 1, 6, 12, 13, 20):
        assert epoch_batches(split, 16, seed=7, epoch=2, start_batch=k,
                             group_by_length=group_by_length) == full[k:]


def test_group_by_length_without_seed_keeps_split_order_of_mega_batches():
    split = varied_split(300)  # evaluation use: no shuffle, each mega-batch sorted
    batches = epoch_batches(split, 10, group_by_length=True)
    assert sorted(sum(batches, [])) == list(range(300))
    assert batches == epoch_batches(split, 10, group_by_length=True)


# ------------------------------------------------------------------ end to end
def test_end_to_end_from_minibert_checkpoint(dataset, pretrained_run, tmp_path, capsys):
    out = tmp_path / "ft"
    rc = finetune.main(["--init", str(pretrained_run), "--data", str(dataset),
                        "--output-dir", str(out), "--epochs", "8", "--batch-size", "8",
                        "--lr", "1e-2", "--max-seq-length", "16", "--log-every", "2",
                        "--no-progress", "--predict", "very good film",
                        "--plot-attention", "the plot was dull",
                        "--export-hf", str(tmp_path / "hf")])
    assert rc == 0
    for f in ("checkpoint.npz", "best_model.npz", "vocab.txt", "labels.json", "config.json",
              "args.json", "metrics.jsonl",
              "summary.json", "predictions_dev.tsv", "predictions_test.tsv",
              "training_curves.png", "attention.png"):
        assert (out / f).is_file(), f
    assert not list(out.glob("*.tmp"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["labels"] == ["neg", "pos"]
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(evals) == 8
    best = max(r["dev_accuracy"] for r in evals)
    assert summary["dev"]["accuracy"] == pytest.approx(best)  # the kept model is the best one
    train = [r["loss"] for r in records if r["kind"] == "train"]
    assert train[-1] < train[0]
    assert best >= 0.75  # the task is one word away from trivial
    lines = (out / "predictions_test.tsv").read_text().splitlines()
    assert lines[0] == "line\tgold\tpredicted\tp_neg\tp_pos" and len(lines) == 17
    printed = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[{")]
    assert len(printed) == 1                   # --predict: every label, most probable first
    scores = json.loads(printed[0])
    assert sorted(s["label"] for s in scores) == ["neg", "pos"]
    assert scores[0]["score"] >= scores[1]["score"]
    assert sum(s["score"] for s in scores) == pytest.approx(1.0, abs=1e-6)
    assert (out / "attention.png").read_bytes()[:4] == b"\x89PNG"

    # the saved model predicts the same without training, and carries its labels
    pre = load_start(out)
    assert pre.labels == ["neg", "pos"]
    rc = finetune.main(["--model", str(out), "--predict", "very good film"])
    again = capsys.readouterr().out
    assert rc == 0 and again.splitlines() == printed

    # the exported HF directory gives the same probabilities in transformers
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.id2label == {0: "neg", 1: "pos"}
    tok = BertTokenizer(out / "vocab.txt")
    enc = tok("very good film", return_tensors="np")
    with torch.no_grad():
        p = torch.softmax(hf(**{k: torch.from_numpy(v[None]) for k, v in enc.items()}).logits,
                          -1)[0].numpy()
    probs = {s["label"]: s["score"] for s in scores}
    assert float(probs["pos"]) == pytest.approx(float(p[1]), abs=1e-4)


def test_end_to_end_pairs_from_hf_directory_with_random_init(tmp_path, pretrained_run):
    rng = np.random.default_rng(1)
    d = tmp_path / "pairs"
    d.mkdir()
    for split, n in (("train", 16), ("dev", 8), ("test", 8)):
        write(d / f"{split}.tsv", "label\tsentence_a\tsentence_b\n"
              + "\n".join(make_rows(n, rng, pair=True)) + "\n")
    hf_dir = hf_copy(pretrained_run, tmp_path / "hf")
    out = tmp_path / "ft"
    rc = finetune.main(["--init", str(hf_dir), "--data", str(d), "--output-dir", str(out),
                        "--epochs", "1", "--batch-size", "8", "--max-seq-length", "12",
                        "--random-init", "--no-progress", "--test", "none"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["random_init"] and summary["test"] is None and summary["steps"] == 2


# ------------------------------------------------------------------ run directory, resume

def test_finetune_never_writes_over_a_pretraining_run(dataset, pretrained_run, tmp_path,
                                                      capsys):
    before = {p.name: p.read_bytes() for p in pretrained_run.iterdir()}
    other_start = shutil.copytree(pretrained_run, tmp_path / "other_start")
    # into another pretraining run; into the very run it starts from (its input: refused
    # first, with --overwrite too)
    for init, extra, message in ((other_start, (), "holds the checkpoint of a pretrain run"),
                                 (pretrained_run, (), "is an input of this job (--init"),
                                 (pretrained_run, ("--overwrite",), "is an input of this job")):
        with pytest.raises(SystemExit) as e:
            run_ft("--init", init, "--data", dataset, "--output-dir", pretrained_run, *extra)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "error:" in err and message in err
        assert {p.name: p.read_bytes() for p in pretrained_run.iterdir()} == before


def test_finetune_refuses_another_finetune_run_unless_overwrite(dataset, pretrained_run,
                                                                 tmp_path, capsys):
    out = tmp_path / "ft"
    common = ("--init", pretrained_run, "--data", dataset, "--output-dir", out,
              "--max-seq-length", "12", "--batch-size", "16", "--max-steps", "2")
    assert run_ft(*common) == 0
    with pytest.raises(SystemExit):
        run_ft(*common)
    assert "--overwrite" in capsys.readouterr().err
    assert run_ft(*common, "--overwrite") == 0
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [2]  # no stale records


@pytest.mark.parametrize("argv,option", [
    (["--epochs", "0"], "--epochs"), (["--max-steps", "0"], "--max-steps"),
    (["--batch-size", "0"], "--batch-size"), (["--lr", "-1"], "--lr"),
    (["--lr", "nan"], "--lr"), (["--log-every", "0"], "--log-every"),
    (["--warmup-proportion", "1.5"], "--warmup-proportion"),
    (["--max-seq-length", "0"], "--max-seq-length"),
])
def test_bad_options_name_the_option(dataset, pretrained_run, tmp_path, capsys, argv, option):
    with pytest.raises(SystemExit) as e:
        run_ft("--init", pretrained_run, "--data", dataset, "--output-dir", tmp_path / "o", *argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {option}" in err and "Traceback" not in err


def test_output_dir_that_is_a_file(dataset, pretrained_run, tmp_path, capsys):
    f = write(tmp_path / "afile", "x")
    with pytest.raises(SystemExit):
        run_ft("--init", pretrained_run, "--data", dataset, "--output-dir", f)
    assert "--output-dir" in capsys.readouterr().err and f.read_text() == "x"


def test_single_class_train_split_is_named(dataset, pretrained_run, tmp_path, capsys):
    write(dataset / "train.tsv", "label\tsentence\npos\tgood film\npos\tgreat plot\n")
    with pytest.raises(SystemExit):
        run_ft("--init", pretrained_run, "--data", dataset, "--output-dir", tmp_path / "o")
    err = capsys.readouterr().err
    assert "train.tsv: the train split has one class only ('pos')" in err
    assert "unknown label" not in err


def test_gradient_accumulation_equals_the_larger_batch(dataset, pretrained_run, tmp_path):
    """2 micro-batches of 8 with accumulation = batches of 16, in float64 terms: the same
    rows per step (the permutation is per epoch) and equal weights per micro-batch."""
    outs = []
    for name, extra in (("big", ["--batch-size", "16"]),
                        ("acc", ["--batch-size", "8", "--gradient-accumulation-steps", "2"])):
        out = tmp_path / name
        assert run_ft("--init", pretrained_run, "--data", dataset, "--output-dir", out,
                      "--max-seq-length", "12", "--epochs", "2", "--classifier-dropout", "0",
                      "--lr", "1e-3", "--log-every", "1", *extra) == 0
        outs.append([r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text()
                                            .splitlines()) if r["kind"] == "train"])
    # hidden dropout stays on (its masks differ between the two micro-batch layouts), so the
    # curves agree closely, not exactly; exact equality is checked in test_training.py
    assert len(outs[0]) == len(outs[1]) == 6
    np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=0.05)


def test_bare_resume_takes_the_runs_own_settings(dataset, pretrained_run, tmp_path, capsys):
    out = tmp_path / "ft"
    assert run_ft("--init", pretrained_run, "--data", dataset, "--output-dir", out,
                  "--max-seq-length", "12", "--batch-size", "16", "--max-steps", "3") == 0
    before = json.loads((out / "summary.json").read_text())
    assert run_ft("--resume", out) == 0  # --init, --data ... from the run itself
    assert json.loads((out / "summary.json").read_text())["dev"] == before["dev"]
    with pytest.raises(SystemExit):
        run_ft("--resume", out, "--batch-size", "8")
    assert "--batch-size: checkpoint 16, now 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_ft("--resume", tmp_path / "nothing_here")
    assert "no such run directory" in capsys.readouterr().err
    assert not (tmp_path / "nothing_here").exists()


def length_varied_dataset(path: Path, n_train=128, seed=0) -> Path:
    """Train rows of 1 to 24 words (most short), so batches of random rows pad a lot."""
    rng = np.random.default_rng(seed)
    path.mkdir()
    for split, n in (("train", n_train), ("dev", 16), ("test", 8)):
        rows = []
        for _ in range(n):
            y = int(rng.integers(0, 2))
            words = list(rng.choice(WORDS[6:], size=min(int(rng.exponential(5)), 23)))
            words.insert(0, str(rng.choice(POS if y else NEG)))
            rows.append(f"{('neg', 'pos')[y]}\t{' '.join(words)}")
        write(path / f"{split}.tsv", "label\tsentence\n" + "\n".join(rows) + "\n")
    return path


def train_records(out: Path):
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"]


def test_group_by_length_end_to_end(pretrained_run, tmp_path, capsys, monkeypatch):
    data = length_varied_dataset(tmp_path / "data")
    common = ("--init", pretrained_run, "--data", data, "--max-seq-length", "32",
              "--batch-size", "8", "--epochs", "2", "--log-every", "4", "--lr", "3e-3")
    runs = {}
    for name, extra in (("plain", ()), ("grouped", ("--group-by-length",))):
        assert run_ft(*common, "--output-dir", tmp_path / name, *extra) == 0
        runs[name] = train_records(tmp_path / name)
        args = json.loads((tmp_path / name / "args.json").read_text())
        assert args["group_by_length"] is bool(extra)
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["group_by_length"] is bool(extra)
    for name, records in runs.items():
        assert [r["step"] for r in records] == [4, 8, 12, 16, 20, 24, 28, 32]
        for r in records:  # real tokens: the attention-mask ones; padded: B x T
            assert 0 < r["real_tokens"] <= r["padded_tokens"] and r["tokens_per_s"] > 0
            assert r["padding_fraction"] == pytest.approx(
                1 - r["real_tokens"] / r["padded_tokens"], abs=1e-4)
    # every row once per epoch either way: the same real tokens, far fewer padded ones
    real = {k: sum(r["real_tokens"] for r in v) for k, v in runs.items()}
    padded = {k: sum(r["padded_tokens"] for r in v) for k, v in runs.items()}
    assert real["plain"] == real["grouped"]
    assert 1 - real["grouped"] / padded["grouped"] < 0.5 * (1 - real["plain"] / padded["plain"])
    assert runs["grouped"][-1]["loss"] < runs["grouped"][0]["loss"]

    # a bare --resume keeps the run's grouping; a changed one is refused
    out = tmp_path / "grouped"
    assert run_ft("--resume", out, "--epochs", "2") == 0
    assert json.loads((out / "args.json").read_text())["group_by_length"] is True
    capsys.readouterr()
    with pytest.raises(SystemExit):
        run_ft("--resume", tmp_path / "plain", "--group-by-length")
    assert "--group-by-length: checkpoint False, now True" in capsys.readouterr().err
    # a checkpoint from before the option (no group_by_length saved) ran unsorted
    import minibert.checkpoint  # the job's prologue (minibert.cli.start_job) reads it there
    real_load = minibert.checkpoint.load_checkpoint

    def old_checkpoint(path, *a, **kw):
        ck = real_load(path, *a, **kw)
        ck["trainer"]["args"].pop("group_by_length", None)
        return ck
    monkeypatch.setattr(minibert.checkpoint, "load_checkpoint", old_checkpoint)
    with pytest.raises(SystemExit):
        run_ft("--resume", tmp_path / "plain", "--group-by-length")
    assert "--group-by-length: checkpoint False, now True" in capsys.readouterr().err
    assert run_ft("--resume", tmp_path / "plain") == 0
    assert json.loads((tmp_path / "plain" / "args.json").read_text())["group_by_length"] is False


def test_bench_compare_runs_both_systems(pretrained_run, tmp_path, capsys):
    """bench/bench_finetune.py compare: minibert (grouped) and transformers (not) on the same
    rows, real tokens/s for each and their ratio."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    bench = load_bench("bench_finetune")
    hf_dir = hf_copy(pretrained_run, tmp_path / "hf")
    data = length_varied_dataset(tmp_path / "data", n_train=128)
    assert bench.main(["compare", "--init", str(hf_dir), "--data", str(data),
                       "--batch-size", "8", "--max-seq-length", "32", "--threads", "1"]) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.splitlines() if l.startswith("{")]
    ours, peer, ratio = lines
    assert (ours["name"], ours["group_by_length"]) == ("minibert", True)
    assert (peer["name"], peer["group_by_length"]) == ("transformers", False)
    assert ours["padding_fraction"] < 0.5 * peer["padding_fraction"]
    assert ours["real_tokens"] == peer["real_tokens"]  # the same rows
    assert ours["padded_tokens"] < peer["padded_tokens"]
    assert ratio["ratio_real_tokens_per_s_minibert_over_transformers"] == pytest.approx(
        ours["real_tokens_per_s"] / peer["real_tokens_per_s"], rel=1e-2)


def test_damaged_inputs_get_error_lines(dataset, pretrained_run, tmp_path, capsys):
    bad_vocab = tmp_path / "badvocab"
    bad_vocab.mkdir()
    (bad_vocab / "vocab.txt").write_text("a\nb\n")  # no [UNK]
    (bad_vocab / "checkpoint.npz").write_bytes((pretrained_run / "checkpoint.npz").read_bytes())
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "vocab.txt").write_bytes((pretrained_run / "vocab.txt").read_bytes())
    np.savez(damaged / "checkpoint.npz", meta=np.frombuffer(b"not json", np.uint8))
    for init, message in ((bad_vocab, "[UNK]"), (damaged, "damaged 'meta' entry")):
        with pytest.raises(SystemExit) as e:
            run_ft("--init", init, "--data", dataset, "--output-dir", tmp_path / "o")
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and "Traceback" not in err
    afile = write(tmp_path / "afile", "x")
    with pytest.raises(SystemExit):
        run_ft("--init", pretrained_run, "--data", dataset, "--output-dir", tmp_path / "o2",
               "--export-hf", afile)
    assert "--export-hf" in capsys.readouterr().err and not (tmp_path / "o2").exists()


@pytest.mark.parametrize("extra", [[], ["--group-by-length"]])
def test_finetune_killed_and_resumed_reproduces_the_loss_curve(pretrained_run, tmp_path,
                                                               extra):
    import subprocess
    rng = np.random.default_rng(0)
    data = tmp_path / "data"   # more rows than the dataset fixture: time to kill the run
    data.mkdir()
    for split, n in (("train", 96), ("dev", 16), ("test", 8)):
        write(data / f"{split}.tsv", "label\tsentence\n" + "\n".join(make_rows(n, rng)) + "\n")
    base = [sys.executable, str(ROOT / "finetune.py"), "--init", str(pretrained_run),
            "--data", str(data),
            "--max-seq-length", "12", "--batch-size", "8", "--epochs", "3", "--log-every", "2",
            "--lr", "3e-3", "--no-progress", *extra]
    full = tmp_path / "full"
    subprocess.run(base + ["--output-dir", str(full)], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    cut = tmp_path / "cut"
    killed = kill_when_checkpointed(base + ["--output-dir", str(cut)], cut / "checkpoint.npz")
    assert killed, "the run finished before it could be killed"
    subprocess.run(base + ["--output-dir", str(cut), "--resume"], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    assert train_losses(cut / "metrics.jsonl") == train_losses(full / "metrics.jsonl")
    assert json.loads((cut / "summary.json").read_text())["dev"] == \
        json.loads((full / "summary.json").read_text())["dev"]
    assert not list(cut.glob("*.tmp"))
