"""Admin endpoints for tools, groups and bindings (admin scope, or a console login with a role)."""
from rest_framework.test import APIClient

from tools.models import BoundArgument, ToolGroup


def test_group_crud(world):
    client = world.a.client("admin")
    created = client.post("/api/v1/groups", {"name": "research", "description": "Find things.", "notes": "Cite.",
                                             "tools": ["calculate", "current_time"]}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert sorted(body["tools"]) == ["calculate", "current_time"]
    assert body["switchable"] is True
    url = f"/api/v1/groups/{body['id']}"
    assert client.get(url).json()["notes"] == "Cite."
    patched = client.patch(url, {"notes": "Always cite.", "tools": ["calculate"]}, format="json")
    assert patched.status_code == 200
    assert patched.json()["tools"] == ["calculate"]
    assert client.delete(url).status_code == 204
    assert not ToolGroup.objects.for_tenant(world.a.tenant).filter(name="research").exists()


def test_group_bad_input(world):
    client = world.a.client("admin")
    assert client.post("/api/v1/groups", {"name": "math"}, format="json").status_code == 400
    assert client.post("/api/v1/groups", {"name": "x", "tools": ["nope"]}, format="json").status_code == 400
    assert client.post("/api/v1/groups", {"name": "has space"}, format="json").status_code == 400
    basic = world.a.groups["basic"]
    assert client.delete(f"/api/v1/groups/{basic.pk}").status_code == 400
    assert client.patch(f"/api/v1/groups/{basic.pk}", {"switchable": True}, format="json").status_code == 400
    assert ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").switchable is False


def test_binding_crud(world):
    client = world.a.client("admin")
    created = client.post("/api/v1/bindings", {"tool": "calculate", "name": "expression", "value": "1+1",
                                               "agent": "calc-bot"}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["tool"] == "calculate" and body["agent"] == "calc-bot" and body["value"] == "1+1"
    listed = client.get("/api/v1/bindings", {"tool": "calculate"}).json()["results"]
    assert [b["id"] for b in listed] == [body["id"]]
    assert client.get("/api/v1/bindings", {"agent": "calc-bot"}).json()["count"] == 1
    url = f"/api/v1/bindings/{body['id']}"
    assert client.patch(url, {"value": "2+2"}, format="json").json()["value"] == "2+2"
    assert client.delete(url).status_code == 204
    assert not BoundArgument.objects.for_tenant(world.a.tenant).filter(pk=body["id"]).exists()


def test_binding_of_an_unknown_argument_is_400(world):
    response = world.a.client("admin").post("/api/v1/bindings", {"tool": "calculate", "name": "nope", "value": 1},
                                            format="json")
    assert response.status_code == 400
    assert "name" in response.json()["error"]["fields"]


def test_binding_set_twice_updates(world):
    client = world.a.client("admin")
    body = {"tool": "current_time", "name": "timezone", "value": "Europe/Berlin", "agent": "support-bot"}
    response = client.post("/api/v1/bindings", body, format="json")
    assert response.status_code in (200, 201, 400), response.content
    assert BoundArgument.objects.for_tenant(world.a.tenant).filter(tool__name="current_time",
                                                                   agent="support-bot").count() == 1


def test_tool_admin(world):
    client = world.a.client("admin")
    listed = client.get("/api/v1/tools", {"limit": 500}).json()["results"]
    assert {t["name"] for t in listed} == set(world.a.tools)
    tool = world.a.tools["calculate"]
    response = client.patch(f"/api/v1/tools/{tool.pk}", {"timeout_s": 2}, format="json")
    assert response.status_code == 200 and response.json()["timeout_s"] == 2
    assert client.delete(f"/api/v1/tools/{tool.pk}").status_code == 405


def _console(world, role):
    client = APIClient()
    client.force_login(world.a.users[role])
    client.credentials(HTTP_X_TENANT=world.a.tenant.slug)
    return client


def test_console_roles_on_the_admin_api(world):
    for role in ("admin", "operator", "reviewer", "viewer"):
        assert _console(world, role).get("/api/v1/groups").status_code == 200, role
    assert _console(world, "operator").post("/api/v1/groups", {"name": "ops2"}, format="json").status_code == 201
    for role in ("reviewer", "viewer"):
        response = _console(world, role).post("/api/v1/groups", {"name": f"by-{role}"}, format="json")
        assert response.status_code == 403, role
    assert _console(world, "viewer").post("/api/v1/sessions", {"agent": "x"}, format="json").status_code == 403


def test_tool_timeout_must_be_positive(world):
    client = world.a.client("admin")
    tool = world.a.tools["calculate"]
    for bad in (-5, 0, "soon"):
        response = client.patch(f"/api/v1/tools/{tool.pk}", {"timeout_s": bad}, format="json")
        assert response.status_code == 400, (bad, response.content)
        assert "timeout_s" in response.json()["error"]["fields"]
    tool.refresh_from_db()
    assert tool.timeout_s == 5
