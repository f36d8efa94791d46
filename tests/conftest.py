"""Two fully populated tenants, so every test can check that one never sees the other.

`world.a` and `world.b` have the same shape: users of every role, API keys of every scope,
groups, a bound argument, a session with calls and events, audit events.
"""
import os
from dataclasses import dataclass, field

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from approvals.engine import index_cache
from tenancy.models import Role
from tenancy.services import apikey_create, membership_set, tenant_create
from tools.calls.submit import calls_submit
from tools.catalog.services import binding_set, group_update, session_create
from tools.models import CallStatus, Tool, ToolGroup

PASSWORD = "correct horse battery staple"


@dataclass
class TenantWorld:
    tenant: object
    users: dict = field(default_factory=dict)  # role -> user
    keys: dict = field(default_factory=dict)  # label -> full key string
    key_objects: dict = field(default_factory=dict)  # label -> ApiKey
    groups: dict = field(default_factory=dict)
    tools: dict = field(default_factory=dict)
    binding: object = None
    session: object = None
    calls: list = field(default_factory=list)

    def client(self, key_label: str = "agent") -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.keys[key_label]}")
        return client

    def console(self, role: str = "admin"):
        from django.test import Client

        client = Client()
        client.force_login(self.users[role])
        return client


@dataclass
class World:
    a: TenantWorld
    b: TenantWorld


def build_tenant(slug: str) -> TenantWorld:
    users = get_user_model().objects
    world = TenantWorld(tenant=None)
    admin = users.create_user(username=f"{slug}-admin", password=PASSWORD)
    world.tenant = tenant_create(slug=slug, name=slug.title(), admin=admin, default_behavior="allow")
    world.users["admin"] = admin
    for role in (Role.OPERATOR, Role.REVIEWER, Role.VIEWER):
        user = users.create_user(username=f"{slug}-{role}", password=PASSWORD)
        membership_set(tenant=world.tenant, user=user, role=role)
        world.users[role] = user
    for label, scopes, agent in (
        ("agent", ["agent"], ""),
        ("external", ["external"], ""),
        ("admin", ["admin"], ""),
        ("locked", ["agent"], "support-bot"),
    ):
        issued = apikey_create(tenant=world.tenant, name=label, scopes=scopes, agent=agent, created_by=admin)
        world.keys[label] = issued.key
        world.key_objects[label] = issued.api_key
    world.tools = {t.name: t for t in Tool.objects.for_tenant(world.tenant)}
    world.groups = {g.name: g for g in ToolGroup.objects.for_tenant(world.tenant)}
    group_update(group=world.groups["math"], description="Arithmetic.", notes="Use calculate for arithmetic.")
    world.binding = binding_set(tenant=world.tenant, tool=world.tools["current_time"], name="timezone",
                                value="Asia/Tokyo", agent="support-bot")
    world.session = session_create(tenant=world.tenant, agent="support-bot", user="alice@example.com",
                                   api_key=world.key_objects["agent"])
    world.calls = calls_submit(session=world.session, calls=[
        {"id": "call_time", "name": "reset_tools", "input": {"math": True}},
        {"id": "call_missing", "name": "no_such_tool", "input": {}},
    ])
    assert [c.status for c in world.calls] == [CallStatus.SUCCEEDED, CallStatus.FAILED]
    return world


@pytest.fixture
def world(db) -> World:
    return World(a=build_tenant("acme"), b=build_tenant("globex"))


@pytest.fixture
def fresh_rule_index():
    """Compiled rule indexes live per process, keyed by tenant id and policy version: start the test clean."""
    index_cache.clear()
    yield
    index_cache.clear()


@pytest.fixture
def api():
    return APIClient()


@pytest.fixture
def drain_calls(db):
    """For transactional tests whose calls really run: at teardown, wait (bounded) until the local
    executor is idle, so no worker thread writes while the tables are flushed."""
    yield
    import time

    from tools.calls.runtime import runtime

    executor = runtime()._executor
    if executor is None or not hasattr(executor, "_running"):
        return  # only the local executor runs calls inside the test process
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with executor._lock:
            if not executor._running and not executor._waiting:
                return
        time.sleep(0.02)


@pytest.fixture(scope="session", autouse=True)
def _close_stray_connections(django_db_setup, django_db_blocker):
    """Worker threads (executor, wait pool) keep their own connections open; end them before the
    test database is dropped, or the drop fails with "being accessed by other users"."""
    yield
    from django.db import OperationalError, connection

    if connection.vendor != "postgresql" or not connection.settings_dict["NAME"].startswith("test_"):
        return  # no test database was set up in this process
    with django_db_blocker.unblock():
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        except OperationalError:
            pass  # nothing to end


if os.environ.get("TOOLKEEPER_MUTATION_DB") == "1":
    MUTATION_TEMPLATE = "test_toolkeeper_mutation"
    MUTATION_SLOTS = 8  # more than mutmut ever runs at once on this kind of machine
    _slot_lock = None  # held for the life of the process: the kernel frees the slot when it ends, however it ends

    def _claim_slot(data_dir) -> int:
        import fcntl

        global _slot_lock
        for slot in range(MUTATION_SLOTS):
            lock = open(data_dir / f"mutation-slot-{slot}.lock", "w")  # noqa: SIM115 - held until exit
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            _slot_lock = lock
            return slot
        raise RuntimeError(f"all {MUTATION_SLOTS} mutation databases are in use")

    @pytest.fixture(scope="session")
    def django_db_setup(django_test_environment, django_db_blocker):
        """`make mutate` runs the tests once per mutant, each time in a new process: migrating a database
        there would cost more than most mutants' tests, and copying one (CREATE DATABASE … TEMPLATE, then
        DROP) costs PostgreSQL a checkpoint each, seconds a mutant. So the first run migrates a template;
        each process claims one of a few copies of it (a file lock, freed when the process ends) and
        empties it, as pytest-django does after every transactional test: whatever the last mutant's
        run left there, interrupted or not, never reaches the next."""
        import fcntl
        from pathlib import Path

        from django.conf import settings
        from django.core.management import call_command
        from django.db import connection
        from django.test.utils import setup_databases

        if connection.vendor != "postgresql":
            raise RuntimeError("make mutate needs PostgreSQL (TEST_DATABASE_URL or 127.0.0.1:5432)")
        data_dir = Path(settings.DATA_DIR)
        ready = data_dir / "mutation-template.ready"  # removed by `make mutate`, so each run migrates afresh
        slot = _claim_slot(data_dir)
        name = f"{MUTATION_TEMPLATE}_{slot}"
        copied = data_dir / f"mutation-slot-{slot}.copied"  # this slot's copy is of the current template
        with django_db_blocker.unblock():
            with open(data_dir / "mutation-template.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # runs of two mutants at once: one migrates, the other waits
                connection.settings_dict["TEST"]["NAME"] = MUTATION_TEMPLATE
                if not ready.exists():
                    with connection._nodb_cursor() as cursor:  # the copies of the template before
                        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                                       [f"{MUTATION_TEMPLATE}\\_%"])
                        for (old,) in cursor.fetchall():
                            cursor.execute(f'DROP DATABASE IF EXISTS "{old}" WITH (FORCE)')
                    for stale in data_dir.glob("mutation-slot-*.copied"):
                        stale.unlink()
                    setup_databases(verbosity=0, interactive=False, serialized_aliases=[])
                    ready.touch()
                if not copied.exists():
                    connection.settings_dict["NAME"] = MUTATION_TEMPLATE
                    connection.creation.clone_test_db(suffix=str(slot), verbosity=0)
                    copied.touch()
            connection.close()
            connection.settings_dict["NAME"] = settings.DATABASES["default"]["NAME"] = name
            call_command("flush", interactive=False, verbosity=0, database="default")
        yield

    def _collecting_stats() -> bool:
        from mutmut.mutation.trampoline import get_mutant_under_test

        return get_mutant_under_test() == "stats"

    def pytest_collection_modifyitems(items):
        """mutmut hands a mutant's tests over in no particular order and stops at the first failure: run the
        quick ones first, so a mutant that a unit test kills is not first run through the slow end-to-end
        tests. A module's tests stay together (its fixtures may start servers); modules by their quickest test."""
        from mutmut.mutation.trampoline import get_mutant_under_test
        from mutmut.state import state

        if get_mutant_under_test() in (None, "", "stats", "fail"):
            return
        durations = state().duration_by_test
        module = {item.nodeid: item.nodeid.split("::", 1)[0] for item in items}
        quickest = {}
        for item in items:
            duration = durations.get(item.nodeid, float("inf"))
            quickest[module[item.nodeid]] = min(quickest.get(module[item.nodeid], float("inf")), duration)
        items.sort(key=lambda item: (quickest[module[item.nodeid]], module[item.nodeid],
                                     durations.get(item.nodeid, float("inf"))))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(item):
        """mutmut runs a mutant against the tests that reached its function. Counted from the test's own
        call, not its fixtures': a test whose only contact was building the shared world kills a mutant by
        crashing, not by checking it, and would cost every survivor of the call path a thousand runs."""
        from mutmut.state import state

        if _collecting_stats():
            state()._stats.clear()

    def pytest_runtest_makereport(item, call):
        """mutmut times a test by its call alone and gives a mutant's run a multiple of its tests' time before
        calling it a timeout (a kill); the fixtures' time counts here too, or slow set-ups would look like hangs."""
        from mutmut.state import state

        if call.when != "call" and _collecting_stats():
            durations = state().duration_by_test
            durations[item.nodeid] = durations.get(item.nodeid, 0) + call.duration
