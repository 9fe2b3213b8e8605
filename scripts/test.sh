#!/usr/bin/env bash
# Set up and run the test suite: venv + install with the test extra, browser for the web UI test, pytest.
# Usage (from the repository root):  bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -f scripts/install_browser.sh ]; then
  bash scripts/install_browser.sh
fi

VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e ".[test]"

python -m pytest -q "$@"
