"""A reviewer of tenant A sees nothing of tenant B in the governance API: lists, details, decisions, counts,
rules, queues, external results (docs/api.md: every object outside the key's tenant is a 404).

The console inbox side is covered by the inbox tests.
"""
import pytest

from approvals.models import ApprovalRequest, Queue, RequestStatus
from approvals.selectors import inbox_count, inbox_requests, pending_counts_by_queue
from approvals.services import queue_save, rule_create
from tenancy.models import Role
from tests.approvals.conftest import console_api
from tools.calls.submit import calls_submit
from tools.models import CallStatus


def ask_everything(tenant_world, count: int) -> list:
    tenant = tenant_world.tenant
    tenant.default_behavior = "ask"
    tenant.auto_allow_read_only = False
    tenant.save()
    calls = calls_submit(session=tenant_world.session, calls=[
        {"name": "calculate", "input": {"expression": f"{n} + {n}"}} for n in range(count)
    ])
    assert {c.status for c in calls} == {CallStatus.AWAITING_APPROVAL}
    return [ApprovalRequest.objects.for_tenant(tenant).get(call=c) for c in calls]


@pytest.fixture
def both(world):
    queue_save(tenant=world.b.tenant, name="secret-b-queue")
    return ask_everything(world.a, 3), ask_everything(world.b, 2)


def clients_of_a(world):
    """Every way a member of tenant A reaches the approvals API."""
    return {
        "reviewer": console_api(world.a.users[Role.REVIEWER], world.a.tenant),
        "admin-user": console_api(world.a.users[Role.ADMIN], world.a.tenant),
        "admin-key": world.a.client("admin"),
    }


def test_lists_and_counts_show_only_the_own_tenant(world, both):
    mine, theirs = both
    for label, client in clients_of_a(world).items():
        response = client.get("/api/v1/approvals")
        assert response.status_code == 200, (label, response.content)
        body = response.json()
        assert body["count"] == 3, label
        assert sorted(r["id"] for r in body["results"]) == sorted(r.pk for r in mine)
        text = response.content.decode()
        assert "globex" not in text and "secret-b-queue" not in text
        assert str(world.b.session.pk) not in text
        for query in ({"queue": "default"}, {"tool": "calculate"}, {"agent": "support-bot"}):
            filtered = client.get("/api/v1/approvals", query).json()
            assert {r["id"] for r in filtered["results"]} == {r.pk for r in mine}, (label, query)
        assert client.get("/api/v1/approvals", {"queue": "secret-b-queue"}).json()["count"] == 0
    assert inbox_count(tenant=world.a.tenant) == 3
    assert inbox_count(tenant=world.b.tenant) == 2
    assert inbox_requests(tenant=world.a.tenant).count() == 3
    assert pending_counts_by_queue(tenant=world.a.tenant) == {"default": 3}
    assert pending_counts_by_queue(tenant=world.b.tenant) == {"default": 2}


def test_other_tenants_requests_are_404_for_detail_and_decide(world, both):
    mine, theirs = both
    for label, client in clients_of_a(world).items():
        for request in theirs:
            detail = client.get(f"/api/v1/approvals/{request.pk}")
            assert detail.status_code == 404, (label, detail.status_code)
            assert detail.json()["error"]["code"] == "not_found"
            for decision in ("approve", "reject", "respond", "edit"):
                response = client.post(f"/api/v1/approvals/{request.pk}/decide",
                                       {"decision": decision, "message": "x", "input": {"expression": "1"}},
                                       format="json")
                assert response.status_code == 404, (label, decision, response.status_code, response.content)
        assert client.get(f"/api/v1/approvals/{mine[0].pk}").status_code == 200
    for request in theirs:
        request.refresh_from_db()
        assert request.status == RequestStatus.PENDING
        assert not request.votes.exists()


def test_a_member_of_a_cannot_name_tenant_b(world, both):
    client = console_api(world.a.users[Role.REVIEWER], world.b.tenant)
    for url in ("/api/v1/approvals", f"/api/v1/approvals/{both[1][0].pk}"):
        response = client.get(url)
        assert response.status_code == 403, (url, response.status_code)
        assert "globex" not in response.content.decode().replace("X-Tenant", "")
    response = client.post(f"/api/v1/approvals/{both[1][0].pk}/decide", {"decision": "approve"}, format="json")
    assert response.status_code == 403
    both[1][0].refresh_from_db()
    assert both[1][0].status == RequestStatus.PENDING


def test_decided_history_is_per_tenant(world, both):
    mine, theirs = both
    ApprovalRequest.objects.for_tenant(world.b.tenant).filter(pk=theirs[0].pk).update(status=RequestStatus.REJECTED)
    for client in clients_of_a(world).values():
        assert client.get("/api/v1/approvals", {"status": "rejected"}).json()["count"] == 0


def test_rules_and_queues_of_b_are_404(world, both):
    rule_b = rule_create(tenant=world.b.tenant, behavior="deny", tool_pattern="calculate", note="b-secret-note")
    queue_b = Queue.objects.for_tenant(world.b.tenant).get(name="secret-b-queue")
    admin = world.a.client("admin")
    listed = admin.get("/api/v1/rules").json()
    assert "b-secret-note" not in str(listed)
    assert admin.get(f"/api/v1/rules/{rule_b.pk}").status_code == 404
    assert admin.patch(f"/api/v1/rules/{rule_b.pk}", {"enabled": False}, format="json").status_code == 404
    assert admin.delete(f"/api/v1/rules/{rule_b.pk}").status_code == 404
    assert admin.get(f"/api/v1/queues/{queue_b.pk}").status_code == 404
    assert admin.delete(f"/api/v1/queues/{queue_b.pk}").status_code == 404
    assert "secret-b-queue" not in admin.get("/api/v1/queues").content.decode()
    # B's queue cannot be named by A's rule, B's members cannot review A's queue
    response = admin.post("/api/v1/rules", {"behavior": "ask", "tool_pattern": "calculate",
                                            "queue": "secret-b-queue"}, format="json")
    assert response.status_code == 400 and "queue" in response.json()["error"]["fields"]
    response = admin.post("/api/v1/queues", {"name": "mixed", "reviewers": [world.b.users[Role.REVIEWER].username]},
                          format="json")
    assert response.status_code == 400 and "reviewers" in response.json()["error"]["fields"]
    rule_b.refresh_from_db()
    assert rule_b.enabled
    # evaluate in A is not influenced by B's deny rule
    evaluated = admin.post("/api/v1/rules/evaluate", {"tool": "calculate", "input": {"expression": "1"}},
                           format="json").json()
    assert evaluated["rule"] != rule_b.pk


def test_external_result_and_events_of_b_are_404(world, both):
    call_b = both[1][0].call
    external = world.a.client("external")
    response = external.post(f"/api/v1/calls/{call_b.pk}/result", {"state": "success", "content": []}, format="json")
    assert response.status_code == 404
    assert world.a.client("agent").get(f"/api/v1/calls/{call_b.pk}/events").status_code == 404
    call_b.refresh_from_db()
    assert call_b.status == CallStatus.AWAITING_APPROVAL
