#!/usr/bin/env bash
# Installs what tests/test_webui_e2e.py drives: Debian's headless Chromium, the chromedriver built from
# the same Chromium release (so the two always match), and Selenium's Python client. Nothing is
# downloaded at test time. Run as root (CI) or with sudo; pass the Python environment's pip via $PIP.
set -euo pipefail

PIP="${PIP:-python -m pip}"
APT_GET="apt-get"
if [ "$(id -u)" -ne 0 ]; then
    APT_GET="sudo apt-get"
fi

$APT_GET update -qq
DEBIAN_FRONTEND=noninteractive $APT_GET install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core
$PIP install -q "selenium>=4.11"

chromium --version
chromedriver --version
