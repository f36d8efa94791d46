"""This suite runs on the database of the test settings (PostgreSQL where it answers) and, through
this test, once more on the other backend in a subprocess: SQLite (a temporary file) when the run is
on PostgreSQL; PostgreSQL, when it answers, when the run is on SQLite."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.sqlite_subprocess
def test_the_knowledge_suite_passes_on_the_other_backend(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_SETTINGS"))}
    if connection.vendor == "postgresql":
        env["TEST_DATABASE_URL"] = f"sqlite:///{tmp_path / 'knowledge_test.sqlite3'}"
        other = "sqlite"
        settings_module = ["--ds", "tests.knowledge.sqlite_settings"]  # a file test database (threads)
    else:
        env.pop("TEST_DATABASE_URL", None)  # the test settings pick PostgreSQL when it answers
        import socket

        try:
            socket.create_connection(("127.0.0.1", 5432), timeout=1).close()
            reachable = True
        except OSError:
            reachable = False
        if not reachable:
            if getattr(settings, "REQUIRE_SERVICES", False):
                pytest.fail("PostgreSQL is required but not reachable")
            pytest.skip("PostgreSQL is not reachable: the suite ran on SQLite only")
        other = "postgresql"
        settings_module = []
    env["KNOWLEDGE_EXPECT_VENDOR"] = other
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/knowledge", "-m", "not sqlite_subprocess", "-q", "-p",
         "no:cacheprovider", "-p", "no:xdist", "-W", "ignore::DeprecationWarning", *settings_module],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
    assert result.returncode == 0, f"the knowledge suite failed on {other}:\n{tail}"
    assert " passed" in result.stdout and "failed" not in result.stdout.splitlines()[-1], tail


@pytest.mark.django_db
def test_the_expected_backend_is_in_use():
    """In the subprocess run, proves the suite really ran on the other database."""
    expected = os.environ.get("KNOWLEDGE_EXPECT_VENDOR")
    if expected:
        assert connection.vendor == expected
