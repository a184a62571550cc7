"""Headless Chromium driven by selenium, for the HTML report's tests (skipped when absent).

Debian's `chromium` and `chromium-driver` (.ci/run installs them); selenium from the dev extras.
The driver is given by path, so selenium-manager never tries to download one.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or (
    "/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists() else None
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,900",
)


def missing() -> Optional[str]:
    """Why the browser tests cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if CHROMIUM is None or CHROMEDRIVER is None:
        return "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
    return None


def chromium() -> Iterator[Any]:
    """A headless Chromium with a fresh profile; browser console messages are kept for get_log."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    profile = tempfile.mkdtemp(prefix="hooktrace-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # type: ignore[assignment]
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(driver: Any, path: Path) -> list[dict[str, Any]]:
    """Load `path` and wait for the report to be built; the console messages of the load."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # drop what an earlier page left
    driver.get(path.resolve().as_uri())
    WebDriverWait(driver, 60).until(
        lambda d: d.execute_script("return !!window.hooktraceReport || !!document.querySelector('.loading')")
    )
    WebDriverWait(driver, 60).until(lambda d: d.execute_script("return !!window.hooktraceReport"))
    return driver.get_log("browser")
