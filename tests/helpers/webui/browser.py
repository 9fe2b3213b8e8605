"""Headless Chromium from the distribution's packages, driven by Selenium through chromedriver.

Debian builds ``chromium`` and ``chromium-driver`` from one source package, so the driver always
matches the browser, and giving Selenium both paths keeps Selenium Manager from downloading anything.
"""

from __future__ import annotations

import os
import shutil

SKIP_ENV = "ZEBRA_SKIP_BROWSER_TESTS"
INSTALL_HINT = "run scripts/install_browser.sh (apt-get install chromium chromium-driver; pip install selenium)"
WINDOW_SIZE = (1280, 900)


class BrowserMissing(RuntimeError):
    pass


def browser_tests_skipped() -> bool:
    return os.environ.get(SKIP_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def _executable(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BrowserMissing(f"`{name}` is not on PATH; {INSTALL_HINT}, or set {SKIP_ENV}=1 to skip locally")
    return path


def headless_chromium():
    """A Selenium driver for headless Chromium; :class:`BrowserMissing` says what to install."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as err:
        raise BrowserMissing(f"Selenium is not installed ({err}); {INSTALL_HINT}, or set {SKIP_ENV}=1") from err

    options = webdriver.ChromeOptions()
    options.binary_location = _executable("chromium")
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI containers run as root, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={WINDOW_SIZE[0]},{WINDOW_SIZE[1]}",
        "--hide-scrollbars",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(executable_path=_executable("chromedriver")))
