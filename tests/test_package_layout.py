"""The package's layout rules, read from the source: no import cycle, library code never imports the CLI,
tools never build parameters through the trainer, and no module shadows the standard library."""

import ast
import pathlib
import sys

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "ptmjax"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Each ptmjax module -> the ptmjax modules it imports, at any depth of its code."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_no_import_cycle():
    graph, state, cycles = imports(), {}, []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for child in sorted(graph[node]):
            if state.get(child) == "open":
                cycles.append(stack[stack.index(child):] + [child])
            elif child not in state:
                visit(child, [*stack, child])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, f"import cycles: {cycles}"


def test_library_code_never_imports_the_cli():
    importers = sorted(name for name, deps in imports().items() if "ptmjax.cli" in deps and name != "ptmjax.train")
    assert importers == []


def test_only_training_imports_the_trainer():
    importers = {name for name, deps in imports().items() if "ptmjax.training.trainer" in deps}
    assert importers and all(name.startswith("ptmjax.training.") for name in importers), sorted(importers)


def test_no_module_shadows_the_standard_library():
    names = {p.stem for p in PACKAGE.rglob("*.py")} | {p.name for p in PACKAGE.rglob("*") if p.is_dir()}
    assert sorted(names & set(sys.stdlib_module_names)) == []
