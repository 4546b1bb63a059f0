"""Fixtures shared by several test modules; the lists of numerically sensitive tests and of
the tests run at the dependency floors."""
import re
from pathlib import Path

import pytest

from helpers import moby_chapters
from hypothesis import HealthCheck, settings

# Hypothesis's data_too_large health check judges how the strategies generate, not what a
# test checks, and fires at random on small strategies under the floor's older Hypothesis
# (three tests on one floor run of 2026-12-08, none on the run before): off for every test
# that does not set its own list of suppressed checks
settings.register_profile("minibert", suppress_health_check=[HealthCheck.data_too_large])
settings.load_profile("minibert")

ROOT = Path(__file__).resolve().parents[1]

# The numerically sensitive tests, marked ``numerics`` here and nowhere else: those whose
# result could depend on the BLAS kernel (AVX2, AVX-512), the thread count or the order of
# a float32 sum. .ci/run runs them again under forced OpenBLAS kernels and other thread
# counts (``pytest -m numerics``): the fast paths against the formulas, gradient checks,
# parity with transformers, the examples, and every test of resuming, reproducing a run or
# equal bits.
NUMERICS_FILES = {"test_fast_cpu.py", "test_core.py", "test_gradcheck.py", "test_layers.py",
                  "test_parity_hf.py", "test_examples.py", "test_optim.py"}
NUMERICS_NAMES = re.compile(r"resum|reproduc|same_curve|bits|exactly|determin")

# ------------------------------------------------------------------- the floor selection
# The tests that .ci/floor runs (``pytest -m floor``) at the lowest versions pyproject.toml
# allows: Python 3.10 and the pins of .ci/floor-constraints.txt, with no torch,
# transformers or CuPy installed. Each entry is a module of tests/ ("test_core.py") or
# one test of it ("test_core.py::test_name", every parametrization). A test here that
# needs torch must skip without it (pytest.importorskip). tests/test_floor.py checks that
# every entry still names a module and a test.
FLOOR_TESTS = (
    # the core: layers, model, optimizer, loop, data, backend, the CPU fast paths, and
    # the GPU code through the NumPy stand-in (where NumPy 1's promotion rules showed)
    "test_floor.py", "test_core.py", "test_backend.py", "test_layers.py", "test_model.py",
    "test_training.py", "test_mixed_precision.py", "test_fast_cpu.py",
    "test_pretraining.py", "test_objectives.py", "test_gpu.py", "test_gpu_kernels.py",
    "test_selftest.py",
    # the jobs: shared options, tiny runs from Python, a train_mlm.py run and exact resume
    # of pretraining and fine-tuning
    "test_cli.py", "test_job_configs.py",
    "test_train_mlm.py::test_runs_and_writes_everything",
    "test_train_mlm.py::test_killed_and_resumed_reproduces_the_loss_curve",
    "test_finetune.py::test_finetune_killed_and_resumed_reproduces_the_loss_curve",
)


def in_floor_selection(nodeid: str) -> bool:
    """Whether the test ``nodeid`` ("tests/test_x.py::test_y[param]") is one of
    FLOOR_TESTS."""
    path, sep, rest = nodeid.partition("::")
    name = path.rsplit("/", 1)[-1] + sep + rest
    return any(name == entry or name.startswith((entry + "::", entry + "["))
               for entry in FLOOR_TESTS)


@pytest.hookimpl(tryfirst=True)       # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    """Marks the tests of FLOOR_TESTS ``floor``, and the numerically sensitive ones
    ``numerics``."""
    for item in items:
        if in_floor_selection(item.nodeid):
            item.add_marker(pytest.mark.floor)
        if item.path.name in NUMERICS_FILES or NUMERICS_NAMES.search(item.name):
            item.add_marker(pytest.mark.numerics)


@pytest.fixture(scope="session")
def moby30(tmp_path_factory):
    """The first 30 chapters of the embedded Moby-Dick, as a corpus file of their own."""
    return moby_chapters(tmp_path_factory, 30)


class CudaUnderTest:
    """What a ``gpu`` test runs on (the ``cuda`` fixture).

    Attributes:
        stand_in: True when CuPy is the NumPy stand-in of tests/fakecupy.py, False on a
            real GPU.
    """

    def __init__(self, stand_in: bool):
        self.stand_in = stand_in

    def record(self):
        """A context manager yielding the transfers and launches made inside it
        (``.syncs``, ``.uploads``, ``.launches``): counted by the stand-in; on a real GPU
        nothing is counted (the lists stay empty) and ``cupyx.allow_synchronize(False)``
        is the check."""
        if self.stand_in:
            import fakecupy
            return fakecupy.record()
        from contextlib import nullcontext
        from types import SimpleNamespace
        return nullcontext(SimpleNamespace(syncs=[], uploads=[], launches=[]))


@pytest.fixture(scope="session")
def real_gpu() -> bool:
    """Whether CuPy and a CUDA GPU pass minibert's start-up check here (asked once)."""
    from minibert.testing import gpu_available
    return gpu_available()


@pytest.fixture
def cuda(real_gpu):
    """The CUDA device of a ``gpu`` test: the real GPU when there is one, else the NumPy
    stand-in (tests/fakecupy.py) installed as ``cupy`` / ``cupyx`` for this test only,
    with minibert.backend's CuPy state reset and everything put back afterwards."""
    if real_gpu:
        yield CudaUnderTest(stand_in=False)
        return
    import fakecupy
    with fakecupy.installed():
        yield CudaUnderTest(stand_in=True)


# ------------------------------------------------------------- tiny runs of the job scripts
@pytest.fixture(scope="session")
def moby_vocab(moby30, tmp_path_factory):
    """A 300-token WordPiece vocab.txt learned from ``moby30``."""
    from minibert.tokenization import train_wordpiece
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    train_wordpiece(moby30, 300, output=path, show_progress=False)
    return path


@pytest.fixture(scope="session")
def tiny_pretrained(moby30, moby_vocab, tmp_path_factory):
    """A finished train_mlm.py run (tests/helpers.py tiny_pretrain_argv, 4 steps); copy it
    before writing into it."""
    import sys
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import train_mlm
    from helpers import tiny_pretrain_argv
    out = tmp_path_factory.mktemp("pretrained") / "run"
    assert train_mlm.main(tiny_pretrain_argv(moby30, moby_vocab, out, "--max-steps", 4)) == 0
    return out


@pytest.fixture(scope="session")
def classify_task(moby30, tmp_path_factory):
    """A sentence-classification task directory (train/dev/test.tsv) of Moby-Dick lines:
    label "long" or "short" by word count."""
    lines = [l for l in moby30.read_text(encoding="utf-8").splitlines() if l.strip()][:64]
    d = tmp_path_factory.mktemp("task")
    rows = [f"{'long' if len(l.split()) > 12 else 'short'}\t{l}" for l in lines]
    for split, part in (("train", rows[:32]), ("dev", rows[32:48]), ("test", rows[48:])):
        (d / f"{split}.tsv").write_text("label\tsentence\n" + "\n".join(part) + "\n",
                                        encoding="utf-8")
    return d


@pytest.fixture(scope="session")
def tiny_finetuned(tiny_pretrained, classify_task, tmp_path_factory):
    """A finished finetune.py run from ``tiny_pretrained`` (2 steps); copy it before
    writing into it."""
    import sys
    sys.path.insert(0, str(ROOT))
    import finetune
    out = tmp_path_factory.mktemp("finetuned") / "run"
    assert finetune.main(["--init", str(tiny_pretrained), "--data", str(classify_task),
                          "--output-dir", str(out), "--max-seq-length", "16",
                          "--batch-size", "8", "--max-steps", "2", "--no-progress"]) == 0
    return out


# ------------------------------------------------------- toy fine-tuning data and start
@pytest.fixture
def dataset(tmp_path):
    """A toy sentiment task directory (train/dev/test.tsv of 48/16/16 rows,
    tests/helpers.py make_rows)."""
    import numpy as np
    from helpers import make_rows, write
    rng = np.random.default_rng(0)
    d = tmp_path / "data"
    d.mkdir()
    for split, n in (("train", 48), ("dev", 16), ("test", 16)):
        write(d / f"{split}.tsv", "label\tsentence\n" + "\n".join(make_rows(n, rng)) + "\n")
    return d


@pytest.fixture
def pretrained_run(tmp_path):
    """A directory as train_mlm.py writes it: checkpoint.npz + vocab.txt
    (tests/helpers.py toy_pretrained_run)."""
    from helpers import toy_pretrained_run
    return toy_pretrained_run(tmp_path / "pretrain")


@pytest.fixture(autouse=True)
def fast_paths_restored():
    """Every test starts with the fast paths as a plain import has them (off), whatever an
    earlier test switched on (a job or a pipeline run in-process switches them on)."""
    from minibert import fast
    fast.set_fast_paths(False)
    yield
    fast.set_fast_paths(False)


@pytest.fixture
def vocab_file(tmp_path):
    """A 30-token vocab.txt (the five special tokens, then w0 .. w24) for tiny models
    saved as Hugging Face directories."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(25)]
    p = tmp_path / "vocab.txt"
    p.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return p
