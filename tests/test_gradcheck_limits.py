"""The gradient-check tool refuses nonsense: tolerances that are not finite and positive,
and sizes that cannot fit in memory, before anything is allocated (command line and API)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert.gradcheck import Shapes, check_module, check_tensor, run_checks
from minibert.nn import Linear

ROOT = Path(__file__).resolve().parents[1]


def gradcheck_cli(*args):
    return subprocess.run([sys.executable, "-m", "minibert.gradcheck", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("option,value", [("--tol", "0"), ("--tol", "nan"), ("--atol", "-1"),
                                          ("--atol", "inf"), ("--batch", "0"),
                                          ("--label-smoothing", "1")])
def test_cli_refuses_bad_numbers_naming_the_option(option, value):
    r = gradcheck_cli("--layer", "linear", option, value)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"python -m minibert.gradcheck: error: argument {option}: expected")


@pytest.mark.parametrize("argv,named", [
    (["--batch", "100000", "--seq-len", "4096"], "--batch x --heads x --seq-len^2"),
    (["--vocab", "1000000000", "--hidden", "4096", "--heads", "1"], "--vocab x --hidden"),
    (["--layers", "100000", "--hidden", "4096", "--intermediate", "16384", "--heads", "1"],
     "--layers x --hidden x --intermediate")])
def test_cli_refuses_sizes_that_cannot_fit_before_allocating(argv, named):
    r = gradcheck_cli("--layer", "linear", *argv)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "MemoryError" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"python -m minibert.gradcheck: error: {named} too large")
    assert "GB of memory available" in last


@pytest.mark.parametrize("bad", [0.0, -1e-5, float("nan"), float("inf")])
def test_api_refuses_bad_tolerances(bad):
    lin = Linear(3, 2, rng=np.random.default_rng(0), dtype=np.float64)
    x = np.random.default_rng(1).standard_normal((4, 3))
    for kw in ({"tol": bad}, {"atol": bad}, {"h": bad}):
        name = next(iter(kw))
        with pytest.raises(ValueError, match=rf"^{name} must be a finite number > 0"):
            check_module(lin, [x], **kw)
        with pytest.raises(ValueError, match=rf"^{name} must be a finite number > 0"):
            check_tensor(lambda: 0.0, x.copy(), np.zeros_like(x), **kw)
        with pytest.raises(ValueError, match=rf"^{name} must be a finite number > 0"):
            run_checks(["linear"], Shapes(), **kw)
    assert check_module(lin, [x], tol=1e-5, atol=1e-8)  # the defaults still pass


def test_api_refuses_sizes_that_cannot_fit():
    with pytest.raises(ValueError, match=r"--batch x --heads x --seq-len\^2 too large"):
        run_checks(["linear"], Shapes(batch=10**6, seq_len=10**6))
    assert 8 * sum(Shapes().float64_terms().values()) < 1 << 20  # the defaults are small
