"""Registering an MCP server (tools.upstream.servers): what a tenant may not point it at, the stdio allow-list, and
credentials that are written, used and never shown back — not in errors, the audit trail or the log."""
import hashlib
import logging
import socket

import pytest
from django.db import connection
from django.test import override_settings

from audit.models import Event
from common.errors import ServiceError
from common.secrets import SecretUnreadable
from tools.models import McpServer, McpStatus, Tool
from tools.upstream import servers as mcp_servers
from tools.upstream.client import UpstreamTool, UpstreamUnavailable
from tools.upstream.definitions import tool_flags
from tools.upstream.servers import mcp_server_create, mcp_server_delete, mcp_server_sync, mcp_server_update

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _listed_without_prompts(monkeypatch):
    """The servers of these tests are never reached (their listings are given): they offer no prompts."""
    monkeypatch.setattr(mcp_servers.mcp_client, "mcp_list_prompts", lambda endpoint: None)

PUBLIC_URL = "https://93.184.215.14/mcp"  # a literal public address: checked without a lookup, never reached
TOKEN = "Bearer ghp_5ecret-T0ken-9d2f"  # noqa: S105
ENV_SECRET = "sk-env-5ecret-77aa"  # noqa: S105
STDIO = {
    "files": {"command": "/usr/bin/env", "args": ["mcp-files"], "env": {"ROOT": "/srv"}, "tenant_env": ["API_TOKEN"]},
    "clock": {"command": "/usr/bin/env", "args": ["mcp-clock"]},
}


@pytest.fixture
def resolver(monkeypatch):
    """Names of this test resolved to the addresses given (`resolver["a.test"] = ["127.0.0.1"]`)."""
    real, names = socket.getaddrinfo, {}

    def getaddrinfo(host, port, *args, **kwargs):
        key = host.decode() if isinstance(host, bytes) else host
        if key not in names:
            return real(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port or 0)) for a in names[key]]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return names


def refused(field: str, **fields) -> str:
    with pytest.raises(ServiceError) as caught:
        mcp_server_create(**fields)
    assert field in caught.value.fields, caught.value.detail
    return " ".join(caught.value.fields[field])


def http(tenant, **fields) -> dict:
    return {"tenant": tenant, "name": "github", "transport": "streamable_http", "url": PUBLIC_URL, **fields}


# --- where it may point --------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "kind"), [
    ("http://127.0.0.1:8000/mcp", "is a loopback address"),
    ("http://[::1]/mcp", "is a loopback address"),
    ("http://localhost:3000/mcp", "is a loopback address"),
    ("http://api.localhost/mcp", "is a loopback address"),
    ("http://10.1.2.3/mcp", "is a private address"),
    ("http://192.168.0.10/mcp", "is a private address"),
    ("http://169.254.169.254/latest/meta-data/", "is a cloud metadata address"),
    ("http://[fd00:ec2::254]/", "is a cloud metadata address"),
    ("http://[::ffff:127.0.0.1]/mcp", "is a loopback address"),
    ("ftp://93.184.215.14/mcp", "only http and https"),
    ("https://user:pw@93.184.215.14/mcp", "user name or password"),
    ("not a url", "only http and https"),
])
def test_internal_addresses_are_refused(world, url, kind):
    assert kind in refused("url", **http(world.a.tenant, url=url))
    assert not McpServer.objects.for_tenant(world.a.tenant).exists()


def test_a_name_resolving_to_loopback_is_refused(world, resolver):
    resolver["evil.test"] = ["127.0.0.1"]
    resolver["meta.test"] = ["169.254.169.254"]
    resolver["mixed.test"] = ["93.184.215.14", "10.0.0.7"]
    assert "evil.test resolves to a loopback address" in refused(
        "url", **http(world.a.tenant, url="http://evil.test:8000/mcp"))
    assert "resolves to a cloud metadata address" in refused("url", **http(world.a.tenant, url="http://meta.test/"))
    assert "resolves to a private address" in refused("url", **http(world.a.tenant, url="http://mixed.test/"))


def test_a_name_resolving_to_public_addresses_is_accepted(world, resolver):
    resolver["mcp.example.test"] = ["93.184.215.14"]
    server = mcp_server_create(**http(world.a.tenant, url="https://mcp.example.test/mcp"))
    assert server.url == "https://mcp.example.test/mcp" and server.status == McpStatus.NEW


def test_the_admins_allow_list_opens_an_internal_server(world):
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["127.0.0.1"]):
        server = mcp_server_create(**http(world.a.tenant, url="http://127.0.0.1:9999/mcp"))
    assert server.url == "http://127.0.0.1:9999/mcp"
    # once closed, an edit is refused
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=[]), pytest.raises(ServiceError) as caught:
        mcp_server_update(server=server, url="http://127.0.0.1:9998/mcp")
    assert "loopback" in caught.value.message


# --- stdio: only what the platform admin allows -------------------------------------------------

@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=STDIO)
def test_a_stdio_server_is_named_from_the_allow_list(world):
    server = mcp_server_create(tenant=world.a.tenant, name="files", transport="stdio", command="files",
                               env={"API_TOKEN": ENV_SECRET})
    assert (server.command, dict(server.env)) == ("files", {"API_TOKEN": ENV_SECRET})
    for command in ("/bin/sh", "bash -c 'id'", "python", "files ", "FILES", "", "../files"):
        message = refused("command", tenant=world.a.tenant, name="x", transport="stdio", command=command)
        assert "not an allowed stdio server" in message and "clock, files" in message


def test_without_an_allow_list_no_stdio_server_can_be_added(world):
    with override_settings(TOOLKEEPER_MCP_STDIO_SERVERS={}):
        message = refused("command", tenant=world.a.tenant, name="x", transport="stdio", command="files")
    assert "none are configured" in message


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=STDIO)
def test_only_the_environment_the_entry_lets_tenants_set(world):
    tenant = world.a.tenant
    for env in ({"PATH": "/tmp"}, {"LD_PRELOAD": "/tmp/x.so"}, {"ROOT": "/"}, {"API_TOKEN": ENV_SECRET, "HOME": "/"}):
        message = refused("env", tenant=tenant, name="files", transport="stdio", command="files", env=env)
        assert "lets tenants set" in message and ENV_SECRET not in message
    assert "lets tenants set" in refused("env", tenant=tenant, name="clock", transport="stdio", command="clock",
                                         env={"API_TOKEN": "x"})
    assert "text" in refused("env", tenant=tenant, name="files", transport="stdio", command="files",
                             env={"API_TOKEN": 42})


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=STDIO)
def test_each_transport_takes_only_its_own_fields(world):
    tenant = world.a.tenant
    stdio = {"tenant": tenant, "name": "files", "transport": "stdio", "command": "files"}
    assert "no URL" in refused("url", **stdio, url=PUBLIC_URL)
    assert "no headers" in refused("headers", **stdio, headers={"Authorization": TOKEN})
    assert "names a command" in refused("command", **http(tenant, command="files"))
    assert "environment" in refused("env", **http(tenant, env={"API_TOKEN": "x"}))
    assert "needs its URL" in refused("url", **http(tenant, url=""))
    assert "one of" in refused("transport", **http(tenant, transport="websocket"))


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=STDIO)
def test_changing_the_transport_drops_the_other_transports_fields(world):
    server = mcp_server_create(**http(world.a.tenant, headers={"Authorization": TOKEN}))
    mcp_server_update(server=server, transport="stdio", command="clock")
    server = McpServer.objects.for_tenant(world.a.tenant).get(pk=server.pk)
    assert (server.transport, server.url, server.headers, server.command) == ("stdio", "", None, "clock")


# --- the rest of the fields --------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value", "message"), [
    ("name", "GitHub", "lowercase"),
    ("name", "git_hub", "lowercase"),  # no underscore: `__` separates the server from the tool
    ("name", "-github", "starting and ending"),
    ("name", "a" * 25, "1-24"),
    ("name", "", "1-24"),
    ("name", "github\n", "1-24"),
    ("timeout_s", 0, "between 0.1 and 3600"),
    ("timeout_s", 3601, "between 0.1 and 3600"),
    ("timeout_s", True, "between 0.1 and 3600"),
    ("timeout_s", "30", "between 0.1 and 3600"),
    ("include", "search", "a list"),
    ("include", [1], "a list"),
    ("exclude", ["x" * 256], "a list"),
    ("exclude", ["n"] * 501, "a list"),
    ("trusted", "yes", "true or false"),
    ("enabled", 1, "true or false"),
])
def test_other_fields_are_checked(world, field, value, message):
    assert message in refused(field, **http(world.a.tenant, **{field: value}))


def test_names_are_unique_in_a_tenant_and_fixed(world):
    server = mcp_server_create(**http(world.a.tenant))
    assert "exists" in refused("name", **http(world.a.tenant))
    mcp_server_create(**http(world.b.tenant))  # another tenant may use it
    with pytest.raises(ServiceError) as caught:
        mcp_server_update(server=server, name="gitlab")
    assert "cannot change" in caught.value.message
    with pytest.raises(ServiceError):
        mcp_server_create(**http(world.a.tenant, name="other", colour="blue"))


# --- credentials -------------------------------------------------------------------------------

@pytest.mark.parametrize(("headers", "message"), [
    ({"Host": "internal"}, "set by the connection"),
    ({"content-length": "0"}, "set by the connection"),
    ({"Transfer-Encoding": "chunked"}, "set by the connection"),
    ({"Connection": "close"}, "set by the connection"),
    ({"Proxy-Authorization": TOKEN}, "set by the connection"),
    ({"Mcp-Session-Id": "abc"}, "set by the connection"),
    ({"Bad Name": "x"}, "is not a header name"),
    ({"X:Y": "x"}, "is not a header name"),
    ({"Authorization": TOKEN + "\r\nX-Injected: 1"}, "without line breaks"),
    ({"Authorization": TOKEN + "\x00"}, "without line breaks"),
    ({"Authorization": 42}, "must be a string"),
    ({"Authorization": TOKEN, "authorization": TOKEN}, "given twice"),
    ({f"X-{n}": "v" for n in range(33)}, "at most 32"),
    ("Authorization: x", "JSON object"),
])
def test_headers_are_checked_without_echoing_a_value(world, headers, message):
    text = refused("headers", **http(world.a.tenant, headers=headers))
    assert message in text and "ghp_5ecret" not in text


def test_credentials_are_encrypted_at_rest(world):
    server = mcp_server_create(**http(world.a.tenant, headers={"Authorization": TOKEN}))
    with connection.cursor() as cursor:
        cursor.execute("SELECT headers FROM tools_mcpserver WHERE id = %s", [server.pk])
        (stored,) = cursor.fetchone()
    assert "ghp_5ecret" not in stored and "Authorization" not in stored
    assert dict(McpServer.objects.for_tenant(world.a.tenant).get(pk=server.pk).headers) == {"Authorization": TOKEN}
    assert "ghp_5ecret" not in repr(server.headers)


def test_an_update_without_headers_keeps_them_and_an_empty_object_clears_them(world):
    server = mcp_server_create(**http(world.a.tenant, headers={"Authorization": TOKEN}))
    mcp_server_update(server=server, timeout_s=10, url=PUBLIC_URL + "/v2")  # the same host: kept
    assert dict(McpServer.objects.for_tenant(world.a.tenant).get(pk=server.pk).headers) == {"Authorization": TOKEN}
    mcp_server_update(server=server, headers={"X-Team": "core"})
    assert dict(McpServer.objects.for_tenant(world.a.tenant).get(pk=server.pk).headers) == {"X-Team": "core"}
    mcp_server_update(server=server, headers={})
    assert McpServer.objects.for_tenant(world.a.tenant).get(pk=server.pk).headers is None


def test_stored_headers_never_follow_the_url_to_another_host(world):
    server = mcp_server_create(**http(world.a.tenant, headers={"Authorization": TOKEN}))
    for url in ("https://93.184.215.15/mcp", "http://93.184.215.14/mcp", "https://93.184.215.14:8443/mcp"):
        with pytest.raises(ServiceError) as caught:
            mcp_server_update(server=server, url=url)
        assert "send the headers again" in " ".join(caught.value.fields["headers"])
    assert McpServer.objects.for_tenant(world.a.tenant).get(pk=server.pk).url == PUBLIC_URL
    mcp_server_update(server=server, url="https://93.184.215.15/mcp", headers={"Authorization": TOKEN + "-new"})
    mcp_server_update(server=server, url="https://93.184.215.16/mcp", headers={})


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS={**STDIO, "files2": STDIO["files"]})
def test_stored_environment_never_follows_another_command(world):
    server = mcp_server_create(tenant=world.a.tenant, name="files", transport="stdio", command="files",
                               env={"API_TOKEN": ENV_SECRET})
    with pytest.raises(ServiceError) as caught:
        mcp_server_update(server=server, command="files2")
    assert "send the environment again" in caught.value.message
    mcp_server_update(server=server, command="files2", env={"API_TOKEN": "other"})


def test_changes_are_audited_by_name_never_by_value(world, caplog):
    caplog.set_level(logging.DEBUG)
    admin = world.a.users["admin"]
    server = mcp_server_create(**http(world.a.tenant, headers={"Authorization": TOKEN}), actor=admin)
    mcp_server_update(server=server, headers={"Authorization": TOKEN + "2", "X-Team": "core"}, actor=admin)
    mcp_server_update(server=server, timeout_s=5, actor=admin)
    mcp_server_delete(server=server, actor=admin)
    events = list(Event.objects.for_tenant(world.a.tenant).filter(target="mcp_server:github").order_by("id"))
    assert [e.verb for e in events] == ["mcp_server.created", "mcp_server.updated", "mcp_server.updated",
                                        "mcp_server.deleted"]
    assert events[0].data["header_names"] == ["Authorization"]
    assert events[1].data["fields"] == ["headers"] and events[1].data["header_names"] == ["Authorization", "X-Team"]
    assert events[2].data["fields"] == ["timeout_s"]
    assert all(e.actor_label == admin.username for e in events)
    assert "ghp_5ecret" not in repr([e.data for e in events])
    assert "ghp_5ecret" not in caplog.text


def test_an_update_that_changes_nothing_records_nothing(world):
    server = mcp_server_create(**http(world.a.tenant, headers={"Authorization": TOKEN}))
    before = Event.objects.for_tenant(world.a.tenant).count()
    mcp_server_update(server=server, url=PUBLIC_URL, headers={"Authorization": TOKEN}, timeout_s=30)
    assert Event.objects.for_tenant(world.a.tenant).count() == before


def test_a_new_connection_forgets_the_last_status(world):
    server = mcp_server_create(**http(world.a.tenant))
    McpServer.objects.for_tenant(world.a.tenant).filter(pk=server.pk).update(status=McpStatus.ERROR,
                                                                             last_error="refused")
    server.refresh_from_db()
    mcp_server_update(server=server, url=PUBLIC_URL + "/v2")
    server.refresh_from_db()
    assert (server.status, server.last_error) == (McpStatus.NEW, "")


def test_a_disabled_server_cannot_be_synced(world):
    server = mcp_server_create(**http(world.a.tenant, enabled=False))
    with pytest.raises(ServiceError, match="disabled"):
        mcp_server_sync(server=server)


def test_an_upstream_failure_is_told_in_one_plain_line_without_stored_secrets(world):
    server = mcp_server_create(**http(world.a.tenant, headers={"Authorization": TOKEN}))
    text = mcp_servers._upstream_failure(
        UpstreamUnavailable(f"401 from upstream\nit said: {TOKEN}\x00 \ud800 " + "x" * 600), server)
    assert "ghp_5ecret" not in text and "[hidden]" in text
    assert "\n" not in text and "\x00" not in text and "\ud800" not in text and len(text) == 500
    assert mcp_servers._upstream_failure(RuntimeError(TOKEN), server) == mcp_servers.UNEXPECTED


def test_an_upstream_failure_is_told_in_exact_words(world):
    server = mcp_server_create(**http(world.a.tenant, headers={"Authorization": TOKEN, "X-Short": "abcd",
                                                                   "X-Shorter": "xyz"}))
    told = mcp_servers._upstream_failure
    assert told(SecretUnreadable("x"), server) == ("the stored credentials cannot be read with the platform's keys; "
                                                   "enter them again")
    assert told(UpstreamUnavailable(""), server) == "the server could not be reached"
    assert told(UpstreamUnavailable(" \x00\n"), server) == "the server could not be reached"
    assert told(UpstreamUnavailable(f"refused\x00{TOKEN}\tabcd xyz"), server) == "refused [hidden] [hidden] xyz"
    exactly_max = "e" * mcp_servers.ERROR_MAX
    assert told(UpstreamUnavailable(exactly_max), server) == exactly_max  # cut only past the bound
    assert told(UpstreamUnavailable(exactly_max + "f"), server) == "e" * (mcp_servers.ERROR_MAX - 1) + "…"
    # a value that is no text (none is stored so, but nothing assumes it) is not looked for
    assert told(UpstreamUnavailable("down 1234"), McpServer(headers={"X-Number": 1234})) == "down 1234"


def test_an_unexpected_failure_is_logged_with_the_server_and_the_kind_of_error(world, caplog):
    server = mcp_server_create(**http(world.a.tenant, headers={"Authorization": TOKEN}))
    with caplog.at_level(logging.ERROR, logger="tools.upstream.servers"):
        assert mcp_servers._upstream_failure(RuntimeError(f"bad {TOKEN}"), server) == mcp_servers.UNEXPECTED
        assert mcp_servers._upstream_failure(KeyError(), server) == mcp_servers.UNEXPECTED
    assert [r.getMessage() for r in caplog.records] == [
        f"MCP server {server.pk} of tenant {world.a.tenant.pk}: unexpected failure RuntimeError: bad [hidden]",
        f"MCP server {server.pk} of tenant {world.a.tenant.pk}: unexpected failure KeyError: "]


def test_a_connection_test_is_audited_with_its_outcome(world, monkeypatch):
    server = mcp_server_create(**http(world.a.tenant))
    admin = world.a.users["admin"]
    monkeypatch.setattr(mcp_servers.mcp_client, "mcp_probe", lambda endpoint: ["not", "an", "object"])
    assert mcp_servers.mcp_server_probe(server=server, actor=admin) == {"ok": True, "info": {}}
    monkeypatch.setattr(mcp_servers.mcp_client, "mcp_probe", lambda endpoint: {"name": "upstream"})
    assert mcp_servers.mcp_server_probe(server=server, actor=admin) == {"ok": True, "info": {"name": "upstream"}}

    def unreachable(endpoint):
        raise UpstreamUnavailable("connection refused")

    monkeypatch.setattr(mcp_servers.mcp_client, "mcp_probe", unreachable)
    with pytest.raises(ServiceError) as refused:
        mcp_servers.mcp_server_probe(server=server, actor=admin)
    assert str(refused.value) == "the connection test failed: connection refused"
    events = Event.objects.for_tenant(world.a.tenant).filter(verb="mcp_server.tested").order_by("pk")
    assert [(e.actor, e.target, e.data) for e in events] == [
        (admin, "mcp_server:github", {"ok": True}), (admin, "mcp_server:github", {"ok": True}),
        (admin, "mcp_server:github", {"ok": False, "error": "connection refused"})]
    server.enabled = False
    with pytest.raises(ServiceError) as refused:
        mcp_servers.mcp_server_probe(server=server, actor=admin)
    assert str(refused.value) == "the server is disabled: enable it to test the connection"


def test_the_origin_of_what_is_no_url_is_empty():
    assert mcp_servers._origin("") == mcp_servers._origin(None) == mcp_servers._origin("files") == ""
    assert mcp_servers._origin("HTTPS://Example.COM:8443/mcp?x=1") == "https://example.com:8443"


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=STDIO)
def test_the_environment_s_refusals_in_exact_words(world):
    stdio = {"tenant": world.a.tenant, "name": "files", "transport": "stdio", "command": "files"}
    assert refused("env", **stdio, env="API_TOKEN=x") == "a JSON object of environment variable names and values"
    assert refused("env", **stdio, env={"HOME": "/"}) == ("HOME is not a variable files lets tenants set "
                                                          "(allowed: API_TOKEN)")
    longest = "v" * mcp_servers.ENV_VALUE_MAX
    assert mcp_server_create(**stdio, env={"API_TOKEN": longest}).env == {"API_TOKEN": longest}
    assert refused("env", **{**stdio, "name": "files2"}, env={"API_TOKEN": longest + "v"}) == (
        f"the value of API_TOKEN must be text of at most {mcp_servers.ENV_VALUE_MAX} characters")


def test_a_disabled_server_is_not_synced_and_says_so(world):
    server = mcp_server_create(**http(world.a.tenant, enabled=False))
    with pytest.raises(ServiceError) as refused_sync:
        mcp_server_sync(server=server)
    assert str(refused_sync.value) == "the server is disabled: enable it to sync its tools"


def test_a_failed_sync_is_answered_recorded_audited_and_logged(world, monkeypatch, caplog):
    server = mcp_server_create(**http(world.a.tenant))

    def unreachable(endpoint):
        raise UpstreamUnavailable("connection refused")

    monkeypatch.setattr(mcp_servers.mcp_client, "mcp_list_tools", unreachable)
    with caplog.at_level(logging.INFO, logger="tools.upstream.servers"):
        answer = mcp_server_sync(server=server, actor=world.a.users["admin"])
    assert answer == {"status": McpStatus.ERROR, "error": "connection refused", "added": 0, "updated": 0,
                      "disabled": 0, "held": 0, "skipped": [],
                      "prompts": {"added": 0, "updated": 0, "removed": 0, "skipped": []}}
    event = Event.objects.for_tenant(world.a.tenant).get(verb="mcp_server.synced")
    assert (event.actor, event.target, event.data) == (world.a.users["admin"], "mcp_server:github",
                                                       {"status": "error", "error": "connection refused"})
    assert f"MCP server {server.pk} of tenant {world.a.tenant.pk} not synced: connection refused" in [
        r.getMessage() for r in caplog.records]


def test_a_sync_after_a_failure_clears_the_error_and_stamps_the_time(world, monkeypatch):
    server = mcp_server_create(**http(world.a.tenant))
    McpServer.objects.for_tenant(world.a.tenant).filter(pk=server.pk).update(status=McpStatus.ERROR,
                                                                             last_error="connection refused")
    monkeypatch.setattr(mcp_servers.mcp_client, "mcp_list_tools", lambda endpoint: [])
    assert mcp_server_sync(server=server)["status"] == McpStatus.OK
    stored = McpServer.objects.for_tenant(world.a.tenant).get(pk=server.pk)
    assert (stored.status, stored.last_error) == (McpStatus.OK, "")
    assert stored.last_synced_at is not None and stored.last_synced_at == server.last_synced_at


def test_a_sync_is_audited_with_its_counts_and_the_first_skipped_names(world, monkeypatch):
    admin = world.a.users["admin"]
    server = mcp_server_create(**http(world.a.tenant))
    schema = {"type": "object"}
    monkeypatch.setattr(mcp_servers.mcp_client, "mcp_list_tools", lambda endpoint: [
        UpstreamTool("search", "Search", schema), UpstreamTool("fetch", "Fetch", schema)])
    mcp_server_sync(server=server, actor=admin)
    twice = [UpstreamTool("dup", "listed again and again", schema)] * (mcp_servers.SKIPPED_IN_AUDIT + 2)
    monkeypatch.setattr(mcp_servers.mcp_client, "mcp_list_tools", lambda endpoint: [
        UpstreamTool("search", "Search, better", schema), *twice])
    answer = mcp_server_sync(server=server, actor=admin)
    # after the first sync, a changed definition and a new tool both wait for review (docs/mcp.md)
    assert (answer["added"], answer["updated"], answer["disabled"], answer["held"]) == (1, 0, 1, 2)
    assert len(answer["skipped"]) == mcp_servers.SKIPPED_IN_AUDIT + 1  # the first "dup" was added
    events = list(Event.objects.for_tenant(world.a.tenant).filter(verb="mcp_server.synced").order_by("id"))
    assert [(e.actor, e.target) for e in events] == [(admin, "mcp_server:github")] * 2
    no_prompts = {"added": 0, "updated": 0, "removed": 0, "skipped": []}
    assert events[0].data == {"status": "ok", "added": 2, "updated": 0, "disabled": 0, "held": 0, "skipped": [],
                              "prompts": no_prompts}
    assert events[1].data == {"status": "ok", "added": 1, "updated": 0, "disabled": 1, "held": 2,
                              "skipped": ["dup"] * mcp_servers.SKIPPED_IN_AUDIT, "prompts": no_prompts}


def test_a_sync_after_a_failure_clears_the_error_on_the_instance_too(world, monkeypatch):
    server = mcp_server_create(**http(world.a.tenant))

    def unreachable(endpoint):
        raise UpstreamUnavailable("connection refused")

    monkeypatch.setattr(mcp_servers.mcp_client, "mcp_list_tools", unreachable)
    mcp_server_sync(server=server)
    assert (server.status, server.last_error) == (McpStatus.ERROR, "connection refused")
    monkeypatch.setattr(mcp_servers.mcp_client, "mcp_list_tools", lambda endpoint: [])
    mcp_server_sync(server=server)
    assert (server.status, server.last_error) == (McpStatus.OK, "")


@pytest.mark.parametrize("allow_list", ["absent", ["files"], "files"])
def test_an_allow_list_that_is_absent_or_no_mapping_allows_nothing(world, settings, allow_list):
    if allow_list == "absent":
        del settings.TOOLKEEPER_MCP_STDIO_SERVERS
    else:
        settings.TOOLKEEPER_MCP_STDIO_SERVERS = allow_list
    assert mcp_servers.stdio_servers() == {}
    assert refused("command", tenant=world.a.tenant, name="files", transport="stdio", command="files") == (
        "not an allowed stdio server (the platform allows: none are configured)")


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS={"bare": "/usr/bin/env", "nameless": {"args": ["x"]},
                                                 "numbered": {"command": 7}})
def test_an_allow_list_entry_without_a_command_allows_nothing(world):
    for command in ("bare", "nameless", "numbered"):
        assert refused("command", tenant=world.a.tenant, name="x", transport="stdio", command=command) == (
            "not an allowed stdio server (the platform allows: bare, nameless, numbered)")


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=STDIO)
@pytest.mark.parametrize("command", [["files"], {"files": 1}, 7, None])
def test_a_command_that_is_no_text_is_refused_by_field(world, command):
    assert refused("command", tenant=world.a.tenant, name="x", transport="stdio", command=command) == (
        "not an allowed stdio server (the platform allows: clock, files)")


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=STDIO)
def test_each_transport_s_refusals_in_exact_words(world):
    stdio = {"tenant": world.a.tenant, "name": "files", "transport": "stdio", "command": "files"}
    assert refused("url", **stdio, url=PUBLIC_URL) == "a stdio server has no URL"
    assert refused("headers", **stdio, headers={"Authorization": TOKEN}) == "a stdio server takes no headers"
    server = mcp_server_create(**stdio, env={"API_TOKEN": ENV_SECRET})
    with pytest.raises(ServiceError) as caught:
        mcp_server_update(server=server, command="clock")
    assert caught.value.fields == {"env": [
        "the command changed: send the environment again (stored values are only given to the command they were "
        "entered for), or {} to give none"]}


def test_headers_refusals_in_exact_words_and_at_their_bounds(world):
    tenant = world.a.tenant
    assert refused("headers", **http(tenant, headers=["Authorization"])) == "a JSON object of header names and values"
    most = {f"X-{n}": "v" for n in range(mcp_servers.HEADERS_MAX)}
    assert dict(mcp_server_create(**http(tenant, name="most", headers=most)).headers) == most
    longest = "v" * mcp_servers.HEADER_VALUE_MAX
    assert dict(mcp_server_create(**http(tenant, name="longest", headers={"X-Key": longest})).headers) == {
        "X-Key": longest}
    assert refused("headers", **http(tenant, headers={"X-Key": longest + "v"})) == (
        f"the value of X-Key must be at most {mcp_servers.HEADER_VALUE_MAX} visible ASCII characters, "
        "without line breaks")
    bad_name = "bad name " + "x" * 100
    assert refused("headers", **http(tenant, headers={bad_name: "v", "Other Bad": "v", "Host": "h"})) == " ".join([
        f"{bad_name[:60]!r} is not a header name", "'Other Bad' is not a header name",
        "Host is set by the connection itself and cannot be given"])
    assert refused("headers", **http(tenant, headers={7: "v"})) == "'7' is not a header name"


@pytest.mark.parametrize(("trusted", "annotations", "flags"), [
    (True, None, (False, True, False)),  # no annotations: MCP's defaults
    (True, {}, (False, True, False)),
    (True, {"readOnlyHint": True, "destructiveHint": True}, (True, False, False)),  # read-only is never destructive
    (True, {"destructiveHint": False}, (False, False, False)),
    (True, {"destructiveHint": "no", "idempotentHint": True}, (False, True, True)),
    (False, {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True}, (False, True, False)),
])
def test_the_flags_of_a_synced_tool_follow_its_hints_when_trusted(trusted, annotations, flags):
    values = tool_flags(McpServer(trusted=trusted), annotations)
    assert (values["read_only"], values["destructive"], values["idempotent"]) == flags
    assert values["concurrency_safe"] is flags[0] and values["trusted"] is trusted


def test_a_synced_definition_keeps_the_upstream_schema_and_reads_only_text_and_objects():
    server = McpServer(trusted=True, timeout_s=12.0)
    listed = UpstreamTool(name="find", description=None, input_schema={"properties": {}, "type": "object"},
                          output_schema={"type": "object"}, annotations={"readOnlyHint": True})
    values, reason = mcp_servers._definition(server, listed)
    assert reason == "" and list(values["input_schema"]) == ["properties", "type"]  # kept as the server sent it
    assert (values["name"], values["description"], values["output_schema"], values["annotations"]) == (
        "find", "", {"type": "object"}, {"readOnlyHint": True})
    hints = {"readOnlyHint": "yes", "title": "Find\x00", "openWorldHint": False, "other": {"deep": 1}}
    odd, _ = mcp_servers._definition(server, UpstreamTool(name="n", description="", input_schema={"type": "object"},
                                                           annotations=hints))
    assert odd["annotations"] == {"openWorldHint": False}  # only MCP's hints as booleans and a storable title
    untyped, _ = mcp_servers._definition(server, UpstreamTool(name="n", description=7, input_schema={"properties": {}},
                                                               output_schema=["not", "a", "schema"]))
    assert untyped["input_schema"] == {"type": "object", "properties": {}} and untyped["output_schema"] is None
    assert untyped["description"] == ""
    assert mcp_servers._definition(server, UpstreamTool(name="n", description="", input_schema=["x"])) == (
        None, 'its input schema is not a JSON Schema of type "object"')


def test_an_output_schema_is_stored_up_to_its_bound():
    server = McpServer(trusted=True, timeout_s=5.0)
    bound = 4 * 64 * 1024  # characters of its repr

    def stored(size: int):
        output = {"d": "x" * (size - len(repr({"d": ""})))}
        assert len(repr(output)) == size
        values, _ = mcp_servers._definition(server, UpstreamTool(name="n", description="", input_schema={
            "type": "object"}, output_schema=output))
        return values["output_schema"]

    assert stored(bound) is not None and stored(100) is not None
    assert stored(bound + 1) is None


def test_a_name_that_fits_is_kept_and_one_with_a_lone_surrogate_is_hashed():
    prefix = "mcp__s__"
    fits = "a" * (mcp_servers.TOOL_NAME_MAX - len(prefix))
    assert mcp_servers.mcp_tool_name("s", fits) == prefix + fits
    longer = mcp_servers.mcp_tool_name("s", fits + "b")
    assert len(longer) == mcp_servers.TOOL_NAME_MAX and longer != prefix + fits + "b"
    lone = mcp_servers.mcp_tool_name("s", "a\ud800")
    digest = hashlib.sha256("a\ud800".encode("utf-8", "surrogatepass")).hexdigest()[:mcp_servers.HASH_LENGTH]
    assert lone == f"{prefix}a__{digest}"
    assert lone != mcp_servers.mcp_tool_name("s", "a\udc00")


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=STDIO)
def test_a_servers_audit_record_holds_its_fields_by_name(world):
    mcp_server_create(**http(world.a.tenant, headers={"X-B": "b", "Authorization": TOKEN}, trusted=True))
    mcp_server_create(tenant=world.a.tenant, name="files", transport="stdio", command="files",
                      env={"API_TOKEN": ENV_SECRET}, enabled=False)
    created = {e.target: e.data for e in Event.objects.for_tenant(world.a.tenant).filter(verb="mcp_server.created")}
    assert created == {
        "mcp_server:github": {"transport": "streamable_http", "header_names": ["Authorization", "X-B"],
                              "env_names": [], "command": "", "enabled": True, "trusted": True, "join_group": None,
                              "accept_changes": False, "accounts": "tenant", "oauth_client": False, "oauth_scopes": ""},
        "mcp_server:files": {"transport": "stdio", "header_names": [], "env_names": ["API_TOKEN"],
                             "command": "files", "enabled": False, "trusted": False, "join_group": None,
                             "accept_changes": False, "accounts": "tenant", "oauth_client": False, "oauth_scopes": ""}}


def test_an_http_servers_url_is_needed_and_bounded(world):
    assert refused("url", **http(world.a.tenant, url="")) == "an HTTP server needs its URL"
    assert refused("url", **http(world.a.tenant, url=None)) == "an HTTP server needs its URL"
    at_bound = PUBLIC_URL + "/" + "x" * (2000 - len(PUBLIC_URL) - 1)
    assert len(at_bound) == 2000
    assert mcp_server_create(**http(world.a.tenant, url=at_bound)).url == at_bound
    assert refused("url", **http(world.a.tenant, name="other", url=at_bound + "x")) == "at most 2000 characters"


def test_a_servers_tools_are_its_own_and_those_detached_under_its_name(world):
    github = mcp_server_create(**http(world.a.tenant))
    other = mcp_server_create(**http(world.a.tenant, name="gitlab"))

    def tool(name, server=None):
        return Tool.objects.create(tenant=world.a.tenant, name=name, source="mcp", mcp_server=server,
                                   input_schema={"type": "object"})

    own, detached = tool("mcp__github__a", github), tool("mcp__github__b")
    tool("mcp__gitlab__c")  # another server's, detached
    tool("mcp__gitlab__d", other)
    assert sorted(t.pk for t in mcp_servers.server_tools(github)) == sorted([own.pk, detached.pk])
    by_server = mcp_servers.mcp_tools_by_server(world.a.tenant, [github])
    assert [t.name for t in by_server[github.pk]] == ["mcp__github__a", "mcp__github__b"]


def test_a_server_whose_credentials_no_key_opens_asks_for_them_again(world):
    from cryptography.fernet import Fernet

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[old]):
        created = mcp_server_create(**http(world.a.tenant, headers={"Authorization": TOKEN}))
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[new]):
        server = McpServer.objects.for_tenant(world.a.tenant).get(pk=created.pk)  # loads: its pages stay up
        answer = mcp_server_sync(server=server)
        assert (answer["status"], answer["error"]) == (
            McpStatus.ERROR, "the stored credentials cannot be read with the platform's keys; enter them again")
        with pytest.raises(ServiceError) as caught:
            mcp_server_update(server=server, timeout_s=5)
        assert caught.value.fields == {"headers": [
            "the stored headers cannot be read with the platform's keys: send it again, or {} for none"]}
        mcp_server_update(server=server, headers={"Authorization": TOKEN + "2"}, timeout_s=5)
        assert McpServer.objects.for_tenant(world.a.tenant).get(pk=created.pk).headers == {
            "Authorization": TOKEN + "2"}
        event = Event.objects.for_tenant(world.a.tenant).filter(verb="mcp_server.updated").get()
        assert event.data["fields"] == ["headers", "timeout_s"]


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=STDIO)
def test_unreadable_credentials_go_with_their_transport(world):
    from cryptography.fernet import Fernet

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[old]):
        created = mcp_server_create(tenant=world.a.tenant, name="files", transport="stdio", command="files",
                                    env={"API_TOKEN": ENV_SECRET})
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[new]):
        server = McpServer.objects.for_tenant(world.a.tenant).get(pk=created.pk)
        with pytest.raises(ServiceError) as caught:
            mcp_server_update(server=server, command="clock")
        assert caught.value.fields == {"env": [
            "the stored environment cannot be read with the platform's keys: send it again, or {} for none"]}
        mcp_server_update(server=server, transport="streamable_http", url=PUBLIC_URL)
        assert McpServer.objects.for_tenant(world.a.tenant).get(pk=created.pk).env is None


def test_name_lists_at_their_bounds(world):
    names = [f"t{i}" for i in range(mcp_servers.NAMES_MAX)]
    server = mcp_server_create(**http(world.a.tenant, include=["x", *names[1:]], exclude=["y" * 128]))
    assert len(server.include) == mcp_servers.NAMES_MAX
    words = (f"a list of at most {mcp_servers.NAMES_MAX} upstream tool names (1-{mcp_servers.NAME_LENGTH_MAX} "
             "characters each)")
    assert refused("include", **http(world.a.tenant, name="b", include=[*names, "one-more"])) == words
    assert refused("exclude", **http(world.a.tenant, name="c", exclude=[""])) == words
    too_long = ["n" * (mcp_servers.NAME_LENGTH_MAX + 1)]
    assert refused("exclude", **http(world.a.tenant, name="d", exclude=too_long)) == words
    at_most = ["n" * mcp_servers.NAME_LENGTH_MAX]
    assert mcp_server_create(**http(world.a.tenant, name="e", include=at_most)).include == at_most
    assert refused("include", **http(world.a.tenant, name="f", include=["ok", "nul\x00name"])) == words


def test_a_server_is_made_of_its_own_fields_only(world):
    with pytest.raises(ServiceError) as caught:
        mcp_servers.mcp_server_check(world.a.tenant, {"name": "g", "zeta": 1, "alpha": 2})
    assert caught.value.fields == {"alpha": ["not a field of an MCP server"], "zeta": ["not a field of an MCP server"]}


def test_a_new_server_needs_a_name(world):
    with pytest.raises(ServiceError) as caught:
        mcp_servers.mcp_server_check(world.a.tenant, {"transport": "streamable_http", "url": PUBLIC_URL})
    assert caught.value.fields == {"name": [mcp_servers.SERVER_NAME_RULE]}
    with pytest.raises(ServiceError) as caught:
        mcp_servers.mcp_server_check(world.a.tenant, {"name": "h", "transport": "carrier-pigeon"})
    assert caught.value.fields == {"transport": ["one of: streamable_http, sse, stdio"]}


def test_an_http_servers_refusals_in_exact_words(world):
    assert refused("command", **http(world.a.tenant, command="files")) == "only a stdio server names a command"
    assert refused("env", **http(world.a.tenant, env={"A": "b"})) == "only a stdio server takes environment variables"
    server = mcp_server_create(**http(world.a.tenant, headers={"Authorization": TOKEN}))
    with pytest.raises(ServiceError) as caught:
        mcp_server_update(server=server, name="renamed")
    assert caught.value.fields == {"name": [
        "the name is part of its tools' names and cannot change; add the server again instead"]}
    with pytest.raises(ServiceError) as caught:
        mcp_server_update(server=server, url="https://93.184.215.15/mcp")
    assert caught.value.fields == {"headers": [
        "the URL now points at another server: send the headers again (stored credentials are only sent where "
        "they were entered for), or {} to send none"]}
    mcp_server_update(server=server, url=PUBLIC_URL + "/other")  # the same server: the headers stay
    assert McpServer.objects.for_tenant(world.a.tenant).get(pk=server.pk).headers == {"Authorization": TOKEN}


def test_a_refused_url_is_not_also_another_server(world):
    server = mcp_server_create(**http(world.a.tenant, headers={"Authorization": TOKEN}))
    with pytest.raises(ServiceError) as caught:
        mcp_server_update(server=server, url="ftp://93.184.215.15/mcp")
    assert list(caught.value.fields) == ["url"]
