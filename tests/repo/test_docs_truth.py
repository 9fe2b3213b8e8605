"""The README and docs/*.md say only what the tree holds.

Two checks, cheap like the seam-table test: the README's layout block names every subpackage and
top-level module of ``llamafactory_zebra/``, and every repository path the docs quote exists. Each
failure lists exactly what is missing, so a moved or new module is a one-line docs fix.
"""

import re
from pathlib import Path

from repo_paths import REPO

PACKAGE = REPO / "llamafactory_zebra"

# A quoted path starts at one of these folders (after a space, a backtick, "(" or "../"; not inside
# another path, as tools/ in tests/tools/).
QUOTED_PATH = re.compile(
    r"(?<![\w-])(?<!\w/)((?:llamafactory_zebra|examples|scripts|benchmarks|tools|deepspeed_configs)/[\w./*-]*)"
)

# Paths the docs quote from another repository, with where they live.
OTHER_REPOSITORIES = {
    "examples/deepspeed/ds_z*_config.json": "LLaMA-Factory's own DeepSpeed presets (docs/deepspeed.md)",
}


def layout_block(readme: str) -> str:
    """The fenced block under the README's ``## Layout`` heading."""
    section = readme.split("\n## Layout", 1)[1]
    return section.split("```", 2)[1]


def package_parts(package: Path) -> list[str]:
    """Every subpackage (``name/``) and top-level module (``name.py``) of the package."""
    folders = [f"{p.name}/" for p in package.iterdir() if p.is_dir() and not p.name.startswith("__")]
    modules = [p.name for p in package.glob("*.py") if p.name != "__init__.py"]
    return sorted(folders + modules)


def missing_from_layout(layout: str, parts: list[str]) -> list[str]:
    named = set(re.findall(r"[\w.]+/?", layout))
    return [part for part in parts if part not in named]


def stale_in_layout(layout: str, package: Path) -> list[str]:
    """Modules (``name.py``) and folders (``name/``) the layout names that exist nowhere in the package
    (a folder may also be one of the repository's own: ``examples/``, ``tests/``)."""
    stale = []
    for name in sorted(set(re.findall(r"[\w.]+\.py|\w+/", layout))):
        if name.endswith("/"):
            found = (package.parent / name).is_dir() or any(p.is_dir() for p in package.rglob(name[:-1]))
        else:
            found = any(package.rglob(name))
        if not found:
            stale.append(name)
    return stale


def missing_paths(documents: dict[str, str], root: Path) -> list[str]:
    """``file:line: path`` for each quoted path that matches nothing under ``root``."""
    missing = []
    for name, text in documents.items():
        for number, line in enumerate(text.splitlines(), 1):
            for match in QUOTED_PATH.finditer(line):
                path = match.group(1).rstrip(".")
                if path not in OTHER_REPOSITORIES and not any(root.glob(path.rstrip("/"))):
                    missing.append(f"{name}:{number}: {path}")
    return missing


def _documents() -> dict[str, str]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return {str(f.relative_to(REPO)): f.read_text(encoding="utf-8") for f in files}


def test_readme_layout_names_every_subpackage_and_top_level_module_and_nothing_else():
    layout = layout_block((REPO / "README.md").read_text(encoding="utf-8"))
    missing = missing_from_layout(layout, package_parts(PACKAGE))
    assert not missing, f"README.md's layout block does not name: {', '.join(missing)}"
    stale = stale_in_layout(layout, PACKAGE)
    assert not stale, f"README.md's layout block names what the package no longer has: {', '.join(stale)}"


def test_every_quoted_repository_path_exists():
    missing = missing_paths(_documents(), REPO)
    assert not missing, "paths quoted in the docs that do not exist:\n" + "\n".join(missing)


def test_a_renamed_path_or_an_unlisted_module_is_reported():
    """The checks on edited copies: a quoted path renamed, a module dropped from or renamed in the layout."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "`scripts/quickstart.sh`" in readme or "scripts/quickstart.sh" in readme
    renamed = readme.replace("scripts/quickstart.sh", "scripts/quick_start.sh")
    assert any(line.endswith(": scripts/quick_start.sh") for line in missing_paths({"README.md": renamed}, REPO))
    assert missing_paths({"README.md": readme}, REPO) == []

    layout = layout_block(readme)
    assert "packing.py" in layout
    parts = package_parts(PACKAGE)
    assert missing_from_layout(layout.replace("packing.py", ""), parts) == ["packing.py"]
    assert stale_in_layout(layout.replace("packing.py", "packed_rows.py"), PACKAGE) == ["packed_rows.py"]
