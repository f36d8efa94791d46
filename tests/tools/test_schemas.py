"""Tool input schemas: checked when a tool is defined, compiled once per catalog version, never fetched
(a `$ref` to a URL must not make the server send a request, let alone show the model the answer).
Tools are what they claim: an external tool takes only the keys it declares, a bound argument cannot
be set under another spelling, and no tool takes the name of one of the platform's own tools."""
import contextlib
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import jsonschema
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tools.calls.pipeline import input_problems
from tools.calls.submit import calls_submit
from tools.catalog import registry
from tools.catalog.registry import ToolDefinition
from tools.catalog.schemas import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, SchemaProblem, schema_check
from tools.catalog.services import binding_set, catalog_sync, tool_external_create, tool_update
from tools.models import CallStatus, Tool, ToolCall, ToolGroup, ToolSource

# The API reads rows on connections of its own: tests that call through it commit what they write.
transactional = pytest.mark.django_db(transaction=True)

LEAKED = "internal-only-7f3a"  # what the recording server answers: must never reach a call's error


class RecordingServer:
    """A real HTTP server on a free local port that records every request it gets."""

    def __init__(self):
        self.hits: list[str] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the name http.server calls)
                hits.append(self.path)
                body = json.dumps({"const": LEAKED}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/schema+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/schema.json"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def remote():
    with RecordingServer() as server:
        yield server


def define(world, name: str, schema, **extra):
    return world.a.client("admin").post("/api/v1/tools", {"name": name, "input_schema": schema, **extra},
                                        format="json")


def field_errors(response) -> dict:
    assert response.status_code == 400, (response.status_code, response.content)
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "fields"}, body
    return body["error"]["fields"]


def in_basic(world, tool: Tool) -> Tool:
    ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").tools.add(tool)
    return tool


def forced_tool(world, name: str, schema: dict) -> Tool:
    """A row with a schema the checks would refuse, written past them (an old row, a hand edit)."""
    tool = Tool.objects.create(tenant=world.a.tenant, name=name, input_schema=schema, source=ToolSource.EXTERNAL)
    return in_basic(world, tool)


def call(world, name: str, arguments: dict) -> dict:
    """One call of world.a.session (agent support-bot) through the API, as the app sees it."""
    response = world.a.client().post(f"/api/v1/sessions/{world.a.session.pk}/calls",
                                     {"name": name, "input": arguments}, format="json")
    assert response.status_code == 200, (response.status_code, response.content)
    [result] = response.json()["calls"]
    return result


def submit(world, name: str, arguments: dict) -> ToolCall:
    [submitted] = calls_submit(session=world.a.session, calls=[{"name": name, "input": arguments}])
    return submitted


def nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


def remote_ref(url: str) -> dict:
    return {"type": "object", "properties": {"target": {"$ref": url}}, "required": ["target"]}


MISSING_LOCAL = {"type": "object", "properties": {"target": {"$ref": "#/definitions/nowhere"}}}


# --- checked when a tool is defined -----------------------------------------------------------------

def test_a_schema_referring_to_a_url_is_refused_at_creation_and_nothing_is_fetched(world, remote):
    response = define(world, "fetcher", remote_ref(remote.url))
    problem = " ".join(field_errors(response)["input_schema"])
    assert "$ref" in problem and remote.url in problem
    assert remote.hits == []
    assert not Tool.objects.for_tenant(world.a.tenant).filter(name="fetcher").exists()


@pytest.mark.parametrize(("schema", "says"), [
    (MISSING_LOCAL, "points at nothing"),
    ({"type": "object", "properties": {"a": {"$ref": "#/properties"}}}, "does not point at a subschema"),
    ({"type": "object", "properties": {"a": {"$ref": "other.json"}}}, "leaves the schema"),
    ({"type": "object", "$defs": {"x": {"$dynamicRef": "https://example.com/s#meta"}}}, "leaves the schema"),
    ({"type": "object", "$ref": "#"}, "cycle"),
    ({"type": "object", "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
      "properties": {"x": {"$ref": "#/$defs/a"}}}, "cycle"),
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}},
      "$defs": {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(24)} | {"d24": {}}},
     "expands"),
    ({"type": "object", "properties": {"a": nested(MAX_SCHEMA_DEPTH // 2)}}, "deeper than"),
    ({"type": "object", "description": "x" * MAX_SCHEMA_BYTES}, "bytes"),
    ({"type": "object", "properties": {"a": {"type": "no-such-type"}}}, "not a valid JSON Schema"),
    ({"type": "array"}, '"object"'),
])
def test_unusable_schemas_are_refused_with_a_clear_400(world, schema, says):
    problem = " ".join(field_errors(define(world, "broken", schema))["input_schema"])
    assert says in problem, problem
    assert not Tool.objects.for_tenant(world.a.tenant).filter(name="broken").exists()


def test_schemas_with_local_references_recursion_and_anchors_are_accepted(world):
    schema = {
        "type": "object",
        "$defs": {
            "node": {"type": "object", "properties": {
                "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}},
            "when": {"$anchor": "when", "type": "string", "format": "date"},
        },
        "properties": {"tree": {"$ref": "#/$defs/node"}, "due": {"$ref": "#when"}},
        "required": ["tree"],
    }
    response = define(world, "planner", schema)
    assert response.status_code == 201, response.content
    tool = in_basic(world, Tool.objects.for_tenant(world.a.tenant).get(name="planner"))
    good = submit(world, tool.name, {"tree": {"label": "a", "children": [{"label": "b", "children": []}]}})
    assert good.status == CallStatus.AWAITING_EXTERNAL, good.error
    bad = submit(world, tool.name, {"tree": {"label": "a", "children": [{"label": 5}]}})
    assert bad.status == CallStatus.FAILED and bad.error["errorType"] == "InvalidInput"
    assert "tree/children/0/label" in bad.error["error"]


# --- never fetched, never a 500, even for a schema stored past the checks ------------------------------

@transactional
@pytest.mark.usefixtures("drain_calls")
def test_a_stored_schema_referring_to_a_url_fails_the_call_without_any_request(world, remote):
    tool = forced_tool(world, "legacy_fetcher", remote_ref(remote.url))
    result = call(world, tool.name, {"target": "anything"})
    assert result["status"] == CallStatus.FAILED
    assert result["error"]["errorType"] == "ToolMisconfigured"
    assert result["error"]["tool"] == tool.name and result["result"]["state"] == "error"
    assert remote.hits == []
    assert LEAKED not in json.dumps(result)


@transactional
@pytest.mark.usefixtures("drain_calls")
def test_a_stored_schema_with_a_missing_local_definition_is_a_structured_error(world):
    tool = forced_tool(world, "legacy_missing", MISSING_LOCAL)
    result = call(world, tool.name, {"target": 1})
    assert result["status"] == CallStatus.FAILED
    assert result["error"]["errorType"] == "ToolMisconfigured"
    assert "#/definitions/nowhere" in result["error"]["error"]


def test_a_reviewers_edit_of_a_misconfigured_tool_is_refused_without_a_request(world, remote):
    tool = forced_tool(world, "legacy_edit", remote_ref(remote.url))
    problems = input_problems(session=world.a.session, tool_name=tool.name, new_input={"target": "x"})
    assert problems and "input schema" in problems[0]
    assert remote.hits == []


# --- sources and the Django admin go through the same check ------------------------------------------

class OneToolSource:
    def __init__(self, definition: ToolDefinition):
        self.definition = definition
        self.kinds = (f"test_{definition.name}",)  # a kind is claimed by one source

    def definitions(self, tenant):
        return [self.definition]

    def invoke(self, tool, arguments, ctx):
        raise AssertionError("never called")


@contextlib.contextmanager
def offered(definition: ToolDefinition):
    source = OneToolSource(definition)
    registry.register_source(source)
    try:
        yield
    finally:
        registry._sources.remove(source)


def test_catalog_sync_leaves_out_a_source_tool_with_an_unusable_schema(world, remote):
    bad = ToolDefinition(name="synced_fetcher", description="", input_schema=remote_ref(remote.url),
                         source=ToolSource.EXTERNAL, default_groups=("basic",))
    good = ToolDefinition(name="synced_fine", description="", input_schema={"type": "object"},
                          source=ToolSource.EXTERNAL, default_groups=("basic",))
    with offered(bad), offered(good):
        synced = {tool.name for tool in catalog_sync(tenant=world.a.tenant)}
        # the verdict on a schema is kept for the next tenant's sync: it is still a refusal there
        synced_b = {tool.name for tool in catalog_sync(tenant=world.b.tenant)}
    for names in (synced, synced_b):
        assert "synced_fine" in names and "current_time" in names
        assert "synced_fetcher" not in names
    assert not Tool.objects.for_tenant(world.a.tenant).filter(name="synced_fetcher").exists()
    assert not Tool.objects.for_tenant(world.b.tenant).filter(name="synced_fetcher").exists()
    assert remote.hits == []


def test_the_admin_refuses_an_unusable_schema(world, remote):
    user = get_user_model().objects.create_superuser(username="root", password="x", email="")
    client = Client()
    client.force_login(user)
    tool = world.a.tools["calculate"]
    response = client.post(f"/admin/tools/tool/{tool.pk}/change/", {
        "tenant": world.a.tenant.pk, "name": tool.name, "description": tool.description,
        "input_schema": json.dumps(remote_ref(remote.url)), "output_schema": "null", "source": tool.source,
        "source_ref": tool.source_ref, "trusted": "on", "timeout_s": tool.timeout_s, "enabled": "on",
    })
    assert response.status_code == 200
    assert "leaves the schema" in response.content.decode()
    tool.refresh_from_db()
    assert "$ref" not in json.dumps(tool.input_schema)
    assert remote.hits == []


# --- compiled once per tool version ----------------------------------------------------------------------

def test_the_validator_is_built_once_per_tool_version(world):
    tool = in_basic(world, tool_external_create(tenant=world.a.tenant, name="counted", description="",
                                                input_schema={"properties": {"n": {"type": "integer"}}}))
    real = jsonschema.Draft202012Validator
    with mock.patch.object(jsonschema, "Draft202012Validator", wraps=real) as built:
        for n in range(3):
            assert submit(world, tool.name, {"n": n}).status == CallStatus.AWAITING_EXTERNAL
        assert submit(world, tool.name, {"n": "three"}).error["errorType"] == "InvalidInput"
        assert built.call_count == 1
        tool_update(tool=tool, description="Counts.")  # a new version of the tool
        assert submit(world, tool.name, {"n": 4}).status == CallStatus.AWAITING_EXTERNAL
        assert submit(world, tool.name, {"n": 5}).status == CallStatus.AWAITING_EXTERNAL
        assert built.call_count == 2


def _metaschema_checks():
    return mock.patch.object(jsonschema.Draft202012Validator, "check_schema",
                             wraps=jsonschema.Draft202012Validator.check_schema)


def test_a_schema_is_checked_against_the_metaschema_once_and_its_verdict_kept():
    name = f"n{uuid.uuid4().hex}"  # a text no other test checked
    good = {"type": "object", "properties": {name: {"type": "integer"}}}
    bad = {"type": "object", "properties": {name: {"type": "no-such-type"}}}
    with _metaschema_checks() as checks:
        for _ in range(3):
            schema_check(dict(good))
            with pytest.raises(SchemaProblem, match="not a valid JSON Schema") as refused:
                schema_check(dict(bad))
            assert name in str(refused.value)
        assert checks.call_count == 2


def test_a_schema_that_json_cannot_write_as_it_is_is_checked_every_time():
    """A key that is not a string reads the same as JSON as a key that is: no verdict is shared between them."""
    schema = {"type": "object", "properties": {7: {"type": "integer"}}, "$defs": {"t": {"type": "string"}}}
    with _metaschema_checks() as checks:
        schema_check(schema)
        schema_check(schema)
        assert checks.call_count == 2


# --- external tools take what they declare ---------------------------------------------------------------

def test_an_external_tool_refuses_undeclared_keys_by_default(world):
    tool = in_basic(world, tool_external_create(tenant=world.a.tenant, name="strict", description="",
                                                input_schema={"properties": {"title": {"type": "string"}}}))
    assert tool.input_schema["additionalProperties"] is False
    assert submit(world, tool.name, {"title": "ok"}).status == CallStatus.AWAITING_EXTERNAL
    refused = submit(world, tool.name, {"title": "ok", "priority": "urgent"})
    assert refused.status == CallStatus.FAILED
    assert refused.error["errorType"] == "InvalidInput" and "priority" in refused.error["error"]


def test_an_external_tool_that_states_additional_properties_keeps_them(world):
    tool = in_basic(world, tool_external_create(
        tenant=world.a.tenant, name="open", description="",
        input_schema={"properties": {"title": {"type": "string"}}, "additionalProperties": True}))
    assert submit(world, tool.name, {"title": "ok", "extra": 1}).status == CallStatus.AWAITING_EXTERNAL


# --- bound names cannot be reached by another spelling ---------------------------------------------------

FULLWIDTH = str.maketrans({chr(c): chr(c + 0xFEE0) for c in range(0x21, 0x7F)})
SPELLINGS = ["Timezone", "TIMEZONE", "timezone".translate(FULLWIDTH), "TimeZone".translate(FULLWIDTH)]


@pytest.mark.parametrize("key", SPELLINGS)
def test_a_bound_name_in_another_case_or_width_is_an_override(world, key):
    # The world binds current_time.timezone for support-bot, the agent of world.a.session.
    refused = submit(world, "current_time", {key: "UTC"})
    assert refused.status == CallStatus.FAILED
    assert refused.error["errorType"] == "BoundArgumentOverride"
    assert key in refused.error["error"] and "Asia/Tokyo" not in json.dumps(refused.error)


@pytest.mark.parametrize("key", ["Scope", "scope".translate(FULLWIDTH)])
def test_an_open_schema_does_not_let_a_respelled_bound_name_reach_the_tool(world, key):
    tool = in_basic(world, tool_external_create(
        tenant=world.a.tenant, name="scoped", description="",
        input_schema={"properties": {"query": {"type": "string"}, "scope": {"type": "string"}},
                      "additionalProperties": True}))
    binding_set(tenant=world.a.tenant, tool=tool, name="scope", value="tenant-42")
    refused = submit(world, tool.name, {"query": "q", key: "everything"})
    assert refused.status == CallStatus.FAILED
    assert refused.error["errorType"] == "BoundArgumentOverride"
    assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=refused.pk).effective_input == {}


# --- names of the platform's own tools -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["reset_tools", "load_skill_through_path", "Reset_Tools"])
def test_an_external_tool_cannot_take_a_meta_tool_name(world, name):
    fields = field_errors(define(world, name, {"type": "object"}))
    assert "reserved" in " ".join(fields["name"])
    assert not Tool.objects.for_tenant(world.a.tenant).filter(name=name).exists()
