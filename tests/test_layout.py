"""w4cli's layout: the import graph of its modules has no cycle, nor has the graph of its packages,
and the top of the package stays small (everything else lives in the package of its pipeline
stage: read/, formats/, write/, gpu/).

Every import counts, the ones inside functions and under TYPE_CHECKING too: an import deferred to
dodge a cycle is still a cycle in the design."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "w4cli"
MAX_LOOSE_MODULES = 10


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def w4cli_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The w4cli modules that the module `name` at `path` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # `from w4cli.gpu import kernels` imports the module w4cli.gpu.kernels
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as the modules along it (first repeated at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once every path from it is walked
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for successor in sorted(graph[node]):
            if state.get(successor) == "open":
                return path[path.index(successor):] + [successor]
            if successor not in state and (cycle := visit(successor)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one():
    # the check below is only as good as this: a two-module cycle and a longer one are found
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imported_resolves_every_import_form():
    modules = w4cli_modules()
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    # spot checks of the forms the package uses: from-package-import-module, from-module-import-name,
    # and an import inside a function
    assert "w4cli.gpu.kernels" in graph["w4cli.dequantize"]
    assert "w4cli.formats.unpacked" in graph["w4cli.formats.awq_gemm"]
    assert "w4cli.read.checkpoint" in graph["w4cli.write.writer"]


def test_w4cli_imports_have_no_cycle():
    modules = w4cli_modules()
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def package_of(name: str) -> str:
    """w4cli.read.hub -> w4cli.read; a module loose at the top (w4cli.cli) is its own unit."""
    parts = name.split(".")
    return ".".join(parts[:2])


def test_packages_import_each_other_one_way():
    """The packages are stages of one pipeline (gpu/ <- formats/ <- read/ <- write/ <- the
    pipelines <- commands/): read/ hands a checked model on and never needs the writer, formats/
    never reads a checkpoint. A cycle between packages means a module is in the wrong one."""
    modules = w4cli_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(package_of(name), set())
        edges.update(package_of(target) for target in imported(name, path, modules))
    for package, edges in graph.items():
        edges.discard(package)
    cycle = find_cycle(graph)
    assert cycle is None, "packages import each other: " + " -> ".join(cycle)


def test_few_modules_loose_at_the_top():
    loose = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, f"{len(loose)} modules loose in w4cli/: {loose}"
