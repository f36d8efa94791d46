"""`/api/v1/mcp-servers`: CRUD for admin keys and operators (members read), credentials write-only, and
tenant B never reaching tenant A's servers. Syncing against live servers: test_mcp_servers_sync.py."""
import logging

import pytest
from rest_framework.test import APIClient

from audit.models import Event
from tools.models import McpServer, Tool
from tools.upstream.client import UpstreamTool
from tools.upstream.servers import mcp_server_create, mcp_tools_reconcile

pytestmark = pytest.mark.django_db

PUBLIC_URL = "https://93.184.215.14/mcp"
TOKEN = "Bearer ghp_api-5ecret-4e1b"  # noqa: S105
URL = "/api/v1/mcp-servers"


def console_api(world, role: str) -> APIClient:
    client = APIClient()
    client.force_login(world.a.users[role])
    client.credentials(HTTP_X_TENANT=world.a.tenant.slug)
    return client


def create(client, **fields):
    body = {"name": "github", "transport": "streamable_http", "url": PUBLIC_URL,
            "headers": {"Authorization": TOKEN, "X-Team": "core"}, **fields}
    return client.post(URL, body, format="json")


def test_crud_with_credentials_write_only(world, caplog):
    caplog.set_level(logging.DEBUG)
    client = world.a.client("admin")
    created = create(client, timeout_s=20, include=["search"], trusted=True)
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["header_names"] == ["Authorization", "X-Team"] and "headers" not in body
    assert body["env_names"] == [] and "env" not in body
    assert (body["name"], body["transport"], body["url"], body["timeout_s"], body["include"], body["trusted"]) == (
        "github", "streamable_http", PUBLIC_URL, 20.0, ["search"], True)
    assert (body["status"], body["last_error"], body["last_synced_at"], body["tools"]) == ("new", "", None, [])
    detail = f"{URL}/{body['id']}"

    patched = client.patch(detail, {"timeout_s": 5, "exclude": ["delete"]}, format="json")
    assert patched.status_code == 200 and patched.json()["header_names"] == ["Authorization", "X-Team"]
    put = client.put(detail, {"name": "github", "transport": "streamable_http", "url": PUBLIC_URL + "/v2"},
                     format="json")
    assert put.status_code == 200 and put.json()["header_names"] == ["Authorization", "X-Team"]  # kept
    assert put.json()["timeout_s"] == 5  # PUT leaves out what it does not send, like the credentials
    replaced = client.patch(detail, {"headers": {"Authorization": TOKEN + "-2"}}, format="json")
    assert replaced.json()["header_names"] == ["Authorization"]
    cleared = client.patch(detail, {"headers": {}}, format="json")
    assert cleared.json()["header_names"] == []

    answers = [created, patched, put, replaced, cleared, client.get(URL), client.get(detail)]
    assert client.delete(detail).status_code == 204
    assert not McpServer.objects.for_tenant(world.a.tenant).exists()
    for answer in answers:
        assert "ghp_api-5ecret" not in answer.content.decode()
    audit = Event.objects.for_tenant(world.a.tenant).filter(verb__startswith="mcp_server.")
    assert audit.count() == 6 and all(e.actor_label == "apikey:admin" for e in audit)
    assert "ghp_api-5ecret" not in repr(list(audit.values_list("data", flat=True)))
    assert "ghp_api-5ecret" not in client.get("/api/v1/audit").content.decode()
    assert "ghp_api-5ecret" not in caplog.text


def test_tools_are_listed_with_their_upstream_names(world):
    client = world.a.client("admin")
    server_id = create(client).json()["id"]
    server = McpServer.objects.for_tenant(world.a.tenant).get(pk=server_id)
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    search, get = UpstreamTool("search", "", schema), UpstreamTool("repo.get", "", schema)
    mcp_tools_reconcile(server=server, listed=[search, get])
    mcp_tools_reconcile(server=server, listed=[search])
    tools = client.get(f"{URL}/{server_id}").json()["tools"]
    gone = Tool.objects.for_tenant(world.a.tenant).get(source_ref="repo.get")
    assert tools == [
        {"id": gone.pk, "name": gone.name, "upstream_name": "repo.get", "enabled": False, "offered": False,
         "review": None},
        {"id": tools[1]["id"], "name": "mcp__github__search", "upstream_name": "search", "enabled": True,
         "offered": True, "review": None},
    ]
    assert client.get(URL).json()["results"][0]["tools"] == tools


@pytest.mark.parametrize(("body", "field"), [
    ({"url": "http://169.254.169.254/latest/"}, "url"),
    ({"url": "http://localhost:8080/mcp"}, "url"),
    ({"url": "http://10.0.0.1/mcp"}, "url"),
    ({"name": "Not_Valid"}, "name"),
    ({"transport": "stdio", "command": "/bin/sh", "url": "", "headers": {}}, "command"),
    ({"headers": {"Host": "evil"}}, "headers"),
    ({"headers": ["Authorization"]}, "headers"),
    ({"timeout_s": "30"}, "timeout_s"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"include": "search"}, "include"),
    ({"trusted": "true"}, "trusted"),
])
def test_bad_input_is_400_naming_the_field(world, body, field):
    response = create(world.a.client("admin"), **body)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"], response.json()
    assert "ghp_api-5ecret" not in response.content.decode()
    assert not McpServer.objects.for_tenant(world.a.tenant).exists()


def test_a_header_value_is_never_echoed_in_an_error(world):
    response = create(world.a.client("admin"), headers={"Authorization": TOKEN + "\n"})
    assert response.status_code == 400
    assert "ghp_api-5ecret" not in response.content.decode()


def test_a_duplicate_name_is_400_and_the_name_cannot_change(world):
    client = world.a.client("admin")
    server_id = create(client).json()["id"]
    assert create(client).status_code == 400
    renamed = client.patch(f"{URL}/{server_id}", {"name": "gitlab"}, format="json")
    assert renamed.status_code == 400 and "cannot change" in renamed.json()["error"]["fields"]["name"][0]


def test_members_read_and_operators_change(world):
    server_id = create(world.a.client("admin")).json()["id"]
    for role in ("viewer", "reviewer"):
        client = console_api(world, role)
        assert client.get(URL).status_code == 200
        assert client.get(f"{URL}/{server_id}").status_code == 200
        assert create(client, name="mine").status_code == 403
        assert client.patch(f"{URL}/{server_id}", {"timeout_s": 1}, format="json").status_code == 403
        assert client.post(f"{URL}/{server_id}/sync").status_code == 403
        assert client.post(f"{URL}/{server_id}/test").status_code == 403
        assert client.delete(f"{URL}/{server_id}").status_code == 403
    operator = console_api(world, "operator")
    assert create(operator, name="ops").status_code == 201
    assert operator.patch(f"{URL}/{server_id}", {"timeout_s": 1}, format="json").status_code == 200
    agent = world.a.client("agent")
    assert agent.get(URL).status_code == 403 and create(agent, name="agent").status_code == 403
    assert McpServer.objects.for_tenant(world.a.tenant).get(pk=server_id).timeout_s == 1


def test_another_tenant_cannot_see_or_touch_a_server(world):
    server = mcp_server_create(tenant=world.a.tenant, name="github", transport="streamable_http", url=PUBLIC_URL,
                               headers={"Authorization": TOKEN})
    b = world.b.client("admin")
    assert b.get(URL).json()["results"] == []
    detail = f"{URL}/{server.pk}"
    assert b.get(detail).status_code == 404
    assert b.patch(detail, {"timeout_s": 1}, format="json").status_code == 404
    assert b.put(detail, {"name": "github", "transport": "sse", "url": PUBLIC_URL}, format="json").status_code == 404
    assert b.post(f"{detail}/sync").status_code == 404
    assert b.post(f"{detail}/test").status_code == 404
    assert b.delete(detail).status_code == 404
    same = McpServer.objects.for_tenant(world.a.tenant).get(pk=server.pk)
    assert (same.timeout_s, same.transport, same.status) == (30, "streamable_http", "new")
    assert create(b).status_code == 201  # B has a server of the same name of its own


def test_a_disabled_server_is_not_synced(world):
    client = world.a.client("admin")
    server_id = create(client, enabled=False).json()["id"]
    response = client.post(f"{URL}/{server_id}/sync")
    assert response.status_code == 400 and "disabled" in response.json()["error"]["message"]
