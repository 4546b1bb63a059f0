"""No two modules of minibert import each other, directly or around a longer circle.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import``
statement counts, at module level, inside a function (a lazy import) or under
``if TYPE_CHECKING:`` (a circle of types is still a circle of design). ``from pkg import
name`` is an edge to the submodule ``pkg.name`` when there is one, else to ``pkg`` (its
``__init__``); importing a submodule does not add an edge to its package, so a package
``__init__`` that re-exports its submodules makes no circle with them.

Nor does any module of minibert import one of the job scripts at the repository's root
(``train_mlm.py``, ``finetune.py``, ``evaluate.py`` ...): the scripts are wiring over the
package, and the package runs a job through its own modules (issue 51 item 9).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]



def module_files(root: Path, package: str) -> dict[str, Path]:
    """{dotted module name: file} of every ``.py`` file under ``root / package``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, from every import statement."""
    files = module_files(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if base not in files:
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.add(sub if sub in files else base)
        targets.discard(name)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative): each is a set of modules every one of which reaches every other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_minibert_has_no_import_circle():
    graph = import_graph(ROOT, "minibert")
    assert len(graph) > 50 and "minibert.pretraining.corpus" in graph["minibert.pretraining.job"]
    new = [sorted(c) for c in cycles(graph)]
    assert new == [], f"modules that import each other: {new}"


def write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_finder_sees_circles_through_lazy_and_type_only_imports(tmp_path):
    write_package(tmp_path, {
        "pkg/__init__.py": "from .a import A\nfrom .sub import helper\n",
        "pkg/a.py": "from .b import B\nclass A: pass\n",
        # a function-level import closes a -> b -> c -> a
        "pkg/b.py": "from . import c\nclass B: pass\n",
        "pkg/c.py": "def f():\n    from .a import A\n    return A\n",
        "pkg/sub/__init__.py": "from .helper import helper\n",
        # a TYPE_CHECKING import closes sub.helper -> sub.other -> sub.helper
        "pkg/sub/helper.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from .other import X\ndef helper(): pass\n"),
        "pkg/sub/other.py": "from pkg.sub.helper import helper\nX = 1\n",
        # imports its package's __init__ only: a re-export, no circle
        "pkg/d.py": "from pkg import A\n",
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.d"] == {"pkg"}
    assert sorted(map(sorted, cycles(graph))) == [
        ["pkg.a", "pkg.b", "pkg.c"], ["pkg.sub.helper", "pkg.sub.other"]]


def test_the_finder_passes_a_package_without_circles(tmp_path):
    write_package(tmp_path, {"pkg/__init__.py": "from .a import A\n",
                             "pkg/a.py": "from .b import B\nA = 1\n",
                             "pkg/b.py": "import json\nB = 2\n"})
    assert cycles(import_graph(tmp_path, "pkg")) == []


def script_imports(root: Path, package: str) -> dict[str, set[str]]:
    """{module: the scripts at ``root`` (its ``*.py`` files) that the module imports}, for
    every module of ``package`` that imports one, at any level of its code."""
    scripts = {p.stem for p in root.glob("*.py")}
    found: dict[str, set[str]] = {}
    for name, path in module_files(root, package).items():
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
        if names & scripts:
            found[name] = names & scripts
    return found


def test_no_package_module_imports_a_script():
    assert {"train_mlm", "finetune", "evaluate"} <= {p.stem for p in ROOT.glob("*.py")}
    assert script_imports(ROOT, "minibert") == {}


def test_the_script_finder_sees_an_import_inside_a_function(tmp_path):
    write_package(tmp_path, {
        "job.py": "print('a script')\n",
        "pkg/__init__.py": "",
        "pkg/a.py": "def run():\n    import job\n    return job\n",
        "pkg/b.py": "from job import something\n",
        "pkg/c.py": "from . import a\nimport json\n"})
    assert script_imports(tmp_path, "pkg") == {"pkg.a": {"job"}, "pkg.b": {"job"}}
