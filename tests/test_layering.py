"""The house stays as drawn in docs/architecture.md: every import points down the layers

    dprelease.cli (entry) -> dprelease.flows -> dprelease.tasks -> dprelease (platform) -> dp_core (engine)

(cli/, flows/ and tasks/ sit at the repository's top level and are imported as dprelease.cli,
dprelease.flows and dprelease.tasks; an import of the bare names is refused: the wheel has none)

and no package imports itself back through another (no cycles between the project's packages and
modules). Imports are read from the source (the AST), lazy imports inside functions included, so a
cycle hidden in a function body is caught too. Tests, benchmarks and examples sit outside the house.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the floors from the bottom up: each floor's import name and its directory in the repository
LAYERS = ["dp_core", "dprelease", "dprelease.tasks", "dprelease.flows", "dprelease.cli"]
LAYER_DIRS = {"dp_core": "dp_core", "dprelease": "dprelease", "dprelease.tasks": "tasks",
              "dprelease.flows": "flows", "dprelease.cli": "cli"}
#: names the checkout's directories would have as top-level packages; no installed wheel has them
BARE_NAMES = {"tasks", "flows", "cli"}
#: third-party libraries a layer must not need (the engine runs without the platform's stack)
FORBIDDEN_LIBRARIES = {
    "dp_core": {"prefect", "sqlmodel", "sqlalchemy", "great_expectations", "jinja2", "typer", "rich", "cryptography"},
    "dprelease": {"typer"},
}


def _module_name(layer: str, path: Path) -> str:
    parts = list(path.relative_to(ROOT / LAYER_DIRS[layer]).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([layer, *parts])


def _project_modules() -> dict[str, Path]:
    """Every module of the house by its import name (dprelease.cli.app for cli/app.py)."""
    return {
        _module_name(layer, path): path
        for layer in LAYERS
        for path in sorted((ROOT / LAYER_DIRS[layer]).rglob("*.py"))
    }


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (relative imports resolved against the file)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every module (project or library) that `module` imports, anywhere in its body."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            found.add(target)
            # `from package import module` imports the module itself
            found.update(f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in known)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _project_modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _layer(module: str) -> str | None:
    """The floor a module is on: the longest floor name it starts with."""
    floors = [layer for layer in LAYERS if module == layer or module.startswith(layer + ".")]
    return max(floors, key=len, default=None)


def _project_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    known = set(graph)
    return {m: {t for t in targets if t in known and t != m} for m, targets in graph.items()}


def test_every_import_points_down_the_layers():
    upward = []
    for module, targets in _graph().items():
        here = LAYERS.index(_layer(module))
        for target in targets:
            layer = _layer(target)
            if layer is not None and LAYERS.index(layer) > here:
                upward.append(f"{module} imports {target} ({_layer(module)} is below {layer})")
    assert not upward, "imports that point up the layers:\n" + "\n".join(sorted(upward))


def test_lower_layers_do_not_need_the_upper_layers_libraries():
    offending = []
    for module, targets in _graph().items():
        banned = FORBIDDEN_LIBRARIES.get(_layer(module), set())
        offending += [f"{module} imports {t}" for t in targets if t.split(".")[0] in banned]
    assert not offending, "\n".join(sorted(offending))


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan, iterative enough here)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return components


def _without_package_reexports(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's __init__ re-exporting its own modules is not a cycle: drop parent -> child edges
    (a child importing its parent package's public names still counts)."""
    return {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in edges.items()}


def test_no_import_cycles_between_modules():
    cycles = _cycles(_without_package_reexports(_project_edges(_graph())))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_import_cycles_between_packages():
    """Folded to packages (dprelease.store, dprelease.reporting, ...): still no cycle."""
    def package(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 else parts[0]

    folded: dict[str, set[str]] = {}
    for module, targets in _project_edges(_graph()).items():
        folded.setdefault(package(module), set()).update(package(t) for t in targets if package(t) != package(module))
    cycles = _cycles(folded)
    assert not cycles, "package cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("package", ["dprelease.store", "dprelease.escrow", "dprelease.requests",
                                     "dprelease.reporting", "dprelease.evaluators", "dprelease.cli"])
def test_each_platform_package_says_what_it_owns(package):
    init = ROOT.joinpath(*LAYER_DIRS.get(package, package).split("."), "__init__.py")
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and len(doc.split()) >= 25, f"{package} needs a one-paragraph docstring saying what it owns"


def test_the_check_catches_an_upward_import(tmp_path, monkeypatch):
    """The check itself can fail: a platform module importing a flow is reported."""
    fake_root = tmp_path
    for layer in LAYERS:
        (fake_root / LAYER_DIRS[layer]).mkdir()
        (fake_root / LAYER_DIRS[layer] / "__init__.py").write_text("")
    (fake_root / "dprelease" / "bad.py").write_text("from dprelease.flows.release import release_flow\n")
    (fake_root / "flows" / "release.py").write_text("import dprelease.bad\n")
    monkeypatch.setitem(globals(), "ROOT", fake_root)
    with pytest.raises(AssertionError, match="dprelease.bad imports dprelease.flows.release"):
        test_every_import_points_down_the_layers()
    with pytest.raises(AssertionError, match="package cycles"):
        test_no_import_cycles_between_packages()


def _bare_name_imports(path: Path) -> list[str]:
    """Imports in one file of `flows`, `tasks` or `cli` as top-level packages, with their lines."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"
                  for name in names if name.split(".")[0] in BARE_NAMES]
    return found


def test_the_platform_is_imported_by_its_one_name_everywhere():
    """cli/, flows/ and tasks/ are dprelease.cli, dprelease.flows and dprelease.tasks: the wheel
    installs no top-level package of those names, so `from dprelease.flows.release import ...` works only
    from a checkout's working directory and fails once installed. Every Python file of the
    repository (the house, tests, benchmarks, examples, docs scripts) uses the one name."""
    files = sorted(p for p in ROOT.rglob("*.py") if not {".venv", "build", "mutants", "site"} & set(p.relative_to(ROOT).parts))
    bare = [line for path in files for line in _bare_name_imports(path)]
    assert not bare, "import the platform as dprelease.cli/flows/tasks:\n" + "\n".join(bare)


def test_the_one_name_check_catches_a_bare_import(tmp_path, monkeypatch):
    """The check itself can fail: each way of spelling the old names is reported."""
    planted = tmp_path / "bench" / "planted.py"
    planted.parent.mkdir()
    cli, flows, tasks = sorted(BARE_NAMES)  # spelled apart: a rewrite of the imports leaves this file alone
    planted.write_text(f"import {cli}.app\nfrom {flows} import release\nfrom {tasks}.release_steps import plan\n"
                       "from dprelease.flows import approvals\nimport dprelease.cli.app\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    reported = [line.split(" imports ")[1] for line in _bare_name_imports(planted)]
    assert reported == [f"{cli}.app", flows, f"{tasks}.release_steps"]
    with pytest.raises(AssertionError, match=f"planted.py:1 imports {cli}"):
        test_the_platform_is_imported_by_its_one_name_everywhere()
