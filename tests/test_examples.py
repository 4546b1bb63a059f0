"""The learner's examples run and show what they claim.

``examples/train_tiny.py`` runs as a script and its printed loss falls; the notebook
``examples/attention_backward.ipynb`` executes cell by cell (nbclient) without an error, is
stored without outputs, and its summary cell reports passing gradient checks, failing ones
under the perturbations, and attention rows that sum to 1.

Both run the minibert of this checkout (its root first on PYTHONPATH), not an installed one.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
NOTEBOOK = EXAMPLES / "attention_backward.ipynb"


def _env_with_checkout_first() -> dict[str, str]:
    """os.environ with this checkout's root in front of PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def train_tiny_figures(stdout: str) -> tuple[list[float], float, float]:
    """The losses of train_tiny.py's ``step N  loss X`` lines, its held-out loss and the
    loss of its guess by token frequency, read from its output.

    Raises:
        AssertionError: fewer than two step lines, or no held-out line.
    """
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)", stdout, re.M)]
    held_out = re.search(r"^held-out loss ([0-9.]+) \(a guess by token frequency scores "
                         r"([0-9.]+)", stdout, re.M)
    assert len(losses) >= 2 and held_out, f"unexpected output of train_tiny.py:\n{stdout}"
    return losses, float(held_out.group(1)), float(held_out.group(2))


@pytest.mark.slow
def test_train_tiny_loss_falls():
    proc = subprocess.run([sys.executable, str(EXAMPLES / "train_tiny.py")], cwd=ROOT,
                          env=_env_with_checkout_first(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses, held_out, by_frequency = train_tiny_figures(proc.stdout)
    # measured: 6.64 over the first 100 steps, 5.70 over the last 100 (ln V = 7.60)
    assert losses[-1] < losses[0] - 0.5, losses
    # measured: 5.69 against 6.06: the model uses the context, not just token frequencies
    assert held_out < by_frequency - 0.15, (held_out, by_frequency)


def test_train_tiny_figures_reject_other_output():
    with pytest.raises(AssertionError):
        train_tiny_figures("vocab 2000 tokens\nstep  100  loss 6.6\n")
    losses, held_out, freq = train_tiny_figures(
        "step  100  loss 6.636  lr 3e-03\nstep  200  loss 6.096  lr 2.67e-03\n"
        "held-out loss 5.687 (a guess by token frequency scores 6.06; below it, ...)\n")
    assert losses == [6.636, 6.096] and (held_out, freq) == (5.687, 6.06)


def test_notebook_is_stored_without_outputs():
    import nbformat
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


@pytest.mark.slow
def test_notebook_executes_and_its_checks_hold(monkeypatch):
    import nbformat
    from nbclient import NotebookClient
    monkeypatch.setenv("PYTHONPATH", _env_with_checkout_first()["PYTHONPATH"])  # the kernel's
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # raises CellExecutionError, with the cell and its traceback, if any cell fails
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors, errors
    last = nb.cells[-1]
    assert "summary" in last.source
    summary = json.loads("".join(o.text for o in last.outputs if o.output_type == "stream"))
    # every gradient of section 3 checked, and all well inside check_tensor's 1e-5
    assert summary["gradients_checked"] >= 8 and summary["all_passed"]
    assert summary["worst_rel_error"] < 1e-7
    # section 4: each perturbation breaks dq and dk and leaves dv right
    for name, errs in summary["perturbed_rel_errors"].items():
        assert errs["dq"] > 1e-2 and errs["dk"] > 1e-2 and errs["dv"] < 1e-7, (name, errs)
    assert set(summary["perturbed_rel_errors"]) == {"softmax-diagonal", "attention-scale"}
    assert summary["gradcheck_failures_under_perturbation"] == ["attention.q", "attention.k"]
    # section 5: one softmax row per layer and head, each summing to 1 (float32)
    rows = summary["cls_row_sums"]
    assert len(rows) == 4 and all(abs(s - 1) < 1e-5 for s in rows), rows
