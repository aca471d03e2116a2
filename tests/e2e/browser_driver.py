"""Debian's headless Chromium driven by selenium through Debian's chromedriver.

Nothing is downloaded: both binaries come from the distribution (``make browser`` installs
them), and selenium is told exactly where they are so its driver manager never runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1800",
)
"""Headless, no sandbox (root in CI), and no traffic of the browser's own to anywhere."""
INSTALL_HINT = "run 'make browser' (as root: apt-get install chromium chromium-driver)"


@contextlib.contextmanager
def chromium(profile_dir: Path) -> Iterator[webdriver.Chrome]:
    """A fresh headless Chromium with its own user-data dir; quit (with its driver) on exit.

    Raises:
        AssertionError: Chromium or chromedriver is missing (with the install hint).
    """
    for binary in (CHROMIUM, CHROMEDRIVER):
        assert os.access(binary, os.X_OK), f"{binary} is missing: {INSTALL_HINT}"
    opts = Options()
    opts.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile_dir}")
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(profile_dir / "driver.log"))
    driver = webdriver.Chrome(options=opts, service=service)
    try:
        yield driver
    finally:
        driver.quit()
