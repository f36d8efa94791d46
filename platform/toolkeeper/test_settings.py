"""Settings for the test suite: real PostgreSQL and Redis where they run (docs/notes/structure-and-testing.md).

TEST_DATABASE_URL / TEST_REDIS_URL override the standard local ports. With
TOOLKEEPER_REQUIRE_SERVICES=1 a missing service is an error instead of a fallback.
"""
import os
import socket

from toolkeeper.settings import *  # noqa: F403
from toolkeeper.settings import DATA_DIR, database_from_url

REQUIRE_SERVICES = os.environ.get("TOOLKEEPER_REQUIRE_SERVICES") == "1"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


TEST_DATABASE_URL = os.environ.get("TEST_DATABASE_URL")
if not TEST_DATABASE_URL and _reachable("127.0.0.1", 5432):
    TEST_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/toolkeeper"
if not TEST_DATABASE_URL and REQUIRE_SERVICES:
    raise RuntimeError("PostgreSQL is required (TOOLKEEPER_REQUIRE_SERVICES=1) but not reachable")
DATABASES = {
    "default": database_from_url(TEST_DATABASE_URL or f"sqlite:///{DATA_DIR / 'test.sqlite3'}"),
}
USING_POSTGRES = DATABASES["default"]["ENGINE"].endswith("postgresql")
if not USING_POSTGRES:
    # A file, not Django's in-memory default: executor threads need their own connections to it.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / f"test_{os.getpid()}.sqlite3")}
if USING_POSTGRES:
    DATABASES["default"]["ENGINE"] = "tests.pg_backend"  # Django's, with a flush that deletes rows (its docstring)
    # One test database per run (xdist adds its worker suffix), so concurrent runs never collide.
    _run = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))
    DATABASES["default"]["TEST"] = {"NAME": f"test_toolkeeper_{_run}"[:58]}

TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL")
if not TEST_REDIS_URL and _reachable("127.0.0.1", 6379):
    TEST_REDIS_URL = "redis://127.0.0.1:6379/0"
if not TEST_REDIS_URL and REQUIRE_SERVICES:
    raise RuntimeError("Redis is required (TOOLKEEPER_REQUIRE_SERVICES=1) but not reachable")

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # noqa: S105 (fast logins in tests)
TOOLKEEPER_EXECUTOR = "local"
TOOLKEEPER_RUNTIME, TOOLKEEPER_EXECUTOR_CLASS = TOOLKEEPER_MODES[TOOLKEEPER_EXECUTOR]  # noqa: F405
CHANNEL_LAYERS = {"default": {"BACKEND": "realtime.layers.InProcessChannelLayer"}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
