"""One command that verifies the GPU path: ``python -m minibert.selftest --device cuda``.

Run it first on the day a GPU is at hand (docs/gpu.md). It runs a fixed plan of steps, each
a separate process with its own time limit (the limits add up to under 10 minutes on one
GPU), prints one table row per step (PASS / FAIL / SKIP, seconds, what it found) and exits
1 when any step failed, 0 otherwise:

- env: ``nvidia-smi``; driver / CUDA versions and :func:`minibert.backend.device_summary`;
  the start-up check of ``set_device("cuda")`` with a cold kernel cache, then warm; the TF32
  check of docs/gpu.md (a product of 1.0001s is exactly 256 with TF32 on the three matmul
  paths, about 256.0256 without);
- tests: ``pytest -q -rs tests/test_gpu.py tests/test_backend.py tests/test_gpu_kernels.py
  tests/test_graphs.py``
  against the real CuPy; a skip whose reason is not one of :data:`EXPECTED_SKIPS` fails;
- parity: one step of mini on the CPU and the GPU with dropout off (loss and gradient
  norm), and 50 steps float16, then bfloat16, against float32 on the GPU;
- smoke: 30 steps of ``train_mlm.py --device cuda``, ``--resume`` for 10 more (compared
  with 40 uninterrupted steps), ``--dtype float16``, ``--dtype bfloat16``, ``--tf32``,
  ``finetune.py --device cuda`` from the run, the fill-mask pipeline and PLL scoring on the device;
- nccl: ``mpirun -np 1 train_mlm.py --device cuda --distributed nccl`` (and ``-np N``
  with N GPUs);
- speed: the kernel launches of one mini step in float32 and float16, counted on the GPU
  (CUPTI, through PyTorch's profiler, in bench/count_launches.py) against :data:`LAUNCH_PINS`, the counts the stand-in
  pins; then ``bench/bench_train_step.py --device cuda`` for mini and small at fp32, TF32,
  float16 and bfloat16 against PyTorch eager and PyTorch with CUDA graphs, the speed table
  printed; it fails when a half-precision step is slower than the float32 one.

``--dry-run`` prints the plan (every command, with its time limit) and runs nothing; it
needs no GPU and exits 0. ``--only GROUP_OR_STEP ...`` runs a part of the plan. The checks
that are Python code (parity, TF32, start-up timing) run as ``python -m minibert.selftest
--check NAME`` in their own process.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from .distributed import OPEN_MPI_AS_ROOT

ROOT = Path(__file__).resolve().parent.parent

EXPECTED_SKIPS = ("NumPy stand-in", "without a GPU")
"""Substrings of the pytest skip reasons that are expected on a real GPU (tests that check
the stand-in itself, tests/fakecupy.py, or what a machine without a GPU does); any other
skip is a failure of the tests step."""


@dataclasses.dataclass
class Step:
    """One step of the plan.

    Attributes:
        name: ``group/what`` (e.g. ``smoke/resume``); group is one of env, tests, parity,
            smoke, nccl, speed.
        argv: the command (run with cwd = the repository root); empty for a step that is
            planned as skipped.
        timeout_s: its time limit in seconds.
        check: reads the step's output (stdout and stderr together) and returns a failure
            message, or None when the output is as expected; run only when the exit status
            is 0.
        skip: why the step is skipped on this machine (an expected skip: the -np N run with
            fewer than two GPUs), or None.
        env: extra environment variables.
    """

    name: str
    argv: list[str]
    timeout_s: int
    check: Callable[[str], str | None] | None = None
    skip: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def group(self) -> str:
        return self.name.split("/", 1)[0]

    def command(self) -> str:
        """The command as a shell line (environment first)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


@dataclasses.dataclass
class Result:
    """What a step gave: status PASS / FAIL / SKIP, seconds, and a one-line note (the
    reason of a failure or skip, or the step's summary line)."""

    step: Step
    status: str
    seconds: float
    note: str


# ------------------------------------------------------------------------- output checks

def unexpected_skips(output: str, expected: Sequence[str] = EXPECTED_SKIPS) -> str | None:
    """The pytest ``-rs`` summary's skips whose reason contains none of ``expected``, as a
    failure message; None when there are none."""
    skips = [line for line in output.splitlines() if line.startswith("SKIPPED")]
    bad = [s for s in skips if not any(e in s for e in expected)]
    if bad:
        return f"{len(bad)} unexpected skip(s): " + " | ".join(bad)
    return None


def _json_line(output: str, key: str) -> dict | None:
    """The last line of ``output`` that is a JSON object with ``key``."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if key in obj:
                return obj
    return None


def _expect_ok(output: str) -> str | None:
    """A ``--check`` step: its last JSON line must have ``"ok": true``."""
    obj = _json_line(output, "ok")
    if obj is None:
        return "no result line"
    return None if obj["ok"] else obj.get("why", "check failed")


SPEED_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
"""The precisions of the speed table (bench/bench_train_step.py's --precision)."""


def half_not_slower(output: str) -> str | None:
    """A speed step (bench/bench_train_step.py): its ``{"speed": [row, ...]}`` line must
    have a row per precision of :data:`SPEED_PRECISIONS`, and minibert's float16 and bfloat16
    steps must not be slower than its float32 step of the same preset (issue 52)."""
    obj = _json_line(output, "speed")
    if obj is None:
        return "no speed line"
    rows = {(r["preset"], r["precision"]): r["minibert_s_per_step"] for r in obj["speed"]}
    missing = [f"{p} {q}" for p in {p for p, _ in rows} for q in SPEED_PRECISIONS
               if (p, q) not in rows]
    if missing or not rows:
        return f"no speed row for {', '.join(missing) or 'any preset'}"
    slow = [f"{p} {q} {1e3 * t:.1f} ms > fp32 {1e3 * rows[p, 'fp32']:.1f} ms"
            for (p, q), t in rows.items() if q in ("fp16", "bf16") and t > rows[p, "fp32"]]
    return f"half precision slower than float32: {'; '.join(slow)}" if slow else None


# ------------------------------------------------------------------------- the plan

def _env_steps(check: list[str], py: list[str], cache: str) -> list[Step]:
    """The env, tests and parity steps: the device, the start-up with a cold and a warm
    kernel cache (``cache``), TF32, pytest against the real CuPy and the parity checks.
    ``check`` is the ``--check`` command prefix, ``py`` the interpreter."""
    return [
        Step("env/nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                                "compute_cap", "--format=csv"], 10),
        Step("env/device-summary", check + ["device-summary"], 10, _expect_ok),
        Step("env/start-up-cold", check + ["start-up"], 15, _expect_ok,
             env={"CUPY_CACHE_DIR": cache}),
        Step("env/start-up-warm", check + ["start-up"], 15, _expect_ok,
             env={"CUPY_CACHE_DIR": cache}),
        Step("env/tf32", check + ["tf32"], 15, _expect_ok),
        Step("tests/pytest", py + ["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                                   "tests/test_gpu.py", "tests/test_backend.py",
                                   "tests/test_gpu_kernels.py", "tests/test_graphs.py"], 80,
             unexpected_skips),
        Step("parity/one-step-cpu-gpu", check + ["parity-one-step"], 15, _expect_ok),
        Step("parity/float16-vs-float32-50-steps", check + ["parity-half", "float16"], 15,
             _expect_ok),
        Step("parity/bfloat16-vs-float32-50-steps", check + ["parity-half", "bfloat16"], 15,
             _expect_ok),
    ]


def _smoke_steps(w: Path, check: list[str], py: list[str], train, device: str) -> list[Step]:
    """The smoke steps under the work directory ``w``: prepare, train 30 steps then resume,
    against 40 straight, float16, bfloat16, TF32, fine-tuning, fill-mask and PLL scoring. ``train(out,
    steps, *extra)`` gives a train_mlm.py command."""
    run = w / "run"
    return [
        Step("smoke/prepare-corpus-and-vocab", check + ["prepare", str(w)], 15, _expect_ok),
        Step("smoke/train-30", check + ["interrupted-run", "30", *train(run, 40)[2:]], 30,
             _expect_ok),
        Step("smoke/resume-10", train(run, 40, "--resume", str(run)), 13),
        Step("smoke/uninterrupted-40", train(w / "run40", 40), 15),
        Step("smoke/resume-exact", check + ["same-run", str(run), str(w / "run40")], 5,
             _expect_ok),
        Step("smoke/float16", train(w / "run16", 30, "--dtype", "float16"), 15),
        Step("smoke/bfloat16", train(w / "runbf16", 30, "--dtype", "bfloat16"), 15),
        Step("smoke/tf32", train(w / "runtf32", 30, "--tf32"), 12),
        Step("smoke/finetune", py + ["finetune.py", "--init", str(run), "--data",
                                     str(ROOT / "data/classify/en/sms_spam"), "--output-dir",
                                     str(w / "finetune"), "--max-seq-length", "64",
                                     "--batch-size", "16", "--max-steps", "30",
                                     "--device", device, "--no-progress"], 15),
        Step("smoke/fill-mask", py + ["-m", "minibert", "predict", "fill-mask", str(run),
                                      "the whale swam in the [MASK] .", "--device", device,
                                      "--no-progress"], 15),
        Step("smoke/pll-score", py + ["-m", "minibert", "score", str(run),
                                      "the whale swam in the sea .", "--device", device,
                                      "--no-progress"], 10),
    ]


def _nccl_and_speed_steps(w: Path, py: list[str], train, device: str,
                          gpus: int) -> list[Step]:
    """The nccl steps (``mpirun -np 1``, and ``-np gpus``, planned as an expected skip with
    fewer than two GPUs) and the speed steps (mini and small against PyTorch)."""
    many = ["mpirun", "-np", str(gpus), *train(w / "ncclN", 10, "--distributed", "nccl")]
    steps = [
        Step("nccl/mpirun-np-1", ["mpirun", "-np", "1", *train(w / "nccl1", 10, "--distributed",
                                                                "nccl")], 15,
             env=OPEN_MPI_AS_ROOT),
        Step(f"nccl/mpirun-np-{max(gpus, 2)}", many if gpus > 1 else [], 30,
             skip=None if gpus > 1 else f"{gpus} GPU: the -np N run needs two",
             env=OPEN_MPI_AS_ROOT),
    ]
    steps.append(Step("speed/launches", py + ["bench/count_launches.py"], 30, _expect_ok))
    for preset, limit in (("mini", 100), ("small", 100)):
        steps.append(Step(f"speed/{preset}-vs-torch", py + [
            "bench/bench_train_step.py", "--presets", preset, "--device", device,
            "--precision", *SPEED_PRECISIONS, "--systems", "minibert", "torch_equal_work",
            "torch_graphed", "minibert_graphed", "--steps", "10", "--warmup", "3",
            "--rounds", "1"],
            limit, half_not_slower))
    return steps


def plan(device: str = "cuda", gpus: int = 1, workdir: Path | None = None,
         python: str = sys.executable) -> list[Step]:
    """The steps of the self-test, in order.

    Args:
        device: the device under test ("cuda").
        gpus: the number of GPUs (the -np N NCCL run needs two or more; with fewer it is
            planned as an expected skip).
        workdir: where the runs are written (default: a new temporary directory).
        python: the interpreter the steps run.
    Returns:
        the list of :class:`Step` (time limits sum to under 600 s).
    """
    w = Path(workdir) if workdir is not None else default_workdir()
    py = [python]
    check = [python, "-m", "minibert.selftest", "--check"]
    small_run = ["--corpus", str(w / "corpus.txt"), "--vocab", str(w / "vocab.txt"),
                 "--preset", "mini", "--max-seq-length", "64", "--batch-size", "16",
                 "--log-every", "10", "--eval-every", "1000", "--save-every", "10",
                 "--dupe-factor", "1", "--eval-instances", "64", "--eval-samples", "0",
                 "--eval-pairs-per-paradigm", "0", "--no-progress",
                 "--device", device, "--seed", "0"]

    def train(out, steps, *extra):
        return py + ["train_mlm.py", *small_run, "--output-dir", str(out),
                     "--max-steps", str(steps), *extra]

    return (_env_steps(check, py, str(w / "kernel-cache"))
            + _smoke_steps(w, check, py, train, device)
            + _nccl_and_speed_steps(w, py, train, device, gpus))


def default_workdir() -> Path:
    """Where a run writes when no ``--workdir`` is given: a fresh directory name under the
    system's temporary directory (made when the steps run, not by a dry run)."""
    return Path(tempfile.gettempdir()) / f"minibert-selftest-{os.getpid()}"


# ------------------------------------------------------------------------- running it

def run_process(step: Step) -> tuple[int | None, str]:
    """Run one step's command: (exit status, or None after its time limit; its output).

    The output is stdout and stderr together, the one that says most last (the table shows
    the last line): stdout after a clean exit (a check's result line, a run's summary),
    stderr otherwise (the error or traceback)."""
    env = {**os.environ, **step.env}

    def text(out) -> str:
        return (out or b"").decode(errors="replace") if not isinstance(out, str) else out
    try:
        done = subprocess.run(step.argv, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=step.timeout_s)
    except subprocess.TimeoutExpired as e:
        return None, text(e.stdout) + text(e.stderr)
    except FileNotFoundError as e:
        return 127, str(e)
    if done.returncode == 0:
        return 0, done.stderr + done.stdout
    return done.returncode, done.stdout + done.stderr


def _summary(output: str) -> str:
    """The step's last non-empty output line, shortened for the table."""
    lines = [l.strip() for l in output.splitlines() if l.strip()]
    return lines[-1][:100] if lines else ""


def run_steps(steps: Sequence[Step], runner=None, out=sys.stdout,
              log=None) -> list[Result]:
    """Run the steps in order and print a row for each as it finishes.

    A step fails when its command exits non-zero, runs past its limit, or its ``check``
    reads a failure in the output (an unexpected pytest skip, a parity check out of
    tolerance); a step planned with ``skip`` is reported as SKIP and not run.

    Args:
        steps: from :func:`plan` (or stand-in steps in tests).
        runner: ``runner(step) -> (exit status or None on timeout, output)``; default
            :func:`run_process`.
        out: where the rows go.
        log: a text file that gets each run step's command, exit status and whole output
            (the table keeps one line of it), or None.
    Returns:
        one :class:`Result` per step.
    """
    runner = runner or run_process
    results = []
    print(f"{'step':40} {'status':6} {'s':>6}  note", file=out, flush=True)
    for step in steps:
        if step.skip is not None:
            result = Result(step, "SKIP", 0.0, step.skip)
        else:
            start = time.perf_counter()
            rc, output = runner(step)
            seconds = time.perf_counter() - start
            if log is not None:
                print(f"===== {step.name} (exit {rc}, {seconds:.1f} s): {step.command()}\n"
                      f"{output}", file=log, flush=True)
            if rc is None:
                result = Result(step, "FAIL", seconds, f"timed out after {step.timeout_s} s")
            elif rc != 0:
                result = Result(step, "FAIL", seconds, f"exit {rc}: {_summary(output)}")
            else:
                why = step.check(output) if step.check is not None else None
                result = (Result(step, "FAIL", seconds, why) if why is not None
                          else Result(step, "PASS", seconds, _summary(output)))
        results.append(result)
        print(f"{step.name:40} {result.status:6} {result.seconds:6.1f}  {result.note}",
              file=out, flush=True)
    return results


def exit_status(results: Sequence[Result]) -> int:
    """1 when any step failed, else 0."""
    return int(any(r.status == "FAIL" for r in results))


def print_plan(steps: Sequence[Step], out=sys.stdout) -> None:
    """Every step's name, time limit and command (or why it is skipped)."""
    total = sum(s.timeout_s for s in steps if s.skip is None)
    print(f"minibert self-test plan: {len(steps)} steps, time limits {total} s in all", file=out)
    for s in steps:
        what = f"SKIP ({s.skip})" if s.skip else s.command()
        print(f"{s.name:40} {s.timeout_s:4d} s  {what}", file=out)


# ------------------------------------------------------------------------- the checks

def _result(ok: bool, **values) -> int:
    print(json.dumps({"ok": bool(ok), **values}, default=str))
    return 0


def _check_device_summary() -> int:
    from . import backend
    backend.set_device("cuda")
    return _result(True, **backend.device_summary())


def _check_start_up() -> int:
    start = time.perf_counter()
    from . import backend
    backend.set_device("cuda")
    return _result(True, seconds=round(time.perf_counter() - start, 3),
                   cache=os.environ.get("CUPY_CACHE_DIR"))


def _check_tf32() -> int:
    import cupy as cp
    from . import backend
    backend.set_device("cuda")
    x = cp.full((8, 256, 256), 1.0001, cp.float32)
    w, w3 = cp.ones((256, 256), cp.float32), cp.ones((8, 256, 256), cp.float32)
    paths = {"2-D": lambda: x[0] @ w, "batched x 2-D": lambda: x @ w,
             "batched": lambda: x @ w3}
    found = {}
    for on in (False, True, False):
        backend.set_tf32(on)
        for name, f in paths.items():
            found.setdefault(name, []).append(float(f()[0, 0] if name == "2-D" else f()[0, 0, 0]))
    bad = [n for n, (off, on, back) in found.items()
           if not (on == 256.0 and abs(off - 256.0256) < 1e-3 and back == off)]
    return _result(not bad, values=found, why=f"TF32 not in effect on {bad}" if bad else None)


def _mini_model(device: str, dtype="float32", dropout: bool = False, preset: str = "mini"):
    """A BertForPreTraining of ``preset`` (vocabulary 1000, 64 positions) on ``device``."""
    import numpy as np
    from .modeling import BertConfig, BertForPreTraining
    p = 0.1 if dropout else 0.0
    config = BertConfig.from_preset(preset, vocab_size=1000, max_position_embeddings=64,
                                    hidden_dropout_prob=p, attention_probs_dropout_prob=p)
    from .backend import resolve_dtype
    return BertForPreTraining(config, seed=0).to(device, dtype=resolve_dtype(dtype, device))


def _batch(step: int = 0, B: int = 8, T: int = 64):
    """A host batch of the mini model's inputs (random ids, 15% of positions predicted)."""
    import numpy as np
    from .modeling import masked_lm_from_labels
    rng = np.random.default_rng(step)
    ids = rng.integers(5, 1000, (B, T))
    labels = np.where(rng.random((B, T)) < 0.15, ids, -100)
    labels[:, 1] = ids[:, 1]
    pos, mids, w = masked_lm_from_labels(labels, width=T)
    return dict(input_ids=ids, attention_mask=np.ones_like(ids), masked_lm_positions=pos,
                masked_lm_ids=mids, masked_lm_weights=w.astype(np.float32),
                next_sentence_label=rng.integers(0, 2, B))


def _check_parity_one_step(preset: str = "mini") -> int:
    """One forward and backward of ``preset`` (dropout off, float32) on the CPU and the
    GPU: loss within 1e-4 and gradient norm within 2e-3, relative."""
    from . import backend
    from .fast import set_fast_paths
    from .optim import clip_grad_norm
    set_fast_paths(True)
    found = {}
    for device in ("cpu", "cuda"):
        backend.set_device(device)
        xp = backend.xp_for(device)
        model = _mini_model(device, preset=preset)
        out = model(**{k: xp.asarray(v) for k, v in _batch().items()})
        model.backward()
        grads = [p.grad for p in model.parameters()]
        found[device] = (float(out.loss), float(clip_grad_norm(grads, float("inf"))))
    (l0, g0), (l1, g1) = found["cpu"], found["cuda"]
    ok = abs(l0 - l1) <= 1e-4 * abs(l0) and abs(g0 - g1) <= 2e-3 * abs(g0)
    return _result(ok, loss=[l0, l1], grad_norm=[g0, g1],
                   why=None if ok else "loss or gradient norm differs beyond 1e-4 / 2e-3")


def _check_parity_half(dtype: str = "float16", steps: int = 50, preset: str = "mini") -> int:
    """``steps`` training steps of ``preset`` (dropout on) in float32 and in ``dtype``
    (float16 or bfloat16) on the GPU: the half type learns as much, its loss drop (first
    step's loss minus the mean of the last five) within 5 % of float32's, with at most 5
    skipped steps (float16's loss scale settling; bfloat16 has no scaler).

    The drop, not the last losses: the run memorises its four batches (7.6 -> 0.28 nats in
    50 steps on the H200), so float16's first step, skipped while the loss scale settles,
    leaves it one update behind, 12 % apart at the end and 0.5 % apart in the drop."""
    steps = int(steps)
    from . import backend
    from .fast import set_fast_paths
    from .optim import AdamW
    from .training import TrainingConfig, train_step
    set_fast_paths(True)
    backend.set_device("cuda")
    import cupy as cp

    class Task:
        def forward(self, model, batch):
            out = model(**{k: cp.asarray(v) for k, v in batch.items()})
            return out.loss, {}

    losses = {}
    for name in ("float32", dtype):
        model = _mini_model("cuda", name, dropout=True, preset=preset)
        opt = AdamW(model.named_parameters(), lr=1e-3, correct_bias=True)
        cfg = TrainingConfig(max_steps=steps, lr=1e-3, max_grad_norm=1.0)
        rng = backend.DropoutRNG("cuda")
        seen, skipped = [], 0
        for step in range(steps):
            loss, _, finite, _ = train_step(model, opt, Task(), [_batch(step % 4)], step, 1e-3,
                                            cfg, device="cuda", dropout_rng=rng)
            skipped += not bool(finite)
            seen.append(float(loss))
        last = sum(seen[-5:]) / len(seen[-5:])
        losses[name] = (seen[0], last, skipped)
    (f32, l32, _), (f16, l16, skipped16) = losses["float32"], losses[dtype]
    drop32, drop16 = f32 - l32, f16 - l16
    ok = abs(drop16 - drop32) <= 0.05 * abs(drop32) and skipped16 <= 5
    return _result(ok, first_loss=[f32, f16], last5_loss=[l32, l16],
                   loss_drop=[drop32, drop16], skipped_steps=skipped16,
                   why=None if ok else f"{dtype}'s loss drop strays beyond 5% of float32's "
                   "or it skips > 5 steps")


def _check_interrupted_run(at_step: str, *train_argv: str) -> int:
    """The pretraining job (``train_mlm.py TRAIN_ARGV``, through the package's
    :func:`minibert.pretraining.command.main`, as the script runs it) in this process,
    stopped by a KeyboardInterrupt right after the checkpoint of step ``at_step`` is
    written (as a crash would stop it; the resume step then continues it with the same
    settings)."""
    from . import training
    from .pretraining.command import main as pretrain
    real_save, stop = training.save_checkpoint, int(at_step)

    def save_then_stop(path, model, optimizer, state, **kw):
        real_save(path, model, optimizer, state, **kw)
        if state["step"] == stop:
            raise KeyboardInterrupt(f"selftest: stopped after the step-{stop} checkpoint")

    training.save_checkpoint = save_then_stop
    try:
        status = pretrain(list(train_argv))
    except SystemExit as e:
        status = e.code
    finally:
        training.save_checkpoint = real_save
    ok = status == 130                       # Ctrl-C's exit status: stopped where asked
    return _result(ok, exit_status=status, why=None if ok else f"exit status {status}, "
                   f"expected 130 (stopped after step {stop})")


def _check_same_run(resumed: str, straight: str) -> int:
    """The resumed run's train records against the uninterrupted run's: the same steps
    and losses within 1e-5 relative (float32 on a GPU is not bitwise reproducible:
    cupyx.scatter_add's atomics add in a varying order; docs/gpu.md)."""
    def curve(d):
        recs = [json.loads(l) for l in (Path(d) / "metrics.jsonl").read_text().splitlines()
                if l.strip()]
        return {r["step"]: r["loss"] for r in recs
                if r.get("kind", "train") == "train" and r.get("loss") is not None}
    a, b = curve(resumed), curve(straight)
    worst = max((abs(a[k] - b[k]) / abs(b[k]) for k in b if k in a), default=float("inf"))
    ok = sorted(a) == sorted(b) and worst <= 1e-5
    return _result(ok, steps=sorted(b), max_relative_difference=worst,
                   why=None if ok else f"curves differ: steps {sorted(a)} vs {sorted(b)}, "
                   f"worst relative difference {worst:.2e}")


def _check_prepare(workdir: str) -> int:
    """The smoke runs' corpus (the first 300 paragraphs of the embedded Moby-Dick) and a
    2000-piece WordPiece vocabulary learned from it, written once into ``workdir``."""
    from .tokenization import train_wordpiece
    w = Path(workdir)
    w.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "data/pretrain/en/moby_dick.txt").read_text(encoding="utf-8")
    corpus = w / "corpus.txt"
    corpus.write_text("\n\n".join(text.split("\n\n")[:300]) + "\n", encoding="utf-8")
    train_wordpiece(corpus, 2000, output=w / "vocab.txt", show_progress=False)
    return _result(True, corpus=str(corpus), vocab=str(w / "vocab.txt"))


LAUNCH_PINS = {"float32": 380, "float16": 466}
"""The kernel launches of one mini training step (:func:`mini_train_step`, fast paths on)
that tests/test_gpu_kernels.py pins on the stand-in (tests/fakecupy.py: one per CuPy call
that launches, one per cuBLAS product) and bench/count_launches.py holds a GPU to."""


def mini_train_step(dtype="float32", micro_batches: int = 1, graphed: bool = False):
    """One optimizer step of the mini preset (4 layers, C=256; vocabulary 50, B=3, T=10 with
    a padded row; dropout, clipping, AdamW with bias correction; float16: master weights and
    loss scaling) on the current CUDA device, as a function: each call runs train_step once
    more (step 0, 1, ...) on ``micro_batches`` copies of the batch. The step whose launches
    :data:`LAUNCH_PINS` counts is the second (the first compiles the kernels). ``graphed``:
    the steps go through :class:`minibert.graphs.GraphedStep` (the second step is
    captured, later ones replay the graph); ``step.graphed`` is it (None without)."""
    import numpy as np
    from . import backend
    from .modeling import BertConfig, BertForPreTraining, masked_lm_from_labels
    from .objectives import get_objective
    from .optim import AdamW
    from .pretraining import PretrainingBatch
    from .training import TrainingConfig, train_step
    import cupy
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 50, (3, 10))
    mask = np.ones_like(ids)
    mask[1, 6:] = ids[1, 6:] = 0                          # a padded row
    labels = np.where(rng.random((3, 10)) < 0.3, ids, -100)
    labels[:, 0] = ids[:, 0]
    pos, mids, w = masked_lm_from_labels(labels, width=4)
    batch = PretrainingBatch(ids, np.zeros_like(ids), mask, pos, mids, w.astype(np.float32),
                             np.array([0, 1, 0]))
    objective = get_objective("mlm+nsp")

    class Task:                                           # train_mlm.py's forward
        def forward(self, model, b):
            x = {k: cupy.asarray(v) for k, v in b.model_inputs().items()}
            out = model(**x)
            return out.loss, objective.stats(out, x)

    config = BertConfig.from_preset("mini", vocab_size=50, max_position_embeddings=16)
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    model = BertForPreTraining(config, seed=1).to("cuda", dtype=backend.resolve_dtype(name,
                                                                                "cuda"))
    opt = AdamW(model.named_parameters(), lr=1e-3, correct_bias=True)
    cfg = TrainingConfig(max_steps=1 << 30, lr=1e-3, max_grad_norm=1.0)
    dropout_rng, count = backend.DropoutRNG("cuda"), [0]
    runner = None
    if graphed:
        from .distributed import Communicator
        from .graphs import GraphedStep
        runner = GraphedStep(model, opt, Task(), cfg, Communicator(), dropout_rng)

    def step():
        micro = [batch] * micro_batches
        out = (runner(micro, count[0], 1e-3) if runner is not None else
               train_step(model, opt, Task(), micro, count[0], 1e-3, cfg, device="cuda",
                          dropout_rng=dropout_rng))
        count[0] += 1
        return out
    step.graphed = runner
    return step


CHECKS = {"prepare": _check_prepare, "interrupted-run": _check_interrupted_run,
          "device-summary": _check_device_summary, "start-up": _check_start_up,
          "tf32": _check_tf32, "parity-one-step": _check_parity_one_step,
          "parity-half": _check_parity_half, "same-run": _check_same_run}
"""The Python checks a step runs as ``python -m minibert.selftest --check NAME [ARGS]``."""


def _gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return len(re.findall(r"^GPU \d+", out.stdout, flags=re.M))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (1 when a step failed)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--check"] and len(argv) > 1:      # a step's own check: NAME [ARGS...]
        return CHECKS[argv[1]](*argv[2:])
    ap = argparse.ArgumentParser(prog="python -m minibert.selftest",
                                 description="Verify minibert's GPU path in under 10 minutes.")
    ap.add_argument("--device", choices=["cuda"], default="cuda")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan (commands and time limits) and run nothing")
    ap.add_argument("--only", nargs="+", metavar="GROUP_OR_STEP",
                    help="run only these groups (env, tests, parity, smoke, nccl, speed) "
                         "or step names")
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs to use for the -np N NCCL run (default: nvidia-smi -L)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--log", type=Path, default=None, metavar="FILE",
                    help="also write every step's command and whole output to FILE")
    args = ap.parse_args(argv)
    if args.gpus is not None and args.gpus < 1:
        ap.error(f"--gpus must be >= 1, got {args.gpus}")
    gpus = args.gpus if args.gpus is not None else (1 if args.dry_run else _gpu_count())
    steps = plan(args.device, gpus, args.workdir or default_workdir())
    if args.only:
        steps = [s for s in steps if s.group in args.only or s.name in args.only]
    if args.dry_run:
        print_plan(steps)
        return 0
    with contextlib.ExitStack() as files:
        log = None
        if args.log is not None:
            try:
                log = files.enter_context(open(args.log, "w", encoding="utf-8"))
            except OSError as e:
                ap.error(f"--log: cannot write {args.log}: {e.strerror}")
        results = run_steps(steps, log=log)
    failed = [r.step.name for r in results if r.status == "FAIL"]
    print(f"{len(results) - len(failed)} of {len(results)} steps did not fail"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
