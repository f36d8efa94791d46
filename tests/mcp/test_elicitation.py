"""Confirm rules over `/mcp/` (docs/mcp.md, "Elicitation"): the SDK client's elicitation callback is asked the
question (form mode) in both protocol eras and its answer decides the call; a client without elicitation gets an
`awaiting_user` error result with the question, and the app answers over REST."""
import json

import anyio
import httpx2
import pytest
from mcp import types
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.live.server import LiveServer
from tests.mcp.test_endpoint import rest

pytestmark = pytest.mark.live

AGENT = "confirm-bot"


@pytest.fixture(scope="module")
def server():
    with LiveServer(extra_env={"TOOLKEEPER_MCP_HEARTBEAT_S": "0.2", "TOOLKEEPER_MCP_MAX_WAIT_S": "20"}) as live:
        status, rule = rest(live, "POST", "/api/v1/rules", {
            "behavior": "confirm", "tool_pattern": "current_time", "agents": [AGENT], "note": "the user says"},
            key=live.admin_api_key)
        assert status == 201, rule
        yield live


# The client's mode: the protocol version our /mcp/ then speaks with it. "auto" discovers the 2026 era (no
# handshake): its questions come back as `input_required` results, answered on the tools/call's retry.
MODES = {"legacy": "2025-11-25", "auto": "2026-07-28", "2026-07-28": "2026-07-28"}
ANSWERED_BY = {"2025-11-25": "response", "2026-07-28": "inputResponses"}


def run(server, work, *, mode: str, answer=None):
    """`work(client)` with an SDK client of AGENT; `answer(params)` is its elicitation callback (None: the client
    declares no elicitation). Returns (what work returns, the questions the callback was asked, how the client
    sent its answers: "inputResponses" on a 2026-era retry, "response" as a 2025-era JSON-RPC response); asserts
    the protocol era the connection speaks."""
    asked, answered = [], []

    async def sent(request):
        try:
            message = json.loads(request.content or b"null")
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if message.get("method") == "tools/call" and (message.get("params") or {}).get("inputResponses"):
            assert all(key.startswith("tk-ask.") for key in message["params"]["inputResponses"])
            answered.append("inputResponses")
        elif "method" not in message and str(message.get("id", "")).startswith("tk-ask."):
            answered.append("response")

    async def elicit(context, params):
        asked.append(params)
        return answer(params)

    async def main():
        http_client = httpx2.AsyncClient(headers={**server.headers(), "X-Toolkeeper-Agent": AGENT}, timeout=30,
                                         event_hooks={"request": [sent]})
        transport = streamable_http_client(f"{server.url}/mcp/", http_client=http_client)
        async with Client(transport, mode=mode, elicitation_callback=elicit if answer else None) as client:
            assert client.protocol_version == MODES[mode]
            return await work(client)

    return anyio.run(main), asked, answered


def calling(client):
    return client.call_tool("current_time", {"timezone": "UTC"})


@pytest.mark.parametrize("mode", list(MODES))
def test_accept_runs_the_call(server, mode):
    result, asked, answered = run(server, calling, mode=mode, answer=lambda params: types.ElicitResult(
        action="accept", content={"confirm": True}))
    assert result.is_error is not True, result
    assert answered == [ANSWERED_BY[MODES[mode]]]
    [question] = asked
    assert "current_time" in question.message and '"timezone": "UTC"' in question.message
    assert question.requested_schema["properties"]["confirm"]["type"] == "boolean"


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(("action", "error_type"), [("decline", "UserDeclined"), ("cancel", "UserCancelled")])
def test_decline_and_cancel_end_the_call(server, mode, action, error_type):
    result, asked, answered = run(server, calling, mode=mode, answer=lambda params: types.ElicitResult(action=action))
    assert len(asked) == 1 and answered == [ANSWERED_BY[MODES[mode]]]
    assert result.is_error is True and result.structured_content["errorType"] == error_type


@pytest.mark.parametrize("mode", list(MODES))
def test_a_client_without_elicitation_gets_the_question_and_the_app_answers(server, mode):
    result, _, answered = run(server, calling, mode=mode)
    assert result.is_error is True and answered == []
    waiting = result.structured_content
    assert waiting["status"] == "awaiting_user" and waiting["expires_at"]
    assert waiting["question"]["tool"] == "current_time" and waiting["question"]["input"] == {"timezone": "UTC"}
    status, call = rest(server, "POST", f"/api/v1/calls/{waiting['id']}/answer", {"action": "accept"})
    assert status == 200, call
    status, call = rest(server, "GET", f"/api/v1/calls/{waiting['id']}?wait=10")
    assert call["status"] == "succeeded", json.dumps(call)
