#!/usr/bin/env bash
# Installs what tests/integration/test_webui_e2e.py drives: Debian's headless Chromium, the chromedriver built from
# the same Chromium release (so the two always match). Selenium's Python client comes with the
# package's `test` extra. Nothing is downloaded at test time. Runs as root (CI) or through sudo.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver fonts-dejavu-core fonts-noto-color-emoji

chromium --version
chromedriver --version
