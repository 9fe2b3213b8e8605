"""Every command the README, docs, scripts and examples tell a user to run is a ``llamafactory-zebra`` command.

A command quoted in code (a backtick span, a fenced block, a script line, a YAML comment) names a subcommand
of ``cli/commands.py`` and, where that subcommand has its own (``data inspect``), one of those; and no page
sends the user to ``python -m llamafactory_zebra...``: what a user runs is in ``llamafactory-zebra --help``.
"""

import argparse
import re

from repo_paths import DOCS, EXAMPLES, REPO

from llamafactory_zebra.cli.commands import SUBCOMMANDS
from llamafactory_zebra.cli.main import build_parser

COMMAND = re.compile(r"llamafactory-zebra ([a-z][\w-]*)(?: ([a-z][\w-]*))?")


def documents() -> dict[str, str]:
    paths = [REPO / "README.md", *DOCS.glob("*.md"), *(REPO / "scripts").glob("*.sh"), *EXAMPLES.rglob("*.yaml")]
    return {str(path.relative_to(REPO)): path.read_text(encoding="utf-8") for path in paths}


def nested_commands(name: str) -> set[str]:
    """The subcommands of ``llamafactory-zebra NAME`` (``data``: inspect, list, ...); empty for most."""
    top = next(a for a in build_parser([name])._actions if isinstance(a, argparse._SubParsersAction))
    parser = top.choices[name]
    return {
        choice
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for choice in action.choices
    }


def starts_a_command(name: str, prefix: str, fenced: bool) -> bool:
    """Whether ``llamafactory-zebra`` after ``prefix`` (the line before it) is a command a user runs, not prose
    or a quoted message: a backtick span or a code line that begins with it, a shell prompt's ``$``, or the
    value of a YAML comment's ``Key:``."""
    before = prefix.rstrip()
    if name.endswith(".yaml"):
        return before.startswith("#") and before.endswith(":")
    if name.endswith(".sh"):
        return not before.startswith("#") and (before == "" or before.endswith(("$", "&&", "|", "(")))
    return prefix.endswith("`") or (fenced and (before == "" or before.endswith("$")))


def quoted_commands(name: str, text: str) -> list[tuple[int, str, str | None]]:
    """``(line, word, next word)`` of each ``llamafactory-zebra WORD`` written as a command to run."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        for match in COMMAND.finditer(line):
            if starts_a_command(name, line[: match.start()], fenced):
                found.append((number, match.group(1), match.group(2)))
    return found


def unknown_commands(docs: dict[str, str]) -> list[str]:
    unknown = []
    nested = {name: nested_commands(name) for name in SUBCOMMANDS}
    for name, text in docs.items():
        for number, word, following in quoted_commands(name, text):
            if word not in SUBCOMMANDS:
                unknown.append(f"{name}:{number}: llamafactory-zebra {word}")
            elif nested[word] and following is not None and following not in nested[word]:
                unknown.append(f"{name}:{number}: llamafactory-zebra {word} {following}")
    return unknown


def test_every_documented_command_is_a_llamafactory_zebra_subcommand():
    assert unknown_commands(documents()) == []


def test_no_page_runs_a_package_module_with_python_m():
    runs = [
        f"{name}:{number}"
        for name, text in documents().items()
        for number, line in enumerate(text.splitlines(), 1)
        if "python -m llamafactory_zebra" in line
    ]
    assert runs == []


def test_an_unknown_or_nested_typo_is_reported():
    docs = {
        "a.md": "run `llamafactory-zebra data retrival-sft --rows 3` then `llamafactory-zebra eval-longg x.yaml`\n",
        "b.sh": "llamafactory-zebra data inspect train.yaml\n# llamafactory-zebra stopped the run (prose)\n",
        "c.md": "llamafactory-zebra installed its hook\n```\nllamafactory-zebra compare a=b\n"
        "Error: llamafactory-zebra x\n```\n",
        "d.yaml": "# Data:  llamafactory-zebra dta list\n",
    }
    assert unknown_commands(docs) == [
        "a.md:1: llamafactory-zebra data retrival-sft",
        "a.md:1: llamafactory-zebra eval-longg",
        "c.md:3: llamafactory-zebra compare",
        "d.yaml:1: llamafactory-zebra dta",
    ]


def test_documented_subcommands_show_in_the_top_level_help():
    help_text = build_parser([]).format_help()
    assert all(name in help_text for name in SUBCOMMANDS)
    assert "retrieval-sft" in nested_commands("data")
