"""Live servers: Toolkeeper under daphne in a subprocess, each with its own data dir and port.

`toolkeeper_server` is the embedded default (SQLite, in-process channel layer, local executor).
`toolkeeper_server_pg` runs on a fresh PostgreSQL database (created here, dropped at teardown);
`toolkeeper_server_distributed` adds the Redis channel layer (the distributed mode on one daphne
process). Without PostgreSQL or Redis they skip, unless TOOLKEEPER_REQUIRE_SERVICES=1, where
they fail.

Both are safe under pytest-xdist: every server gets a free port, a temporary data dir and, for
PostgreSQL, a database of its own.
"""
import os
import secrets
from pathlib import Path

import pytest

from tests.live.server import LiveServer, pg_admin_url, pg_available, port_open, temporary_pg_database

REQUIRE_SERVICES = os.environ.get("TOOLKEEPER_REQUIRE_SERVICES") == "1"
LIVE_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if LIVE_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.live)


@pytest.fixture(scope="session", autouse=True)
def _close_stray_connections():
    """Live tests talk to server processes, never to the test database: the suite-wide fixture of this
    name (tests/conftest.py), which needs that database, does not apply here."""
    yield


def _missing(what: str):
    if REQUIRE_SERVICES:
        pytest.fail(f"{what} is required (TOOLKEEPER_REQUIRE_SERVICES=1) but not reachable")
    pytest.skip(f"{what} is not reachable")


def live_redis_url() -> str:
    """TEST_REDIS_URL, else the standard local port; a database number of its own limits crosstalk."""
    url = os.environ.get("TEST_REDIS_URL")
    if url:
        return url
    if not port_open("127.0.0.1", 6379):
        return ""
    return f"redis://127.0.0.1:6379/{secrets.randbelow(14) + 2}"


def _report(server: LiveServer) -> None:
    """Printed at teardown; pytest shows it only when a test failed."""
    print(f"--- {server.url} server log (tail) ---\n{server.log_tail(20000)}")


@pytest.fixture(scope="module")
def toolkeeper_server():
    with LiveServer() as server:
        yield server
        _report(server)


def _require_postgres() -> None:
    if not pg_available():
        _missing(f"PostgreSQL ({pg_admin_url()})")


@pytest.fixture(scope="module")
def toolkeeper_server_pg():
    """PostgreSQL (a fresh database), the in-process channel layer, the local executor."""
    _require_postgres()
    with temporary_pg_database(migrated_for="toolkeeper.settings") as (name, url), LiveServer(
            database_url=url, database_name=name, migrated=True) as server:
        yield server
        _report(server)


@pytest.fixture(scope="module")
def toolkeeper_server_distributed():
    """The distributed mode on one daphne process: PostgreSQL and the Redis channel layer."""
    _require_postgres()
    redis_url = live_redis_url()
    if not redis_url:
        _missing("Redis (127.0.0.1:6379)")
    with (
        temporary_pg_database(migrated_for="toolkeeper.settings") as (name, url),
        LiveServer(database_url=url, database_name=name, redis_url=redis_url, migrated=True) as server,
    ):
        yield server
        _report(server)
