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
