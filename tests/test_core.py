"""The core stands alone and runs the formulas it shows.

The formulas of minibert/nn/ are the code that runs: a formula broken in a copy of the
package fails ``python -m minibert.gradcheck`` and changes a job run with ``--no-fast-cpu``,
while the fast paths stay off unless something switches them on. And the core
(backend, fast, nn, modeling, albert, heads, optim, gradcheck, testing) imports with NumPy and
SciPy (Hypothesis for testing) and loads no job, pipeline, plotting or file-format module.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from minibert.checkpoint import load_checkpoint

from helpers import records, tiny_pretrain_argv

ROOT = Path(__file__).resolve().parents[1]
# softmax_backward's last line, and the same line without the row term sum(dp * p)
SOFTMAX_RETURN = "    return xp.multiply(dprobs - row, probs, out=out)    # shape of x\n"
BROKEN_RETURN = "    return xp.multiply(dprobs, probs, out=out)    # row term dropped\n"


def copy_with_broken_softmax(dst: Path, broken: bool) -> Path:
    """A copy of the package (and the scripts) under ``dst``, its softmax backward
    without the row term when ``broken``; returns the copy's root."""
    shutil.copytree(ROOT / "minibert", dst / "minibert",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "train_mlm.py", dst / "train_mlm.py")
    (dst / "data").symlink_to(ROOT / "data")           # the job's default files
    if broken:
        path = dst / "minibert" / "nn" / "activations.py"
        text = path.read_text()
        assert text.count(SOFTMAX_RETURN) == 1, "softmax_backward's last line moved"
        path.write_text(text.replace(SOFTMAX_RETURN, BROKEN_RETURN))
    return dst


def run(root: Path, *args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` with ``root`` first on the import path (the copy's package wins)."""
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_broken_softmax_backward_fails_gradcheck(tmp_path):
    good = run(copy_with_broken_softmax(tmp_path / "good", broken=False),
               "-m", "minibert.gradcheck", "--layer", "softmax", "attention")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "0 failed" in good.stdout
    bad = run(copy_with_broken_softmax(tmp_path / "bad", broken=True),
              "-m", "minibert.gradcheck", "--layer", "softmax", "attention")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    failed = bad.stdout.split("FAILED: ")[-1]
    # the softmax input and attention's q and k lose their gradient; v does not pass
    # through the softmax backward
    assert "attention.q" in failed and "attention.k" in failed
    assert "attention.v" not in failed


def test_a_job_with_the_fast_paths_off_runs_the_broken_formula(tmp_path, moby30, moby_vocab):
    """train_mlm.py --no-fast-cpu trains through the formulas, so the broken softmax
    backward changes the gradients of the attention's query and key weights, and AdamW
    (which follows a gradient's sign, not its size) moves those weights apart by a share
    of the learning rate; with the fast paths on (the default) the broken formula never
    runs and the run is the intact copy's, bit for bit (the same code on the same machine).

    The effect is judged on the query and key weights after 6 steps, not on the loss: on
    so tiny a model at initialisation the loss moves by about 2e-5, no more than the
    round-off by which another BLAS kernel or thread count moves it. The weights move by
    about 2e-2 (lr 1e-2), while the fast paths against the formulas, or the AVX2 kernel
    against the AVX-512 one, move them by at most about 3e-8 (measured with
    OPENBLAS_CORETYPE=Haswell; the word embeddings by 1.5e-7): the bound of 1e-3 is 20
    times below the effect and far above any round-off."""
    copies = {b: copy_with_broken_softmax(tmp_path / str(b), broken=b) for b in (False, True)}

    def trained(broken: bool, *flags) -> tuple[np.ndarray, dict]:
        """(the losses, the final weights) of a 6-step run of the intact or broken copy."""
        out = tmp_path / f"run-{broken}-{'-'.join(flags) or 'fast'}"
        argv = tiny_pretrain_argv(moby30, moby_vocab, out, "--max-steps", 6, "--lr", "1e-2",
                                  "--warmup-steps", 0, "--seed", 3, *flags)
        done = run(copies[broken], "train_mlm.py", *argv)
        assert done.returncode == 0, done.stderr[-2000:]
        losses = np.array([r["loss"] for r in records(out)])
        return losses, load_checkpoint(out / "checkpoint.npz")["model"]

    formula, broken = trained(False, "--no-fast-cpu"), trained(True, "--no-fast-cpu")
    fast, fast_broken = trained(False), trained(True)
    assert formula[0].shape == (6,)
    assert formula[0][0] == broken[0][0]                   # the forward is intact

    def moved(a: dict, b: dict, names) -> float:
        return max(float(np.abs(a[n] - b[n]).max()) for n in names)

    attention = "bert.encoder.layer.0.attention.self."
    query_key = [attention + f"{m}.{p}" for m in ("query", "key") for p in ("weight", "bias")]
    change = moved(formula[1], broken[1], query_key)       # the backward is not
    assert change > 1e-3, change
    # the fast paths differ from the formulas by round-off only, everywhere
    round_off = moved(fast[1], formula[1], formula[1])
    assert round_off * 30 < 1e-3, round_off
    np.testing.assert_array_equal(fast[0], fast_broken[0])     # the formula never ran
    for name in fast[1]:
        np.testing.assert_array_equal(fast[1][name], fast_broken[1][name], err_msg=name)


def test_a_plain_import_runs_the_formulas():
    probe = ("import minibert.modeling, minibert.optim, minibert.fast as b, sys; "
             "print(b.fast_paths_enabled(), 'minibert.fast_cpu' in sys.modules)")
    out = run(ROOT, "-c", probe)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


CORE = ("minibert", "minibert.backend", "minibert.fast", "minibert.nn", "minibert.modeling",
        "minibert.albert", "minibert.heads", "minibert.optim", "minibert.gradcheck", "minibert.testing")
# third-party modules the core must not load, and minibert's job-side modules
NOT_CORE_LIBRARIES = ("tqdm", "regex", "safetensors", "matplotlib", "torch", "mpi4py")


def test_the_core_stands_alone_in_a_fresh_interpreter():
    probe = (f"import importlib, json, sys; [importlib.import_module(m) for m in {CORE!r}]; "
             "print(json.dumps(sorted(sys.modules)))")
    out = run(ROOT, "-c", probe)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    ours = {m for m in loaded if m.startswith("minibert")}
    allowed = set(CORE) | {m for m in ours
                           if m.startswith(("minibert.nn.", "minibert.gradcheck."))}
    assert ours - allowed == set(), "the core loads job-side modules"
    assert [m for m in NOT_CORE_LIBRARIES if m in loaded] == []
    assert "numpy" in loaded and "minibert.modeling" in loaded   # the probe ran


def test_the_package_loads_its_names_lazily():
    probe = ("import sys, minibert; before = sorted(m for m in sys.modules "
             "if m.startswith('minibert')); from minibert import pipeline, BertModel; "
             "print(before, callable(pipeline), BertModel.__module__, "
             "'minibert.pipelines' in sys.modules)")
    out = run(ROOT, "-c", probe)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['minibert']", "True", "minibert.modeling", "True"]
    missing = run(ROOT, "-c", "import minibert; minibert.no_such_name")
    assert missing.returncode == 1 and "has no attribute 'no_such_name'" in missing.stderr
