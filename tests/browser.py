"""Debian's Chromium for the browser tests, driven by Playwright (DESIGN §11)."""
import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
# No background traffic: this machine's network is closed, and the tests must not wait on it.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]


def chromium_or_skip() -> None:
    """Skip when Chromium or Playwright is missing; with TOOLKEEPER_REQUIRE_SERVICES=1, fail instead."""
    problem = None
    if not CHROMIUM.exists():
        problem = f"{CHROMIUM} is not installed (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "the playwright package is not installed"
    if problem:
        if os.environ.get("TOOLKEEPER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{problem}, and TOOLKEEPER_REQUIRE_SERVICES=1")
        pytest.skip(problem)
