"""Every migration of ours is reversible: all apps down to zero and up again, on both databases."""
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS_TOP_DOWN = ["knowledge", "approvals", "tools", "audit", "tenancy"]


def manage(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def down_and_up(env: dict) -> None:
    for step in (["migrate", "-v0"], *(["migrate", app, "zero", "-v0"] for app in APPS_TOP_DOWN), ["migrate", "-v0"]):
        result = manage(env, *step)
        assert result.returncode == 0, f"{' '.join(step)}:\n{result.stderr[-3000:]}"
    shown = manage(env, "showmigrations", "--plan")
    assert shown.returncode == 0 and "[ ]" not in shown.stdout, shown.stdout


def clean_env(tmp_path, database_url: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "TOOLKEEPER_EXECUTOR"}}
    env.update({"DATABASE_URL": database_url, "TOOLKEEPER_DATA_DIR": str(tmp_path), "DEBUG": "1",
                "DJANGO_SETTINGS_MODULE": "toolkeeper.settings"})
    return env


def test_migrations_reverse_on_sqlite(tmp_path):
    down_and_up(clean_env(tmp_path, f"sqlite:///{tmp_path / 'migrations.sqlite3'}"))


def test_migrations_reverse_on_postgres(tmp_path, settings):
    if not settings.USING_POSTGRES:
        pytest.skip("PostgreSQL is not in use for this run")
    import psycopg

    admin_url = os.environ.get("TEST_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    name = f"tk_migrations_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        down_and_up(clean_env(tmp_path, admin_url.rsplit("/", 1)[0] + f"/{name}"))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
