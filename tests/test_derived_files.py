"""Files a run leaves behind are verified (issue 42, item 6; docs/reliability.md, "Files a
run leaves behind are verified"): every derived file a job reads back carries a size and
SHA-256 record written with it; damage (flipped bytes, truncation, deletion, an empty file)
is rebuilt where it can be (the token store, a fine-tuning run of the harness) and
otherwise ends in one ``error:`` line naming the file and what to delete; never a
traceback, never training on damaged data."""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import evaluate  # noqa: E402
import finetune  # noqa: E402
import train_mlm  # noqa: E402
from helpers import tiny_pretrain_argv  # noqa: E402
from minibert import derived, training  # noqa: E402
from minibert.pretraining.corpus import (DamagedStoreError, TokenStore,  # noqa: E402
                                         load_store, save_store)
from minibert.runs import MetricsLog  # noqa: E402

STORE = ("tokens.npy", "sentence_offsets.npy", "document_offsets.npy", "store.json")


# ------------------------------------------------------------------------------ damage
def flip(path: Path) -> None:
    """Every bit of 4 bytes in the middle of the file inverted (size kept)."""
    b = bytearray(path.read_bytes())
    mid = len(b) // 2
    b[mid:mid + 4] = bytes(x ^ 0xFF for x in b[mid:mid + 4])
    path.write_bytes(bytes(b))


def flip_bit(path: Path) -> None:
    """One low bit of a token id in the middle of a tokens.npy inverted: the id stays in
    the vocabulary, so only the SHA-256 can tell."""
    arr = np.load(path)
    i = len(arr) // 2
    assert arr[i] < 299
    b = bytearray(path.read_bytes())
    b[len(b) - arr.nbytes + 4 * i] ^= 1
    path.write_bytes(bytes(b))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def delete(path: Path) -> None:
    path.unlink()


def empty(path: Path) -> None:
    path.write_bytes(b"")


DAMAGE = {"flipped bytes": flip, "truncated": truncate, "deleted": delete, "empty": empty}


def losses(run: Path):
    return [(r["step"], r["loss"]) for r in MetricsLog.read(run / "metrics.jsonl")
            if r["kind"] == "train"]


def assert_no_traceback(err: str) -> None:
    assert "Traceback" not in err, err


# ------------------------------------------------------------------- the token store
@pytest.fixture(scope="module")
def runs(moby30, moby_vocab, tmp_path_factory):
    """(a run of 8 steps never interrupted, the same run interrupted just after its step-4
    checkpoint)."""
    base = tmp_path_factory.mktemp("derived")
    straight, half = base / "straight", base / "half"
    assert train_mlm.main(tiny_pretrain_argv(moby30, moby_vocab, straight)) == 0
    with pytest.MonkeyPatch.context() as mp:
        real, saves = training.save_checkpoint, [0]

        def save(*a, **kw):
            saves[0] += 1
            if saves[0] == 2:
                raise KeyboardInterrupt
            return real(*a, **kw)
        mp.setattr(training, "save_checkpoint", save)
        with pytest.raises(SystemExit):
            train_mlm.main(tiny_pretrain_argv(moby30, moby_vocab, half))
    return straight, half


def resumed(runs, tmp_path, moby30, moby_vocab, damage=None, *extra):
    """A copy of the interrupted run, ``damage(copy)`` applied, then resumed to step 8."""
    straight, half = runs
    out = tmp_path / "run"
    shutil.copytree(half, out)
    if damage:
        damage(out)
    assert train_mlm.main([*tiny_pretrain_argv(moby30, moby_vocab, out), *extra]) == 0
    return out


@pytest.mark.parametrize("name,how", [(n, h) for n in STORE for h in DAMAGE]
                         + [("tokens.npy", "one flipped bit")])
def test_a_damaged_token_store_is_rebuilt_and_resume_trains_on_the_corpus(
        name, how, runs, moby30, moby_vocab, tmp_path, capsys):
    """Each file of the cached token store damaged in each way (and one id changed within
    the vocabulary, which only the SHA-256 can tell): --resume notes the damage (naming
    the cache), rebuilds the store from the corpus and ends with the losses of an
    undamaged run; the rebuilt files are the original bytes."""
    straight, half = runs
    hit = flip_bit if how == "one flipped bit" else DAMAGE[how]
    capsys.readouterr()
    out = resumed(runs, tmp_path, moby30, moby_vocab, lambda out: hit(out / "cache" / name),
                  "--resume")
    err = capsys.readouterr().err
    assert_no_traceback(err)
    notes = [l for l in err.splitlines() if l.startswith("note: the cached token store")]
    assert len(notes) == 1 and "rebuilding it from the corpus" in notes[0], err
    assert str(out / "cache") in notes[0]
    assert losses(out) == losses(straight)
    for f in STORE[:3]:
        assert (out / "cache" / f).read_bytes() == (half / "cache" / f).read_bytes(), f
    info = json.loads((out / "cache" / "store.json").read_text())
    assert set(info["files"]) == set(STORE[:3])


def test_an_undamaged_store_is_reused_silently(runs, moby30, moby_vocab, tmp_path, capsys):
    straight, _ = runs
    capsys.readouterr()
    out = resumed(runs, tmp_path, moby30, moby_vocab, None, "--resume")
    assert "note:" not in capsys.readouterr().err
    assert losses(out) == losses(straight)


def _legacy(out: Path) -> None:
    """The cache as a version before the records wrote it: no "files" and no "sha256" in
    store.json."""
    marker = out / "cache" / "store.json"
    info = json.loads(marker.read_text())
    del info["files"], info["sha256"]
    marker.write_text(json.dumps(info, indent=1))


def test_a_store_written_before_records_is_checked_and_given_them(
        runs, moby30, moby_vocab, tmp_path, capsys):
    """A run written before this change resumes: its cache passes the checks that need no
    record (sizes, offsets, ids in the vocabulary), is reused and given its records."""
    straight, half = runs
    capsys.readouterr()
    out = resumed(runs, tmp_path, moby30, moby_vocab, _legacy, "--resume")
    assert "note:" not in capsys.readouterr().err
    assert losses(out) == losses(straight)
    info = json.loads((out / "cache" / "store.json").read_text())
    assert info["files"]["tokens.npy"] == derived.digest(half / "cache" / "tokens.npy")


def _legacy_with_bad_id(out: Path) -> None:
    _legacy(out)
    tokens = out / "cache" / "tokens.npy"
    arr = np.load(tokens)
    b = bytearray(tokens.read_bytes())
    at = len(b) - arr.nbytes + 4 * (len(arr) // 2)
    b[at:at + 4] = np.int32(32767).tobytes()
    tokens.write_bytes(bytes(b))


@pytest.mark.parametrize("how", ["id 32767", "truncated offsets"])
def test_a_damaged_store_written_before_records_is_rebuilt(
        how, runs, moby30, moby_vocab, tmp_path, capsys):
    """The issue's case: an id >= the vocab size in a cache without records ended in
    ``ValueError: token id 32767 >= vocab_size 300`` (a traceback); now it is rebuilt."""
    straight, _ = runs
    damage = (_legacy_with_bad_id if how == "id 32767" else
              lambda out: (_legacy(out), truncate(out / "cache" / "sentence_offsets.npy")))
    capsys.readouterr()
    out = resumed(runs, tmp_path, moby30, moby_vocab, damage, "--resume")
    err = capsys.readouterr().err
    assert_no_traceback(err)
    assert "note: the cached token store is damaged" in err
    if how == "id 32767":
        assert "token id 32767 outside the vocabulary of 300" in err
    assert losses(out) == losses(straight)


def test_overwrite_discards_the_cache(runs, moby30, moby_vocab, tmp_path, capsys):
    """--overwrite replaces the run and what it derived: a cache damaged where no check
    can see it (a legacy store, one id changed within the vocabulary) is not reused."""
    straight, _ = runs

    def damage(out):
        _legacy(out)
        flip_bit(out / "cache" / "tokens.npy")
        (out / "cache" / "left-by-the-old-run").write_text("x")
    out = resumed(runs, tmp_path, moby30, moby_vocab, damage, "--overwrite")
    assert not (out / "cache" / "left-by-the-old-run").exists()
    assert losses(out) == losses(straight)


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_run_vocab_is_copied_again_from_its_source(how, runs, moby30, moby_vocab,
                                                             tmp_path, capsys):
    """The run's vocab.txt is a copy of --vocab: damaged in each way, --resume copies it
    again (one note line) and trains as an undamaged run."""
    straight, _ = runs
    capsys.readouterr()
    out = resumed(runs, tmp_path, moby30, moby_vocab,
                  lambda out: DAMAGE[how](out / "vocab.txt"), "--resume")
    err = capsys.readouterr().err
    assert_no_traceback(err)
    assert f"note: {out / 'vocab.txt'} " in err and "copied again from --vocab" in err
    assert (out / "vocab.txt").read_bytes() == moby_vocab.read_bytes()
    assert losses(out) == losses(straight)


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_checkpoint_ends_in_an_error_line(how, runs, moby30, moby_vocab, tmp_path,
                                                    capsys):
    """The checkpoint is the run's state, not derived: it cannot be rebuilt, and --resume
    ends in one error line naming it and the way out; nothing is trained."""
    _, half = runs
    out = tmp_path / "run"
    shutil.copytree(half, out)
    ckpt = out / "checkpoint.npz"
    DAMAGE[how](ckpt)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train_mlm.main([*tiny_pretrain_argv(moby30, moby_vocab, out), "--resume"])
    assert e.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("train_mlm.py: error: "), lines
    if how == "deleted":
        assert lines[0].endswith(f"--resume {out}: no checkpoint.npz to resume from")
    else:
        assert str(ckpt) in lines[0] and lines[0].endswith(
            f"the checkpoint cannot be rebuilt: restore {ckpt} from a copy, or start the run "
            "again with --overwrite (which deletes it)")
    assert losses(out) == losses(half)


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_metrics_log_is_noted_and_the_resumed_curve_is_right(
        how, runs, moby30, moby_vocab, tmp_path, capsys):
    """metrics.jsonl is appended to line by line and cannot be rebuilt: a damaged line is
    left out (the records around it kept) and noted, a missing or empty file noted; the
    resumed steps' records equal the undamaged run's, and training is untouched."""
    straight, half = runs
    capsys.readouterr()
    out = resumed(runs, tmp_path, moby30, moby_vocab,
                  lambda out: DAMAGE[how](out / "metrics.jsonl"), "--resume")
    err = capsys.readouterr().err
    assert_no_traceback(err)
    metrics = out / "metrics.jsonl"
    if how == "flipped bytes":
        assert f"note: {metrics}: line(s) " in err and "cannot be read (damaged)" in err
    elif how != "truncated":   # a cut file reads as one torn by a crash
        assert f"note: {metrics} is missing or empty; the records before step 4" in err
    after = [r for r in losses(out) if r[0] > 4]
    assert after == [r for r in losses(straight) if r[0] > 4]
    assert set(losses(out)) <= set(losses(straight))
    assert (out / "checkpoint.npz").read_bytes() != (half / "checkpoint.npz").read_bytes()


def test_load_store_names_the_file_and_what_is_wrong(tmp_path):
    store = TokenStore(np.arange(1, 7, dtype=np.int32), np.array([0, 2, 6], np.int64),
                       np.array([0, 2], np.int64))
    d = save_store(store, tmp_path / "s")
    np.testing.assert_array_equal(load_store(d, vocab_size=7).tokens, store.tokens)
    # store.json still valid JSON, one count changed: its own SHA-256 tells
    marker = d / "store.json"
    good = marker.read_text()
    marker.write_text(good.replace('"num_tokens": 6', '"num_tokens": 5'))
    with pytest.raises(DamagedStoreError, match="store.json does not match its recorded SHA"):
        load_store(d)
    marker.write_text(good)
    with pytest.raises(DamagedStoreError, match="outside the vocabulary of 6"):
        load_store(d, vocab_size=6)
    expected = {"flipped bytes": "does not match its recorded SHA-256",
                "truncated": "truncated or extended", "deleted": "is missing",
                "empty": "is empty"}
    for how, damage in DAMAGE.items():
        d = save_store(store, tmp_path / how)
        damage(d / "tokens.npy")
        with pytest.raises(DamagedStoreError) as e:
            load_store(d)
        assert str(d / "tokens.npy") in str(e.value) and expected[how] in str(e.value)


# --------------------------------------------------------------- the evaluation harness
@pytest.fixture(scope="module")
def harness_run(tiny_pretrained, classify_task, tmp_path_factory):
    """A finished evaluate.py run (one start, one budget, one seed, one rate) and its argv
    without --output-dir."""
    argv = [str(tiny_pretrained), "--tasks", "t", "--task-dir", f"t={classify_task}",
            "--budgets", "8", "--seeds", "1", "--lr", "1e-3", "--epochs", "1",
            "--batch-size", "8", "--max-seq-length", "16", "--no-probe"]
    out = tmp_path_factory.mktemp("harness") / "eval"
    assert evaluate.main([*argv, "--output-dir", str(out)]) == 0
    return out, argv


def _copy(harness_run, tmp_path):
    src, argv = harness_run
    out = tmp_path / "eval"
    shutil.copytree(src, out)
    return out, [*argv, "--output-dir", str(out)]


def _runs(results: Path):
    return json.loads(results.read_text())["runs"]


def test_the_harness_records_its_files(harness_run):
    out, _ = harness_run
    summaries = list(out.glob("runs/**/summary.json"))
    assert len(summaries) == 1
    for f in [*summaries, out / "settings.json", out / "results.json"]:
        assert derived.check_recorded(f) is None, f


@pytest.mark.parametrize("how", [*DAMAGE, "record damaged"])
def test_a_damaged_finetuning_summary_is_run_again(how, harness_run, tmp_path, capsys):
    """A finished fine-tuning run's summary.json damaged in each way (or its record): the
    harness notes it, runs that fine-tuning again and reports what the undamaged run did."""
    out, argv = _copy(harness_run, tmp_path)
    summary = next(out.glob("runs/**/summary.json"))
    if how == "record damaged":
        flip(derived.record_path(summary))
    else:
        DAMAGE[how](summary)
    capsys.readouterr()
    assert evaluate.main(argv) == 0
    err = capsys.readouterr().err
    assert_no_traceback(err)
    assert f"note: {summary} " in err and "running that fine-tuning again" in err
    assert derived.check_recorded(summary) is None
    assert _runs(out / "results.json") == _runs(harness_run[0] / "results.json")


def test_an_undamaged_harness_run_is_reused(harness_run, tmp_path, capsys):
    out, argv = _copy(harness_run, tmp_path)
    summary = next(out.glob("runs/**/summary.json"))
    before = summary.stat().st_mtime_ns
    derived.record_path(summary).unlink()   # a run of a harness before records: adopted
    capsys.readouterr()
    assert evaluate.main(argv) == 0
    assert "note:" not in capsys.readouterr().err
    assert summary.stat().st_mtime_ns == before and derived.check_recorded(summary) is None


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_harness_settings_file_ends_in_an_error_line(how, harness_run, tmp_path,
                                                               capsys):
    """settings.json ties the finished runs to their settings and cannot be rebuilt: one
    error line names it and what to delete; --overwrite starts afresh."""
    out, argv = _copy(harness_run, tmp_path)
    settings = out / "settings.json"
    DAMAGE[how](settings)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        evaluate.main(argv)
    assert e.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"evaluate.py: error: {settings} ")
    assert f"delete {settings} and {out / 'runs'}" in lines[0]
    summary = next(out.glob("runs/**/summary.json"))
    before = summary.stat().st_mtime_ns
    assert evaluate.main([*argv, "--overwrite"]) == 0
    assert summary.stat().st_mtime_ns != before   # run afresh
    assert derived.check_recorded(settings) is None
    assert _runs(out / "results.json") == _runs(harness_run[0] / "results.json")


# ---------------------------------------------------------------- fine-tuning's best model
@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_best_model_ends_in_an_error_line(how, tiny_finetuned, classify_task,
                                                    tiny_pretrained, tmp_path, capsys):
    """best_model.npz holds the best dev weights, which cannot be rebuilt: damaged, the
    resumed run ends in one error line naming it and what to delete; deleted (as that line
    says), the run goes on (the model it ends with stands in for the best)."""
    out = tmp_path / "ft"
    shutil.copytree(tiny_finetuned, out)
    best = out / "best_model.npz"
    DAMAGE[how](best)
    argv = ["--init", str(tiny_pretrained), "--data", str(classify_task), "--output-dir",
            str(out), "--max-seq-length", "16", "--batch-size", "8", "--max-steps", "2",
            "--no-progress", "--resume"]
    capsys.readouterr()
    if how != "deleted":
        with pytest.raises(SystemExit) as e:
            finetune.main(argv)
        assert e.value.code == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"finetune.py: error: the run's best model: checkpoint {best}: "), lines
        assert f"delete {best} and go on with python finetune.py --resume {out}" in lines[0]
        best.unlink()
    assert finetune.main(argv) == 0
    assert_no_traceback(capsys.readouterr().err)
    assert json.loads((out / "summary.json").read_text())["test"]
