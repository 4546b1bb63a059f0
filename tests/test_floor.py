"""The floor selection of tests/conftest.py (FLOOR_TESTS, run by .ci/floor as
``pytest -m floor``) names tests that exist, and the floor pins of
.ci/floor-constraints.txt are the lower bounds pyproject.toml states."""
import re
from pathlib import Path

from conftest import FLOOR_TESTS, in_floor_selection

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_every_floor_entry_names_a_module_and_a_test():
    """A renamed module or test would drop out of the floor run without a word."""
    for entry in FLOOR_TESTS:
        module, _, test = entry.partition("::")
        path = TESTS / module
        assert path.is_file(), f"FLOOR_TESTS names {module}, which tests/ does not hold"
        if test:
            assert re.search(rf"^def {re.escape(test)}\(", path.read_text(encoding="utf-8"),
                             re.M), f"FLOOR_TESTS names {entry}, which {module} does not define"


def test_the_selection_matches_modules_tests_and_parametrizations_only():
    assert in_floor_selection("tests/test_core.py::test_anything")
    assert in_floor_selection("tests/test_train_mlm.py::test_runs_and_writes_everything")
    assert in_floor_selection(
        "tests/test_train_mlm.py::test_killed_and_resumed_reproduces_the_loss_curve[default]")
    assert not in_floor_selection("tests/test_train_mlm.py::test_runs_and_writes_everything_2")
    assert not in_floor_selection("tests/test_train_mlm.py::test_help_lists_presets")
    assert not in_floor_selection("tests/test_optim.py::test_clip_grad_norm_matches_torch[1]")


def floor_pins() -> dict:
    """name -> version of .ci/floor-constraints.txt's ``name==version`` lines."""
    pins = {}
    for line in (ROOT / ".ci" / "floor-constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def stated_floors() -> dict:
    """name -> the ``>=`` bound of each requirement in pyproject.toml's dependencies and
    its ``test`` extra (read as text: Python 3.10 has no tomllib)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return {name.lower(): version for name, version in
            re.findall(r'^\s*"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?>=([0-9][0-9.]*)', text, re.M)}


def as_release(version: str) -> tuple:
    """(1, 10) for "1.10.0" and "1.10": trailing zeros do not change a version."""
    parts = [int(p) for p in version.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def runtime_dependencies() -> set:
    """The names in pyproject.toml's ``dependencies = [...]`` list (the run-time ones)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S).group(1)
    return {name.lower() for name in re.findall(r'^\s*"([A-Za-z0-9_.-]+)', block, re.M)}


def test_floor_pins_are_the_lower_bounds_pyproject_states():
    pins, floors = floor_pins(), stated_floors()
    runtime = runtime_dependencies()
    assert "numpy" in runtime and len(runtime) >= 6           # the list was read
    assert set(runtime) <= set(pins), f".ci/floor-constraints.txt lacks {set(runtime) - set(pins)}"
    for name, version in pins.items():
        assert name in floors, f"{name} is pinned for the floor run but pyproject.toml " \
                               "states no lower bound for it"
        assert as_release(version) == as_release(floors[name]), \
            f"{name}: pinned {version} for the floor run, pyproject.toml says >={floors[name]}"
