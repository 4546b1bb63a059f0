"""python -m minibert.selftest (issue 43 item 1): the plan its --dry-run prints on a machine
without a GPU, and the step runner's verdicts, with stand-in steps."""
import io
import json
import subprocess
import sys

import pytest

from helpers import bfloat16_or_refusal
from minibert import selftest
from minibert.selftest import Step, exit_status, plan, run_steps, unexpected_skips

# what issue 43 asks the command to cover, as words the plan's step names must contain
REQUIRED = ["env/nvidia-smi", "env/device-summary", "env/start-up-cold", "env/start-up-warm",
            "env/tf32", "tests/pytest", "parity/one-step-cpu-gpu",
            "parity/float16-vs-float32-50-steps", "smoke/train-30", "smoke/resume-10",
            "smoke/resume-exact", "smoke/float16", "smoke/tf32", "smoke/finetune",
            "smoke/fill-mask", "smoke/pll-score", "nccl/mpirun-np-1", "nccl/mpirun-np-2",
            "speed/launches", "speed/mini-vs-torch", "speed/small-vs-torch"]


def test_the_dry_run_prints_every_step_with_its_command_and_limit(tmp_path):
    done = subprocess.run([sys.executable, "-m", "minibert.selftest", "--device", "cuda",
                           "--dry-run", "--workdir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name in REQUIRED:
        row = next((l for l in lines if l.startswith(name + " ")), None)
        assert row is not None, f"{name} missing from the plan:\n{done.stdout}"
        assert " s  " in row
    text = done.stdout
    for piece in ("nvidia-smi", "pytest -q -rs", "tests/test_gpu.py", "tests/test_backend.py",
                  "train_mlm.py", "--resume", "--dtype float16", "--tf32", "finetune.py",
                  "predict fill-mask", "minibert score", "mpirun -np 1", "--distributed nccl",
                  "bench/bench_train_step.py", "--presets mini", "--presets small",
                  "--device cuda", "--precision fp32 tf32 fp16 bf16", "torch_graphed",
                  "bench/count_launches.py"):
        assert piece in text, piece
    assert not (tmp_path / "w").exists()                   # a dry run writes nothing


def test_the_plan_fits_in_ten_minutes_on_one_gpu():
    steps = plan("cuda", 1)
    assert sum(s.timeout_s for s in steps if s.skip is None) < 600
    assert [s.name for s in steps if s.skip] == ["nccl/mpirun-np-2"]
    four = plan("cuda", 4)
    np4 = next(s for s in four if s.name == "nccl/mpirun-np-4")
    assert np4.skip is None and np4.argv[:3] == ["mpirun", "-np", "4"]
    assert len({s.name for s in steps}) == len(steps)


def steps_with(outcomes):
    """Stand-in steps and a runner giving each its (exit status or None, output)."""
    steps = [Step(name, ["true"], 5, check=check, skip=skip)
             for name, (_, _, check, skip) in outcomes.items()]
    return steps, lambda step: outcomes[step.name][:2]


def table(steps, runner):
    out = io.StringIO()
    results = run_steps(steps, runner, out)
    return results, out.getvalue()


def test_a_failing_step_gives_a_fail_row_and_a_non_zero_exit():
    steps, runner = steps_with({
        "env/ok": (0, "fine\n", None, None),
        "smoke/broken": (1, "Traceback ...\nRuntimeError: boom\n", None, None),
        "smoke/hung": (None, "", None, None),
        "nccl/np-2": (0, "", None, "1 GPU"),
    })
    results, text = table(steps, runner)
    status = {r.step.name: r.status for r in results}
    assert status == {"env/ok": "PASS", "smoke/broken": "FAIL", "smoke/hung": "FAIL",
                      "nccl/np-2": "SKIP"}
    assert exit_status(results) == 1
    row = next(l for l in text.splitlines() if l.startswith("smoke/broken"))
    assert "FAIL" in row and "exit 1: RuntimeError: boom" in row
    assert "timed out after 5 s" in next(l for l in text.splitlines() if l.startswith("smoke/hung"))
    ok, _ = table(*steps_with({"env/ok": (0, "", None, None), "x/skip": (0, "", None, "why")}))
    assert exit_status(ok) == 0


PYTEST_OUT = """\
..s.s
SKIPPED [1] tests/test_gpu.py:390: checks the NumPy stand-in itself (tests/fakecupy.py)
{extra}5 passed, 2 skipped in 3.0s
"""


def test_an_unexpected_pytest_skip_counts_as_a_failure():
    expected = PYTEST_OUT.format(extra="")
    unexpected = PYTEST_OUT.format(extra="SKIPPED [1] tests/test_gpu.py:213: NCCL is not "
                                         "available (pip install 'minibert[nccl]')\n")
    assert unexpected_skips(expected) is None
    assert "NCCL is not available" in unexpected_skips(unexpected)
    results, text = table(*steps_with({
        "tests/expected": (0, expected, unexpected_skips, None),
        "tests/unexpected": (0, unexpected, unexpected_skips, None)}))
    assert [r.status for r in results] == ["PASS", "FAIL"]
    assert exit_status(results) == 1 and "1 unexpected skip(s)" in text


def test_the_tests_that_skip_on_a_gpu_by_design_are_expected_skips():
    """The GPU-run files' skips that a real GPU meets by design (the missing-CUDA error,
    found there on the H200's first run as an "unexpected skip") say so in their reason."""
    import test_backend
    (mark,) = test_backend.test_cuda_without_gpu_names_the_missing_piece.pytestmark
    line = f"SKIPPED [1] tests/test_backend.py:33: {mark.kwargs['reason']}"
    assert unexpected_skips(PYTEST_OUT.format(extra=line + "\n")) is None


def test_a_check_step_fails_on_its_result_line():
    bad = '{"ok": false, "why": "loss differs"}\n'
    results, _ = table(*steps_with({"parity/x": (0, bad, selftest._expect_ok, None),
                                    "parity/y": (0, '{"ok": true}\n', selftest._expect_ok, None),
                                    "parity/z": (0, "no json\n", selftest._expect_ok, None)}))
    assert [(r.status, r.note) for r in results] == [
        ("FAIL", "loss differs"), ("PASS", '{"ok": true}'), ("FAIL", "no result line")]


def speed_line(preset="mini", **ms):
    """A bench_train_step.py result line: minibert's ms per step by precision."""
    rows = [{"preset": preset, "precision": q, "minibert_s_per_step": t / 1e3}
            for q, t in ms.items()]
    return json.dumps({"speed": rows})


FAST_HALF = dict(fp32=16.0, tf32=12.0, fp16=9.0, bf16=9.5)


def test_a_speed_step_fails_when_half_precision_is_slower_than_float32():
    check = selftest.half_not_slower
    assert check("mini fp32: ...\n" + speed_line(**FAST_HALF) + "\n") is None
    assert check(speed_line(**dict(FAST_HALF, fp16=16.0))) is None          # level passes
    why = check(speed_line(**dict(FAST_HALF, bf16=47.0)))
    assert why == "half precision slower than float32: mini bf16 47.0 ms > fp32 16.0 ms"
    assert "fp16" in check(speed_line(**dict(FAST_HALF, fp16=16.1)))
    assert check(speed_line(fp32=16.0, fp16=9.0)) == "no speed row for mini tf32, mini bf16"
    assert check("no json\n") == "no speed line"
    assert check('{"speed": []}') == "no speed row for any preset"


def test_main_runs_only_the_steps_asked_for(monkeypatch, capsys):
    ran = []
    out = '{"ok": true}\n' + speed_line(**FAST_HALF)
    monkeypatch.setattr(selftest, "run_process", lambda step: (ran.append(step.name), (0, out))[1])
    monkeypatch.setattr(selftest, "run_steps",
                        lambda steps, runner=None, out=None, log=None: run_steps(
                            steps, selftest.run_process, io.StringIO(), log))
    assert selftest.main(["--only", "env/tf32", "speed", "--gpus", "1"]) == 0
    assert ran == ["env/tf32", "speed/launches", "speed/mini-vs-torch", "speed/small-vs-torch"]


def test_the_log_keeps_every_steps_whole_output(monkeypatch, tmp_path):
    outputs = {"env/tf32": (0, "line one\nline two\n"), "speed/launches": (0, '{"ok": true}'),
               "speed/mini-vs-torch": (3, "boom\n"), "speed/small-vs-torch": (None, "half")}
    monkeypatch.setattr(selftest, "run_process", lambda step: outputs[step.name])
    log = tmp_path / "selftest.log"
    assert selftest.main(["--only", "env/tf32", "speed", "--gpus", "1", "--log", str(log)]) == 1
    text = log.read_text()
    for name, (rc, out) in outputs.items():
        head = next(l for l in text.splitlines() if l.startswith(f"===== {name} "))
        assert f"(exit {rc}," in head
        assert out in text
    assert text.index("line one\nline two") < text.index("boom") < text.index("half")


@pytest.mark.parametrize("argv, expected", [
    (["--log", "{tmp}/no-such-dir/selftest.log"], "error: --log: cannot write"),
    (["--gpus", "0"], "error: --gpus must be >= 1, got 0"),
])
def test_bad_options_get_an_error_line_before_any_step_runs(monkeypatch, tmp_path, capsys,
                                                             argv, expected):
    ran = []
    monkeypatch.setattr(selftest, "run_process", lambda step: (ran.append(step.name), (0, ""))[1])
    with pytest.raises(SystemExit) as exit_:
        selftest.main(["--only", "env/tf32", *(a.format(tmp=tmp_path) for a in argv)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and expected in err and "Traceback" not in err
    assert ran == []


def test_the_parity_checks_run_through_the_stand_in(cuda, capsys):
    """The parity steps' own code (one mini step on the CPU and the device; float16 against
    float32; the tiny preset and 2 steps here, mini and 50 on a GPU) runs and reports ok: on the stand-in the device is
    NumPy, so this checks the plumbing, not cuBLAS."""
    import json
    from minibert import backend
    try:
        assert selftest._check_parity_one_step("tiny") == 0
        assert selftest._check_parity_half("float16", 2, "tiny") == 0
        bf16 = bfloat16_or_refusal()      # None on the floor run's NumPy (refused there)
        if bf16 is not None:
            assert selftest._check_parity_half("bfloat16", 2, "tiny") == 0
    finally:
        backend.set_device("cpu")
    lines = [json.loads(l) for l in capsys.readouterr().out.splitlines() if l.startswith("{")]
    assert lines[0]["ok"], lines[0]
    assert len(lines) == 2 + (bf16 is not None)
    for half in lines[1:]:
        assert half["ok"] and min(half["loss_drop"]) > 0, half


def test_a_steps_output_ends_with_the_stream_that_says_most():
    """run_process: stdout last after a clean exit (the result line the table shows), stderr
    last after a failure, and both kept when the step runs past its limit."""
    say = "import sys, time; print('to stdout', flush=True); " \
          "print('to stderr', file=sys.stderr, flush=True); "
    ok = selftest.run_process(Step("t/ok", [sys.executable, "-c", say], 20))
    bad = selftest.run_process(Step("t/bad", [sys.executable, "-c", say + "sys.exit(3)"], 20))
    slow = selftest.run_process(Step("t/slow", [sys.executable, "-c", say + "time.sleep(30)"], 3))
    assert ok == (0, "to stderr\nto stdout\n")
    assert bad == (3, "to stdout\nto stderr\n")
    assert slow[0] is None and "to stdout" in slow[1] and "to stderr" in slow[1]


def test_the_interrupted_run_check_runs_the_job_from_the_package(moby30, moby_vocab, tmp_path,
                                                                  capsys, monkeypatch):
    """smoke/train-30's check runs the pretraining job in its process through
    minibert.pretraining.command (no script put on sys.path, issue 51 item 9) and stops it
    right after the asked step's checkpoint: on the CPU here, 4 of 8 steps."""
    import json
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(selftest.ROOT)])
    monkeypatch.delitem(sys.modules, "train_mlm", raising=False)   # no script to import
    from helpers import tiny_pretrain_argv
    from minibert.checkpoint import load_checkpoint
    out = tmp_path / "run"
    assert selftest._check_interrupted_run("4", *tiny_pretrain_argv(moby30, moby_vocab, out)) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.splitlines() if l.startswith("{")]
    assert lines[-1]["ok"] and lines[-1]["exit_status"] == 130, lines[-1]
    assert load_checkpoint(out / "checkpoint.npz", arrays=False)["trainer"]["step"] == 4
    assert "train_mlm" not in sys.modules
