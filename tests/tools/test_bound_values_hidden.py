"""Bound values can be secrets: the API shows them to operators, admins and admin-scoped keys only.
Reviewers and viewers (a console login with the X-Tenant header) see that a value is bound, not what
it is, on every endpoint they can read, as in the console."""
import pytest
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from approvals.services import rule_create
from tenancy.models import Role
from tools.calls.submit import calls_submit
from tools.catalog.services import binding_set, session_create
from tools.models import CallStatus

SECRET = "s3cr3t-scope-7f3a9c"


def console_api(world, role: str) -> APIClient:
    client = APIClient()
    client.force_login(world.a.users[role])
    client.credentials(HTTP_X_TENANT=world.a.tenant.slug)
    return client


@pytest.fixture
def bound_secret(world, echo_tool):
    """A secret bound to the echo tool, and a call of it waiting for a reviewer (so every kind of row that
    could carry it exists: the binding, a call with its effective input, its events, an approval, audit)."""
    binding = binding_set(tenant=world.a.tenant, tool=echo_tool, name="scope", value=SECRET,
                          actor=world.a.users["admin"])
    rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern=echo_tool.name)
    session = session_create(tenant=world.a.tenant, agent="support-bot", api_key=world.a.key_objects["agent"])
    [call] = calls_submit(session=session, calls=[{"name": echo_tool.name, "input": {"city": "Oslo"}}])
    assert call.status == CallStatus.AWAITING_APPROVAL, call.error
    assert call.effective_input["scope"] == SECRET  # stored for the tool; never shown below
    approval = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    return binding, echo_tool, session, call, approval


def readable_urls(binding, tool, session, call, approval) -> list[str]:
    return [
        "/api/v1/bindings", f"/api/v1/bindings?tool={tool.name}", f"/api/v1/bindings/{binding.pk}",
        f"/api/v1/calls/{call.pk}", f"/api/v1/calls/{call.pk}/events",
        "/api/v1/approvals", f"/api/v1/approvals/{approval.pk}",
        "/api/v1/tools", f"/api/v1/tools/{tool.pk}", "/api/v1/audit", "/api/v1/rules", "/api/v1/queues",
    ]


@pytest.mark.django_db(transaction=True)  # the calls endpoints read in threads of their own
@pytest.mark.parametrize("role", [Role.VIEWER, Role.REVIEWER])
def test_reviewers_and_viewers_never_see_a_bound_value(world, bound_secret, role):
    client = console_api(world, role)
    for url in readable_urls(*bound_secret):
        response = client.get(url)
        assert response.status_code == 200, (url, response.content)
        assert SECRET not in response.content.decode(), f"{role} sees the bound value at {url}"
    binding = bound_secret[0]
    listed = client.get("/api/v1/bindings", {"tool": binding.tool.name}).json()["results"]
    assert listed == [{"id": binding.pk, "tool": binding.tool.name, "agent": "", "name": "scope", "value": None,
                       "value_hidden": True, "created_at": listed[0]["created_at"]}]
    assert client.get(f"/api/v1/bindings/{binding.pk}").json()["value_hidden"] is True


@pytest.mark.parametrize("who", ["operator", "admin", "admin key"])
def test_operators_admins_and_admin_keys_see_bound_values(world, bound_secret, who):
    client = world.a.client("admin") if who == "admin key" else console_api(world, who)
    binding = bound_secret[0]
    detail = client.get(f"/api/v1/bindings/{binding.pk}").json()
    assert (detail["value"], detail["value_hidden"]) == (SECRET, False)
    listed = client.get("/api/v1/bindings", {"tool": binding.tool.name}).json()["results"]
    assert [(b["value"], b["value_hidden"]) for b in listed] == [(SECRET, False)]
    # What they write comes back whole.
    patched = client.patch(f"/api/v1/bindings/{binding.pk}", {"value": f"{SECRET}-2"}, format="json")
    assert patched.status_code == 200, patched.content
    assert patched.json()["value"] == f"{SECRET}-2"
