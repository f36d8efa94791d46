"""Rules and queues through the governance API (docs/api.md), and the compiled rule index staying in step with
the stored rules (docs/governance.md)."""
import pytest
from django.db import transaction

from approvals import selectors
from approvals.models import PermissionRule, Queue
from approvals.services import rule_create
from tenancy.models import Role
from tests.approvals.conftest import console_api
from tools.calls.submit import calls_submit
from tools.models import CallStatus


def test_rule_crud_decides_the_next_call(world, gov_shell, gov_session):
    admin = world.a.client("admin")
    session = gov_session()
    created = admin.post("/api/v1/rules", {"behavior": "deny", "tool_pattern": gov_shell.name,
                                           "arg_match": {"command": "rm *"}, "note": "no deletions"}, format="json")
    assert created.status_code == 201, created.content
    rule = created.json()
    [call] = calls_submit(session=session, calls=[{"name": gov_shell.name, "input": {"command": "rm -rf /"}}])
    assert (call.status, call.decision["rule"]) == (CallStatus.DENIED, rule["id"])

    patched = admin.patch(f"/api/v1/rules/{rule['id']}", {"behavior": "ask"}, format="json")
    assert patched.status_code == 200, patched.content
    [call] = calls_submit(session=session, calls=[{"name": gov_shell.name, "input": {"command": "rm -rf /"}}])
    assert call.status == CallStatus.AWAITING_APPROVAL

    assert admin.patch(f"/api/v1/rules/{rule['id']}", {"enabled": False}, format="json").status_code == 200
    [call] = calls_submit(session=session, calls=[{"name": gov_shell.name, "input": {"command": "rm -rf /"}}])
    assert call.status == CallStatus.QUEUED  # the tenant default (allow)

    assert admin.delete(f"/api/v1/rules/{rule['id']}").status_code == 204
    assert not PermissionRule.objects.for_tenant(world.a.tenant).filter(pk=rule["id"]).exists()


@pytest.mark.parametrize(("body", "field"), [
    ({"behavior": "maybe", "tool_pattern": "x"}, "behavior"),
    ({"behavior": "deny", "tool_pattern": ""}, "tool_pattern"),
    ({"behavior": "deny", "tool_pattern": "x", "arg_match": {"command": 5}}, "arg_match"),
    ({"behavior": "deny", "tool_pattern": "x", "arg_match": ["git *"]}, "arg_match"),
    ({"behavior": "deny", "tool_pattern": "x", "agents": "bot"}, "agents"),
    ({"behavior": "deny", "tool_pattern": "x", "users": [""]}, "users"),
    ({"behavior": "ask", "tool_pattern": "x", "queue": "no-such-queue"}, "queue"),
])
def test_invalid_rules_are_field_errors(world, body, field):
    response = world.a.client("admin").post("/api/v1/rules", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"], response.json()
    assert not PermissionRule.objects.for_tenant(world.a.tenant).exists()


def test_rules_are_changed_by_admins_and_operators_only(world):
    body = {"behavior": "deny", "tool_pattern": "calculate"}
    assert world.a.client("agent").post("/api/v1/rules", body, format="json").status_code == 403
    reviewer = console_api(world.a.users[Role.REVIEWER], world.a.tenant)
    assert reviewer.post("/api/v1/rules", body, format="json").status_code == 403
    assert reviewer.get("/api/v1/rules").status_code == 200
    operator = console_api(world.a.users[Role.OPERATOR], world.a.tenant)
    assert operator.post("/api/v1/rules", body, format="json").status_code == 201


def test_queue_crud_with_reviewers_and_durations(world):
    admin = world.a.client("admin")
    reviewer = world.a.users[Role.REVIEWER]
    named = [world.a.users[role].username for role in (Role.ADMIN, Role.OPERATOR, Role.REVIEWER)]  # 2 + four-eyes
    response = admin.post("/api/v1/queues", {"name": "payments", "reviewers": named,
                                             "required_approvals": 2, "four_eyes": True, "expires_after": 3600,
                                             "escalate_after": 600}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert sorted(body["reviewers"]) == sorted(named) and reviewer.username in body["reviewers"]
    assert (body["expires_after"], body["escalate_after"], body["required_approvals"]) == (3600, 600, 2)
    queue = Queue.objects.for_tenant(world.a.tenant).get(name="payments")
    assert queue.expires_after.total_seconds() == 3600 and queue.four_eyes
    assert admin.post("/api/v1/queues", {"name": "payments"}, format="json").status_code == 400
    assert admin.post("/api/v1/queues", {"name": "zero", "required_approvals": 0}, format="json").status_code == 400
    default = Queue.objects.for_tenant(world.a.tenant).get(is_default=True)
    assert admin.delete(f"/api/v1/queues/{default.pk}").status_code == 400
    assert admin.delete(f"/api/v1/queues/{queue.pk}").status_code == 204


def test_a_rolled_back_rule_change_never_decides_later_calls(world):
    """The compiled index is cached per (tenant, policy version). A rule change whose transaction rolls back
    must not leave its index behind under a version number that a later, committed change reuses."""
    tenant = world.a.tenant

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        rule_create(tenant=tenant, behavior="deny", tool_pattern="calculate")
        assert selectors.evaluate(tenant=tenant, tool_name="calculate", effective_input={}).behavior == "deny"
        raise Abort
    assert not PermissionRule.objects.for_tenant(tenant).exists()
    rule_create(tenant=tenant, behavior="ask", tool_pattern="todo_write")  # a committed change: version moves on
    decision = selectors.evaluate(tenant=tenant, tool_name="calculate", effective_input={})
    assert decision.behavior == "allow", decision  # the tenant default: the rolled-back deny is gone
