"""No function of the package runs over 80 lines: past that a reader cannot hold it, and it does more than one job.

Counted from the ``def`` to the last line, decorators and docstring included (``ast``'s line numbers).
"""

import ast

from repo_paths import REPO

PACKAGE = REPO / "llamafactory_zebra"
LIMIT = 80


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int]]:
    """``(name, lines)`` of each function in ``source`` longer than ``limit`` lines."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit
    ]


def test_the_counter_finds_a_long_function():
    source = "def short():\n    return 1\n\n\ndef long():\n" + "    x = 1\n" * 80
    assert long_functions(source) == [("long", 81)]


def test_no_package_function_is_over_80_lines():
    found = {
        f"{path.relative_to(PACKAGE)}:{name}": lines
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, lines in long_functions(path.read_text(encoding="utf-8"))
    }
    assert not found, found
