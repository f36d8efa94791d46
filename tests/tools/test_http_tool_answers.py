"""An HTTP tool's answer: one over the transport's size limit is a permanent failure, never retried (whether
its Content-Length announced it or only what arrived showed it); a JSON answer is read as structure only within
the bounds on the work of reading it (tools.http_tools.services, ANSWER_JSON_MAX_BYTES and ANSWER_JSON_MAX_NODES)."""

import pytest

from tests.tools.http_endpoint import serve
from tests.tools.support import wait_terminal
from tools.calls import aftercare
from tools.catalog.services import tool_update
from tools.http_tools import services as http_tools
from tools.http_tools.services import HttpSource, http_tool_create
from tools.models import CallStatus, Tool, ToolCall, ToolGroup
from tools.python.decorators import ToolError

LIMIT = 4096
SCHEMA = {"properties": {"note": {"type": "string"}, "values": {"type": "array"}}}


@pytest.fixture
def endpoint(settings):
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES = LIMIT
    yield from serve()


def make(world, url: str, name: str = "answers") -> Tool:
    return http_tool_create(tenant=world.a.tenant, name=name, input_schema=SCHEMA, method="POST", url=url,
                            idempotent=True)


def invoke(tool: Tool, arguments: dict) -> dict:
    return HttpSource().invoke(Tool.objects.for_tenant(tool.tenant_id).get(pk=tool.pk), arguments, None)


# Over the limit: announced by Content-Length (the echo of a long note), or only seen as it streams in.
OVER_LIMIT = {"announced": ("/echo", {"note": "n" * 2 * LIMIT}), "streamed": (f"/stream/{4 * LIMIT}", {})}


@pytest.mark.django_db
@pytest.mark.parametrize("how", sorted(OVER_LIMIT))
def test_an_answer_over_the_limit_is_a_permanent_failure(world, endpoint, how):
    path, arguments = OVER_LIMIT[how]
    tool = make(world, endpoint.url + path)
    with pytest.raises(ToolError) as caught:
        invoke(tool, arguments)
    assert caught.value.error_type == "HttpError" and "refused" in str(caught.value)
    assert f"{LIMIT}" in str(caught.value)  # names the limit
    assert not caught.value.transient and not aftercare.error_is_transient(caught.value)
    assert len(endpoint.received) == 1


@pytest.mark.usefixtures("drain_calls")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("path", "arguments", "requests"), [
    (*OVER_LIMIT["announced"], 1),
    (*OVER_LIMIT["streamed"], 1),
    ("/busy", {}, 3),  # the control: a 503 is transient, so the same tool is retried
])
def test_a_tool_with_retries_sends_an_over_limit_request_once(world, endpoint, path, arguments, requests):
    tool = make(world, endpoint.url + path)
    tool_update(tool=tool, retry_max=2, retry_backoff_s=0)
    ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").tools.add(tool)
    response = world.a.client("agent").post(f"/api/v1/sessions/{world.a.session.pk}/calls",
                                            {"id": "big", "name": tool.name, "input": arguments}, format="json")
    assert response.status_code == 200, response.content
    done = wait_terminal(response.json()["calls"][0]["id"], tenant=world.a.tenant)
    assert done.status == CallStatus.FAILED and done.error["errorType"] == "HttpError", done.error
    assert len(endpoint.received) == requests
    assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=done.pk).attempts == requests


# --- a JSON answer within the limit: structure only within the bounds of reading it -------------------------

def counting(monkeypatch) -> list[dict]:
    """Each parse of an answer (`json_parse`), with the bounds it was given."""
    seen = []
    real = http_tools.json_parse

    def parse(text, **bounds):
        seen.append({"bytes": len(text), **bounds})
        return real(text, **bounds)

    monkeypatch.setattr(http_tools, "json_parse", parse)
    return seen


@pytest.mark.django_db
def test_a_json_answer_of_too_many_values_is_text(world, endpoint, settings, monkeypatch):
    settings.TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES = 1024 * 1024
    monkeypatch.setattr(http_tools, "ANSWER_JSON_MAX_NODES", 50)
    parsed = counting(monkeypatch)
    tool = make(world, endpoint.url + "/echo")
    assert invoke(tool, {"values": [1] * 10})["structured"]["body"] == {"values": [1] * 10}
    result = invoke(tool, {"values": [1] * 1000})
    assert [p["max_nodes"] for p in parsed] == [50, 50]
    assert result["structured"] is None and '"values": [1, 1, 1' in result["content"][0]["text"]


@pytest.mark.django_db
def test_a_json_answer_over_the_byte_bound_is_text_without_being_parsed(world, endpoint, settings, monkeypatch):
    settings.TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES = 1024 * 1024
    monkeypatch.setattr(http_tools, "ANSWER_JSON_MAX_BYTES", 2000)
    parsed = counting(monkeypatch)
    tool = make(world, endpoint.url + "/echo", name="bounded")
    assert invoke(tool, {"note": "x" * 100})["structured"]["body"] == {"note": "x" * 100}
    result = invoke(tool, {"note": "x" * 3000})
    assert len(parsed) == 1  # the second answer, over 2000 bytes, was never parsed
    assert result["structured"] is None and '"note": "' + "x" * 3000 in result["content"][0]["text"]
