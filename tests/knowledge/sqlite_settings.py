"""Test settings for the SQLite run of this suite: the test database is a file, not Django's default
in-memory shared-cache database, whose table locks make the executor's worker threads fail with
"database table is locked" while the test thread polls. Use: --ds tests.knowledge.sqlite_settings."""
from toolkeeper.test_settings import *  # noqa: F403
from toolkeeper.test_settings import DATABASES

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["TEST"] = {"NAME": f"{DATABASES['default']['NAME']}.test"}
