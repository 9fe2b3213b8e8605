"""No module of the package imports, directly or through others, a module that imports it back — also
not through an import inside a function (the old config → checkpoint → model → config loop was one)."""

import ast
import pathlib

from repo_paths import REPO

PACKAGE = REPO / "llamafactory_zebra"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Each module → the package modules its ``import`` statements name, wherever they stand."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
                base = base if node.level else node.module or ""
                targets |= {base} | {f"{base}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done, path = set(), []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        path.append(module)
        for target in sorted(graph[module]):
            found = visit(target)
            if found:
                return found
        path.pop()
        done.add(module)
        return None

    return next((found for module in sorted(graph) if (found := visit(module))), None)


def test_the_checker_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycle():
    graph = _import_graph()
    assert "llamafactory_zebra.released.layout" in graph["llamafactory_zebra.released"]
    assert "llamafactory_zebra.released" in graph["llamafactory_zebra.modeling_zebra"]
    assert _cycle(graph) is None, " → ".join(_cycle(graph))


# The floors, low to high: a module imports from its own floor or lower ones. Top-level modules and
# sub-packages by name ("" is the package's own ``__init__``).
FLOORS = [
    {
        "configuration_zebra",
        "presets",
        "hparams",
        "kernel_names",
        "packing",
        "quantization",
        "rope",
        "attention_policy",
        "seam",
    },
    {"kernels"},
    {"ops", "loss"},
    {"parallel"},
    {"layers", "cache_zebra"},
    {"released"},
    {"modeling_zebra"},
    {"", "inventory"},
    {"data", "distill", "planning", "convert", "evaluation", "environment", "serving", "testing"},
    {"integration"},
    {"cli", "_autoload"},
]
# Each import that still goes up, and why (see the docstring where it stands).
UPWARD = {
    ("released", "inventory"): "released/__init__.py: import checks weight names against the inventory",
}


def _floor(module: str) -> int:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else ""
    floor = next((index for index, floor in enumerate(FLOORS) if name in floor), None)
    assert floor is not None, f"{module}: put {name!r} on a floor in FLOORS"
    return floor


def test_imports_go_down_the_floors_except_the_listed_ones():
    upward = set()
    for module, targets in _import_graph().items():
        for target in targets:
            if _floor(target) > _floor(module):
                upward.add((module.split(".")[1], target.split(".")[1]))
    assert upward <= set(UPWARD), sorted(upward - set(UPWARD))
