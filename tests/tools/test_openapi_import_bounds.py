"""The OpenAPI import cannot stall the server (tools.http_tools.services): the document is read by common.documents
within the import's bounds, which stop the reading at the first event past one, and the tools' input schemas
carry only the components they use, within a budget of values for the whole import. No timed assertions: the
work is counted (the parser's events, the schema values checked)."""
import json
import random

import pytest
import yaml

from common import documents
from common.errors import ServiceError
from tests.document_events import counted_events
from tools.http_tools import services as http_tools
from tools.http_tools.services import (
    IMPORT_MAX_BYTES,
    IMPORT_MAX_NODES,
    IMPORT_SCHEMA_VALUES_MAX,
    http_tools_import,
    openapi_parse,
)
from tools.models import Tool

URL = "/api/v1/http-tools/import"
PUBLIC = "https://93.184.215.14"
HEAD = "openapi: 3.0.0\npaths: {}\nx: "
ROOM = IMPORT_MAX_BYTES - 64
ISSUE = "openapi: 3.0.0\nx: " + "[" * 5000 + "]" * 5000  # 10 KB that took 8-55 s of CPU


@pytest.fixture
def events(monkeypatch):
    """How many events the document's parser handed out."""
    return counted_events(monkeypatch)


def refused(text: str) -> str:
    with pytest.raises(ServiceError) as caught:
        openapi_parse(text)
    return " ".join(caught.value.fields["document"])


@pytest.mark.parametrize("text", [
    ISSUE,
    HEAD + "[" * (ROOM // 2) + "]" * (ROOM // 2),
    HEAD + "{a: " * (ROOM // 5) + "1" + "}" * (ROOM // 5),
    "openapi: 3.0.0\npaths: {}\nx:\n  " + "- " * (ROOM // 2) + "1",
], ids=["issue's 10 KB", "flow [", "flow {a:", "block - - -"])
def test_a_deep_document_is_refused_at_the_nesting_bound(events, text):
    assert refused(text) == "the document is nested more than 64 levels deep (lists and mappings inside one another)"
    assert events["events"] <= 2 * 64 + 10, events  # the levels up to the bound, not the whole document


@pytest.mark.parametrize("text", [
    HEAD + "[" + "1," * (ROOM // 2) + "1]",
    "openapi: 3.0.0\npaths: {}\nx:\n" + "- 1\n" * (ROOM // 4),
    HEAD + "[" + "[]," * (ROOM // 3) + "[]]",
], ids=["flow [1,1,1", "block - 1", "empty lists"])
def test_a_document_of_too_many_values_is_refused_at_the_bound(events, text):
    assert refused(text) == (f"the document is more than {IMPORT_MAX_NODES} values (scalars, keys, lists and "
                             "mappings)")
    assert events["events"] <= 2 * IMPORT_MAX_NODES + 10, events


def test_json_is_held_to_the_same_bounds():
    assert refused('{"x": ' + "[" * 5000 + "]" * 5000 + "}") == "JSON may be nested at most 64 levels deep"
    assert refused('{"x": [' + "1," * (ROOM // 2) + "1]}") == (
        f"JSON may hold at most {IMPORT_MAX_NODES} values (scalars, keys, arrays and objects)")


def test_anchors_are_refused_at_the_first(events):
    text = "openapi: 3.0.0\npaths: {}\n" + "".join(f"a{i}: &a{i} 1\n" for i in range(ROOM // 20))
    assert refused(text) == "YAML anchors and aliases (&name, *name) are not accepted; write the values out"
    assert events["events"] <= 10


# --- a realistic document of the size limit is read ---------------------------------------------------

def realistic(resources: int) -> dict:
    """An OpenAPI document in the shape real ones have: described component schemas, CRUD operations."""
    rng = random.Random(7)
    words = ["account", "issue", "label", "owner", "state", "created", "name", "team", "branch", "token"]

    def text(n):
        return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."

    document = {"openapi": "3.0.3", "info": {"title": "Generated", "version": "1"},
                "servers": [{"url": PUBLIC}], "paths": {}, "components": {"schemas": {}}}
    for n in range(resources):
        kinds = [rng.choice(["string", "integer", "boolean"]) for _ in range(rng.randint(4, 12))]
        document["components"]["schemas"][f"Thing{n}"] = {"type": "object", "required": ["p0"], "properties": {
            f"p{i}": {"type": kind, "description": text(rng.randint(3, 10))} for i, kind in enumerate(kinds)}}
        document["paths"][f"/things{n}/{{id}}"] = {
            "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}],
            "get": {"operationId": f"get{n}", "summary": text(5), "responses": {"200": answer(n)}},
            "put": {"operationId": f"put{n}", "summary": text(5), "responses": {"200": answer(n)},
                    "requestBody": {"content": {"application/json": {"schema": reference(n)}}}}}
    return document  # no object in it twice: YAML would write an anchor and an alias


def reference(n: int) -> dict:
    return {"$ref": f"#/components/schemas/Thing{n}"}


def answer(n: int) -> dict:
    return {"description": "OK", "content": {"application/json": {"schema": reference(n)}}}


def values_of(value) -> int:
    if isinstance(value, dict):
        return 1 + sum(1 + values_of(item) for item in value.values())
    if isinstance(value, list):
        return 1 + sum(values_of(item) for item in value)
    return 1


@pytest.mark.parametrize("form", ["yaml", "compact json"])
def test_a_realistic_document_of_the_size_limit_is_read(form):
    dumper = yaml.CSafeDumper if documents.CParser is not None else yaml.SafeDumper
    render = (lambda d: yaml.dump(d, Dumper=dumper, sort_keys=False, width=120)) if form == "yaml" else (
        lambda d: json.dumps(d, separators=(",", ":")))
    per_resource = len(render(realistic(50)).encode()) / 50
    resources = int(IMPORT_MAX_BYTES / per_resource)
    while len((text := render(realistic(resources))).encode()) > IMPORT_MAX_BYTES:
        resources -= max(1, resources // 50)
    value = openapi_parse(text)
    assert len(text.encode()) > 0.95 * IMPORT_MAX_BYTES
    assert values_of(value) > 60_000  # a document of the size limit, and still well under the bound
    read = yaml.load(text, Loader=yaml.CSafeLoader) if documents.CParser is not None else yaml.safe_load(text)
    assert value == json.loads(json.dumps(read))  # as PyYAML reads it


# --- what an import makes of the document: bounded too ------------------------------------------------

def component(properties: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 10} for i in range(properties)}}


@pytest.mark.django_db
def test_a_tool_carries_only_the_components_it_uses(world):
    document = {"openapi": "3.0.0", "paths": {"/a": {"post": {"operationId": "makeA", "requestBody": {
        "content": {"application/json": {"schema": {"type": "object", "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/A"}}}}}}}}}},
        "components": {"schemas": {"A": {"type": "object", "properties": {"b": {"$ref": "#/components/schemas/B"}}},
                                   "B": {"type": "string"}, "Unused": component(5)}}}
    [entry] = http_tools_import(tenant=world.a.tenant, document=json.dumps(document), base_url=PUBLIC)
    assert entry["created"], entry
    schema = Tool.objects.for_tenant(world.a.tenant).get(name="makeA").input_schema
    assert schema["$defs"] == {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}},
                               "B": {"type": "string"}}


@pytest.mark.django_db
def test_a_component_every_operation_uses_is_copied_within_the_budget(world, monkeypatch):
    """200 operations that all reference a component of 1,000 properties: each tool would carry it (and its
    schema be checked, ~40 µs a value). The import copies and checks at most IMPORT_SCHEMA_VALUES_MAX values
    and reports the rest."""
    checked = []
    real = http_tools.declared_object_schema
    monkeypatch.setattr(http_tools, "declared_object_schema",
                        lambda schema, errors, field: checked.append(values_of(schema)) or real(schema, errors, field))
    operation = {"requestBody": {"content": {"application/json": {"schema": {"type": "object", "properties": {
        "items": {"type": "array", "items": {"$ref": "#/components/schemas/Big"}}}}}}}}
    document = {"openapi": "3.0.0", "paths": {f"/r{i}": {"post": {**operation, "operationId": f"op{i}"}}
                                              for i in range(200)},
                "components": {"schemas": {"Big": component(1000)}}}
    report = http_tools_import(tenant=world.a.tenant, document=json.dumps(document), base_url=PUBLIC)
    assert len(report) == 200
    over = [entry for entry in report if f"at most {IMPORT_SCHEMA_VALUES_MAX} values" in entry["reason"]]
    assert len(over) >= 190 and not any(entry["created"] for entry in over)
    assert sum(checked) <= IMPORT_SCHEMA_VALUES_MAX + 200, (len(checked), sum(checked))


# --- through the API ------------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize(("document", "words"), [
    (ISSUE, "nested more than 64 levels deep"),
    (HEAD + "[" + "1," * 300_000 + "1]", f"more than {IMPORT_MAX_NODES} values"),
    ("openapi: 3.0.0\npaths: {}\nx: &a [1]\ny: *a\n", "anchors and aliases"),
])
def test_the_import_answers_400_naming_the_bound(world, events, document, words):
    response = world.a.client("admin").post(URL, {"document": document, "base_url": PUBLIC}, format="json")
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()["error"]["fields"]["document"]), response.json()
    assert events["events"] <= 2 * IMPORT_MAX_NODES + 10
