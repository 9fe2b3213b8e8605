"""The README, docs/*.md and the package's own docstrings and comments say only what the tree holds.

Cheap checks, like the seam-table test: the README's layout block names every subpackage and
top-level module of ``llamafactory_zebra/``, every repository path the docs quote exists, and every name
of this package the docs quote in backticks exists (``ZebraMLA.expand``, ``released.checkpoint_layout(path)``,
``packed_attention(...)``); the package's docstrings and comments are held to the same paths and to
the dotted names they quote (``kernels.packed_attention``). Each failure lists exactly what is
missing, so a moved, renamed or new module or function is a one-line docs fix.
"""

import ast
import importlib
import re
from functools import cache
from pathlib import Path

from repo_paths import REPO

PACKAGE = REPO / "llamafactory_zebra"

# A quoted path starts at one of these folders (after a space, a backtick, "(" or "../"; not inside
# another path, as tools/ in tests/tools/).
QUOTED_PATH = re.compile(
    r"(?<![\w-])(?<!\w/)((?:llamafactory_zebra|examples|scripts|benchmarks|tools|deepspeed_configs|tests_vllm|tests"
    r"|docs)/[\w./*-]*)"
)

# Paths the docs quote from another repository, with where they live.
OTHER_REPOSITORIES = {
    "examples/deepspeed/ds_z*_config.json": "LLaMA-Factory's own DeepSpeed presets (docs/deepspeed.md)",
    "tools/hybrid/patch_fla_triton_autotune_hang.sh": "AMD-AGI/Primus's fla patch (kernels/known_issues.py)",
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


# A backticked span that names code: ``name(...)``, ``a.b.c(...)`` or ``a.b.c``.
CODE_SPAN = re.compile(r"`([^`\n]+)`")
CALLED = re.compile(r"^([A-Za-z_][\w.]*)\(.*\)$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
# A dotted name ending in one of these is a file name (the path check covers files).
FILE_SUFFIXES = {
    "py",
    "pth",
    "json",
    "jsonl",
    "yaml",
    "yml",
    "sh",
    "png",
    "md",
    "toml",
    "env",
    "parquet",
    "safetensors",
}
# Names the docs quote that are another project's although they look like this package's: bare calls of
# upstream or builtin functions, and dotted names that start like one of this package's modules.
OTHER_NAMES = {
    "BitsAndBytesConfig": "transformers",
    "KL": "a formula",
    "LLM": "vLLM's LLM class",
    "ceil": "math",
    "check_version": "LLaMA-Factory's extras.misc",
    "eigh": "torch.linalg",
    "generate": "transformers' GenerationMixin",
    "get_memory_footprint": "transformers' PreTrainedModel",
    "min": "a builtin",
    "named_modules": "torch's nn.Module",
    "pipeline": "transformers",
    "round": "a builtin",
    "silu": "torch",
    "sqrt": "math",
    "data.converter": "LLaMA-Factory's data/converter.py",
    "data.loader": "LLaMA-Factory's data/loader.py",
    "data.parser": "LLaMA-Factory's data/parser.py",
    "data.template": "LLaMA-Factory's data/template.py",
    "hparams.parser.get_train_args": "LLaMA-Factory's hparams/parser.py",
}


def _other_project(name: str) -> bool:
    """Whether ``OTHER_NAMES`` lists the name or a module path it starts with
    (``data.loader._load_single_dataset``)."""
    return any(name == other or name.startswith(f"{other}.") for other in OTHER_NAMES)


# Superseded runs name the code they ran, which later changed: their names are not checked.
HISTORY = "docs/benchmarks-history.md"


@cache
def _package_tree() -> tuple[dict[str, str], dict[str, set[str]], dict[str, set[str]]]:
    """From the package's source: class name -> module, module -> top-level names, class -> the names it
    defines (methods, class attributes, ``self.x`` attributes)."""
    classes, module_names, members = {}, {}, {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = module_names.setdefault(module, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, module)
                owned = members.setdefault(node.name, set())
                for inner in ast.walk(node):
                    if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef):
                        owned.add(inner.name)
                    elif isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                        owned.add(inner.id)
                    elif isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name):
                        if inner.value.id == "self" and isinstance(inner.ctx, ast.Store):
                            owned.add(inner.attr)
    return classes, module_names, members


def _defined_anywhere() -> set[str]:
    _, module_names, _ = _package_tree()
    return set().union(*module_names.values())


def _top_level_parts() -> set[str]:
    return {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()} - {"__init__"}


def _exists(name: str) -> bool:
    """Whether a dotted name of this package resolves: a class of it and its members, or a module path
    and the names in it. Imports the module where it can (inherited members count); where it cannot (the
    serving modules need vLLM) the source's definitions decide."""
    classes, module_names, members = _package_tree()
    parts = name.removeprefix("llamafactory_zebra.").split(".")
    if parts[0] in classes:
        module, rest = classes[parts[0]], parts
    else:
        module, rest = "llamafactory_zebra", parts
        while rest and f"{module}.{rest[0]}" in module_names:
            module, rest = f"{module}.{rest[0]}", rest[1:]
    try:
        target = importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name.startswith("llamafactory_zebra"):
            return False
        owner = module_names[module]
        return not rest or (rest[0] in owner and all(member in members.get(rest[0], ()) for member in rest[1:2]))
    for index, part in enumerate(rest):
        if hasattr(target, part):
            target = getattr(target, part)
        elif isinstance(target, type) and index == len(rest) - 1 and part in members.get(target.__name__, ()):
            return True  # an attribute set on instances (``self.x = ...``)
        else:
            return False
    return True


def missing_names(documents: dict[str, str], bare_calls: bool = True) -> list[str]:
    """``file:line: name`` for each name of this package quoted in backticks that the package lacks.

    A name is this package's when it is a call ``name(...)`` (unless ``OTHER_NAMES`` lists it), a dotted
    name that starts at one of its classes, its top-level modules or subpackages, or ``llamafactory_zebra``,
    or a ``Zebra…`` identifier. ``bare_calls=False`` leaves out ``name(...)`` (source code quotes its own
    locals and upstream calls that way).
    """
    classes, _, _ = _package_tree()
    defined, parts = _defined_anywhere(), _top_level_parts() | {"llamafactory_zebra"}
    missing = []
    for document, text in documents.items():
        if document == HISTORY:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for span in CODE_SPAN.finditer(line):
                code = span.group(1).strip()
                called = CALLED.match(code)
                name = called.group(1) if called else code
                if _other_project(name) or name.rsplit(".", 1)[-1] in FILE_SUFFIXES:
                    continue
                if DOTTED.match(name):
                    head = name.split(".")[0]
                    ours = head in parts or head in classes
                    if ours and not _exists(name):
                        missing.append(f"{document}:{number}: {name}")
                elif re.fullmatch(r"[A-Za-z_]\w*", name) and ((called and bare_calls) or name.startswith("Zebra")):
                    if name not in defined:
                        missing.append(f"{document}:{number}: {name}")
    return missing


# Where the package's code points for a measured figure (they live in the docs, not in the code):
# ``docs/benchmarks.md, "A section's heading"`` (the heading may be cut short, and wrapped over lines).
SECTION_POINTER = re.compile(r"(docs/[\w.-]+\.md),\s+\"([^\"]+)\"")


def broken_section_pointers(package: Path, root: Path) -> list[str]:
    """``file: pointer`` for each section the code points to that its document has no heading for."""
    broken = []
    for path in sorted(package.rglob("*.py")):
        text = " ".join(path.read_text(encoding="utf-8").split())  # one line: pointers wrap in docstrings
        for document, heading in SECTION_POINTER.findall(text):
            target = root / document
            headings = (
                [] if not target.exists() else re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.M)
            )
            if not any(h.startswith(heading.strip()) for h in headings):
                broken.append(f'{path.relative_to(root)}: {document}, "{heading}"')
    return broken


def _documents() -> dict[str, str]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return {str(f.relative_to(REPO)): f.read_text(encoding="utf-8") for f in files}


def _package_sources() -> dict[str, str]:
    return {str(f.relative_to(REPO)): f.read_text(encoding="utf-8") for f in sorted(PACKAGE.rglob("*.py"))}


def test_readme_layout_names_every_subpackage_and_top_level_module_and_nothing_else():
    layout = layout_block((REPO / "README.md").read_text(encoding="utf-8"))
    missing = missing_from_layout(layout, package_parts(PACKAGE))
    assert not missing, f"README.md's layout block does not name: {', '.join(missing)}"
    stale = stale_in_layout(layout, PACKAGE)
    assert not stale, f"README.md's layout block names what the package no longer has: {', '.join(stale)}"


def layout_entry(layout: str, folder: str) -> str:
    """The layout block's entry for ``folder/``: its line and the indented lines that continue it."""
    lines = layout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {folder}/"))
    entry = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("   "):
            break
        entry.append(line)
    return "\n".join(entry)


# The folders whose layout entry lists their modules one by one: the list holds every module.
ENUMERATED_FOLDERS = ("kernels", "layers")


def test_readme_layout_lists_every_module_of_the_folders_it_enumerates_and_every_command():
    """The entries that enumerate a folder's modules name all of them, and the ``cli/`` entry names every top-level
    command (aliases aside) and each group's subcommands, so a new module or command cannot leave the block
    quietly behind."""
    from llamafactory_zebra.cli.commands import SUBCOMMANDS

    layout = layout_block((REPO / "README.md").read_text(encoding="utf-8"))
    for folder in ENUMERATED_FOLDERS:
        modules = {path.name for path in (PACKAGE / folder).glob("*.py") if path.name != "__init__.py"}
        listed = set(re.findall(r"[\w]+\.py", layout_entry(layout, folder)))
        assert modules <= listed, f"README.md's {folder}/ entry does not name: {', '.join(sorted(modules - listed))}"
    commands = set(re.findall(r"[a-z][\w-]*", layout_entry(layout, "cli").split("llamafactory-zebra", 1)[1]))
    wanted = {name for name, command in SUBCOMMANDS.items() if not command.help.startswith("alias of")}
    wanted |= {sub for command in SUBCOMMANDS.values() for sub in command.subcommands}
    assert wanted <= commands, f"README.md's cli/ entry does not name: {', '.join(sorted(wanted - commands))}"


def test_every_quoted_repository_path_exists():
    missing = missing_paths(_documents(), REPO)
    assert not missing, "paths quoted in the docs that do not exist:\n" + "\n".join(missing)


def test_every_quoted_name_of_the_package_exists():
    missing = missing_names(_documents())
    assert not missing, (
        "names of llamafactory_zebra quoted in the docs that it does not have (another project's? add it to "
        "OTHER_NAMES):\n" + "\n".join(missing)
    )


def test_every_path_and_dotted_name_the_package_quotes_exists():
    """The package's docstrings and comments point at files and at each other's functions; both move."""
    sources = _package_sources()
    missing = missing_paths(sources, REPO) + missing_names(sources, bare_calls=False)
    assert not missing, "paths and names quoted in the package's docstrings or comments that do not exist:\n" + (
        "\n".join(missing)
    )


def test_a_renamed_function_method_or_module_is_reported():
    """The name check on edited lines: a renamed method, module-level function, bare call and module."""
    good = "`ZebraMLA.expand`, `released.checkpoint_layout(path)`, `packed_attention(name, device)`"
    assert missing_names({"a.md": good}) == []
    renamed = {
        "ZebraMLA.expand": "ZebraMLA.expand_latents",
        "released.checkpoint_layout": "released.layout_of",
        "packed_attention": "packed_kernel",
    }
    for old, new in renamed.items():
        assert missing_names({"a.md": good.replace(old, new)}) == [f"a.md:1: {new}"]
    assert missing_names({"a.md": "`ops.no_such_module.function`"}) == ["a.md:1: ops.no_such_module.function"]
    # In source code only dotted names count (``local(...)`` calls are the code's own business).
    source = "``no_such_call(x)``, ``kernels.no_such_function``, ``data.loader._load_single_dataset``"
    assert missing_names({"a.py": source}, bare_calls=False) == ["a.py:1: kernels.no_such_function"]
    # Another project's names and instance attributes are not this package's.
    assert missing_names({"a.md": "`model.generate(...)`, `torch.compile`, `data.loader`, `ZebraMLA.q_proj`"}) == []


def test_every_section_the_code_points_to_exists():
    broken = broken_section_pointers(PACKAGE, REPO)
    assert not broken, "sections the code points to that the docs do not have:\n" + "\n".join(broken)


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


def test_a_pointer_to_a_renamed_section_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "benchmarks.md").write_text("# Benchmarks\n\n## Decode speed (CPU)\n", encoding="utf-8")
    package = tmp_path / "package"
    package.mkdir()
    code = package / "module.py"
    code.write_text('"""Measured: docs/benchmarks.md,\n    "Decode speed"."""\n', encoding="utf-8")
    assert broken_section_pointers(package, tmp_path) == []
    code.write_text('"""Measured: docs/benchmarks.md, "Decode time"."""\n', encoding="utf-8")
    assert broken_section_pointers(package, tmp_path) == ['package/module.py: docs/benchmarks.md, "Decode time"']
