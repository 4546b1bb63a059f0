"""One owner per run directory (issue 32; docs/reliability.md, "One owner per run
directory"): a job locks the directory it writes before it reads, cleans or writes anything
there; a second job is refused with an error line naming the owner's pid and changes no
file; no job writes over its own inputs; a Hugging Face export goes only where it may."""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import evaluate  # noqa: E402
import finetune  # noqa: E402
import train_mlm  # noqa: E402
from helpers import snapshot, tiny_pretrain_argv  # noqa: E402
from minibert.checkpoint import load_checkpoint  # noqa: E402
from minibert.runs import LOCK, MetricsLog, RunError, lock_run_dir, release_run_dirs  # noqa: E402
from minibert.tokenization.__main__ import main as tokenizer_main  # noqa: E402

# a process that owns a directory (the one way a job takes it) until its stdin closes, then
# lets it go as a job ends
HOLD = ("import sys; from minibert.runs import lock_run_dir, release_run_dirs; "
        "lock_run_dir(sys.argv[1]); print('held', flush=True); sys.stdin.read(); "
        "release_run_dirs()")


@contextlib.contextmanager
def owned_by_another_process(directory: Path):
    """Within the block another process owns ``directory``; yields its pid."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"held"
        yield proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def refused(capsys, main, argv) -> tuple[int, str]:
    """(exit status, stderr) of ``main(argv)``, which must stop with SystemExit."""
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    return e.value.code, capsys.readouterr().err


def train_losses(run: Path):
    return [(r["step"], r["loss"]) for r in MetricsLog.read(run / "metrics.jsonl")
            if r["kind"] == "train"]


def test_a_directory_has_one_owner_and_a_dead_owner_leaves_no_lock(tmp_path):
    d = tmp_path / "run"
    with owned_by_another_process(d) as pid:
        assert (d / LOCK).read_text() == f"{pid}\n"
        with pytest.raises(RunError, match=rf"--output-dir {d}: in use by another job "
                                           rf"\(pid {pid}\)"):
            lock_run_dir(d)
    assert not (d / LOCK).exists()  # the owner removed its lock file as it let go
    # an owner killed with SIGKILL leaves its lock file, but not the lock
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"held"
    proc.kill()
    proc.wait()
    assert (d / LOCK).read_text() == f"{proc.pid}\n"
    try:
        assert lock_run_dir(d) == d
        assert (d / LOCK).read_text() == f"{os.getpid()}\n"
        assert lock_run_dir(d) == d  # owned by this process already: at once
    finally:
        release_run_dirs()
    assert not (d / LOCK).exists()


def jobs_into(d: Path, corpus, vocab, pretrained, finetuned, task) -> dict:
    """Every job that writes a directory, each started into ``d``: name -> (main, argv)."""
    pretrain = tiny_pretrain_argv(corpus, vocab, d)
    return {
        "train_mlm.py": (train_mlm.main, pretrain),
        "train_mlm.py --overwrite": (train_mlm.main, [*pretrain, "--overwrite"]),
        "train_mlm.py --resume": (train_mlm.main, ["--resume", d, "--no-progress"]),
        "finetune.py --overwrite": (finetune.main, [
            "--init", pretrained, "--data", task, "--output-dir", d, "--overwrite",
            "--max-steps", 1, "--no-progress"]),
        "finetune.py --export-hf": (finetune.main, [
            "--model", finetuned, "--export-hf", d, "--overwrite"]),
        "finetune.py --plot-attention": (finetune.main, [
            "--model", finetuned, "--plot-attention", "call me ishmael", "--output-dir", d]),
        "evaluate.py": (evaluate.main, [
            pretrained, "--output-dir", d, "--overwrite", "--tasks", "t", "--task-dir",
            f"t={task}", "--budgets", 8, "--seeds", 1, "--no-finetune", "--no-probe"]),
        "tokenizer": (tokenizer_main, [
            "train", "--quiet", "--files", corpus, "--vocab-size", 100,
            "--output", d / "vocab.txt"]),
    }


JOBS = list(jobs_into(Path("."), *[Path(".")] * 5))


@pytest.mark.parametrize("job", JOBS)
def test_a_job_into_a_directory_another_job_owns_changes_nothing(
        job, moby30, moby_vocab, tiny_pretrained, tiny_finetuned, classify_task, tmp_path,
        capsys):
    """Issue 32: a second train_mlm.py deleted the running job's *.tmp files (its
    checkpoint being written) before it was refused. Now no job touches a directory that
    another owns: not a *.tmp file, not a byte, not an mtime."""
    busy = shutil.copytree(tiny_pretrained, tmp_path / "busy")
    (busy / "checkpoint.npz.k3j9x.tmp").write_bytes(b"the owner's checkpoint, half written")
    main, argv = jobs_into(busy, moby30, moby_vocab, tiny_pretrained, tiny_finetuned,
                           classify_task)[job]
    with owned_by_another_process(busy) as pid:
        before = snapshot(busy)
        code, err = refused(capsys, main, argv)
        assert snapshot(busy) == before
    assert code == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert "error:" in line and f"{busy}: in use by another job (pid {pid})" in line


# started by each of two processes: imports done, it waits for the start signal, then runs
LAUNCH = """import os, sys, time
import train_mlm
ready, go = sys.argv[1:3]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
sys.exit(train_mlm.main(sys.argv[3:]))
"""


def test_two_jobs_started_at_once_into_one_directory(moby30, moby_vocab, tmp_path):
    """Issue 32: both exited 0 and reported the same checkpoint. Now exactly one runs;
    the other is refused naming the winner's pid, and the directory holds the one run,
    the same as a run started alone."""
    out = tmp_path / "run"
    argv = tiny_pretrain_argv(moby30, moby_vocab, out, "--max-steps", 16)
    procs = [subprocess.Popen([sys.executable, "-c", LAUNCH, str(tmp_path / f"ready{i}"),
                               str(tmp_path / "go"), *argv], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for i in range(2)]
    t0 = time.time()
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.time() - t0 < 120 and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    (tmp_path / "go").touch()
    errs = [p.communicate(timeout=300)[1].decode() for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], errs
    winner = procs[codes.index(0)]
    assert errs[codes.index(2)].strip().splitlines() == [
        f"train_mlm.py: error: --output-dir {out}: in use by another job (pid {winner.pid}); "
        "wait for it to end, or choose another directory"]
    alone = tmp_path / "alone"
    assert train_mlm.main(tiny_pretrain_argv(moby30, moby_vocab, alone, "--max-steps", 16)) == 0
    assert set(snapshot(out)) == set(snapshot(alone))  # the same files, no .lock left
    assert train_losses(out) == train_losses(alone)
    a, b = load_checkpoint(out / "checkpoint.npz"), load_checkpoint(alone / "checkpoint.npz")
    assert a["trainer"]["step"] == 16
    for k, v in b["model"].items():
        np.testing.assert_array_equal(a["model"][k], v, err_msg=k)


def own_inputs(tmp_path, moby30, moby_vocab, tiny_pretrained, tiny_finetuned, task) -> dict:
    """name -> (main, argv, the directory or file that must stay as it is, the message)."""
    d = tmp_path / "d"
    d.mkdir()
    corpus = shutil.copy(moby30, d / "corpus.txt")
    vocab = shutil.copy(moby_vocab, d / "vocab.txt")
    corpus_dir = shutil.copytree(moby30.parent, tmp_path / "corpus_dir")
    start = shutil.copytree(tiny_finetuned, tmp_path / "start")
    data = shutil.copytree(task, tmp_path / "data")
    starts = tmp_path / "starts"
    shutil.copytree(tiny_pretrained, starts / "pre")
    return {
        "corpus file": (train_mlm.main, tiny_pretrain_argv(corpus, moby_vocab, d), d,
                        f"--output-dir {d}: holds an input of this job (--corpus {corpus})"),
        "corpus directory": (train_mlm.main, tiny_pretrain_argv(corpus_dir, moby_vocab,
                                                                corpus_dir),
                             corpus_dir, "is an input of this job (--corpus"),
        "vocab": (train_mlm.main, [*tiny_pretrain_argv(moby30, vocab, d), "--overwrite"], d,
                  f"holds an input of this job (--vocab {vocab})"),
        "start model": (finetune.main, [
            "--init", start, "--data", task, "--output-dir", start, "--overwrite",
            "--max-steps", 1, "--no-progress"], start, "is an input of this job (--init"),
        "data": (finetune.main, ["--init", tiny_pretrained, "--data", data, "--output-dir",
                                 data, "--max-steps", 1, "--no-progress"],
                 data, "is an input of this job (--data"),
        "evaluate start": (evaluate.main, [
            starts / "pre", "--output-dir", starts, "--tasks", "t", "--task-dir", f"t={task}",
            "--budgets", 8, "--seeds", 1, "--no-finetune", "--no-probe"],
            starts, "holds an input of this job (START"),
        "tokenizer corpus": (tokenizer_main, [
            "train", "--quiet", "--files", corpus, "--vocab-size", 100, "--output", corpus],
            d, f"--output {corpus}: is an input of this job (--files {corpus})"),
    }


@pytest.mark.parametrize("case", ["corpus file", "corpus directory", "vocab", "start model",
                                  "data", "evaluate start", "tokenizer corpus"])
def test_no_job_writes_over_its_own_inputs(case, moby30, moby_vocab, tiny_pretrained,
                                           tiny_finetuned, classify_task, tmp_path, capsys):
    """Issue 32: the WordPiece trainer with --output one of its --files overwrote the
    corpus. No job writes where its inputs are (with --overwrite neither): it is refused
    before anything is read from or written to that directory."""
    main, argv, kept, message = own_inputs(tmp_path, moby30, moby_vocab, tiny_pretrained,
                                           tiny_finetuned, classify_task)[case]
    before = snapshot(kept)
    code, err = refused(capsys, main, argv)
    assert code == 2 and message in err and "Traceback" not in err
    assert snapshot(kept) == before


def export(capsys, model, target, *extra) -> tuple[int, str]:
    try:
        code = finetune.main(["--model", str(model), "--export-hf", str(target), *extra])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_export_hf_writes_only_into_a_new_directory_or_its_own_export(
        tiny_pretrained, tiny_finetuned, classify_task, tmp_path, capsys):
    """Issue 32: --export-hf into another run's directory overwrote its config.json and
    vocab.txt, and that run then loaded with the wrong vocabulary."""
    ft = tiny_finetuned
    other_run = shutil.copytree(tiny_pretrained, tmp_path / "other_run")
    before = snapshot(other_run)
    code, err = export(capsys, ft, other_run)
    assert code == 2 and (f"--export-hf {other_run}: holds files that are not a minibert "
                          "export (args.json, cache, checkpoint.npz, config.json, ...)") in err
    assert snapshot(other_run) == before
    # a new directory, marked as the export of ft; the same model again needs no --overwrite
    hf = tmp_path / "hf"
    assert export(capsys, ft, hf)[0] == 0 and export(capsys, ft, hf)[0] == 0
    mark = lambda: json.loads((hf / ".minibert-export.json").read_text())["exported_from"]
    assert mark() == str(ft.resolve())
    assert {p.name for p in hf.iterdir()} == {"config.json", "model.safetensors", "vocab.txt",
                                             "tokenizer_config.json", ".minibert-export.json"}
    # another model's export stays unless --overwrite; with it, no file of the old model
    # that a loader would read before ours is left (a tokenizer.json wins over vocab.txt)
    ft2 = shutil.copytree(ft, tmp_path / "ft2")
    before = snapshot(hf)
    code, err = export(capsys, ft2, hf)
    assert code == 2 and f"holds the export of another model ({ft.resolve()})" in err
    assert snapshot(hf) == before
    (hf / "tokenizer.json").write_text("{}")
    assert export(capsys, ft2, hf, "--overwrite")[0] == 0
    assert mark() == str(ft2.resolve()) and not (hf / "tokenizer.json").exists()
    # never into the model's own directory, --overwrite or not
    before = snapshot(ft)
    code, err = export(capsys, ft, ft, "--overwrite")
    assert code == 2 and f"--export-hf {ft}: is an input of this job (--model {ft})" in err
    assert snapshot(ft) == before
    # a training run's export is checked before it trains: not into the run's directory
    out = tmp_path / "new_run"
    with pytest.raises(SystemExit):
        finetune.main(["--init", str(tiny_pretrained), "--data", str(classify_task),
                       "--output-dir", str(out), "--export-hf", str(out), "--no-progress"])
    assert f"--export-hf {out}: is the directory of the model it exports" in \
        capsys.readouterr().err
    assert not out.exists()
