"""``llamafactory-zebra eval-long``: one command group (run, compare, curve), as ``data`` is, with the spellings
from before the group kept (``eval-long INFER.yaml``, ``eval-long-compare``, ``eval-long-curve``)."""

from __future__ import annotations

import pytest

from llamafactory_zebra.cli import eval_long_cmd
from llamafactory_zebra.cli.commands import SUBCOMMANDS
from llamafactory_zebra.cli.main import main, with_default_subcommand


def test_eval_long_help_shows_its_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval-long", "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert all(f"    {name}  " in shown for name in ("run", "compare", "curve")), shown
    assert SUBCOMMANDS["eval-long"].subcommands == tuple(eval_long_cmd.SUBCOMMAND_MODULES)


def test_a_word_that_is_no_subcommand_runs_the_default_one():
    assert with_default_subcommand(["eval-long", "infer.yaml", "--lengths", "4k"]) == [
        "eval-long",
        "run",
        "infer.yaml",
        "--lengths",
        "4k",
    ]
    assert with_default_subcommand(["eval-long", "--lengths", "4k", "x.yaml"])[:2] == ["eval-long", "run"]
    for argv in (["eval-long", "curve", "x.yaml"], ["eval-long", "--help"], ["eval-long"], ["data", "list"]):
        assert with_default_subcommand(argv) == argv


def test_the_group_without_a_subcommand_or_with_the_old_spelling_reaches_the_same_checks(tmp_path, capsys):
    missing = str(tmp_path / "missing.yaml")
    assert main(["eval-long"]) == 2  # the group's help
    assert "compare" in capsys.readouterr().out
    for argv in (["eval-long", "run", missing], ["eval-long", missing]):
        assert main([*argv, "--lengths", "4k"]) == 2
        assert "no such inference YAML" in capsys.readouterr().err
    for argv in (["eval-long", "curve"], ["eval-long-curve"]):
        assert main([*argv, missing, "--stages", str(tmp_path), "--lengths", "4x"]) == 2
        assert "--lengths: '4x' is not a length" in capsys.readouterr().err
