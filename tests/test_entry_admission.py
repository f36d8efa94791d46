"""Every entry admits its requests through `tenancy.entry.admission.admit` (docs/notes/entry-and-admission.md,
"Admission").

The walker goes to every door there is: each route and method of the REST API, each console route that takes a
change, each WebSocket route, each method of `/mcp/`. With the caller's requests-per-minute used up, every
one of them refuses in its own medium (429 and `Retry-After`; a close with 4429; a JSON-RPC error). Every door
that takes a JSON body refuses a value no entry takes (a NUL, nesting past 64) before anything runs. A new
route, socket or MCP method is walked as it is added: one that skips admission fails here.
"""
import asyncio
import json
import uuid

import pytest
from asgiref.testing import ApplicationCommunicator
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django import forms
from django.contrib.auth.models import AnonymousUser
from django.core.asgi import get_asgi_application
from django.urls import NoReverseMatch, get_resolver, reverse
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from common.errors import NotPermitted, RateLimited
from common.json_values import JSONValueField
from realtime.consumers import CLOSE_RATE_LIMITED
from tenancy.entry import limits
from tenancy.entry.admission import (
    Entry,
    NotAuthenticated,
    RestAdmission,
    ValueRefused,
    admit,
    api_key_for_token,
    url_problem,
)
from tenancy.entry.authentication import INVALID_KEY, MALFORMED_AUTHORIZATION
from tenancy.models import Tenant
from tenancy.services import apikey_create
from tests.realtime.test_socket_walker import ORIGIN, cookie_of, fill, routes
from tests.test_url_isolation import API_PREFIX, CONSOLE_PREFIXES, SKIPPED_PREFIXES, walk
from toolkeeper.handlers import http_application
from toolkeeper.routing import websocket_urlpatterns
from tools.gateway.entry import INVALID_PARAMS, RATE_LIMITED, McpEndpoint
from tools.gateway.protocol import mcp_protocol_server
from tools.models import ToolCall

NUL_VALUE = {"name": "walker", "input": {"text": "a\u0000b"}, "description": "x\u0000"}
DEEP_VALUE = {"input": json.loads("[" * 65 + "]" * 65)}
NOW = 1_800_000_030.0  # one fixed minute: the walk never straddles two rate windows


@pytest.fixture
def one_request_a_minute(world, monkeypatch):
    """Tenant A's keys and logins may make one request a minute; the clock stands still."""
    monkeypatch.setattr(limits.time, "time", lambda: NOW)
    limits.counter_store().clear()
    Tenant.objects.filter(pk=world.a.tenant.pk).update(key_requests_per_minute=1)
    yield world
    limits.counter_store().clear()


def _every_scope_key(world) -> str:
    return apikey_create(tenant=world.a.tenant, name="every-scope", scopes=["agent", "external", "admin"],
                         created_by=world.a.users["admin"]).key


def _path(route) -> str | None:
    """A URL of the route, its parameters filled with ids that need not exist: admission comes first."""
    for candidate in ("1", str(uuid.uuid4()), "x"):
        try:
            return reverse(route.name, kwargs={param: candidate for param in route.params})
        except NoReverseMatch:
            continue
    return None


def _routes(prefixes):
    for route in walk():
        path = route.template
        if path.startswith(SKIPPED_PREFIXES) or not path.startswith(prefixes):
            continue
        yield route


# --- REST -----------------------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)  # the waiting views run the DRF view on the database pool's threads
def test_every_api_route_counts_against_the_limits(one_request_a_minute, api):
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {_every_scope_key(one_request_a_minute)}")
    assert api.get("/api/v1/tools").status_code == 200  # the minute's one request
    walked, problems = 0, []
    for route in _routes((API_PREFIX,)):
        path = _path(route)
        assert path is not None, f"{route.template}: the walker cannot make a URL of it (name it)"
        for method in route.methods or ("get", "post"):
            response = getattr(api, method)(path, {}, format="json") if method != "get" else api.get(path)
            walked += 1
            if response.status_code != 429 or "Retry-After" not in response \
                    or response.json()["error"]["code"] != "rate_limited":
                problems.append(f"{method.upper()} {path}: {response.status_code} {response.content[:120]!r}")
    assert not problems, "\n".join(problems)
    assert walked > 60


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("value", [NUL_VALUE, DEEP_VALUE], ids=["nul", "deep"])
def test_every_api_route_that_takes_a_body_refuses_a_value_no_entry_takes(world, api, value):
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {_every_scope_key(world)}")
    walked, problems = 0, []
    for route in _routes((API_PREFIX,)):
        path = _path(route)
        for method in set(route.methods) & {"post", "put", "patch"}:
            response = getattr(api, method)(path, value, format="json")
            walked += 1
            message = json.dumps(response.json()["error"]) if response.status_code == 400 else ""
            if "NUL" not in message and "nested at most 64" not in message:
                problems.append(f"{method.upper()} {path}: {response.status_code} {response.content[:160]!r}")
    assert not problems, "\n".join(problems)
    assert walked > 30
    assert not ToolCall.objects.for_tenant(world.a.tenant).filter(call_id="walker").exists()


# --- the console ------------------------------------------------------------------------------------------------

def test_every_console_change_counts_against_the_login_s_limits(one_request_a_minute):
    world = one_request_a_minute
    console = world.a.console("admin")
    tenant = world.a.tenant.slug
    assert console.post(reverse("console:group_create", kwargs={"tenant": tenant}), {}).status_code != 429
    walked, problems = 0, []
    for route in _routes(CONSOLE_PREFIXES):
        if route.methods_known and "post" not in route.methods:
            continue
        kwargs = {param: (tenant if param == "tenant" else "1") for param in route.params}
        path = reverse(route.name, kwargs=kwargs)
        response = console.post(path, {"name": "walker"})
        walked += 1
        if response.status_code != 429 or "Retry-After" not in response:
            problems.append(f"POST {path}: {response.status_code}")
    assert not problems, "\n".join(problems)
    assert walked > 30
    # reading is not a change: pages still open past the limit
    assert console.get(reverse("console:dashboard", kwargs={"tenant": tenant})).status_code == 200


OUR_PACKAGES = {"toolkeeper", "tenancy", "audit", "realtime", "console", "tools", "approvals", "skills", "knowledge"}


def _project_forms():
    """Every form class of the project's apps (their modules are loaded with the URL conf)."""
    get_resolver().url_patterns  # noqa: B018 (loads every app's views and forms)
    found, stack = set(), [forms.BaseForm]
    while stack:
        for cls in stack.pop().__subclasses__():
            stack.append(cls)
            if cls.__module__.split(".")[0] in OUR_PACKAGES:
                found.add(cls)
    return found


def test_every_console_field_that_takes_json_checks_values_as_every_entry_does():
    """A JSON field of a console form parses with `json_parse`, whose value check is the one `admit` makes."""
    found, problems = 0, []
    for form in _project_forms():
        for name, field in getattr(form, "base_fields", {}).items():
            if isinstance(field, forms.JSONField):
                found += 1
                if not isinstance(field, JSONValueField):
                    problems.append(f"{form.__module__}.{form.__name__}.{name} is a plain JSONField")
    assert not problems, "\n".join(problems)
    assert found >= 5
    field = JSONValueField()
    for text in ('{"a": "\\u0000"}', "[" * 65 + "]" * 65):
        with pytest.raises(forms.ValidationError):
            field.clean(text)


# --- WebSockets -------------------------------------------------------------------------------------------------

async def _close_code(path: str, headers: list) -> int | None:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path, headers=[ORIGIN, *headers])
    connected, code = await communicator.connect(timeout=10)
    if connected:
        output = await communicator.receive_output(timeout=5)
        await communicator.wait()
        return output.get("code")
    return code


@pytest.mark.django_db(transaction=True)
def test_every_socket_route_counts_its_connects(one_request_a_minute):
    world = one_request_a_minute
    a = world.a
    ids = type("Ids", (), {"tenant": a.tenant.slug, "session_id": str(a.session.pk), "call_id": str(a.calls[0].pk)})
    key_headers = [(b"authorization", f"Bearer {a.keys['agent']}".encode())]
    login_headers = [(b"cookie", cookie_of(a.users["admin"]))]
    limits.requests_admit(tenant=a.tenant, api_key=a.key_objects["agent"])  # the key's one request
    limits.requests_admit(tenant=a.tenant, user=a.users["admin"])  # and the login's
    walked = 0
    for route in routes():
        headers = key_headers if route.startswith("ws/api/") else login_headers
        code = asyncio.run(_close_code(fill(route, ids), headers))
        assert code == CLOSE_RATE_LIMITED, f"{route}: {code}"
        walked += 1
    assert walked == len(websocket_urlpatterns) >= 5


# --- /mcp/ --------------------------------------------------------------------------------------------------------

def _mcp_methods() -> list[str]:
    server = mcp_protocol_server()
    return ["initialize", *server._request_handlers, *server._notification_handlers,
            "notifications/initialized", "notifications/cancelled"]


async def _post_mcp(message: dict, key: str) -> tuple[int, dict, dict]:
    body = json.dumps(message).encode()
    scope = {"type": "http", "method": "POST", "path": "/mcp/", "query_string": b"", "headers": [
        (b"host", b"localhost"), (b"authorization", f"Bearer {key}".encode()),
        (b"content-type", b"application/json"), (b"accept", b"application/json, text/event-stream"),
        (b"x-toolkeeper-agent", b"walker"), (b"content-length", str(len(body)).encode())]}
    received = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        return received.pop(0) if received else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await McpEndpoint()(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, json.loads(content)


def _message(method: str, number: int, params: dict) -> dict:
    message = {"jsonrpc": "2.0", "method": method, "params": params}
    return message if method.startswith("notifications/") else {**message, "id": number}


@pytest.mark.django_db(transaction=True)
def test_every_mcp_method_counts_against_the_limits(one_request_a_minute):
    world = one_request_a_minute
    key = world.a.keys["agent"]
    limits.requests_admit(tenant=world.a.tenant, api_key=world.a.key_objects["agent"])  # the minute's one
    methods = _mcp_methods()
    for number, method in enumerate(methods):
        params = {"name": "current_time", "arguments": {}} if method == "tools/call" else {}
        status, headers, body = asyncio.run(_post_mcp(_message(method, number, params), key))
        assert status == 429, (method, status, body)
        assert int(headers["retry-after"]) >= 1
        assert body["error"]["code"] == RATE_LIMITED and "Rate limit" in body["error"]["message"]
        assert body["id"] == (None if method.startswith("notifications/") else number)
    assert {"initialize", "tools/list", "tools/call", "resources/read"} <= set(methods)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("arguments", [{"text": "a\u0000b"}, DEEP_VALUE, {"n": float("nan")}],
                         ids=["nul", "deep", "nan"])
def test_every_mcp_method_refuses_a_value_no_entry_takes_before_anything_is_stored(world, arguments):
    key = world.a.keys["agent"]
    before = ToolCall.all_tenants.count()
    for number, method in enumerate(_mcp_methods()):
        params = {"name": "current_time", "arguments": arguments}
        status, _, body = asyncio.run(_post_mcp(_message(method, number, params), key))
        assert status == 400, (method, status, body)
        assert body["error"]["code"] == INVALID_PARAMS, (method, body)
        assert "Traceback" not in body["error"]["message"] and "INSERT" not in body["error"]["message"]
    assert ToolCall.all_tenants.count() == before


# --- /metrics ------------------------------------------------------------------------------------------------------

def test_the_scrape_is_no_tenants_entry_and_takes_only_its_own_token(one_request_a_minute, client, settings):
    """`/metrics` (docs/observability.md, "Exposing /metrics") is the deployment's, not a tenant's: it does not call
    `admit`, because no tenant's key, login or limit applies to it. Its one way in is the deployment's token: a
    tenant's API key is refused (401), and a tenant whose minute is used up does not stop the scrape. Unconfigured,
    it is not there (404)."""
    world = one_request_a_minute
    settings.TOOLKEEPER_METRICS_TOKEN = "scrape-token"
    key = _every_scope_key(world)
    assert client.get("/api/v1/tools", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200  # the minute's one
    assert client.get("/api/v1/tools", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 429
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 401
    client.force_login(world.a.users["admin"])
    assert client.get("/metrics").status_code == 401  # a console login is no token either
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token").status_code == 200
    settings.TOOLKEEPER_METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token").status_code == 404


# --- the function itself ------------------------------------------------------------------------------------------

def test_admit_checks_who_then_the_limits_then_the_value(one_request_a_minute):
    world = one_request_a_minute
    a = world.a
    with pytest.raises(NotAuthenticated):
        admit(entry=Entry.MCP, authorization="Bearer tk_nope")
    with pytest.raises(NotAuthenticated):
        admit(entry=Entry.MCP, authorization="Basic abc")
    with pytest.raises(NotAuthenticated):  # a console entry needs a login and its tenant
        admit(entry=Entry.CONSOLE, user=a.users["admin"])
    for user in (None, AnonymousUser()):  # a tenant alone is nobody
        with pytest.raises(NotAuthenticated) as refused:
            admit(entry=Entry.CONSOLE, user=user, tenant=a.tenant)
        assert refused.value.detail == "Authentication credentials were not provided."
    with pytest.raises(NotPermitted) as refused:  # a scope refusal is not counted
        admit(entry=Entry.MCP, authorization=f"Bearer {a.keys['admin']}", scope="agent")
    assert refused.value.detail == "This API key lacks the agent scope."
    with pytest.raises(ValueRefused):  # counted: the minute's one request
        admit(entry=Entry.MCP, authorization=f"Bearer {a.keys['agent']}", scope="agent", value={"x": "\u0000"})
    with pytest.raises(RateLimited):  # past the limit, the value is not even looked at
        admit(entry=Entry.MCP, authorization=f"Bearer {a.keys['agent']}", scope="agent", value={"x": "\u0000"})
    admitted = admit(entry=Entry.CONSOLE, user=a.users["admin"], tenant=a.tenant)  # a login has its own bucket
    assert (admitted.entry, admitted.tenant, admitted.api_key, admitted.user) == (
        Entry.CONSOLE, a.tenant, None, a.users["admin"])
    with pytest.raises(ValueRefused) as refused:  # named by the field that holds it
        admit(entry=Entry.REST, user=a.users["admin"], tenant=a.tenant, value={"env": {"TOKEN": "a\u0000"}, "x": 1})
    assert refused.value.fields == {"env": ["JSON strings may not contain the NUL character (\\u0000)"]}
    assert refused.value.message == "env: JSON strings may not contain the NUL character (\\u0000)"
    with pytest.raises(ValueRefused) as refused:  # a key of the object itself, or a list: the whole value
        admit(entry=Entry.REST, user=a.users["admin"], tenant=a.tenant, value={"a\u0000": 1})
    assert refused.value.fields == {} and "NUL" in refused.value.message
    other = admit(entry=Entry.REST, authorization=f"Bearer {a.keys['locked']}", value={"fine": [1, "two"]})
    assert (other.tenant, other.api_key, other.user) == (a.tenant, a.key_objects["locked"], None)


def test_a_token_refusal_says_what_is_wrong(world):
    with pytest.raises(NotAuthenticated) as refused:
        api_key_for_token("Basic abc")
    assert refused.value.detail == MALFORMED_AUTHORIZATION
    with pytest.raises(NotAuthenticated) as refused:
        api_key_for_token("Bearer tk_nope")
    assert refused.value.detail == INVALID_KEY
    assert api_key_for_token(f"Bearer {world.a.keys['agent']}") == world.a.key_objects["agent"]


def test_the_rest_entry_leaves_an_anonymous_request_to_the_view_s_permissions():
    """An open view (the OpenAPI document) is reached without credentials: nothing to count, nothing refused."""
    request = Request(APIRequestFactory().get("/api/schema/"))
    assert RestAdmission().allow_request(request, view=None) is True


@pytest.mark.django_db(transaction=True)
def test_the_rest_entry_reads_only_a_json_body(world, api):
    """A body of another type is the view's to refuse (415 where it reads one): admission does not parse it."""
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {world.a.keys['admin']}")
    response = api.generic("GET", "/api/v1/tools", "a=\u0000", content_type="text/plain")
    assert response.status_code == 200, response.content


# --- the URL, before anyone is asked ------------------------------------------------------------------------------

async def _get(application, path: str, query: bytes, headers: dict) -> tuple[int, bytes]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query, "root_path": "",
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80),
             "headers": [(b"host", b"127.0.0.1"), *((k.encode(), v.encode()) for k, v in headers.items())]}
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await communicator.receive_output(timeout=20)
    body = b""
    while True:
        message = await communicator.receive_output(timeout=20)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(timeout=5)
    return start["status"], body


def test_url_problem_names_the_part_that_holds_a_nul():
    path_problem = "The path may not contain the NUL character."
    query_problem = "Query parameters may not contain the NUL character (%00)."
    assert url_problem("/api/v1/tools/a\x00", b"") == path_problem
    assert url_problem("/api/v1/tools/a\x00", b"agent=%00") == path_problem
    assert url_problem("/api/v1/approvals", b"agent=%00") == query_problem
    assert url_problem("/api/v1/approvals", b"agent=a\x00b") == query_problem  # a raw NUL byte
    assert url_problem("/api/v1/approvals", b"agent=%2500&a=0") is None


@pytest.mark.django_db(transaction=True)
def test_a_nul_in_the_path_or_a_query_parameter_is_refused_before_any_lookup(world):
    """On PostgreSQL a NUL in a filter's text was a database error (500); no entry takes one."""
    application = http_application(get_asgi_application())
    admin = {"authorization": f"Bearer {world.a.keys['admin']}"}
    for path, query in [("/api/v1/approvals", b"agent=%00"), ("/api/v1/audit", b"target=a%00b"),
                        ("/api/v1/documents", b"dataset=%00"), ("/api/v1/notify-deliveries", b"status=%00"),
                        ("/api/v1/tools/\x00", b""), ("/mcp/", b"agent=%00")]:
        status, body = asyncio.run(_get(application, path, query, admin))
        assert status == 400, (path, query, status, body)
        assert "NUL" in json.loads(body)["error"]["message"]
    status, _ = asyncio.run(_get(application, "/api/v1/approvals", b"agent=bob", admin))
    assert status == 200
