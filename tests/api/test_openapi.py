"""The OpenAPI document says what the API does: shapes, statuses, errors, required fields, scopes.

The schema is served, self-contained (no CDN at page load), valid OpenAPI 3, and agrees with docs/api.md
(../shared/API.md) and with the views it describes.
"""
import re

from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from openapi_spec_validator import validate

from tenancy.permissions import console_roles, required_scopes

METHODS = ("get", "post", "put", "patch", "delete")


def operations(schema):
    for path, item in schema["paths"].items():
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def ref(schema, value: dict) -> dict:
    """The schema `value` refers to (or `value` itself)."""
    while "$ref" in value or len(value.get("allOf", ())) == 1:  # a nullable reference is {"allOf": [ref]}
        value = value["allOf"][0] if "allOf" in value else value
        value = schema["components"]["schemas"][value["$ref"].rsplit("/", 1)[1]]
    return value


def body(schema, path, method, status) -> dict:
    return ref(schema, schema["paths"][path][method]["responses"][str(status)]["content"]["application/json"]["schema"])


def request(schema, path, method) -> dict:
    return ref(schema, schema["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"])


def test_schema_documents_the_app_facing_routes(schema):
    for path in ("/api/v1/sessions", "/api/v1/sessions/{session_id}/calls", "/api/v1/calls/{call_id}",
                 "/api/v1/calls/{call_id}/events", "/api/v1/calls/{call_id}/cancel", "/api/v1/rules/evaluate"):
        assert path in schema["paths"], path


def test_the_schema_is_valid_openapi_3(schema):
    assert schema["openapi"].startswith("3.")
    validate(schema)  # raises on any departure from the OpenAPI 3 specification


def test_swagger_ui_loads_its_files_from_this_server(db):
    page = Client().get("/api/docs/").content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert "cdn." not in page and "jsdelivr" not in page


def test_answers_have_the_shapes_of_api_md(schema):
    calls = body(schema, "/api/v1/sessions/{session_id}/calls", "post", 200)
    assert calls["required"] == ["calls"]
    assert ref(schema, calls["properties"]["calls"]["items"]) == ref(schema, {"$ref": "#/components/schemas/Call"})
    tools = body(schema, "/api/v1/sessions/{session_id}/tools", "get", 200)
    assert tools["required"] == ["tools"] and tools["properties"]["tools"]["type"] == "array"
    formats = [ref(schema, one) for one in ref(schema, tools["properties"]["tools"]["items"])["oneOf"]]
    assert [sorted(f["required"]) for f in formats] == [
        ["function", "type"], ["description", "input_schema", "name"], ["annotations", "description", "inputSchema",
                                                                         "name"]]
    events = body(schema, "/api/v1/calls/{call_id}/events", "get", 200)
    assert events["required"] == ["events"]
    assert sorted(ref(schema, events["properties"]["events"]["items"])["properties"]) == ["at", "data", "kind", "seq"]
    assert body(schema, "/api/v1/sessions/{session_id}/prompt", "get", 200)["properties"]["text"]["type"] == "string"
    for path in ("/api/v1/calls/{call_id}", "/api/v1/calls/{call_id}/cancel", "/api/v1/calls/{call_id}/result"):
        method = "get" if path.endswith("}") else "post"
        assert body(schema, path, method, 200) == ref(schema, {"$ref": "#/components/schemas/Call"}), path
    decision = body(schema, "/api/v1/rules/evaluate", "post", 200)
    assert sorted(decision["required"]) == ["behavior", "reason", "rule"]


def test_a_call_is_described_field_by_field(schema):
    call = ref(schema, {"$ref": "#/components/schemas/Call"})
    assert sorted(call["properties"]) == sorted(["id", "call_id", "session", "tool", "input", "status", "decision",
                                                 "result", "error", "approval", "question", "trace_id",
                                                 "created_at", "finished_at"])
    assert {"awaiting_approval", "awaiting_user"} <= set(ref(schema, call["properties"]["status"])["enum"])
    trace_id = call["properties"]["trace_id"]
    assert (trace_id["type"], trace_id["minLength"], trace_id["maxLength"]) == ("string", 32, 32)
    for name in ("decision", "result", "error", "approval", "question", "trace_id"):
        assert call["properties"][name].get("nullable") or ref(schema, call["properties"][name]).get("nullable"), name
    result = ref(schema, call["properties"]["result"])
    assert ref(schema, result["properties"]["state"])["enum"] == ["success", "error", "interrupted"]
    assert sorted(ref(schema, call["properties"]["error"])["required"]) == ["callId", "error", "errorType", "tool"]


def test_the_server_answers_201_where_it_creates(schema):
    for path in ("/api/v1/sessions", "/api/v1/tools", "/api/v1/groups", "/api/v1/bindings", "/api/v1/rules",
                 "/api/v1/queues", "/api/v1/datasets", "/api/v1/documents"):
        assert "201" in schema["paths"][path]["post"]["responses"], path
        assert "200" not in schema["paths"][path]["post"]["responses"] or path == "/api/v1/documents", path
    documents = schema["paths"]["/api/v1/documents"]["post"]["responses"]
    assert ref(schema, documents["202"]["content"]["application/json"]["schema"])["required"] == ["work"]


def test_errors_are_documented_in_the_envelope(schema):
    envelope = ref(schema, {"$ref": "#/components/schemas/Error"})
    assert envelope["required"] == ["error"]
    assert sorted(ref(schema, envelope["properties"]["error"])["required"]) == ["code", "fields", "message"]
    for path, method, operation in operations(schema):
        responses = operation["responses"]
        expected = {"401", "403", "429"}
        if "{" in path:
            expected.add("404")
        if "requestBody" in operation:
            expected |= {"400", "413"}
        assert expected <= set(responses), (method, path, sorted(responses))
        for status in expected:
            error = responses[status]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/Error"}, (method, path, status)
        assert "Retry-After" in responses["429"]["headers"]
    for path, method in (("/api/v1/sessions/{session_id}/calls", "post"), ("/api/v1/calls/{call_id}/cancel", "post"),
                         ("/api/v1/calls/{call_id}/result", "post"), ("/api/v1/approvals/{id}/decide", "post")):
        assert "409" in schema["paths"][path][method]["responses"], path


def test_request_bodies_require_what_the_server_requires(schema):
    submit = schema["paths"]["/api/v1/sessions/{session_id}/calls"]["post"]["requestBody"]
    assert submit["required"] is True
    one, batch = (ref(schema, shape) for shape in request(schema, "/api/v1/sessions/{session_id}/calls",
                                                          "post")["oneOf"])
    assert one["required"] == ["name"] and set(one["properties"]) == {"id", "name", "input", "wait", "tools",
                                                                      "tools_mode"}
    assert batch["required"] == ["calls"] and batch["properties"]["calls"]["minItems"] == 1
    assert batch["properties"]["wait"]["maximum"] == 60
    session = request(schema, "/api/v1/sessions", "post")
    assert session["required"] == ["agent"] and set(session["properties"]) == {"agent", "user", "user_id_token",
                                                                               "context", "tools", "tools_mode"}
    assert request(schema, "/api/v1/rules/evaluate", "post")["required"] == ["tool"]
    assert request(schema, "/api/v1/approvals/{id}/decide", "post")["required"] == ["decision"]
    assert request(schema, "/api/v1/calls/{call_id}/result", "post")["required"] == ["state"]
    rule = request(schema, "/api/v1/rules", "post")
    assert sorted(rule["required"]) == ["behavior", "tool_pattern"]
    assert rule["properties"]["agents"]["items"]["type"] == "string"
    assert "required" not in request(schema, "/api/v1/rules/{id}", "patch")
    documents = request(schema, "/api/v1/documents", "post")
    assert [shape.get("type") for shape in documents["oneOf"]] == ["array", None]


def test_security_is_a_bearer_api_key(schema):
    scheme = schema["components"]["securitySchemes"]["apiKey"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, method, operation in operations(schema):
        assert {"apiKey": []} in operation["security"], (method, path)


def test_each_operation_states_the_scope_its_view_enforces(schema):
    for path, method, operation in operations(schema):
        view = resolve(path.replace("{", "").replace("}", "")).func
        # A viewset's instance knows the action that serves this method.
        instance = view.cls(action=view.actions[method]) if hasattr(view, "actions") else view.cls()
        assert operation["x-required-scope"] == list(required_scopes(instance)), (method, path)
        assert operation["x-console-roles"] == list(console_roles(instance, method.upper())), (method, path)
        scopes = " or ".join(f"`{s}`" for s in operation["x-required-scope"])
        assert f"Needs an API key with the {scopes} scope" in operation["description"], (method, path)
    # `agent`: for the calls of tools the app declared (the view refuses other calls to such a key)
    assert schema["paths"]["/api/v1/calls/{call_id}/result"]["post"]["x-required-scope"] == ["external", "agent"]
    assert schema["paths"]["/api/v1/sessions/{session_id}/calls"]["post"]["x-required-scope"] == ["agent"]
    assert schema["paths"]["/api/v1/rules"]["post"]["x-required-scope"] == ["admin"]
    assert schema["paths"]["/api/v1/approvals/{id}/decide"]["post"]["x-console-roles"] == [
        "admin", "operator", "reviewer"]
    assert schema["paths"]["/api/v1/rules"]["get"]["x-console-roles"] == ["admin", "operator", "reviewer", "viewer"]


def test_mcp_servers_are_documented_with_write_only_credentials(schema):
    for path, methods in (("/api/v1/mcp-servers", {"get", "post"}),
                          ("/api/v1/mcp-servers/{id}", {"get", "put", "patch", "delete"}),
                          ("/api/v1/mcp-servers/{id}/sync", {"post"}), ("/api/v1/mcp-servers/{id}/test", {"post"})):
        assert set(schema["paths"][path]) & set(METHODS) == methods, path
        for method in methods:
            assert schema["paths"][path][method]["x-required-scope"] == ["admin"], (method, path)
    assert "201" in schema["paths"]["/api/v1/mcp-servers"]["post"]["responses"]
    server = body(schema, "/api/v1/mcp-servers/{id}", "get", 200)
    assert {"header_names", "env_names", "status", "last_error", "last_synced_at", "tools"} <= set(server["properties"])
    assert not {"headers", "env"} & set(server["properties"])  # never in an answer
    sent = request(schema, "/api/v1/mcp-servers", "post")
    assert sorted(sent["required"]) == ["name", "transport"]
    for name in ("headers", "env"):
        assert sent["properties"][name]["writeOnly"] is True
        assert sent["properties"][name]["additionalProperties"] == {"type": "string"}
    assert "required" not in request(schema, "/api/v1/mcp-servers/{id}", "patch")
    sync = body(schema, "/api/v1/mcp-servers/{id}/sync", "post", 200)
    assert sorted(sync["required"]) == ["server", "sync"]
    counts = ref(schema, sync["properties"]["sync"])
    assert sorted(counts["required"]) == ["added", "disabled", "error", "held", "prompts", "skipped", "status",
                                         "updated"]
    prompts = ref(schema, counts["properties"]["prompts"])
    assert sorted(prompts["required"]) == ["added", "removed", "skipped", "updated"]
    assert "requestBody" not in schema["paths"]["/api/v1/mcp-servers/{id}/sync"]["post"]


def _api_routes(resolver: URLResolver, prefix: str = ""):
    for pattern in resolver.url_patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _api_routes(pattern, route)
        elif isinstance(pattern, URLPattern) and route.startswith("api/v1/"):
            yield route


def test_every_api_route_is_in_the_schema(schema):
    documented = set(schema["paths"])
    routes = list(_api_routes(get_resolver()))
    assert len(routes) >= 25
    for route in routes:
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", route)  # router patterns
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", path).replace("{pk}", "{id}")  # path converters
        path = "/" + path.replace("^", "").replace("$", "")
        assert path in documented, route


def test_the_notification_routes_are_documented_and_credentials_only_written(schema):
    for path in ("/api/v1/notify-channels", "/api/v1/notify-channels/{id}", "/api/v1/notify-channels/{id}/test",
                 "/api/v1/notify-deliveries", "/api/v1/notify-deliveries/{id}", "/api/v1/notify-settings"):
        assert path in schema["paths"], path
    shown = body(schema, "/api/v1/notify-channels/{id}", "get", 200)["properties"]
    assert "url" not in shown and "signing_secret" not in shown and "host" in shown
    written = request(schema, "/api/v1/notify-channels", "post")["properties"]
    assert {"url", "signing_secret"} <= set(written)
    assert set(body(schema, "/api/v1/notify-deliveries/{id}", "get", 200)["properties"]) >= {
        "status", "attempts", "last_error"}
