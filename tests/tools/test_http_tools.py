"""HTTP tools (tools.http_tools.services): the request a call makes, how the answer becomes the result, the SSRF guard,
secrets never shown, and the checks of the services. Calls through the API and the executor:
tests/api/test_http_tools_api.py."""
import json

import pytest

from audit.models import Event
from common.errors import ServiceError
from tests.tools.http_endpoint import serve
from tools.http_tools.services import (
    IMPORT_MAX_BYTES,
    HttpSource,
    http_tool_create,
    http_tool_delete,
    http_tool_update,
    http_tools_import,
)
from tools.models import HttpEndpoint, Tool
from tools.python.decorators import ToolError

pytestmark = pytest.mark.django_db

TOKEN = "tok-5ecret-9d41c"  # noqa: S105
SCHEMA = {"properties": {"repo": {"type": "string"}, "count": {"type": "integer"}, "tags": {"type": "array"},
                         "note": {"type": "string"}}, "required": ["repo"]}
PUBLIC = "https://93.184.215.14"


@pytest.fixture
def endpoint(settings):
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    yield from serve()


def make(world, url=PUBLIC, **fields):
    values = {"name": "repo_lookup", "input_schema": SCHEMA, "method": "POST", "url": url,
              "headers": {"Authorization": "Bearer {secret:token}", "X-Team": "core"},
              "secrets": {"token": TOKEN}, **fields}
    return http_tool_create(tenant=world.a.tenant, **values)


def invoke(tool, arguments):
    return HttpSource().invoke(Tool.objects.for_tenant(tool.tenant_id).get(pk=tool.pk), arguments, None)


def test_the_request_is_built_from_the_arguments(world, endpoint):
    tool = make(world, endpoint.url + "/echo/{repo}/issues?state=open", query={"n": "{count}", "tag": "{tags}"},
                body={"title": "{note}", "count": "{count}", "label": "repo {repo}", "fixed": [1, "{missing}"]},
                input_schema={**SCHEMA, "properties": {**SCHEMA["properties"], "missing": {"type": "string"}}})
    result = invoke(tool, {"repo": "../a/b?c#d", "count": 3, "tags": ["x", "y z"], "note": "hi"})
    [sent] = endpoint.received
    assert sent.method == "POST"
    assert sent.path == "/echo/..%2Fa%2Fb%3Fc%23d/issues"  # one segment, whatever the argument holds
    assert sent.query == [("state", "open"), ("n", "3"), ("tag", "x"), ("tag", "y z")]
    assert json.loads(sent.body) == {"title": "hi", "count": 3, "label": "repo ../a/b?c#d", "fixed": [1]}
    assert sent.headers["Authorization"] == f"Bearer {TOKEN}" and sent.headers["X-Team"] == "core"
    assert result["state"] == "success" and result["structured"]["items"] == [{"id": 7}, {"id": 8}]
    assert TOKEN not in json.dumps(result)  # the endpoint echoed the header back
    assert result["structured"]["authorization"] == "Bearer [hidden]"


def test_a_dot_segment_argument_stays_a_segment(world, endpoint):
    tool = make(world, endpoint.url + "/echo/{repo}/x", method="GET")
    invoke(tool, {"repo": ".."})
    assert endpoint.received[0].path == "/echo/%2E%2E/x"


def test_without_a_body_template_the_unused_arguments_are_the_body(world, endpoint):
    tool = make(world, endpoint.url + "/echo/{repo}", query={"n": "{count}"})
    invoke(tool, {"repo": "r", "count": 2, "note": "n", "tags": ["t"]})
    assert json.loads(endpoint.received[0].body) == {"note": "n", "tags": ["t"]}
    get = make(world, endpoint.url + "/echo/{repo}", name="repo_get", method="GET")
    invoke(get, {"repo": "r", "note": "n"})
    assert endpoint.received[1].method == "GET" and endpoint.received[1].body == b""


def test_a_pointer_picks_the_result_and_text_stays_text(world, endpoint):
    tool = make(world, endpoint.url + "/echo", response={"pointer": "/items/1"})
    assert invoke(tool, {"repo": "r"})["structured"] == {"id": 8}
    text = make(world, endpoint.url + "/text", name="plain")
    assert invoke(text, {"repo": "r"}) == {"state": "success", "content": [{"type": "text", "text": "plain words"}],
                                           "structured": None}
    missing = make(world, endpoint.url + "/echo", name="nothing_there", response={"pointer": "/items/9"})
    with pytest.raises(ToolError, match="nothing at /items/9"):
        invoke(missing, {"repo": "r"})


def test_an_answer_shaped_like_a_result_is_data(world, endpoint):
    tool = make(world, endpoint.url + "/echo", body={"state": "error", "content": "{note}"})
    result = invoke(tool, {"repo": "r", "note": "x"})
    assert result["state"] == "success" and result["structured"]["body"] == {"state": "error", "content": "x"}
    shaped = make(world, endpoint.url + "/echo", name="shaped", response={"pointer": "/body"},
                  body={"state": "error", "content": []})
    assert invoke(shaped, {"repo": "r"}) == {
        "state": "success", "content": [{"type": "text", "text": '{"state": "error", "content": []}'}],
        "structured": {"state": "error", "content": []}}


def test_an_error_status_names_it_without_the_secret(world, endpoint):
    failing = make(world, endpoint.url + "/fail")
    with pytest.raises(ToolError) as caught:
        invoke(failing, {"repo": "r"})
    assert caught.value.error_type == "HttpError" and not caught.value.transient
    assert "HTTP 500" in str(caught.value) and "boom, you sent Bearer [hidden]" in str(caught.value)
    assert TOKEN not in str(caught.value)
    busy = make(world, endpoint.url + "/busy", name="busy")
    with pytest.raises(ToolError) as caught:
        invoke(busy, {"repo": "r"})
    assert "HTTP 503" in str(caught.value) and caught.value.transient


def test_a_redirect_is_not_followed_and_fails_the_call(world, endpoint):
    moved = make(world, endpoint.url + "/moved", name="moved")
    with pytest.raises(ToolError) as caught:
        invoke(moved, {"repo": "r"})
    assert caught.value.error_type == "HttpError" and "HTTP 302" in str(caught.value)
    assert "not followed" in str(caught.value)
    assert [r.path for r in endpoint.received] == ["/moved"]  # nothing went to where it pointed


def test_nothing_listening_is_a_transient_failure(world, endpoint):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    tool = make(world, f"http://127.0.0.1:{port}/x")
    with pytest.raises(ToolError) as caught:
        invoke(tool, {"repo": "r"})
    assert caught.value.error_type == "HttpUnavailable" and caught.value.transient


@pytest.mark.parametrize("url", ["http://127.0.0.1:{port}/echo", "http://169.254.169.254/latest/meta-data/"])
def test_the_guard_refuses_at_request_time(world, endpoint, settings, url):
    """Rows saved while the admin allowed the host (or written around the service): the request is refused
    when made, and nothing reaches the address."""
    port = endpoint.url.rsplit(":", 1)[1]
    tool = make(world, endpoint.url + "/echo")
    HttpEndpoint.objects.for_tenant(world.a.tenant).filter(tool=tool).update(url_template=url.format(port=port))
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = []
    with pytest.raises(ToolError) as caught:
        invoke(tool, {"repo": "r"})
    assert caught.value.error_type == "OutboundRefused" and "only public addresses" in str(caught.value)
    assert endpoint.received == []


def test_secrets_are_write_only_and_changed_one_by_one(world, endpoint):
    endpoints = HttpEndpoint.objects.for_tenant(world.a.tenant)
    tool = make(world, endpoint.url + "/echo", secrets={"token": TOKEN, "other": "second-5ecret"})
    http_tool_update(tool=tool, secrets={"other": None, "third": "third-5ecret"})
    assert endpoints.get(tool=tool).secrets == {"token": TOKEN, "third": "third-5ecret"}
    http_tool_update(tool=tool, description="kept secrets")
    assert set(endpoints.get(tool=tool).secrets) == {"token", "third"}
    with pytest.raises(ServiceError) as caught:  # a header still names it
        http_tool_update(tool=tool, secrets={"token": None})
    assert "names no stored secret" in str(caught.value.fields["headers"])
    with pytest.raises(ServiceError) as caught:  # another host: the stored secrets are not sent there
        http_tool_update(tool=tool, url=PUBLIC + "/echo")
    assert "send the secrets again" in caught.value.fields["secrets"][0]
    http_tool_update(tool=tool, url=PUBLIC + "/echo", secrets={"token": "new-5ecret", "third": None})
    http_tool_delete(tool=tool)
    assert not Tool.objects.for_tenant(world.a.tenant).filter(pk=tool.pk).exists()
    assert not HttpEndpoint.objects.for_tenant(world.a.tenant).filter(tool_id=tool.pk).exists()
    audit = repr(list(Event.objects.for_tenant(world.a.tenant).filter(target="tool:repo_lookup")
                      .values_list("verb", "data")))
    for value in (TOKEN, "second-5ecret", "third-5ecret", "new-5ecret", "Bearer", "core"):
        assert value not in audit  # neither secret values nor header values
    assert "tool.created" in audit and "tool.updated" in audit and "tool.deleted" in audit


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"url": "https://{repo}.example.com/x"}, "url", "not in the scheme or the host"),
    ({"url": "ftp://93.184.215.14/x"}, "url", "only http and https"),
    ({"url": "http://127.0.0.1/x"}, "url", "loopback"),
    ({"url": "http://169.254.169.254/x"}, "url", "metadata"),
    ({"url": PUBLIC + "/{nope}"}, "url", "names no property"),
    ({"query": {"q": "{secret:token}"}}, "query", "headers only"),
    ({"body": {"t": "{secret:token}"}}, "body", "headers only"),
    ({"body": {"t": "{nope}"}}, "body", "names no property"),
    ({"method": "GET", "body": {"t": "x"}}, "body", "sends no body"),
    ({"headers": {"Authorization": "{secret:missing}"}}, "headers", "names no stored secret"),
    ({"headers": {"X-Repo": "{repo}"}}, "headers", "not arguments"),
    ({"headers": {"Host": "evil"}}, "headers", "set by the connection"),
    ({"secrets": {"token": "line\nbreak"}}, "secrets", "visible ASCII"),
    ({"method": "TRACE"}, "method", "one of"),
    ({"name": "reset_tools"}, "name", "reserved"),
    ({"name": "calculate"}, "name", "exists"),
    ({"input_schema": {"type": "string"}}, "input_schema", "schema"),
    ({"response": {"pointer": "items"}}, "response", "JSON pointer"),
    ({"timeout_s": 0}, "timeout_s", "between"),
])
def test_refused_definitions_name_the_field(world, fields, field, words):
    with pytest.raises(ServiceError) as caught:
        make(world, **{"url": PUBLIC + "/x/{repo}", **fields})
    assert words in " ".join(caught.value.fields[field]), caught.value.fields
    assert TOKEN not in repr(caught.value.fields) and "line\nbreak" not in repr(caught.value.fields)
    assert not Tool.objects.for_tenant(world.a.tenant).filter(source="http").exists()


def test_an_imported_document_is_size_bounded(world):
    document = "openapi: 3.0.0\npaths: {}\n#" + "x" * IMPORT_MAX_BYTES
    with pytest.raises(ServiceError) as caught:
        http_tools_import(tenant=world.a.tenant, document=document, base_url=PUBLIC)
    assert "at most" in caught.value.fields["document"][0]
