"""No value can poison a row: JSON that could not be stored and read back is refused by the API's parser
with a 400 naming the problem, and nothing is stored (lone surrogates, NUL, nesting past 64 levels, NaN).

Before, a lone surrogate was stored (SQLite) or failed the insert (PostgreSQL, 500), and every later read
of the row answered 500; 950 levels of nesting were stored and broke the pages that loaded the row.
"""
import json

import pytest

from approvals.models import PermissionRule
from common.json_values import MAX_JSON_DEPTH, json_parse, json_problem
from knowledge.models import Dataset, Document
from tests.api.test_bad_input import assert_error, raw_post
from tools.models import AgentSession, BoundArgument, ToolCall

SURROGATE = "\ud800"


def nested(levels: int, leaf=1):
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def as_bytes(body) -> bytes:
    return json.dumps(body).encode()  # ASCII escapes: "\ud800" travels as the six characters \ud800


def _rows(world):
    tenant = world.a.tenant
    return {
        "sessions": AgentSession.objects.for_tenant(tenant).count(),
        "bindings": BoundArgument.objects.for_tenant(tenant).count(),
        "rules": PermissionRule.objects.for_tenant(tenant).count(),
        "documents": Document.objects.for_tenant(tenant).count(),
    }


def _bodies(value, key_value):
    """Every governance and session entry point with a JSON field, with `value` in it (or in a key)."""
    bodies = [
        ("agent", "/api/v1/sessions", {"agent": "x", "context": {"k": value}}),
        ("agent", "/api/v1/sessions", {"agent": "x", "context": key_value}),
        ("admin", "/api/v1/bindings", {"tool": "current_time", "name": "timezone", "value": value}),
        ("admin", "/api/v1/bindings", {"tool": "current_time", "name": "timezone", "value": key_value}),
        ("admin", "/api/v1/rules", {"behavior": "deny", "tool_pattern": "x", "arg_match": {"command": value}}),
        ("admin", "/api/v1/rules", {"behavior": "deny", "tool_pattern": "x", "arg_match": key_value}),
        ("admin", "/api/v1/documents", [{"dataset": "handbook", "title": "t", "text": "x", "metadata": {"k": value}}]),
    ]
    if isinstance(value, str):
        bodies.append(("admin", "/api/v1/documents", [{"dataset": "handbook", "title": "t", "text": f"x{value}"}]))
    return bodies


@pytest.mark.parametrize("what, value, key_value, message", [
    ("a lone surrogate", SURROGATE, {SURROGATE: 1}, "lone surrogate"),
    ("a low surrogate", "a\udc00b", {"k\udfff": 1}, "lone surrogate"),
    ("NUL", "a\x00b", {"k\x00": 1}, "NUL character"),
    ("nesting past the cap", nested(MAX_JSON_DEPTH), {"k": nested(MAX_JSON_DEPTH)}, "levels deep"),
])
def test_unstorable_values_are_400_and_nothing_is_stored(world, what, value, key_value, message):
    Dataset.objects.create(tenant=world.a.tenant, name="handbook")
    before = _rows(world)
    for label, url, body in _bodies(value, key_value):
        response = raw_post(world.a.client(label), url, as_bytes(body))
        try:
            error = assert_error(response, 400)
        except AssertionError as exc:
            raise AssertionError(f"{what} in {url} {body!r:.200}: {exc}") from exc
        assert message in error["message"], (url, error)
    assert _rows(world) == before


def test_nesting_up_to_the_cap_is_stored_and_read_back(world):
    context = {"k": nested(MAX_JSON_DEPTH - 2)}  # the body's object and context's object are two levels
    response = raw_post(world.a.client(), "/api/v1/sessions", as_bytes({"agent": "x", "context": context}))
    assert response.status_code == 201, response.content
    assert world.a.client().get(f"/api/v1/sessions/{response.json()['id']}").status_code == 200
    too_deep = {"agent": "x", "context": {"k": nested(MAX_JSON_DEPTH - 1)}}
    assert_error(raw_post(world.a.client(), "/api/v1/sessions", as_bytes(too_deep)), 400)


def test_the_950_levels_once_stored_are_refused(world):
    text = b'{"agent": "x", "context": {"k": ' + b"[" * 950 + b"]" * 950 + b"}}"
    error = assert_error(raw_post(world.a.client(), "/api/v1/sessions", text), 400)
    assert f"at most {MAX_JSON_DEPTH} levels" in error["message"]
    assert not AgentSession.objects.for_tenant(world.a.tenant).filter(agent="x").exists()


def test_surrogate_pairs_and_other_text_are_fine(world):
    context = {"emoji": "\U0001f600", "cjk": "漢字", "rtl": "עברית", "escaped": "\\ud800"}
    response = raw_post(world.a.client(), "/api/v1/sessions", as_bytes({"agent": "x", "context": context}))
    assert response.status_code == 201, response.content
    assert response.json()["context"] == context


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_call_input_with_a_lone_surrogate_is_400_and_no_call_is_stored(world):
    url = f"/api/v1/sessions/{world.a.session.pk}/calls"
    calls = ToolCall.objects.for_tenant(world.a.tenant)
    before = calls.count()
    for body in ({"name": "current_time", "input": {"timezone": SURROGATE}},
                 {"calls": [{"name": "current_time", "input": {SURROGATE: "UTC"}}]},
                 {"name": "current_time", "input": {"timezone": nested(70)}}):
        assert_error(raw_post(world.a.client(), url, as_bytes(body)), 400)
    assert calls.count() == before
    assert world.a.client().get(url.replace("/calls", "")).status_code == 200


@pytest.mark.parametrize("body, field", [
    (b"[null]", "documents[0]"),
    (b"null", "documents[0]"),
    (b'[1, "x", [], true]', "documents[3]"),
    (b'[{"dataset": "handbook", "title": "t", "text": "x"}, null]', "documents[1]"),
])
def test_documents_that_are_not_objects_are_400_naming_them(world, body, field):
    Dataset.objects.create(tenant=world.a.tenant, name="handbook")
    error = assert_error(raw_post(world.a.client("admin"), "/api/v1/documents", body), 400, field=field)
    assert "object" in json.dumps(error)
    assert not Document.objects.for_tenant(world.a.tenant).exists()


def test_json_parse_refuses_what_json_loads_accepts():
    for text, message in [
        ('"\\ud800"', "surrogate"), ('{"\\udc00": 1}', "surrogate"), ('"a\\u0000"', "NUL"),
        ("NaN", "NaN"), ('{"x": Infinity}', "Infinity"), ("[" * 100_000 + "]" * 100_000, "nested"),
        ("1" * 5000, "not valid JSON"), ("{", "not valid JSON"),
    ]:
        with pytest.raises(ValueError, match=message):
            json_parse(text)
    assert json_parse('{"a": ["\\ud83d\\ude00", 1.5, null]}') == {"a": ["\U0001f600", 1.5, None]}
    assert json_problem(float("nan")) and json_problem([float("inf")])
