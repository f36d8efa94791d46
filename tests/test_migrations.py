"""Every migration of ours is reversible: all apps down to zero and up again, on both databases."""
import os
import uuid

import pytest

from tests.migrating import database_env, run_steps

APPS_TOP_DOWN = ["knowledge", "approvals", "tools", "audit", "tenancy"]


def down_and_up(env: dict) -> None:
    steps = [["migrate", "-v0"], *(["migrate", app, "zero", "-v0"] for app in APPS_TOP_DOWN),
             ["showmigrations", "--plan"], ["migrate", "-v0"], ["showmigrations", "--plan"]]
    outputs = run_steps(env, steps)
    at_zero, after = outputs[-3], outputs[-1]
    for app in APPS_TOP_DOWN:  # down: none of our migrations applied
        assert f"[X]  {app}." not in at_zero, at_zero
    assert "[ ]" not in after and "[X]  tenancy." in after, after  # up: all of them again


def test_migrations_reverse_on_sqlite(tmp_path):
    down_and_up(database_env(tmp_path, f"sqlite:///{tmp_path / 'migrations.sqlite3'}"))


def test_migrations_reverse_on_postgres(tmp_path, settings):
    if not settings.USING_POSTGRES:
        pytest.skip("PostgreSQL is not in use for this run")
    import psycopg

    admin_url = os.environ.get("TEST_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    name = f"tk_migrations_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        down_and_up(database_env(tmp_path, admin_url.rsplit("/", 1)[0] + f"/{name}"))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
