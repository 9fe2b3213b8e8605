"""The repository's folders, for tests that read shipped files (docs, examples, presets) or the test
fixtures: written once here, so a test module reads the same wherever it sits under ``tests/``."""

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
REPO = HELPERS.parents[1]
DOCS = REPO / "docs"
EXAMPLES = REPO / "examples"
FIXTURES = REPO / "tests" / "fixtures"
