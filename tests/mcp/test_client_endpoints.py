"""What a proxied call no longer computes or sends each time (docs/notes/mcp.md, "MCP servers — client"): an
endpoint is built once per shape of its server (its secrets' values included) and kept, and the host process is
sent an endpoint's description once, then its number. Whatever changes (a secret, a field, the signing key)
makes another endpoint, which the host is sent whole and uses."""
import uuid

import pytest

from tests.mcp.test_client import endpoint, unsaved_server  # noqa: F401  (the fixture)
from tools.upstream import client as mcp_client
from tools.upstream.client import endpoint_of, mcp_call_tool


@pytest.fixture(autouse=True)
def _host_mode(settings):
    settings.TOOLKEEPER_MCP_CLIENT_PROCESS = True


def test_an_endpoint_is_built_once_per_shape_and_again_when_anything_it_reads_changes(settings):
    fields = {"id": 77_001, "transport": "streamable_http", "url": "https://mcp.example.com/mcp",
              "headers": {"Authorization": "Bearer one"}, "timeout_s": 30, "name": "kept"}
    first = endpoint_of(unsaved_server(**fields))
    assert endpoint_of(unsaved_server(**fields)) is first  # another row object of the same server: the kept one
    assert first.ref > 0

    rotated = endpoint_of(unsaved_server(**{**fields, "headers": {"Authorization": "Bearer two"}}))
    assert rotated is not first and rotated.key != first.key and rotated.ref != first.ref
    assert dict(rotated.headers) == {"Authorization": "Bearer two"}

    slower = endpoint_of(unsaved_server(**{**fields, "timeout_s": 5}))  # same connection, another description
    assert slower.key == first.key and slower.ref != first.ref and slower.timeout_s == 5.0

    person = endpoint_of(unsaved_server(**fields), bearer="person-token", account="user:1")
    assert person.headers["Authorization"] == "Bearer person-token" and person.account == "user:1"
    assert endpoint_of(unsaved_server(**fields), bearer="renewed", account="user:1").headers["Authorization"] \
        == "Bearer renewed"

    settings.SECRET_KEY = "another-signing-key-" + "x" * 40
    resigned = endpoint_of(unsaved_server(**fields))
    assert resigned.key != first.key  # the key is an HMAC under the signing key


def test_a_row_changed_in_place_is_another_shape():
    server = unsaved_server(transport="streamable_http", url="https://mcp.example.com/mcp",
                            headers={"X-Api-Key": "old"})
    before = endpoint_of(server)
    server.headers["X-Api-Key"] = "new"
    after = endpoint_of(server)
    assert after is not before and after.headers["X-Api-Key"] == "new" and after.key != before.key


def _frames(monkeypatch) -> list[dict]:
    """Every message this process sends its host from now on."""
    host = mcp_client._host()
    sent: list[dict] = []
    real = host.child.send

    def send(message: dict) -> None:
        sent.append(message)
        real(message)

    monkeypatch.setattr(host.child, "send", send)
    return sent


def _calls(frames: list[dict]) -> list[dict]:
    return [frame for frame in frames if frame.get("op") == "call"]


def test_the_host_is_sent_a_description_once_then_its_number_and_a_new_secret_is_sent_and_used(
        endpoint, http_server, monkeypatch):  # noqa: F811
    server_id = 77_100 + uuid.uuid4().int % 1000
    old, new = f"old-{uuid.uuid4().hex}", f"new-{uuid.uuid4().hex}"
    target = endpoint("streamable_http", id=server_id, headers={"Authorization": f"Bearer {old}"})
    frames = _frames(monkeypatch)

    for n in (1, 2, 3):
        assert mcp_call_tool(target, "echo", {"n": n}, timeout_s=20)["structured"] == {"n": n}
    calls = _calls(frames)
    assert isinstance(calls[0]["endpoint"], dict) and calls[0]["endpoint"]["headers"] == {
        "Authorization": f"Bearer {old}"}
    assert [frame["endpoint"] for frame in calls[1:]] == [target.ref, target.ref]  # by number, no secret
    assert sum(old in str(frame) for frame in frames) == 1

    rotated = endpoint("streamable_http", id=server_id, headers={"Authorization": f"Bearer {new}"})
    assert rotated.ref != target.ref
    marker = uuid.uuid4().hex
    assert mcp_call_tool(rotated, "echo", {"marker": marker}, timeout_s=20)["structured"] == {"marker": marker}
    assert _calls(frames)[-1]["endpoint"]["headers"] == {"Authorization": f"Bearer {new}"}
    seen = [e["authorization"] for e in http_server.log.calls("echo") if e["arguments"] == {"marker": marker}]
    assert seen == [f"Bearer {new}"]


def test_past_the_bound_the_host_forgets_the_oldest_description_and_is_sent_it_again(endpoint, monkeypatch):  # noqa: F811
    monkeypatch.setattr(mcp_client, "ENDPOINTS_KEPT", 2)
    targets = [endpoint("streamable_http", timeout_s=20 + n) for n in range(3)]
    frames = _frames(monkeypatch)
    host = mcp_client._host()
    for target in targets:
        mcp_call_tool(target, "echo", {}, timeout_s=20)
    assert {"op": "forget", "endpoint": targets[0].ref} in frames
    assert list(host.endpoints) == [targets[1].ref, targets[2].ref]

    assert mcp_call_tool(targets[0], "echo", {"again": 1}, timeout_s=20)["structured"] == {"again": 1}
    assert isinstance(_calls(frames)[-1]["endpoint"], dict)  # sent whole again, and used


def test_a_plain_text_block_is_converted_without_the_model_and_every_block_as_the_model_dumps_it():
    import mcp_types as types

    blocks = [types.TextContent(type="text", text="plain"), types.TextContent(type="text", text=""),
              types.TextContent(type="text", text="noted", annotations=types.Annotations(priority=0.5)),
              types.TextContent(type="text", text="meta", _meta={"a": 1}),
              types.ImageContent(type="image", data="AAAA", mime_type="image/png")]
    for block in blocks:
        assert mcp_client._content_json(block) == block.model_dump(mode="json", by_alias=True, exclude_none=True)
