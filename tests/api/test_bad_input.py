"""Bad input gets a clear JSON 4xx in the envelope of docs/api.md, never a 500 (docs/calls.md, docs/api.md)."""
import json
import threading

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from tenancy.services import apikey_revoke
from tests.tools.support import install_tool, registered_tool, unique_name, wait_terminal
from tools.catalog.services import session_create
from tools.models import ToolCall

transactional = pytest.mark.django_db(transaction=True)


def assert_error(response, status: int, *, field: str | None = None) -> dict:
    assert response.status_code == status, (response.status_code, response.content)
    assert "application/json" in response["Content-Type"]
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message", "fields"}, error
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["fields"], dict)
    assert "Traceback" not in response.content.decode()
    if field is not None:
        assert field in error["fields"], error
    return error


def raw_post(client, url, body: bytes, content_type="application/json"):
    return client.generic("POST", url, body, content_type=content_type)


# --- malformed and wrongly typed bodies ----------------------------------------------------------

def test_malformed_json_on_session_create(world):
    error = assert_error(raw_post(world.a.client(), "/api/v1/sessions", b'{"agent": "x",'), 400)
    assert "JSON" in error["message"]


@pytest.mark.parametrize("body, field", [
    ({"agent": {"name": "x"}}, "agent"),
    ({"agent": "x", "context": ["not", "an", "object"]}, "context"),
    ({"agent": "x", "user": ["u"]}, "user"),
    ({"agent": "x" * 500}, "agent"),
])
def test_wrong_types_on_session_create(world, body, field):
    assert_error(world.a.client().post("/api/v1/sessions", body, format="json"), 400, field=field)


def test_session_create_without_agent(world):
    assert_error(world.a.client().post("/api/v1/sessions", {}, format="json"), 400, field="agent")


def test_body_that_is_not_an_object(world):
    assert_error(raw_post(world.a.client(), "/api/v1/sessions", b'["agent"]'), 400)


def test_unsupported_content_type(world):
    response = raw_post(world.a.client(), "/api/v1/sessions", b"agent=x", "application/x-www-form-urlencoded")
    assert_error(response, 415)


def test_unknown_format_is_400(world):
    error = assert_error(world.a.client().get(f"/api/v1/sessions/{world.a.session.pk}/tools?format=xml"), 400,
                         field="format")
    assert "xml" in json.dumps(error)


def test_unknown_routes_and_ids_are_json_404(world):
    client = world.a.client()
    assert_error(client.get("/api/v1/no-such-thing"), 404)
    assert_error(client.get("/api/v1/sessions/not-a-uuid"), 404)
    assert_error(client.get("/api/v1/sessions/00000000-0000-0000-0000-000000000000/tools"), 404)
    assert_error(world.a.client("admin").get("/api/v1/groups/999999999"), 404)
    assert_error(world.a.client("admin").get("/api/v1/groups/not-a-number"), 404)


def test_wrong_method_is_405_in_the_envelope(world):
    assert_error(world.a.client().delete(f"/api/v1/sessions/{world.a.session.pk}"), 405)


def test_body_over_the_limit_is_413(world):
    client = world.a.client()
    big = {"agent": "x", "context": {"blob": "y" * 2000}}
    with override_settings(TOOLKEEPER_MAX_BODY_BYTES=500):
        assert_error(client.post("/api/v1/sessions", big, format="json"), 413)
        small = client.post("/api/v1/sessions", {"agent": "x"}, format="json")
        assert small.status_code == 201
    assert client.post("/api/v1/sessions", big, format="json").status_code == 201


# --- authentication ------------------------------------------------------------------------------

def _with_auth(header: str | None) -> APIClient:
    client = APIClient()
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header)
    return client


def test_missing_key_is_401(world):
    response = _with_auth(None).get(f"/api/v1/sessions/{world.a.session.pk}")
    assert_error(response, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("header", [
    "Bearer",
    "Bearer ",
    "Token abc",
    "Basic dXNlcjpwYXNz",
    "Bearer not-a-key",
    "Bearer tk_",
    "Bearer tk_abcdef",
    "Bearer tk_abcdef_",
    "Bearer tk_000000000000_secret",
    "Bearer tk_ünïcode_secret",
])
def test_malformed_keys_are_401(world, header):
    assert_error(_with_auth(header).get(f"/api/v1/sessions/{world.a.session.pk}"), 401)


def test_revoked_key_is_401(world):
    client = world.a.client()
    assert client.get(f"/api/v1/sessions/{world.a.session.pk}").status_code == 200
    apikey_revoke(api_key=world.a.key_objects["agent"])
    assert_error(client.get(f"/api/v1/sessions/{world.a.session.pk}"), 401)


def test_foreign_looking_keys_are_401(world):
    a_key = world.a.keys["agent"]
    b_key = world.b.keys["agent"]
    a_prefix, a_secret = a_key[3:].split("_", 1)
    b_prefix, b_secret = b_key[3:].split("_", 1)
    for forged in (f"tk_{a_prefix}_{b_secret}", f"tk_{b_prefix}_{a_secret}", f"tk_{a_prefix}_{a_secret}x",
                   f"tk_{a_prefix}_{a_secret[:-1]}", a_key.upper()):
        assert_error(_with_auth(f"Bearer {forged}").get(f"/api/v1/sessions/{world.a.session.pk}"), 401)
    # B's genuine key works for B and is a 404 (not data) on A's session.
    assert_error(world.b.client().get(f"/api/v1/sessions/{world.a.session.pk}"), 404)


# --- scopes and agent locks ----------------------------------------------------------------------

@pytest.mark.parametrize("label, method, url", [
    ("external", "post", "/api/v1/sessions"),
    ("admin", "post", "/api/v1/sessions"),
    ("agent", "get", "/api/v1/groups"),
    ("agent", "get", "/api/v1/tools"),
    ("agent", "get", "/api/v1/bindings"),
    ("agent", "get", "/api/v1/audit"),
    ("external", "get", "/api/v1/groups"),
])
def test_key_without_the_scope_is_403(world, label, method, url):
    client = world.a.client(label)
    response = client.post(url, {"agent": "x"}, format="json") if method == "post" else client.get(url)
    assert_error(response, 403)


def test_external_key_cannot_read_sessions(world):
    assert_error(world.a.client("external").get(f"/api/v1/sessions/{world.a.session.pk}"), 403)


def test_locked_key_cannot_create_a_session_for_another_agent(world):
    client = world.a.client("locked")
    assert_error(client.post("/api/v1/sessions", {"agent": "sales-bot"}, format="json"), 400, field="agent")
    own = client.post("/api/v1/sessions", {}, format="json")
    assert own.status_code == 201
    assert own.json()["agent"] == "support-bot"


def test_locked_key_cannot_read_another_agents_session(world):
    other = session_create(tenant=world.a.tenant, agent="sales-bot", user="carol@example.com")
    client = world.a.client("locked")
    for suffix in ("", "/tools", "/prompt"):
        error = assert_error(client.get(f"/api/v1/sessions/{other.pk}{suffix}"), 404)
        assert "sales-bot" not in json.dumps(error)
    assert client.get(f"/api/v1/sessions/{world.a.session.pk}").status_code == 200


def test_locked_key_cannot_see_another_agents_calls(world):
    other = session_create(tenant=world.a.tenant, agent="sales-bot")
    from tools.calls.submit import calls_submit

    [call] = calls_submit(session=other, calls=[{"name": "reset_tools", "input": {}}])
    client = world.a.client("locked")
    assert_error(client.get(f"/api/v1/calls/{call.pk}/events"), 404)
    assert_error(client.post(f"/api/v1/calls/{call.pk}/cancel"), 404)


def test_events_after_must_be_a_non_negative_integer(world):
    call = world.a.calls[0]
    client = world.a.client()
    assert_error(client.get(f"/api/v1/calls/{call.pk}/events?after=-1"), 400, field="after")
    assert_error(client.get(f"/api/v1/calls/{call.pk}/events?after=soon"), 400, field="after")


# --- calls (the async endpoints need committed data: transactional) -------------------------------

def _calls_url(world):
    return f"/api/v1/sessions/{world.a.session.pk}/calls"


WRONG_CALL_BODIES = [
    ({"name": "current_time", "input": ["UTC"]}, "input"),
    ({"name": "current_time", "input": "UTC"}, "input"),
    ({"name": "current_time", "wait": "soon"}, "wait"),
    ({"name": "current_time", "wait": 61}, "wait"),
    ({"name": "current_time", "wait": -1}, "wait"),
    ({"name": "current_time", "wait": "NaN"}, "wait"),
    ({"calls": {"name": "current_time"}}, "calls"),
    ({"calls": "current_time"}, "calls"),
    ({"calls": []}, "calls"),
    ({"calls": [{"input": {}}]}, "calls"),
    ({"calls": [{"name": ["current_time"]}]}, "calls"),
    ({"calls": [{"name": "current_time", "input": [1]}]}, "calls"),
    ({"name": {"n": 1}}, "name"),
    ({"name": "x" * 500}, "name"),
    ({"id": "x" * 500, "name": "current_time"}, "id"),
    ({"input": {}}, "name"),
    ({}, "name"),
]


@transactional  # one transactional test for all bodies: the async view needs committed data, flushes are slow
@pytest.mark.usefixtures("drain_calls")
def test_wrong_types_on_calls(world):
    client = world.a.client()
    for body, field in WRONG_CALL_BODIES:
        response = client.post(_calls_url(world), body, format="json")
        try:
            assert_error(response, 400, field=field)
        except AssertionError as exc:
            raise AssertionError(f"body {body!r}: {exc}") from exc
    assert ToolCall.objects.for_tenant(world.a.tenant).filter(session=world.a.session).count() == 2


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_malformed_and_non_object_call_bodies(world):
    client = world.a.client()
    assert_error(raw_post(client, _calls_url(world), b'{"name": "current_time", '), 400)
    assert_error(raw_post(client, _calls_url(world), b'[{"name": "current_time"}]'), 400)
    assert_error(raw_post(client, _calls_url(world), b'"current_time"'), 400)
    assert_error(client.post(_calls_url(world), {"name": "current_time", "calls": [{"name": "x"}]},
                             format="json"), 400)


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_batch_limits(world):
    client = world.a.client()
    with override_settings(TOOLKEEPER_MAX_BATCH=3):
        too_many = {"calls": [{"name": "current_time"} for _ in range(4)]}
        assert_error(client.post(_calls_url(world), too_many, format="json"), 400, field="calls")
    duplicate = {"calls": [{"id": "x", "name": "current_time"}, {"id": "x", "name": "current_time"}]}
    assert_error(client.post(_calls_url(world), duplicate, format="json"), 400, field="calls")
    assert ToolCall.objects.for_tenant(world.a.tenant).filter(session=world.a.session).count() == 2


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_calls_body_over_the_limit_is_413(world):
    with override_settings(TOOLKEEPER_MAX_BODY_BYTES=300):
        body = {"name": "current_time", "input": {"timezone": "x" * 1000}}
        assert_error(world.a.client().post(_calls_url(world), body, format="json"), 413)


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_unknown_tool_is_a_failed_call_not_an_http_error(world):
    response = world.a.client().post(_calls_url(world), {"id": "u1", "name": "rm_rf", "input": {}}, format="json")
    assert response.status_code == 200
    [call] = response.json()["calls"]
    assert call["status"] == "failed"
    assert call["error"] == {"errorType": "ToolNotAvailable", "error": call["error"]["error"], "tool": "rm_rf",
                             "callId": "u1"}
    assert "rm_rf" in call["error"]["error"]
    assert call["result"]["state"] == "error"


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_schema_violations_are_failed_calls(world):
    session = session_create(tenant=world.a.tenant, agent="other")
    response = world.a.client().post(f"/api/v1/sessions/{session.pk}/calls", {"calls": [
        {"name": "current_time", "input": {"timezone": 5}},
        {"name": "current_time", "input": {"zone": "UTC"}},
    ]}, format="json")
    assert response.status_code == 200
    for call in response.json()["calls"]:
        assert call["status"] == "failed"
        assert call["error"]["errorType"] == "InvalidInput"


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_call_detail_wait_must_be_a_number(world):
    client = world.a.client()
    assert_error(client.get(f"/api/v1/calls/{world.a.calls[0].pk}?wait=soon"), 400, field="wait")
    assert_error(client.get(f"/api/v1/calls/{world.a.calls[0].pk}?wait=100"), 400, field="wait")
    assert_error(client.get("/api/v1/calls/not-a-uuid"), 404)


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_locked_key_calls_on_another_agents_session_are_404(world):
    other = session_create(tenant=world.a.tenant, agent="sales-bot")
    client = world.a.client("locked")
    assert_error(client.post(f"/api/v1/sessions/{other.pk}/calls", {"name": "current_time"}, format="json"), 404)
    assert ToolCall.objects.for_tenant(world.a.tenant).filter(session=other).count() == 0


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_calls_need_the_agent_scope(world):
    for label in ("external", "admin"):
        assert_error(world.a.client(label).post(_calls_url(world), {"name": "current_time"}, format="json"), 403)
    assert_error(APIClient().post(_calls_url(world), {"name": "current_time"}, format="json"), 401)


# --- call ids --------------------------------------------------------------------------------------

RUNS = {"count": 0}
RUNS_LOCK = threading.Lock()


def counted(text: str) -> str:
    """Count executions.

    Args:
        text: Anything.
    """
    with RUNS_LOCK:
        RUNS["count"] += 1
    return text


@pytest.fixture
def counting_tool(world):
    name = unique_name("counted")
    RUNS["count"] = 0
    with registered_tool(counted, name=name):
        install_tool(world.a.tenant, name)
        yield name


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_reusing_a_call_id_for_a_different_call_is_409(world, counting_tool):
    client = world.a.client()
    first = client.post(_calls_url(world), {"id": "dup", "name": counting_tool, "input": {"text": "a"}, "wait": 10},
                        format="json")
    assert first.status_code == 200
    assert first.json()["calls"][0]["status"] == "succeeded"
    error = assert_error(client.post(_calls_url(world), {"id": "dup", "name": counting_tool, "input": {"text": "b"}},
                                     format="json"), 409)
    assert "dup" in error["message"]
    assert_error(client.post(_calls_url(world), {"id": "dup", "name": "current_time", "input": {"text": "a"}},
                             format="json"), 409)
    # the world's own call id, reused for another tool
    assert_error(client.post(_calls_url(world), {"id": "call_time", "name": "current_time"}, format="json"), 409)
    assert RUNS["count"] == 1


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_resending_the_same_call_returns_it_without_a_second_execution(world, counting_tool):
    client = world.a.client()
    body = {"id": "again", "name": counting_tool, "input": {"text": "hi"}, "wait": 10}
    first = client.post(_calls_url(world), body, format="json").json()["calls"][0]
    wait_terminal(first["id"], tenant=world.a.tenant)
    second = client.post(_calls_url(world), body, format="json")
    assert second.status_code == 200
    again = second.json()["calls"][0]
    assert again["id"] == first["id"]
    assert again["status"] == "succeeded"
    assert again["result"]["content"][0]["text"] == "hi"
    batch = client.post(_calls_url(world), {"calls": [
        {"id": "again", "name": counting_tool, "input": {"text": "hi"}},
        {"id": "fresh", "name": counting_tool, "input": {"text": "new"}},
    ], "wait": 10}, format="json")
    assert batch.status_code == 200
    ids = [c["id"] for c in batch.json()["calls"]]
    assert ids[0] == first["id"] and ids[1] != first["id"]
    wait_terminal(ids[1], tenant=world.a.tenant)
    assert ToolCall.objects.for_tenant(world.a.tenant).filter(session=world.a.session, call_id="again").count() == 1
    assert RUNS["count"] == 2  # "again" once, "fresh" once


# --- hostile bodies ------------------------------------------------------------------------------

def test_deeply_nested_json_is_400(world):
    deep = b'{"agent": "x", "context": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    assert_error(raw_post(world.a.client(), "/api/v1/sessions", deep), 400)


def test_invalid_utf8_is_400(world):
    assert_error(raw_post(world.a.client(), "/api/v1/sessions", b'{"agent": "\xff\xfe"}'), 400)


@pytest.mark.parametrize("body", [
    {"agent": "a\u0000b"},
    {"agent": "x", "context": {"k": "a\u0000b"}},
    {"agent": "x", "context": {"k\u0000": 1}},
])
def test_nul_characters_in_session_bodies_are_400(world, body):
    assert_error(world.a.client().post("/api/v1/sessions", body, format="json"), 400)


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_nul_characters_in_call_input_are_400_or_a_failed_call(world):
    for call_input in ({"timezone": "a\u0000b"}, {"k\u0000": 1}):
        response = world.a.client().post(_calls_url(world), {"name": "current_time", "input": call_input},
                                         format="json")
        assert response.status_code in (200, 400), (call_input, response.content)
        if response.status_code == 400:
            assert_error(response, 400)
        else:
            assert response.json()["calls"][0]["status"] == "failed"


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_generated_call_ids_never_collide_with_ids_the_app_chose(world):
    from tools.catalog.services import session_create as create

    session = create(tenant=world.a.tenant, agent="ids")
    client = world.a.client()
    url = f"/api/v1/sessions/{session.pk}/calls"
    chosen = client.post(url, {"calls": [{"id": "call_2", "name": "current_time"},
                                         {"id": "call_3", "name": "current_time"}]}, format="json")
    assert chosen.status_code == 200
    ids = {"call_2", "call_3"}
    for _ in range(3):
        response = client.post(url, {"name": "current_time"}, format="json")
        assert response.status_code == 200, response.content
        call_id = response.json()["calls"][0]["call_id"]
        assert call_id not in ids
        ids.add(call_id)
    assert ToolCall.objects.for_tenant(world.a.tenant).filter(session=session).count() == 5
