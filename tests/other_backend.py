"""Run a test directory once more on the other database, in a subprocess: SQLite (a temporary file) when
this run is on PostgreSQL; PostgreSQL, when it answers, when this run is on SQLite. Tests that the
subprocess really used it check `EXPECT_VENDOR_ENV` (see `assert_expected_vendor`)."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[1]
EXPECT_VENDOR_ENV = "TOOLKEEPER_TEST_EXPECT_VENDOR"
MARKER = "sqlite_subprocess"


def _postgres_answers() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=1).close()
        return True
    except OSError:
        return False


def run_on_other_backend(path: str, tmp_path) -> None:
    """Run the tests under `path` (except those marked `sqlite_subprocess`) on the other database; fail with
    the run's tail if any fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_SETTINGS"))}
    if connection.vendor == "postgresql":
        env["TEST_DATABASE_URL"] = f"sqlite:///{tmp_path / 'other_backend.sqlite3'}"
        other = "sqlite"
        settings_module = ["--ds", "tests.knowledge.sqlite_settings"]  # a file test database (threads)
    else:
        env.pop("TEST_DATABASE_URL", None)  # the test settings pick PostgreSQL when it answers
        if not _postgres_answers():
            if getattr(settings, "REQUIRE_SERVICES", False):
                pytest.fail("PostgreSQL is required but not reachable")
            pytest.skip("PostgreSQL is not reachable: the suite ran on SQLite only")
        other = "postgresql"
        settings_module = []
    env[EXPECT_VENDOR_ENV] = other
    result = subprocess.run(
        [sys.executable, "-m", "pytest", path, "-m", f"not {MARKER}", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-W", "ignore::DeprecationWarning", *settings_module],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
    assert result.returncode == 0, f"{path} failed on {other}:\n{tail}"
    assert " passed" in result.stdout and "failed" not in result.stdout.splitlines()[-1], tail


def assert_expected_vendor() -> None:
    """In the subprocess run, proves the tests really ran on the other database."""
    expected = os.environ.get(EXPECT_VENDOR_ENV)
    if expected:
        assert connection.vendor == expected
