"""Helpers for tests whose calls really run: test-only tools, bounded polling."""
import contextlib
import time
import uuid

from tools.catalog.services import catalog_sync
from tools.models import TERMINAL_STATUSES, Tool, ToolCall, ToolGroup
from tools.python import decorators

POLL_LIMIT_S = 10.0


def poll(fetch, *, timeout: float = POLL_LIMIT_S, interval: float = 0.02, message: str = "condition"):
    """Call `fetch` until it returns something truthy; fail after `timeout` seconds (never a timed assertion:
    the bound only keeps a broken run from hanging)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {message} after {timeout} s (last value {value!r})")
        time.sleep(interval)


def wait_terminal(call_pk, *, tenant, timeout: float = POLL_LIMIT_S) -> ToolCall:
    def fetch():
        call = ToolCall.objects.for_tenant(tenant).get(pk=call_pk)
        return call if call.status in TERMINAL_STATUSES else None

    return poll(fetch, timeout=timeout, message=f"call {call_pk} to finish")


def wait_status(call_pk, status: str, *, tenant, timeout: float = POLL_LIMIT_S) -> ToolCall:
    def fetch():
        call = ToolCall.objects.for_tenant(tenant).get(pk=call_pk)
        return call if call.status == status else None

    return poll(fetch, timeout=timeout, message=f"call {call_pk} to be {status}")


def submit(client, session, body) -> list[dict]:
    """Submit calls to a session through the API; the calls as the API returns them."""
    response = client.post(f"/api/v1/sessions/{session.pk}/calls", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["calls"]


def events_of(client, call_id) -> list[dict]:
    return client.get(f"/api/v1/calls/{call_id}/events").json()["events"]


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def registered_tool(fn, *, name: str, **options):
    """Register `fn` as a Python tool under a unique name for the duration of the block.

    The registry is global (one per process): the name is unique and the entry is removed afterwards.
    """
    decorators.tool(name=name, **options)(fn)
    try:
        yield decorators._registry[name]
    finally:
        decorators._registry.pop(name, None)


def install_tool(tenant, name: str, group: str = "basic") -> Tool:
    """Sync the tenant's catalog (picking up registered test tools) and put the tool in a group."""
    catalog_sync(tenant=tenant)
    tool = Tool.objects.for_tenant(tenant).get(name=name)
    ToolGroup.objects.for_tenant(tenant).get(name=group).tools.add(tool)
    return tool


@contextlib.contextmanager
def claim_lock_held_elsewhere(tenant_id: int, *, lock_timeout: str):
    """Another worker's claim holds the tenant's claim lock (in a thread of its own) while the block runs; this
    connection waits at most `lock_timeout` for a lock meanwhile (PostgreSQL)."""
    import threading

    from django.db import connections, transaction

    from tools.calls.statements import tenant_claims_serialise

    held, done = threading.Event(), threading.Event()

    def hold_claim_lock():
        try:
            with transaction.atomic():
                tenant_claims_serialise(tenant_id)
                held.set()
                done.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_claim_lock)
    holder.start()
    try:
        assert held.wait(10)
        with connections["default"].cursor() as cursor:
            cursor.execute(f"SET lock_timeout = '{lock_timeout}'")
        yield
    finally:
        done.set()
        holder.join()
        with connections["default"].cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
