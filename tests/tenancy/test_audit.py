"""The audit log: hash-chained per tenant, tamper-evident, written for calls and admin changes."""
import pytest

from audit.models import AppendOnlyError, Event
from audit.selectors import audit_check
from audit.services import audit_record
from tools.calls.submit import call_cancel, calls_submit
from tools.catalog.services import session_create
from tools.models import BoundArgument, ToolGroup


def audit_verify(*, tenant) -> tuple[bool, int | None]:
    """(intact, id of the first bad entry)"""
    check = audit_check(tenant=tenant)
    return check.intact, check.entry


def test_chain_verifies(world):
    assert audit_verify(tenant=world.a.tenant) == (True, None)
    assert audit_verify(tenant=world.b.tenant) == (True, None)
    events = list(Event.objects.for_tenant(world.a.tenant).order_by("id"))
    assert events[0].prev_hash == ""
    assert all(later.prev_hash == earlier.hash for earlier, later in zip(events, events[1:], strict=False))


@pytest.mark.parametrize("change", [
    {"data": {"tampered": True}},
    {"verb": "tenant.deleted"},
    {"target": "tenant:someone-else"},
    {"actor_label": "mallory"},
])
def test_tampering_is_detected(world, change):
    events = list(Event.objects.for_tenant(world.a.tenant).order_by("id"))
    victim = events[len(events) // 2]
    Event.objects.for_tenant(world.a.tenant).filter(pk=victim.pk).update(**change)
    assert audit_verify(tenant=world.a.tenant) == (False, victim.pk)
    assert audit_verify(tenant=world.b.tenant) == (True, None)


def test_deleting_an_event_is_detected(world):
    events = list(Event.objects.for_tenant(world.a.tenant).order_by("id"))
    victim = events[2]
    Event.all_tenants.filter(pk=victim.pk)._raw_delete(Event.all_tenants.db)
    intact, broken = audit_verify(tenant=world.a.tenant)
    assert not intact and broken == events[3].pk


def test_events_are_append_only(world):
    event = Event.objects.for_tenant(world.a.tenant).first()
    event.verb = "changed"
    with pytest.raises(AppendOnlyError):
        event.save()
    with pytest.raises(AppendOnlyError):
        event.delete()


def test_chains_are_per_tenant(world):
    last_b = Event.objects.for_tenant(world.b.tenant).order_by("-id").first()
    new_a = audit_record(tenant=world.a.tenant, verb="test.event", target="x")
    assert new_a.prev_hash != last_b.hash
    assert audit_verify(tenant=world.a.tenant) == (True, None)


def test_calls_are_audited(world):
    session = session_create(tenant=world.a.tenant, agent="audited")
    [call] = calls_submit(session=session, calls=[{"name": "current_time", "input": {}}])
    events = Event.objects.for_tenant(world.a.tenant)
    assert events.filter(verb="session.created", target=f"session:{session.pk}").exists()
    received = events.get(verb="call.received", target=f"call:{call.pk}")
    assert received.data["tool"] == "current_time"
    call_cancel(call=call, actor="apikey:agent")
    assert events.filter(verb="call.cancelled", target=f"call:{call.pk}").exists()
    assert audit_verify(tenant=world.a.tenant) == (True, None)
    assert not Event.objects.for_tenant(world.b.tenant).filter(target=f"call:{call.pk}").exists()


def test_group_create_via_api_is_audited(world):
    client = world.a.client("admin")
    response = client.post("/api/v1/groups", {"name": "research", "description": "Look things up.",
                                              "tools": ["calculate"]}, format="json")
    assert response.status_code == 201, response.content
    event = Event.objects.for_tenant(world.a.tenant).get(verb="group.created", target="group:research")
    assert event.actor_label == "apikey:admin"
    assert event.data == {"tools": ["calculate"]}
    listed = client.get("/api/v1/audit", {"target": "group:research"}).json()["results"]
    assert [e["verb"] for e in listed] == ["group.created"]
    assert ToolGroup.objects.for_tenant(world.a.tenant).filter(name="research").exists()


def test_binding_set_via_api_is_audited_without_the_value(world):
    client = world.a.client("admin")
    response = client.post("/api/v1/bindings", {"tool": "calculate", "name": "expression",
                                                "value": "s3cr3t-value", "agent": ""}, format="json")
    assert response.status_code == 201, response.content
    binding = BoundArgument.objects.for_tenant(world.a.tenant).get(pk=response.json()["id"])
    assert binding.value == "s3cr3t-value"
    event = Event.objects.for_tenant(world.a.tenant).get(verb="binding.set", target="tool:calculate")
    assert event.actor_label == "apikey:admin"
    assert event.data == {"name": "expression", "agent": ""}
    assert "s3cr3t-value" not in str(event.data)
    assert audit_verify(tenant=world.a.tenant) == (True, None)


def test_binding_update_and_delete_via_api_are_audited(world):
    client = world.a.client("admin")
    url = f"/api/v1/bindings/{world.a.binding.pk}"
    patched = client.patch(url, {"value": "Europe/Paris"}, format="json")
    assert patched.status_code == 200, patched.content
    assert patched.json()["value"] == "Europe/Paris"
    assert client.delete(url).status_code == 204
    verbs = list(Event.objects.for_tenant(world.a.tenant).filter(target="tool:current_time")
                 .order_by("id").values_list("verb", flat=True))
    assert verbs[-2:] == ["binding.set", "binding.deleted"]


def test_tool_update_via_api_is_audited(world):
    tool = world.a.tools["calculate"]
    response = world.a.client("admin").patch(f"/api/v1/tools/{tool.pk}", {"enabled": False}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["enabled"] is False
    event = Event.objects.for_tenant(world.a.tenant).get(verb="tool.updated", target="tool:calculate")
    assert event.data == {"enabled": False}
    refused = world.a.client("admin").patch(f"/api/v1/tools/{tool.pk}", {"name": "renamed"}, format="json")
    assert refused.status_code in (200, 400)
    tool.refresh_from_db()
    assert tool.name == "calculate"  # read-only through the API


def test_audit_list_shows_only_own_events(world):
    listed = world.a.client("admin").get("/api/v1/audit", {"limit": 500}).json()["results"]
    own = set(Event.objects.for_tenant(world.a.tenant).values_list("pk", flat=True))
    assert {e["id"] for e in listed} <= own
    assert len(listed) == len(own)
