"""The code's shape: one home for each name, imports that go one way, and processes that
load only what they run."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("specbatch", "model_repository", "client")
# The conventional names of a module's entry points and of a model file's class: each
# module has its own by design, and nobody imports two of them side by side.
ENTRY_POINTS = {"main", "run", "plot", "markdown", "build_parser", "build_app", "logger", "TritonPythonModel"}


def _sources() -> list[Path]:
    return [
        path
        for root in SOURCE_ROOTS
        for path in sorted((ROOT / root).rglob("*.py"))
        if "__pycache__" not in path.parts
    ]


def _top_level_names(tree: ast.Module) -> list[str]:
    names = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [target.id for target in node.targets if isinstance(target, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


def _homes(paths: list[Path]) -> dict[str, list[str]]:
    homes: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        for name in _top_level_names(ast.parse(path.read_text())):
            if name not in ENTRY_POINTS and name != "__all__":
                homes[name].append(str(path.relative_to(ROOT)))
    return homes


def test_no_name_is_defined_in_two_modules():
    twice = {name: paths for name, paths in _homes(_sources()).items() if len(paths) > 1}
    assert not twice, f"defined in more than one module: {twice}"


def test_no_script_redefines_a_name_of_the_package():
    """A script uses the package's definitions instead of its own copy of them."""
    package = _homes(_sources())
    scripts = _homes(sorted((ROOT / "scripts").rglob("*.py")))
    again = {name: paths + package[name] for name, paths in scripts.items() if name in package}
    assert not again, f"defined in a script and in the package: {again}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, package: str) -> set[str]:
    """The specbatch modules ``path`` imports when it is loaded (not inside functions)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] == package}


def test_no_import_circle_inside_the_package():
    modules = {_module_name(path): path for path in sorted((ROOT / "specbatch").rglob("*.py"))}
    graph = {
        name: {target for target in _imports(path, "specbatch") if target in modules and target != name}
        for name, path in modules.items()
    }
    # A package's __init__ importing its own modules is how a package exposes them.
    for name in graph:
        graph[name] = {
            t for t in graph[name] if not (modules[name].name == "__init__.py" and t.startswith(name))
        }
    circles = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in graph[node]:
            if state.get(target) == 1:
                circles.append([*trail[trail.index(target) :], target])
            elif target not in state:
                visit(target, [*trail, target])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    assert not circles, f"import circles: {circles}"


def test_the_scheduler_and_router_processes_load_no_torch_and_no_simulator():
    """Their stubs start fast and stay small: what they import must not pull torch, and
    the live server never loads the batch-level simulator."""
    modules = [
        "specbatch.serving.scheduler.setup",
        "specbatch.serving.scheduler.hub",
        "specbatch.serving.scheduler.loop",
        "specbatch.serving.router.routing",
        "specbatch.triton.outputs",
    ]
    probe = (
        f"import sys; [__import__(m) for m in {modules!r}]; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers') "
        "or m.startswith('specbatch.scheduling.static')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    assert loaded == "[]", f"loaded by the torch-free processes: {loaded}"
