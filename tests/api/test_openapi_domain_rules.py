"""Rules of the domain that the OpenAPI document states, so that whatever request the fuzzer draws as valid
the API takes (docs/notes/entry-and-admission.md, "OpenAPI and fuzzing"); and the fuzz run's departures
(tests/fuzz/departures.toml) cover the rules the document cannot state, and nothing beside them.
"""
import json
import re

import jsonschema
import pytest
from rest_framework.exceptions import ValidationError

from tests.fuzz.schemathesis_run import Finding, load_departures, triage
from tools.api.serializers import CallBatchSerializer, GroupSerializer


def component_validator(schema, name: str) -> jsonschema.Draft4Validator:
    """A validator of the component `name`, its references resolved in the document."""
    return jsonschema.Draft4Validator({"$ref": f"#/components/schemas/{name}", "components": schema["components"]})


def serializer_takes(field, value) -> bool:
    try:
        field.run_validation(value)
    except ValidationError:
        return False
    return True


SKILL_NAMES = ["", "a", "web-search", "a1-b2", "-", "x" * 64, "A", "Web", "a b", " a", "a\n", "a_b", "a.b",
               "é", "a\x00", "x" * 65]


def test_a_groups_skill_has_the_serializers_pattern_in_the_document(schema):
    field = GroupSerializer().fields["skill"]
    for component in ("GroupRequest", "PatchedGroupRequest"):
        named, blank = schema["components"]["schemas"][component]["properties"]["skill"]["oneOf"]
        assert blank == {"type": "string", "maxLength": 0}
        pattern = named["pattern"]
        assert pattern.startswith("^") and pattern.endswith("$")
        for value in SKILL_NAMES:
            # JSON Schema reads `$` as the end of the text (ECMA-262), where Python's `$` would allow a last \n
            in_document = value == "" or (len(value) <= named["maxLength"]
                                          and re.fullmatch(pattern[1:-1], value) is not None)
            assert in_document == serializer_takes(field, value), (component, value)


@pytest.mark.parametrize(("body", "taken"), [
    ({"name": "current_time"}, True),
    ({"name": "current_time", "tools_mode": "add"}, False),
    ({"name": "current_time", "tools": [], "tools_mode": "replace"}, True),
    ({"calls": [{"name": "current_time"}], "tools_mode": "replace"}, False),
    ({"calls": [{"name": "current_time"}], "tools": [{"name": "lookup"}], "tools_mode": "add"}, True),
])
def test_tools_mode_comes_with_tools_in_the_document_as_in_the_serializer(schema, body, taken):
    assert component_validator(schema, "CallSubmitRequest").is_valid(body) is taken
    assert CallBatchSerializer(data=body).is_valid() is taken


def _finding(operation: str, response, request_body: str) -> Finding:
    return Finding(key="admin", operation=operation, check="positive_data_acceptance", title="", status=
                   response.status_code, request_body=request_body, response_body=response.content.decode(),
                   curl="")


def test_retry_max_of_a_tool_that_is_not_idempotent_is_a_departure_of_its_operations_only(world):
    departures = load_departures()
    tool = world.a.tools["todo_write"]
    assert not tool.idempotent
    body = {"retry_max": 1}
    response = world.a.client("admin").patch(f"/api/v1/tools/{tool.pk}", body, format="json")
    assert response.status_code == 400 and "retry_max" in response.json()["error"]["fields"]
    for operation in ("PATCH /api/v1/tools/{id}", "PUT /api/v1/tools/{id}"):
        assert triage([_finding(operation, response, json.dumps(body))], departures) == []
    # The same refusal elsewhere would be a new problem, not this rule.
    assert triage([_finding("PATCH /api/v1/http-tools/{id}", response, json.dumps(body))], departures)


def test_a_nul_refusal_is_a_departure_only_when_the_body_holds_a_nul(world):
    departures = load_departures()
    body = json.dumps({"agent": "fuzz\u0000bot"})
    assert "\\u0000" in body
    response = world.a.client().post("/api/v1/sessions", body, content_type="application/json")
    assert response.status_code == 400 and "NUL" in response.json()["error"]["message"]
    assert triage([_finding("POST /api/v1/sessions", response, body)], departures) == []
    # The NUL message for a body without one is not the NUL rule.
    assert triage([_finding("POST /api/v1/sessions", response, json.dumps({"agent": "fuzz-bot"}))], departures)
