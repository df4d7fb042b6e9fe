"""The package's layout rules, read from the source: no import cycle, folders import only the folders below
them (FOLDER_ORDER), library code never imports the CLI, tools never build parameters through the trainer, no
module shadows the standard library, tools ask the family record, short functions, one precision seam."""

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


# The folders and top-level modules, lowest first: each imports only from itself and those before it, so
# the package's dependencies run one way (the model maths at the bottom, the tools and the CLI at the top).
FOLDER_ORDER = (
    "tree_paths", "host_malloc", "gin_value_types", "gin_suggestions", "partitioning",
    "layers", "models", "decoding", "families",  # the model maths and the record of each family
    "metrics", "objectives", "data", "tasks",  # text in, examples out; tasks register data and metrics
    "storage", "gin_files",  # model folders and checkpoints; reading a folder's config
    "evaluation", "training", "adapt", "compress", "convert", "inference",
    "configurables", "tools", "tensorflow_import", "cli", "train",
)
# Reading any config.gin needs every configurable registered: `gin_files.parse_gin` imports them, when called.
UPWARD_IMPORTS = {("ptmjax.gin_files", "ptmjax.configurables")}


def folder(module: str) -> str:
    """'ptmjax.families.registry' -> 'families', 'ptmjax.cli' -> 'cli'; the package itself -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_folder_has_its_place_in_the_order():
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    assert sorted(names - set(FOLDER_ORDER) - {"__init__", "__pycache__"}) == []


def test_folders_import_only_those_below_them():
    rank = {name: i for i, name in enumerate(FOLDER_ORDER)}
    wrong = sorted(
        f"{name} imports {dep}"
        for name, deps in imports().items() if folder(name)
        for dep in deps
        if folder(dep) and rank[folder(dep)] > rank[folder(name)] and (name, dep) not in UPWARD_IMPORTS
    )
    assert wrong == []


def model_classes_tested(path: pathlib.Path) -> list[str]:
    """The ptmjax.models module classes that `isinstance` / `issubclass` calls in `path` test against."""
    import importlib

    import flax.linen as nn

    tree = ast.parse(path.read_text())
    names: dict[str, object] = {}  # a local name -> the ptmjax.models object or module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ptmjax.models"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                names[alias.asname or alias.name] = getattr(module, alias.name)

    def classes(node: ast.AST) -> list[object]:
        if isinstance(node, ast.Tuple):
            return [c for element in node.elts for c in classes(element)]
        if isinstance(node, ast.BinOp):  # A | B
            return classes(node.left) + classes(node.right)
        if isinstance(node, ast.Name):
            return [names.get(node.id)]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return [getattr(names.get(node.value.id), node.attr, None)]
        return []

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass"):
            for cls in classes(node.args[1]) if len(node.args) == 2 else []:
                if isinstance(cls, type) and issubclass(cls, nn.Module):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {cls.__name__}")
    return found


def test_tools_ask_the_family_record_never_the_model_class():
    """Outside models/ and families/, what a model is comes from `family_of(module)`, not `isinstance`."""
    outside = [p for p in PACKAGE.rglob("*.py") if folder(module_name(p)) not in ("models", "families")]
    assert [found for path in outside for found in model_classes_tested(path)] == []


MAX_FUNCTION_LINES = 80


def test_no_function_is_longer_than_a_screen():
    """A function's body (its docstring left out) is at most MAX_FUNCTION_LINES lines: a longer one is split."""
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.body[1:] if ast.get_docstring(node) is not None and len(node.body) > 1 else node.body
                lines = node.end_lineno - body[0].lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


PRODUCTS = {"einsum", "matmul", "dot", "inner", "tensordot", "dot_general", "ragged_dot", "batch_matmul"}
# Weight arithmetic, not a model's product: merging LoRA's A @ B into a kernel at float32's highest precision.
OFF_THE_SEAM = {"ptmjax/adapt/lora_merge.py"}


def products_off_the_seam(path: pathlib.Path) -> list[str]:
    """Matrix products in `path` not taken through ptmjax/layers/precision.py: `@` and jnp / lax product calls."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} @")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PRODUCTS:
            owner = ast.unparse(node.func.value)
            if owner in ("jnp", "jax.numpy", "lax", "jax.lax"):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {owner}.{node.func.attr}")
    return found


def declares_policies(path: pathlib.Path) -> bool:
    """A fused kernel's module: it names the precision policies it takes (a module-level `...POLICIES`)."""
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", "").endswith("POLICIES") for t in node.targets)
               for node in ast.parse(path.read_text()).body)


def test_every_matrix_product_goes_through_the_precision_seam():
    """Outside layers/precision.py (and mixed_precision.py, its bfloat16 form), only the fused kernels, which
    declare the policies they take, run products of their own."""
    seam = {"ptmjax/layers/precision.py", "ptmjax/layers/mixed_precision.py"}
    paths = [p for p in PACKAGE.rglob("*.py") if str(p.relative_to(PACKAGE.parent)) not in seam | OFF_THE_SEAM]
    assert [found for p in paths if not declares_policies(p) for found in products_off_the_seam(p)] == []
