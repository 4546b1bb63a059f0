"""minibert on systems without Linux's extras (issue 51 item 8), through stand-ins.

CI runs on Linux x86_64 only. Each test here starts a fresh Python with
tests/portability_shim.py installed before minibert is imported: no /proc, no glibc, no
``os.sched_getaffinity`` (macOS and Windows), and for Windows also no ``resource``,
``fcntl``, ``os.sysconf``, ``os.fork``, ``os.pread`` / ``os.pwrite``, with an
``msvcrt`` for the run directory's lock. In it run the core (a forward and backward of a
tiny BertForPreTraining, the fast paths on, compared with the same step here), a short
pretraining run of train_mlm.py and a short fine-tuning run of finetune.py from it (each
as its script starts, so every module is imported under the stand-in), and, for Windows,
a second process refused a run directory the first one holds. Where minibert called what
the system lacks unguarded, the job's process dies at import or the check fails.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import tiny_pretrain_argv
from minibert.checkpoint import load_checkpoint
from portability_shim import ROOT, tiny_step

SHIM = ROOT / "tests" / "portability_shim.py"
TIMEOUT_S = 300


def shimmed(system: str, scenario: str, *args, threads: int = 1) -> subprocess.CompletedProcess:
    """``python tests/portability_shim.py SYSTEM SCENARIO ARGS`` from the repository root,
    its output captured, with ``threads`` threads for BLAS and minibert's pools
    (``OMP_NUM_THREADS``)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, str(SHIM), system, scenario, *map(str, args)],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def assert_ran(done: subprocess.CompletedProcess) -> None:
    """The process ended with status 0; else its output is the failure's message."""
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize("system", ["windows", "macos"])
def test_the_core_runs_and_the_fallbacks_answer(system, tmp_path):
    """Memory unknown (Windows stand-in: None) or the physical memory (macOS: os.sysconf),
    no glibc setting claimed, OpenBLAS found without /proc and put on one thread while
    the fast paths are on, given its threads back after; the step's loss and gradients
    are the ones this process computes."""
    out = tmp_path / "core.npz"
    assert_ran(shimmed(system, "core", out, threads=2))     # one OpenBLAS thread: a change
    from minibert import fast
    with fast.fast_paths():
        loss, grads = tiny_step()
    with np.load(out) as got:
        assert set(got.files) == {"loss", *grads}
        np.testing.assert_allclose(got["loss"], loss, rtol=1e-6)
        for name, g in grads.items():
            np.testing.assert_allclose(got[name], g, rtol=1e-6, atol=1e-9, err_msg=name)


@pytest.mark.parametrize("system", ["windows", "macos"])
def test_pretraining_and_finetuning_run(system, moby30, moby_vocab, classify_task, tmp_path):
    """train_mlm.py for 2 steps, then finetune.py for 2 steps from its run, both in the
    stand-in's process, write their checkpoints at the last step."""
    pre, ft = tmp_path / "pretrain", tmp_path / "finetune"
    pretrain = tiny_pretrain_argv(moby30, moby_vocab, pre, "--max-steps", 2, "--save-every", 2)
    finetune = ["--init", str(pre), "--data", str(classify_task), "--output-dir", str(ft),
                "--max-seq-length", "16", "--batch-size", "8", "--max-steps", "2",
                "--no-progress"]
    assert_ran(shimmed(system, "jobs", json.dumps(pretrain), json.dumps(finetune)))
    assert load_checkpoint(pre / "checkpoint.npz", arrays=False)["trainer"]["step"] == 2
    assert load_checkpoint(ft / "checkpoint.npz", arrays=False)["trainer"]["step"] == 2
    summary = json.loads((ft / "summary.json").read_text(encoding="utf-8"))
    assert 0.0 <= summary["dev"]["accuracy"] <= 1.0


def test_a_held_run_directory_is_refused_on_windows(tmp_path):
    """Through msvcrt's lock: a second process cannot take a run directory the first
    holds, and its error names the holder's pid (read past the locked byte)."""
    run, ready = tmp_path / "run", tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, str(SHIM), "windows", "hold", run, ready],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    refused = None
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and holder.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if ready.exists():
            refused = shimmed("windows", "refused", run, ready.read_text(encoding="utf-8"))
    finally:
        _, err = holder.communicate(input="", timeout=60)    # stdin closed: it lets go
    assert refused is not None, f"the holder did not take the directory:\n{err}"
    assert_ran(refused)
    assert holder.returncode == 0, err
