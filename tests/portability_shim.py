"""Windows and macOS stand-ins for tests/test_portability.py (issue 51 item 8).

``install(system)`` takes away, in this Linux process, what the other system does not
have, before minibert is imported:

both ("windows", "macos"):
    no ``/proc`` (opening, listing or stat-ing a path under it raises FileNotFoundError,
    so ``os.path.exists("/proc/self")`` is False), no ``os.sched_getaffinity``, no glibc
    (``ctypes.CDLL("libc.so.6")`` raises OSError);
"windows" also:
    no ``resource`` and no ``fcntl`` module (their import raises ImportError), no
    ``os.sysconf``, ``os.fork``, ``os.pread``, ``os.pwrite`` or ``os.O_CLOEXEC``, and an
    ``msvcrt`` module whose ``locking`` takes Windows' byte-range locks (made here with
    the real fcntl's record locks, as Linux has no msvcrt; the standard library's
    subprocess, which takes an importable msvcrt for a sign of Windows, is imported
    before it).

It is a stand-in, not the other system: ``sys.platform`` stays "linux", and a library that
asks it (threadpoolctl) takes its Linux way to list the loaded libraries (without
/proc: ``dl_iterate_phdr``).

Run as a script, ``python tests/portability_shim.py SYSTEM SCENARIO ARGS...`` installs the
stand-in and then runs one scenario (:data:`SCENARIOS`); a failed check exits non-zero
with its message on stderr.
"""
from __future__ import annotations

import builtins
import errno
import io
import json
import os
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("windows", "macos")


def _under_proc(path) -> bool:
    if isinstance(path, int):          # a descriptor, not a path
        return False
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError:
        return False
    return text == "/proc" or text.startswith("/proc/")


def _no_proc(fn):
    """``fn`` that raises FileNotFoundError for a first argument under /proc."""
    def wrapper(path=".", *args, **kwargs):
        if _under_proc(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        return fn(path, *args, **kwargs)
    wrapper.__wrapped__ = fn
    return wrapper


def _remove_proc() -> None:
    builtins.open = io.open = _no_proc(io.open)
    for name in ("open", "stat", "lstat", "listdir", "scandir"):
        setattr(os, name, _no_proc(getattr(os, name)))


def _remove_glibc() -> None:
    import ctypes
    real = ctypes.CDLL

    class CDLL(real):                  # every ctypes.CDLL(...) made from now on
        def __init__(self, name, *args, **kwargs):
            if name and os.path.basename(os.fsdecode(name)).startswith("libc.so"):
                raise OSError(f"{name}: cannot open shared object file (no glibc here)")
            super().__init__(name, *args, **kwargs)

    ctypes.CDLL = CDLL
    ctypes.cdll = ctypes.LibraryLoader(CDLL)


def _msvcrt_stand_in(fcntl) -> types.ModuleType:
    """``msvcrt.locking`` and its modes: lock (or unlock) ``nbytes`` from the file's
    current position, OSError EACCES when another process holds them (Windows' own
    behaviour for LK_NBLCK)."""
    msvcrt = types.ModuleType("msvcrt")
    msvcrt.LK_UNLCK, msvcrt.LK_LOCK, msvcrt.LK_NBLCK, msvcrt.LK_RLCK, msvcrt.LK_NBRLCK = range(5)

    def locking(fd: int, mode: int, nbytes: int) -> None:
        start = os.lseek(fd, 0, os.SEEK_CUR)
        if mode == msvcrt.LK_UNLCK:
            fcntl.lockf(fd, fcntl.LOCK_UN, nbytes, start, os.SEEK_SET)
            return
        wait = mode in (msvcrt.LK_LOCK, msvcrt.LK_RLCK)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB), nbytes, start,
                        os.SEEK_SET)
        except OSError:
            raise OSError(errno.EACCES, "Permission denied") from None

    msvcrt.locking = locking
    return msvcrt


def install(system: str) -> None:
    """Make this process look like ``system`` ("windows" or "macos") to minibert, as the
    module docstring lists. Call it before minibert is imported."""
    if system not in SYSTEMS:
        raise ValueError(f"system: expected one of {SYSTEMS}, got {system!r}")
    if any(name == "minibert" or name.startswith("minibert.") for name in sys.modules):
        raise RuntimeError("install the stand-in before minibert is imported")
    _remove_proc()
    _remove_glibc()
    if hasattr(os, "sched_getaffinity"):
        del os.sched_getaffinity
    if system == "windows":
        import fcntl
        import subprocess  # noqa: F401  (a msvcrt would make it Windows': imported first)
        sys.modules["msvcrt"] = _msvcrt_stand_in(fcntl)
        sys.modules["fcntl"] = sys.modules["resource"] = None     # import raises ImportError
        for name in ("sysconf", "fork", "pread", "pwrite", "O_CLOEXEC"):
            if hasattr(os, name):
                delattr(os, name)


# ------------------------------------------------------------------------- scenarios
def fail(message: str) -> None:
    """End the process with status 3 and ``message`` on stderr: a check failed."""
    print(f"portability check failed: {message}", file=sys.stderr)
    sys.exit(3)


def run_script(name: str, argv: list[str]) -> None:
    """``python NAME ARGV`` in this process, as a job starts: the script's module imports
    happen now, under the stand-in. A non-zero exit fails the check."""
    import runpy
    sys.argv = [name, *argv]
    try:
        runpy.run_path(str(ROOT / name), run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            fail(f"{name} {' '.join(argv)} exited with status {e.code}")


def scenario_jobs(pretrain_json: str, finetune_json: str) -> None:
    """A short pretraining run, then a short fine-tuning run from it (their options as
    JSON lists)."""
    run_script("train_mlm.py", json.loads(pretrain_json))
    run_script("finetune.py", json.loads(finetune_json))


def scenario_core(system: str, out: str) -> None:
    """The fallbacks' answers on this stand-in, then a forward and backward of a tiny
    BertForPreTraining with the fast paths on (their products split over minibert's
    threads, every OpenBLAS on one thread meanwhile); its loss and gradients go to the
    .npz ``out``."""
    import numpy as np
    from threadpoolctl import ThreadpoolController
    from minibert import fast, fast_cpu, untrusted
    memory = untrusted.available_memory()
    if system == "windows" and memory is not None:
        fail(f"available_memory() = {memory}: nothing here can tell it, expected None")
    if system == "macos" and not (isinstance(memory, int) and memory > 0):
        fail(f"available_memory() = {memory}: expected the physical memory (os.sysconf)")
    if fast_cpu.keep_freed_memory():
        fail("keep_freed_memory() reports glibc's mallopt where there is no glibc")
    if fast_cpu.cpu_threads() < 1:
        fail("cpu_threads() < 1")
    blas = ThreadpoolController().select(internal_api="openblas")
    before = [lib["num_threads"] for lib in blas.info()]
    if not before or min(before) < 2:
        fail(f"OpenBLAS threads {before}: run this with OMP_NUM_THREADS=2, so that one "
             "thread is a change")
    with fast.fast_paths():
        during = [lib["num_threads"] for lib in blas.info()]
        if during != [1] * len(before):
            fail(f"OpenBLAS threads {during} while the products are split, expected 1 each")
        loss, grads = tiny_step()
    after = [lib["num_threads"] for lib in blas.info()]
    if after != before:
        fail(f"OpenBLAS threads {after} after the fast paths, expected {before} back")
    np.savez(out, loss=loss, **grads)


def tiny_step():
    """The MLM + NSP loss of a 1-layer, 16-wide BertForPreTraining (seed 0, no dropout) on
    two fixed sequences, and {parameter name: gradient} after its backward."""
    import numpy as np
    from minibert import BertConfig, BertForPreTraining
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=16,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(config, seed=0)
    ids = np.random.default_rng(0).integers(5, 50, (2, 8))
    model.zero_grad()
    out = model(ids, masked_lm_ids=ids, next_sentence_label=np.array([0, 1]))
    model.backward()
    return np.asarray(out.loss), {name: p.grad for name, p in model.named_parameters()}


def scenario_hold(directory: str, ready: str) -> None:
    """Own the run directory, say so in the file ``ready``, and hold it until stdin
    closes."""
    from minibert.runs import lock_run_dir
    lock_run_dir(directory)
    Path(ready + ".part").write_text(str(os.getpid()), encoding="utf-8")
    os.replace(ready + ".part", ready)          # whole when it appears
    sys.stdin.read()


def scenario_refused(directory: str, holder_pid: str) -> None:
    """A second owner of a held run directory is refused, naming the holder's pid."""
    from minibert.runs import RunError, lock_run_dir
    try:
        lock_run_dir(directory)
    except RunError as e:
        if f"in use by another job (pid {holder_pid})" not in str(e):
            fail(f"refused, but not as held by pid {holder_pid}: {e}")
        return
    fail(f"{directory}: locked a second time while pid {holder_pid} holds it")


SCENARIOS = {"jobs": scenario_jobs, "core": scenario_core, "hold": scenario_hold,
             "refused": scenario_refused}


if __name__ == "__main__":
    system, scenario, *args = sys.argv[1:]
    install(system)
    sys.path.insert(0, str(ROOT))          # the worktree's minibert, as `python train_mlm.py`
    if scenario == "core":
        args = [system, *args]
    SCENARIOS[scenario](*args)
