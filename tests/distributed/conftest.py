"""One distributed deployment for the whole directory: a private redis-server, a fresh PostgreSQL
database, daphne with TOOLKEEPER_EXECUTOR=celery, a Celery worker (prefork, 2 processes) and beat,
all with the test-only tools of `stack_tools` (settings `stack_settings`), and a test OTLP receiver
(tests/otlp_receiver.py) that every process of the stack exports its traces to (`deployment.otlp`).

Two tenants: `demo` (seeded by `manage.py bootstrap`) and `bravo` (created here), each with a
console user, an agent key and an admin key; plus a revoked key of `demo`. Tests that stop the
broker or kill the worker put the stack back as they found it.

Without PostgreSQL or redis-server these tests skip, unless TOOLKEEPER_REQUIRE_SERVICES=1, where
they fail.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from tests.distributed.stack import DistributedStack, redis_server_binary
from tests.distributed.support import Api, TenantAccess
from tests.live.server import free_port, pg_admin_url, pg_available
from tests.otlp_receiver import Receiver, serve

REQUIRE_SERVICES = os.environ.get("TOOLKEEPER_REQUIRE_SERVICES") == "1"
BRAVO_PASSWORD = "bravo-password-for-tests"
METRICS_TOKEN = "distributed-scrape-token"
WORKER_METRICS_ADDR = f"127.0.0.1:{free_port()}"  # the workers' own scrape address (test_metrics.py)

SEED_BRAVO = f"""
import json
from django.contrib.auth import get_user_model
from tenancy.models import Tenant
from tenancy.services import apikey_create, apikey_revoke, tenant_create

admin = get_user_model().objects.create_user(username="bravo-admin", password={BRAVO_PASSWORD!r})
bravo = tenant_create(slug="bravo", name="Bravo", admin=admin, default_behavior="allow")
agent = apikey_create(tenant=bravo, name="bravo agent", scopes=["agent"], created_by=admin)
admin_key = apikey_create(tenant=bravo, name="bravo admin", scopes=["admin"], created_by=admin)
revoked = apikey_create(tenant=Tenant.objects.get(slug="demo"), name="revoked", scopes=["agent"])
apikey_revoke(api_key=revoked.api_key)
print(json.dumps({{"api_key": agent.key, "admin_api_key": admin_key.key, "revoked_key": revoked.key}}))
"""


def _missing(what: str):
    if REQUIRE_SERVICES:
        pytest.fail(f"{what} is required (TOOLKEEPER_REQUIRE_SERVICES=1) but not available")
    pytest.skip(f"{what} is not available")


@dataclass
class Deployment:
    stack: DistributedStack
    a: TenantAccess
    b: TenantAccess
    revoked_key: str
    otlp: Receiver

    @property
    def url(self) -> str:
        return self.stack.server.url

    @property
    def ws_base(self) -> str:
        return self.url.replace("http://", "ws://", 1)

    @property
    def origin(self) -> str:
        return self.url

    def api(self, tenant: TenantAccess, key: str | None = None) -> Api:
        return Api(self.url, key or tenant.api_key)


@pytest.fixture(scope="session")
def deployment():
    if not pg_available():
        _missing(f"PostgreSQL ({pg_admin_url()})")
    if redis_server_binary() is None:
        _missing("redis-server (the broker of the distributed tests)")
    receiving = serve()  # before the stack: its processes export their spans as soon as they run calls
    otlp = next(receiving)
    stack = DistributedStack(settings_module="tests.distributed.stack_settings", extra_env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
        "TOOLKEEPER_METRICS_TOKEN": METRICS_TOKEN,
        "TOOLKEEPER_WORKER_METRICS_ADDR": WORKER_METRICS_ADDR})  # /metrics (test_metrics.py)
    stack.start()
    try:
        creds = stack.server.credentials
        bravo = stack.shell(SEED_BRAVO)
        yield Deployment(
            stack=stack,
            a=TenantAccess(slug="demo", api_key=creds["api_key"], admin_key=creds["admin_api_key"],
                           username=creds["operator"]["username"], password=creds["operator"]["password"]),
            b=TenantAccess(slug="bravo", api_key=bravo["api_key"], admin_key=bravo["admin_api_key"],
                           username="bravo-admin", password=BRAVO_PASSWORD),
            revoked_key=bravo["revoked_key"],
            otlp=otlp,
        )
    except BaseException:
        print(stack.log_tail())
        raise
    finally:
        stack.stop()
        receiving.close()


@pytest.fixture(autouse=True)
def _stack_logs_on_failure(request, deployment):
    """After a failed test, print the tails of the processes' logs (pytest shows them for failures)."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(deployment.stack.log_tail(chars=5000))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="session", autouse=True)
def _close_stray_connections():
    """Overrides the root conftest's fixture of this name for this directory: these tests never touch
    Django's test database (every process of the stack uses the stack's own database), so they neither
    create it nor close connections to it."""
    yield
