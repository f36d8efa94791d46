"""Two fully populated tenants, so every test can check that one never sees the other.

`world.a` and `world.b` have the same shape: users of every role, API keys of every scope,
groups, a bound argument, a session with calls and events, audit events.
"""
import copy
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


class _SharedWorld:
    """The world, built and committed once per worker process: the tests that use it roll their changes
    back with their own transaction, and each gets its own copy of the objects. A test that flushes the
    database (a transactional one) takes it away; the next test that needs it builds it again."""

    def __init__(self, blocker):
        self.blocker = blocker
        self.built: World | None = None

    def present(self) -> bool:
        if self.built is None:
            return False
        last = self.built.b.calls[-1]
        return type(last).objects.for_tenant(last.tenant_id).filter(pk=last.pk).exists()

    def ensure(self) -> None:
        with self.blocker.unblock():
            if not self.present():
                self.built = World(a=build_tenant("acme"), b=build_tenant("globex"))


_shared_world: _SharedWorld | None = None


@pytest.fixture(scope="session")
def _world_store(django_db_setup, django_db_blocker) -> _SharedWorld:
    global _shared_world
    _shared_world = _SharedWorld(django_db_blocker)
    _shared_world.ensure()
    return _shared_world


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # Before any of the test's fixtures, so outside its transaction: a world built inside would be rolled
    # back with the test.
    if _shared_world is not None and "world" in item.fixturenames:
        _shared_world.ensure()


@pytest.fixture
def world(_world_store, db) -> World:
    from django.core.cache import caches
    from django.core.cache.backends.locmem import LocMemCache

    from tenancy.entry.limits import counter_store

    # Per-process stores keyed by the world's ids would otherwise carry one test's traces into the next
    # (never a shared Redis: other workers' tests use it).
    for store in (caches["default"], counter_store()):
        if isinstance(store, LocMemCache):
            store.clear()
    return copy.deepcopy(_world_store.built)


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



@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    # A module that shares a server (or other costly fixture) among its tests runs on one worker: split over
    # two, each would start its own.
    for item in items:
        shared = any(fixturedefs[-1].scope in ("module", "package")
                     for fixturedefs in item._fixtureinfo.name2fixturedefs.values())
        if shared and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
