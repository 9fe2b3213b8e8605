"""The start-up hook runs from the copy made at install time; tests of it must not test an old copy."""

from pathlib import Path

from repo_paths import REPO

SOURCE_HOOK = REPO / "llamafactory_zebra" / "_autoload" / "llamafactory_zebra_hook.py"


def assert_installed_hook_is_current() -> None:
    import llamafactory_zebra_hook

    installed = Path(llamafactory_zebra_hook.__file__)
    assert installed.read_text() == SOURCE_HOOK.read_text(), (
        f"{installed} differs from {SOURCE_HOOK}: reinstall the package (pip install -e .) so the "
        "interpreter's start-up hook is the current one"
    )
