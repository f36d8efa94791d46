"""Shared fixtures of the governance tests (rules, queues, approvals, external tools).

Fixtures of this module are prefixed `gov_` (the file is shared with the console tests of the inbox).
"""
import threading
from dataclasses import dataclass, field

import pytest
from rest_framework.test import APIClient

from approvals import services as approvals
from approvals.models import ApprovalRequest
from tenancy.models import Role
from tenancy.services import membership_set, user_create
from tests.conftest import PASSWORD
from tests.tools.support import install_tool, registered_tool, unique_name
from tools.catalog.services import session_create
from tools.models import ToolCall
from tools.python.decorators import ToolContext


@pytest.fixture(autouse=True)
def gov_fresh_rule_index(fresh_rule_index):
    """Every governance test starts with no compiled rule index cached."""


@dataclass
class Counter:
    """Counts a test tool's invocations (from executor threads)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    inputs: list = field(default_factory=list)

    def hit(self, value: dict) -> None:
        with self.lock:
            self.inputs.append(value)

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.inputs)


@dataclass
class ShellTool:
    tool: object
    name: str
    counter: Counter


@pytest.fixture
def gov_shell(world):
    """A test-only Python tool `shell_<hex>(command, cwd="/")` in tenant A's basic group; counts its runs."""
    counter = Counter()

    def shell(command: str, ctx: ToolContext, cwd: str = "/") -> dict:
        """Run a shell command (pretend).

        Args:
            command: The command line.
            cwd: The working directory.
        """
        counter.hit({"command": command, "cwd": cwd})
        return {"ran": command, "cwd": cwd, "agent": ctx.agent}

    name = unique_name("shell")
    with registered_tool(shell, name=name):
        tool = install_tool(world.a.tenant, name)
        yield ShellTool(tool=tool, name=name, counter=counter)


@pytest.fixture
def gov_member(world):
    """Make a member of a tenant (default: tenant A, role reviewer) with a unique username."""

    def make(role: str = Role.REVIEWER, tenant=None, username: str | None = None, email: str = ""):
        user = user_create(username=username or unique_name(f"rev-{role}"), password=PASSWORD, email=email)
        membership_set(tenant=tenant or world.a.tenant, user=user, role=role)
        return user

    return make


def console_api(user, tenant) -> APIClient:
    """The API as a logged-in console user sees it: session auth plus the X-Tenant header."""
    client = APIClient()
    client.force_login(user)
    client.credentials(HTTP_X_TENANT=tenant.slug)
    return client


@pytest.fixture
def gov_console_api():
    return console_api


@pytest.fixture
def gov_session(world):
    """A fresh session in tenant A (agent "ops-bot", user "carol@example.com" unless told otherwise)."""

    def make(agent: str = "ops-bot", user: str = "carol@example.com", tenant=None):
        return session_create(tenant=tenant or world.a.tenant, agent=agent, user=user,
                              api_key=world.a.key_objects["agent"])

    return make


@pytest.fixture
def gov_queue(world):
    """Create a queue in tenant A through the service."""

    def make(name: str | None = None, tenant=None, **values):
        return approvals.queue_save(tenant=tenant or world.a.tenant, name=name or unique_name("q").replace("_", "-"),
                                    **values)

    return make


@pytest.fixture
def gov_rule(world):
    """Create a rule in tenant A through the service."""

    def make(behavior: str, tool_pattern: str, tenant=None, **values):
        return approvals.rule_create(tenant=tenant or world.a.tenant, behavior=behavior, tool_pattern=tool_pattern,
                                     **values)

    return make


def submit(client, session, name: str, call_input: dict, call_id: str | None = None, **extra) -> dict:
    """POST one call through the app-facing API; returns the call as the API shows it."""
    body = {"name": name, "input": call_input, **extra}
    if call_id:
        body["id"] = call_id
    response = client.post(f"/api/v1/sessions/{session.pk}/calls", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["calls"][0]


def request_of(call: dict, tenant) -> ApprovalRequest:
    return ApprovalRequest.objects.for_tenant(tenant).get(call_id=call["id"])


def call_row(call: dict, tenant) -> ToolCall:
    return ToolCall.objects.for_tenant(tenant).get(pk=call["id"])


# --- the inbox console (fixtures prefixed `inbox_`) -----------------------------------------------

@pytest.fixture
def inbox_pending(world, gov_shell, gov_rule, gov_session):
    """Open approval requests in tenant A: an ask rule on the test shell tool (or, with by_default=True,
    the tenant's default behaviour `ask`), then `n` calls of it.

    `make(n, agent=..., user=..., queue=..., command=..., by_default=...)` returns the ApprovalRequests,
    oldest first.
    """
    from tools.calls.submit import calls_submit

    rules = {}

    def make(n: int = 1, *, agent: str = "ops-bot", user: str = "carol@example.com", queue=None,
             command: str = "ls -la", by_default: bool = False):
        key = queue.pk if queue is not None else None
        if by_default:
            world.a.tenant.default_behavior = "ask"
            world.a.tenant.auto_allow_read_only = False
            world.a.tenant.save()
        elif key not in rules:
            scoped = queue is not None  # a queue's rule: for this agent only, before the unscoped one
            rules[key] = gov_rule("ask", gov_shell.name, queue=queue, agents=[agent] if scoped else [],
                                  priority=10 if scoped else 0, note="shell needs a human")
        session = gov_session(agent=agent, user=user)
        calls = calls_submit(session=session, calls=[
            {"name": gov_shell.name, "input": {"command": f"{command} {i}" if n > 1 else command}}
            for i in range(n)
        ])
        requests = list(ApprovalRequest.objects.for_tenant(world.a.tenant).filter(call__in=calls)
                        .order_by("opened_at", "id"))
        assert len(requests) == n, [c.status for c in calls]
        return requests

    make.shell = gov_shell
    return make


@pytest.fixture(scope="module")
def inbox_live_server():
    """Toolkeeper under daphne (embedded mode: SQLite, in-process channel layer, local executor), seeded with
    the demo tenant; started with the live tests' helper (tests/live/server.py)."""
    from tests.live.server import LiveServer

    with LiveServer() as server:
        yield server
        print(f"--- {server.url} server log (tail) ---\n{server.log_tail(20000)}")  # shown when a test failed
