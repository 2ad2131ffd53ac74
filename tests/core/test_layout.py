"""The package's structure, held where a reviewer would check it: no import circle (shared modules below, commands
on top, units found by the registry), no Python file of the repository over 600 lines, and the shared FLARE parts
naming no method."""

import ast
import graphlib
import re
from pathlib import Path

from fairfl.methods import UNITS, VARIANTS

from helpers import REPO

PACKAGE = Path(REPO) / "custom" / "fairfl"
LONGEST = 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set) -> set:
    """The package's modules `path` imports, type-only and function-level imports included."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names)
    return {module for module in found if module in modules and module != name}


def import_circle(graph: dict) -> list:
    """One circle of imports in `graph` ({module: the modules it imports}), [] when there is none (the standard
    library's topological sorter finds it)."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return error.args[1]
    return []


def package_graph() -> dict:
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: imports(path, set(files)) for name, path in files.items()}


def test_the_package_has_no_import_circle():
    assert import_circle(package_graph()) == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    circle = import_circle(graph)
    assert circle[0] == circle[-1] and set(circle) == {"a", "b", "c"}
    assert import_circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_python_file_is_over_600_lines():
    long = {
        str(path.relative_to(REPO)): lines
        for folder in ("custom", "tests", "benchmarks")
        for path in (Path(REPO) / folder).rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > LONGEST
    }
    assert long == {}


def test_the_shared_flare_parts_name_no_method():
    """flare/ is what every method shares; a method's own parts live in its unit. Its name, a variant's, or a display
    name in flare/ (code, docstrings or comments) means a method leaked into shared code."""
    names = {unit.name for unit in UNITS} | set(VARIANTS) | {v.display.split(" (")[0] for v in VARIANTS.values()}
    # FedAvg's weighted mean is the round's default aggregation, which every method starts from
    words = sorted(names - {"fedavg", "FedAvg"}, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, words)) + r")(?![\w-])", re.IGNORECASE)
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted((PACKAGE / "flare").glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
