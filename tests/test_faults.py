"""Faults end cleanly, and the last good state survives (issue 32; docs/reliability.md,
"Faults end cleanly"): a failed write (disk full, read-only, permission), an exhausted
memory and Ctrl-C end every job in one line, never a traceback; the last good checkpoint is
unchanged and ``--resume`` continues from it exactly."""
import errno
import os
import re
import signal
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
from minibert import atomic, training  # noqa: E402
from minibert.atomic import WriteError  # noqa: E402
from minibert.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from minibert.evaluation import harness  # noqa: E402
from minibert.finetuning import job as finetuning_job  # noqa: E402
from minibert.pretraining import job as pretraining_job  # noqa: E402
from minibert.modeling import BertConfig, BertForPreTraining  # noqa: E402
from minibert.optim import AdamW  # noqa: E402
from minibert.runs import LOCK, MetricsLog, held_runs  # noqa: E402
from minibert.tokenization import __main__ as tokenizer_cli  # noqa: E402


# ------------------------------------------------------------------------- fault injection
class _File:
    """A file object whose write and flush are counted operations."""

    def __init__(self, f, io):
        self._f, self._io = f, io

    def write(self, data):
        self._io.op("write")
        return self._f.write(data)

    def flush(self):
        self._io.op("flush")
        return self._f.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._f, name)


class _Os:
    """os for minibert.atomic, with fdopen, fsync, chmod and replace counted."""

    def __init__(self, io):
        self._io = io

    def fdopen(self, *a, **kw):
        return _File(os.fdopen(*a, **kw), self._io)

    def __getattr__(self, name):
        real = getattr(os, name)
        if name not in ("fsync", "chmod", "replace"):
            return real

        def counted(*a, **kw):
            self._io.op(name)
            return real(*a, **kw)
        return counted


class _Tempfile:
    def __init__(self, io):
        self._io = io

    def mkstemp(self, *a, **kw):
        self._io.op("create")
        import tempfile
        return tempfile.mkstemp(*a, **kw)


class FaultyIO:
    """The I/O operations of :func:`minibert.atomic.atomic_write` (create, each write,
    flush, fsync, chmod, replace), counted while armed; the ``k``-th (1-based) fails with
    ``OSError(err)``, as SQLite's I/O error tests fail each operation in turn."""

    def __init__(self, monkeypatch):
        self.k, self.err, self.ops, self.armed = 0, errno.ENOSPC, [], False
        monkeypatch.setattr(atomic, "os", _Os(self))
        monkeypatch.setattr(atomic, "tempfile", _Tempfile(self))

    def arm(self, k: int, err: int = errno.ENOSPC) -> None:
        """Count from here; fail operation ``k`` (0: none)."""
        self.k, self.err, self.ops, self.armed = k, err, [], True

    def op(self, name: str) -> None:
        if self.armed:
            self.ops.append(name)
            if len(self.ops) == self.k:
                raise OSError(self.err, os.strerror(self.err))


def fail_save(monkeypatch, io: FaultyIO, save: int, k: int, err: int = errno.ENOSPC):
    """Arm ``io`` during the ``save``-th checkpoint save of the training loop only."""
    real, count = training.save_checkpoint, [0]

    def save_checkpoint_(*a, **kw):
        count[0] += 1
        if count[0] == save:
            io.arm(k, err)
        try:
            return real(*a, **kw)
        finally:
            io.armed = False
    monkeypatch.setattr(training, "save_checkpoint", save_checkpoint_)


def train_losses(run: Path):
    return [(r["step"], r["loss"]) for r in MetricsLog.read(run / "metrics.jsonl")
            if r["kind"] == "train"]


def assert_same_weights(a: Path, b: Path) -> None:
    a, b = load_checkpoint(a / "checkpoint.npz"), load_checkpoint(b / "checkpoint.npz")
    assert a["model"].keys() == b["model"].keys()
    for k, v in a["model"].items():
        np.testing.assert_array_equal(v, b["model"][k], err_msg=k)


def test_each_io_operation_of_a_checkpoint_save_failing_in_turn_keeps_the_last_good_one(
        tmp_path, monkeypatch):
    config = BertConfig(vocab_size=24, hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=16, max_position_embeddings=16)
    good, new = BertForPreTraining(config, seed=1), BertForPreTraining(config, seed=2)
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, good, AdamW(good.named_parameters()), {"step": 4})
    kept = path.read_bytes()
    io = FaultyIO(monkeypatch)
    io.arm(0)
    save_checkpoint(tmp_path / "probe.npz", new, AdamW(new.named_parameters()), {"step": 8})
    ops = io.ops
    assert ops[0] == "create" and ops[-4:] == ["flush", "fsync", "chmod", "replace"]
    assert ops.count("write") > 10
    for k in range(1, len(ops) + 1):
        io.arm(k)
        with pytest.raises(WriteError) as e:
            save_checkpoint(path, new, AdamW(new.named_parameters()), {"step": 8})
        assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(path)), ops[k - 1]
        assert str(e.value) == f"cannot write {path}: No space left on device"
        assert path.read_bytes() == kept, ops[k - 1]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.npz", "probe.npz"]
    io.armed = False
    loaded = load_checkpoint(path)
    assert loaded["trainer"]["step"] == 4
    for k, v in good.state_dict().items():
        np.testing.assert_array_equal(loaded["model"][k], v, err_msg=k)


@pytest.fixture(scope="module")
def straight(moby30, moby_vocab, tmp_path_factory):
    """A run of 8 steps, checkpoints at 4 and 8, never interrupted; with the operations of
    its second checkpoint save."""
    out = tmp_path_factory.mktemp("straight") / "run"
    with pytest.MonkeyPatch.context() as mp:
        io = FaultyIO(mp)
        fail_save(mp, io, save=2, k=0)
        assert train_mlm.main(tiny_pretrain_argv(moby30, moby_vocab, out)) == 0
    return out, io.ops


@pytest.mark.parametrize("k", [1, 5])     # its create, a write in the middle of it
def test_a_failed_stable_phase_checkpoint_write_with_an_average_resumes_exactly(
        k, moby30, moby_vocab, tmp_path, monkeypatch, capsys):
    """With --ema-decay and the warmup-stable-decay schedule an 8-step run saves at step
    4, at the start of its decay (step 7, checkpoint-stable.npz) and at step 8. The
    stable-phase save fails: one line names it and the step-4 checkpoint, nothing torn
    is left; --resume then ends where the uninterrupted run ends: weights, raw weights,
    average, optimizer, and the stable-phase checkpoint itself."""
    extra = ("--ema-decay", "0.9", "--lr-scheduler-type", "warmup_stable_decay")
    full, out = tmp_path / "full", tmp_path / "run"
    assert train_mlm.main(tiny_pretrain_argv(moby30, moby_vocab, full, *extra)) == 0
    argv = tiny_pretrain_argv(moby30, moby_vocab, out, *extra)
    fail_save(monkeypatch, FaultyIO(monkeypatch), save=2, k=k)
    with pytest.raises(SystemExit) as e:
        train_mlm.main(argv)
    (line,) = capsys.readouterr().err.splitlines()
    assert e.value.code == 1 and f"cannot write {out / 'checkpoint-stable.npz'}" in line
    assert f"the last checkpoint, {out / 'checkpoint.npz'} (step 4), is unchanged" in line
    assert not (out / "checkpoint-stable.npz").exists() and not list(out.glob("*.tmp"))
    monkeypatch.undo()
    assert train_mlm.main([*argv, "--resume"]) == 0
    assert train_losses(out) == train_losses(full)
    for name in ("checkpoint.npz", "checkpoint-stable.npz"):
        a, b = load_checkpoint(full / name), load_checkpoint(out / name)
        assert a["trainer"]["step"] == b["trainer"]["step"] == (8 if name[10] == "." else 7)
        for group in ("model", "train", "ema", "optim"):
            assert a[group] and a[group].keys() == b[group].keys()
            for key, v in a[group].items():
                np.testing.assert_array_equal(v, b[group][key], err_msg=f"{name} {group}/{key}")


PICKS = {"create": lambda ops: 1,
         "first write": lambda ops: ops.index("write") + 1,
         "middle write": lambda ops: [i for i, o in enumerate(ops) if o == "write"][
             ops.count("write") // 2] + 1,
         "last write": lambda ops: len(ops) - ops[::-1].index("write"),
         **{name: (lambda ops, name=name: ops.index(name) + 1)
            for name in ("flush", "fsync", "chmod", "replace")}}


@pytest.mark.parametrize("pick", PICKS)
def test_a_failed_checkpoint_write_ends_in_one_line_and_resume_continues_exactly(
        pick, straight, moby30, moby_vocab, tmp_path, monkeypatch, capsys):
    """Issue 32: a full disk ended in an OSError traceback. The step-8 save fails at one of
    its I/O operations: one line names the file and the last good checkpoint (step 4),
    which loads; --resume then ends where the uninterrupted run ends, weight for weight."""
    full, ops = straight
    out = tmp_path / "run"
    argv = tiny_pretrain_argv(moby30, moby_vocab, out)
    io, k = FaultyIO(monkeypatch), PICKS[pick](ops)
    fail_save(monkeypatch, io, save=2, k=k)
    with pytest.raises(SystemExit) as e:
        train_mlm.main(argv)
    assert e.value.code == 1 and io.ops[k - 1] == pick.split()[-1]
    ckpt = out / "checkpoint.npz"
    assert capsys.readouterr().err.splitlines() == [
        f"train_mlm.py: error: cannot write {ckpt}: No space left on device; the last "
        f"checkpoint, {ckpt} (step 4), is unchanged; once that is fixed, go on with: python "
        f"train_mlm.py --resume {out}"]
    assert load_checkpoint(ckpt)["trainer"]["step"] == 4
    assert not list(out.glob("*.tmp")) and not (out / LOCK).exists() and not held_runs()
    assert train_mlm.main([*argv, "--resume"]) == 0
    assert train_losses(out) == train_losses(full)
    assert_same_weights(out, full)


def test_a_failed_first_checkpoint_names_no_checkpoint(moby30, moby_vocab, tmp_path,
                                                       monkeypatch, capsys):
    out = tmp_path / "run"
    fail_save(monkeypatch, FaultyIO(monkeypatch), save=1, k=1)
    with pytest.raises(SystemExit) as e:
        train_mlm.main(tiny_pretrain_argv(moby30, moby_vocab, out))
    assert e.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        f"train_mlm.py: error: cannot write {out / 'checkpoint.npz'}: No space left on "
        "device; no checkpoint had been written yet"]
    assert not (out / "checkpoint.npz").exists()


# ----------------------------------------------------------------------- read-only directory
class ReadOnly:
    """Makes ``directory`` behave as on a read-only file system while on: opening a file
    there for writing and making a directory there fail with EROFS (as root, too, where
    chmod would not stop a write)."""

    def __init__(self, directory: Path, monkeypatch, on: bool = True):
        self.directory, self.on = Path(directory).resolve(), on
        real_open, real_mkdir = os.open, os.mkdir

        def refuse(path):
            if self.on and Path(os.path.abspath(path)).is_relative_to(self.directory):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

        def open_(path, flags, mode=0o777, *, dir_fd=None):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                refuse(path)
            return real_open(path, flags, mode, dir_fd=dir_fd)

        def mkdir(path, mode=0o777, *, dir_fd=None):
            refuse(path)
            return real_mkdir(path, mode, dir_fd=dir_fd)
        monkeypatch.setattr(os, "open", open_)
        monkeypatch.setattr(os, "mkdir", mkdir)


def test_a_read_only_output_directory(moby30, moby_vocab, tmp_path, monkeypatch, capsys):
    """Issue 32: a read-only output directory ended in a traceback. At the start the job
    is refused before it writes anything (a new run, a resumed one); when the directory
    turns read-only during the run, the failed save ends in one line, the step-4
    checkpoint is unchanged, and --resume once it is writable again continues exactly."""
    out = tmp_path / "run"
    out.mkdir()
    argv = tiny_pretrain_argv(moby30, moby_vocab, out)
    read_only = ReadOnly(out, monkeypatch)
    with pytest.raises(SystemExit) as e:
        train_mlm.main(argv)
    assert e.value.code == 2 and list(out.iterdir()) == []
    assert capsys.readouterr().err.splitlines() == [
        f"train_mlm.py: error: --output-dir {out}: not writable (Read-only file system)"]
    # read-only from the second checkpoint on
    read_only.on, saves = False, [0]
    real_save = training.save_checkpoint

    def save(*a, **kw):
        saves[0] += 1
        read_only.on = saves[0] == 2
        return real_save(*a, **kw)
    monkeypatch.setattr(training, "save_checkpoint", save)
    with pytest.raises(SystemExit) as e:
        train_mlm.main(argv)
    ckpt = out / "checkpoint.npz"
    assert e.value.code == 1 and capsys.readouterr().err.splitlines() == [
        f"train_mlm.py: error: cannot write {ckpt}: Read-only file system; the last "
        f"checkpoint, {ckpt} (step 4), is unchanged; once that is fixed, go on with: python "
        f"train_mlm.py --resume {out}"]
    before = snapshot(out)
    with pytest.raises(SystemExit) as e:  # still read-only: --resume is refused, no change
        train_mlm.main([*argv, "--resume"])
    assert e.value.code == 2 and "not writable (Read-only file system)" in \
        capsys.readouterr().err and snapshot(out) == before
    read_only.on = False
    monkeypatch.setattr(training, "save_checkpoint", real_save)
    assert train_mlm.main([*argv, "--resume"]) == 0
    full = tmp_path / "full"
    assert train_mlm.main(tiny_pretrain_argv(moby30, moby_vocab, full)) == 0
    assert train_losses(out) == train_losses(full)
    assert_same_weights(out, full)


# --------------------------------------------------------------- every job, every fault
def job_argv(job: str, out: Path, moby30, moby_vocab, pretrained, task):
    """(the module of the function the job calls that the fault replaces, argv, that
    function, the memory size named)."""
    if job == "train_mlm.py":
        return (pretraining_job, tiny_pretrain_argv(moby30, moby_vocab, out), "train",
                "--batch-size 4")
    if job == "finetune.py":
        return (finetuning_job, ["--init", pretrained, "--data", task, "--output-dir", out,
                           "--max-seq-length", 16, "--batch-size", 8, "--no-progress"],
                "train", "--max-seq-length 16, --batch-size 8")
    if job == "evaluate.py":
        return (harness, [pretrained, "--output-dir", out, "--tasks", "t",
                                   "--task-dir", f"t={task}", "--budgets", 8, "--seeds", 1,
                                   "--no-probe"], "evaluate_task", "--batch-size 32")
    return (tokenizer_cli, ["train", "--quiet", "--files", moby30, "--vocab-size", 100,
                            "--output", out / "vocab.txt"], "train_wordpiece",
            "--vocab-size 100")


MAINS = {"train_mlm.py": train_mlm.main, "finetune.py": finetune.main,
         "evaluate.py": evaluate.main, "python -m minibert.tokenization": tokenizer_cli.main}


@pytest.mark.parametrize("fault", ["disk full", "out of memory", "Ctrl-C"])
@pytest.mark.parametrize("job", MAINS)
def test_every_job_ends_a_fault_in_one_line(job, fault, moby30, moby_vocab, tiny_pretrained,
                                            classify_task, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    module, argv, target, sizes = job_argv(job, out, moby30, moby_vocab, tiny_pretrained,
                                           classify_task)
    where = out / "somefile.json"
    raised = {"disk full": WriteError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where)),
              "out of memory": MemoryError("Unable to allocate 12.0 GiB for an array with "
                                           "shape (4096, 786432) and data type float32"),
              "Ctrl-C": KeyboardInterrupt()}[fault]

    def hit(*a, **kw):
        raise raised
    monkeypatch.setattr(module, target, hit)
    with pytest.raises(SystemExit) as e:
        MAINS[job]([str(a) for a in argv])
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{job}: "), lines
    line = lines[0]
    if fault == "Ctrl-C":
        assert e.value.code == 130 and line.startswith(f"{job}: interrupted")
    else:
        assert e.value.code == 1 and line.startswith(f"{job}: error: ")
    if fault == "disk full":
        assert f"cannot write {where}: No space left on device" in line
    if fault == "out of memory":
        assert "out of memory (Unable to allocate 12.0 GiB" in line and sizes in line
    if job in ("train_mlm.py", "finetune.py") and fault != "out of memory":
        assert "no checkpoint had been written yet" in line
    if job == "evaluate.py" and fault != "out of memory":
        assert f"the finished fine-tuning runs in {out} are kept" in line
    assert not held_runs() and not list(out.rglob(LOCK))  # the directory was let go


def test_a_diverged_run_names_no_checkpoint_that_does_not_exist(
        moby30, moby_vocab, tmp_path, monkeypatch, capsys):
    """Issue 32: a pretraining run that diverged before its first checkpoint named
    checkpoint.npz in its error, a file that was never written."""
    real_forward = BertForPreTraining.forward

    def forward(self, *a, **kw):
        result = real_forward(self, *a, **kw)
        if self.training:
            result.loss = result.loss * np.nan
        return result
    monkeypatch.setattr(BertForPreTraining, "forward", forward)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train_mlm.main(tiny_pretrain_argv(moby30, moby_vocab, out, "--max-nonfinite-steps", 2))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "not finite in 2 steps in a row since step 1" in err
    assert "no checkpoint had been written yet" in err and "checkpoint.npz" not in err
    assert not (out / "checkpoint.npz").exists()


def test_ctrl_c_ends_in_one_line_with_exit_130_and_resume_continues_exactly(
        moby30, moby_vocab, tmp_path):
    """SIGINT to a running train_mlm.py: exit status 130, one line naming the step, the
    last checkpoint and the command that resumes; that command ends where an
    uninterrupted run ends."""
    cmd = lambda out, *more: [sys.executable, str(ROOT / "train_mlm.py"), *tiny_pretrain_argv(
        moby30, moby_vocab, out, "--max-steps", 40, "--save-every", 4), *more]
    full, cut = tmp_path / "full", tmp_path / "cut"
    subprocess.run(cmd(full), check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    # SIGINT back to its default in the child: a shell ignores it in background jobs (as
    # a CI script started with & would be), and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen(cmd(cut), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0 = time.time()
    while not (cut / "checkpoint.npz").exists():
        assert proc.poll() is None and time.time() - t0 < 120
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 130, err
    ckpt = cut / "checkpoint.npz"
    (line,) = err.strip().splitlines()
    m = re.fullmatch(rf"train_mlm\.py: interrupted at step (\d+); the last checkpoint, "
                     rf"{re.escape(str(ckpt))} \(step (\d+)\), is unchanged; go on with: "
                     rf"python train_mlm\.py --resume {re.escape(str(cut))}", line)
    assert m and 4 <= int(m[2]) <= int(m[1]) < 40, line
    assert load_checkpoint(ckpt)["trainer"]["step"] == int(m[2])
    assert not list(cut.glob("*.tmp")) and not (cut / LOCK).exists()
    subprocess.run(cmd(cut, "--resume"), check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    assert train_losses(cut) == train_losses(full)
    assert_same_weights(cut, full)
