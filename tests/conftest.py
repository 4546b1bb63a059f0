"""Fixtures shared by several test modules."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def moby30(tmp_path_factory):
    """The first 30 chapters of the embedded Moby-Dick, as a corpus file of their own."""
    text = (ROOT / "data" / "pretrain" / "en" / "moby_dick.txt").read_text(encoding="utf-8")
    path = tmp_path_factory.mktemp("corpus") / "moby30.txt"
    path.write_text("\n\n".join(text.split("\n\n")[:30]) + "\n", encoding="utf-8")
    return path


class CudaUnderTest:
    """What a ``gpu`` test runs on (the ``cuda`` fixture).

    Attributes:
        stand_in: True when CuPy is the NumPy stand-in of tests/fakecupy.py, False on a
            real GPU.
    """

    def __init__(self, stand_in: bool):
        self.stand_in = stand_in

    def record(self):
        """A context manager yielding the transfers made inside it (``.syncs``,
        ``.uploads``): counted by the stand-in; on a real GPU nothing is counted (both
        lists stay empty) and ``cupyx.allow_synchronize(False)`` is the check."""
        if self.stand_in:
            import fakecupy
            return fakecupy.record()
        from contextlib import nullcontext
        from types import SimpleNamespace
        return nullcontext(SimpleNamespace(syncs=[], uploads=[]))


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
