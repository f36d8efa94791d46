"""`/api/v1/http-tools` (admin scope; secrets write-only, named only) and HTTP tools' calls through the real
pipeline: a session's call, the executor, a local HTTP server. Success, an error status, a timeout, a rule that
asks, and the secret never shown (answers, events, results, errors, audit) even when the server echoes it."""
import json

import pytest

from approvals.services import rule_create
from audit.models import Event
from tests.tools.http_endpoint import serve
from tests.tools.support import poll, wait_terminal
from tools.models import CallEvent, CallStatus, HttpEndpoint, Tool, ToolCall, ToolGroup

URL = "/api/v1/http-tools"
TOKEN = "api-5ecret-token-77e2"  # noqa: S105
PUBLIC = "https://93.184.215.14"
SCHEMA = {"type": "object", "properties": {"repo": {"type": "string"}, "count": {"type": "integer"}},
          "required": ["repo"]}


@pytest.fixture
def endpoint(settings):
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    yield from serve()


def create(client, url=PUBLIC + "/repos/{repo}", **fields):
    body = {"name": "repo_lookup", "description": "Look a repository up.", "input_schema": SCHEMA, "method": "POST",
            "url": url, "query": {"n": "{count}"}, "headers": {"Authorization": "Bearer {secret:token}"},
            "secrets": {"token": TOKEN}, **fields}
    return client.post(URL, body, format="json")


def in_basic_group(world, tool_id) -> Tool:
    tool = Tool.objects.for_tenant(world.a.tenant).get(pk=tool_id)  # the tool's id, not the HTTP tool's
    ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").tools.add(tool)
    return tool


def call(world, name, arguments, call_id) -> dict:
    response = world.a.client("agent").post(f"/api/v1/sessions/{world.a.session.pk}/calls",
                                            {"id": call_id, "name": name, "input": arguments}, format="json")
    assert response.status_code == 200, response.content
    return response.json()["calls"][0]


def shown_of_call(world, call_id) -> str:
    """Everything the API and the database hold of a call: its detail, events, result and error."""
    client = world.a.client("agent")
    row = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call_id)
    events = list(CallEvent.objects.for_tenant(world.a.tenant).filter(call=row).values_list("data", flat=True))
    return " ".join([client.get(f"/api/v1/calls/{call_id}").content.decode(),
                     client.get(f"/api/v1/calls/{call_id}/events").content.decode(),
                     json.dumps([row.result, row.error, events])])


@pytest.mark.django_db
def test_crud_with_secrets_write_only(world):
    client = world.a.client("admin")
    created = create(client, timeout_s=5, idempotent=True, response={"pointer": "/data"})
    assert created.status_code == 201, created.content
    body = created.json()
    assert "secrets" not in body and body["secret_names"] == ["token"]
    assert (body["method"], body["url"], body["query"], body["timeout_s"], body["idempotent"], body["response"]) == (
        "POST", PUBLIC + "/repos/{repo}", {"n": "{count}"}, 5.0, True, {"pointer": "/data"})
    assert body["headers"] == {"Authorization": "Bearer {secret:token}"}  # the template: no value in it
    detail = f"{URL}/{body['id']}"
    assert client.get(f"/api/v1/tools/{body['tool_id']}").json()["source"] == "http"

    added = client.patch(detail, {"secrets": {"spare": "spare-5ecret-1"}}, format="json")
    assert added.status_code == 200 and added.json()["secret_names"] == ["spare", "token"]
    removed = client.patch(detail, {"secrets": {"spare": None}, "method": "PUT"}, format="json")
    assert removed.json()["secret_names"] == ["token"] and removed.json()["method"] == "PUT"
    put = client.put(detail, {"name": "repo_lookup", "url": PUBLIC + "/v2/{repo}"}, format="json")
    assert put.status_code == 200 and put.json()["secret_names"] == ["token"]  # kept
    endpoint = HttpEndpoint.objects.for_tenant(world.a.tenant).get(pk=body["id"])
    assert endpoint.secrets == {"token": TOKEN} and endpoint.url_template == PUBLIC + "/v2/{repo}"

    answers = [created, added, removed, put, client.get(URL), client.get(detail)]
    assert [t["name"] for t in client.get(URL).json()["results"]] == ["repo_lookup"]  # HTTP tools only
    assert client.delete(detail).status_code == 204
    assert not Tool.objects.for_tenant(world.a.tenant).filter(pk=body["tool_id"]).exists()
    for answer in [*answers, client.get("/api/v1/audit")]:
        assert TOKEN not in answer.content.decode() and "spare-5ecret" not in answer.content.decode()
    audit = Event.objects.for_tenant(world.a.tenant).filter(target="tool:repo_lookup")
    assert audit.count() == 5 and all(e.actor_label == "apikey:admin" for e in audit)


@pytest.mark.django_db
def test_only_the_tenants_own(world):
    client = world.a.client("admin")
    theirs = create(world.b.client("admin")).json()["id"]
    assert client.get(f"{URL}/{theirs}").status_code == 404
    assert client.delete(f"{URL}/{theirs}").status_code == 404
    assert world.a.client("agent").get(URL).status_code == 403


@pytest.mark.django_db
@pytest.mark.parametrize(("fields", "field"), [
    ({"url": "http://169.254.169.254/latest/"}, "url"),
    ({"url": "http://localhost:8080/{repo}"}, "url"),
    ({"url": "https://{repo}.example.com/"}, "url"),
    ({"headers": {"Authorization": "Bearer {secret:other}"}}, "headers"),
    ({"secrets": {"token": 5}}, "secrets"),
    ({"secrets": ["token"]}, "secrets"),
    ({"query": {"q": "{nope}"}}, "query"),
    ({"method": "TRACE"}, "method"),
    ({"name": "bad name"}, "name"),
    ({"timeout_s": "30"}, "timeout_s"),
    ({"body": {"x": "{secret:token}"}}, "body"),
])
def test_bad_input_is_400_naming_the_field(world, fields, field):
    response = create(world.a.client("admin"), **fields)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"], response.json()
    assert TOKEN not in response.content.decode()
    assert not Tool.objects.for_tenant(world.a.tenant).filter(source="http").exists()


@pytest.mark.usefixtures("drain_calls")
@pytest.mark.django_db(transaction=True)
def test_a_call_runs_and_the_echoed_secret_is_hidden(world, endpoint):
    tool = create(world.a.client("admin"), url=endpoint.url + "/echo/{repo}").json()
    in_basic_group(world, tool["tool_id"])
    started = call(world, "repo_lookup", {"repo": "a b/c", "count": 4}, "h1")
    done = wait_terminal(started["id"], tenant=world.a.tenant)
    assert done.status == CallStatus.SUCCEEDED, done.error
    [sent] = endpoint.received
    assert (sent.method, sent.path, sent.query) == ("POST", "/echo/a%20b%2Fc", [("n", "4")])
    assert sent.headers["Authorization"] == f"Bearer {TOKEN}" and json.loads(sent.body) == {}
    assert done.result["structured"]["authorization"] == "Bearer [hidden]"
    assert TOKEN not in shown_of_call(world, started["id"])


@pytest.mark.usefixtures("drain_calls")
@pytest.mark.django_db(transaction=True)
def test_an_error_status_fails_the_call_without_the_secret(world, endpoint):
    tool = create(world.a.client("admin"), url=endpoint.url + "/fail").json()
    in_basic_group(world, tool["tool_id"])
    started = call(world, "repo_lookup", {"repo": "r"}, "h2")
    done = wait_terminal(started["id"], tenant=world.a.tenant)
    assert done.status == CallStatus.FAILED and done.error["errorType"] == "HttpError"
    assert "HTTP 500" in done.error["error"] and "[hidden]" in done.error["error"]
    assert TOKEN not in shown_of_call(world, started["id"])


@pytest.mark.usefixtures("drain_calls")
@pytest.mark.django_db(transaction=True)
def test_a_request_past_the_timeout_times_the_call_out(world, endpoint):
    tool = create(world.a.client("admin"), url=endpoint.url + "/slow", timeout_s=0.3).json()
    in_basic_group(world, tool["tool_id"])
    started = call(world, "repo_lookup", {"repo": "r"}, "h3")
    done = wait_terminal(started["id"], tenant=world.a.tenant)
    assert done.status == CallStatus.TIMED_OUT and done.error["errorType"] == "TimedOut"
    assert len(endpoint.received) == 1  # it was sent; the answer came too late to count


@pytest.mark.usefixtures("drain_calls")
@pytest.mark.django_db(transaction=True)
def test_the_guard_refuses_without_the_allow_list(world, endpoint, settings):
    tool = create(world.a.client("admin"), url=endpoint.url + "/echo/{repo}").json()
    in_basic_group(world, tool["tool_id"])
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = []
    started = call(world, "repo_lookup", {"repo": "r"}, "h4")
    done = wait_terminal(started["id"], tenant=world.a.tenant)
    assert done.status == CallStatus.FAILED and done.error["errorType"] == "OutboundRefused"
    assert "only public addresses" in done.error["error"] and endpoint.received == []


@pytest.mark.usefixtures("drain_calls")
@pytest.mark.django_db(transaction=True)
def test_a_rule_that_asks_holds_the_call_until_approved(world, endpoint):
    tool = create(world.a.client("admin"), url=endpoint.url + "/echo/{repo}").json()
    in_basic_group(world, tool["tool_id"])
    rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern="repo_lookup", note="outbound needs a human")
    held = call(world, "repo_lookup", {"repo": "r"}, "h5")
    assert held["status"] == "awaiting_approval" and endpoint.received == []
    decided = world.a.client("admin").post(f"/api/v1/approvals/{held['approval']['id']}/decide",
                                           {"decision": "approve"}, format="json")
    assert decided.status_code == 200, decided.content
    done = wait_terminal(held["id"], tenant=world.a.tenant)
    assert done.status == CallStatus.SUCCEEDED, done.error
    poll(lambda: len(endpoint.received) == 1, message="the one request")
    assert endpoint.received[0].path == "/echo/r"


OPENAPI = f"""
openapi: 3.0.3
info: {{title: Issues, version: "1"}}
servers: [{{url: "{PUBLIC}/v1"}}]
paths:
  /repos/{{owner}}/issues:
    parameters:
      - {{name: owner, in: path, required: true, schema: {{type: string}}}}
    get:
      operationId: listIssues
      summary: List the issues.
      parameters:
        - {{name: state, in: query, schema: {{type: string, enum: [open, closed]}}}}
    post:
      operationId: createIssue
      requestBody:
        required: true
        content:
          application/json:
            schema: {{$ref: "#/components/schemas/NewIssue"}}
  /upload:
    post:
      requestBody:
        required: true
        content: {{multipart/form-data: {{schema: {{type: object}}}}}}
  /signed:
    delete:
      operationId: dropSigned
      parameters:
        - {{name: X-Signature, in: header, required: true, schema: {{type: string}}}}
components:
  schemas:
    NewIssue:
      type: object
      required: [title]
      properties:
        title: {{type: string}}
        labels: {{type: array, items: {{$ref: "#/components/schemas/Label"}}}}
    Label: {{type: string, maxLength: 50}}
"""


@pytest.mark.django_db
def test_an_openapi_document_becomes_http_tools(world):
    client = world.a.client("admin")
    response = client.post(f"{URL}/import", {"document": OPENAPI, "prefix": "gh_",
                                             "headers": {"Authorization": "Bearer {secret:token}"},
                                             "secrets": {"token": TOKEN}}, format="json")
    assert response.status_code == 200, response.content
    report = {entry["operation"]: entry for entry in response.json()["operations"]}
    assert {key: (entry["name"], entry["created"]) for key, entry in report.items()} == {
        "GET /repos/{owner}/issues": ("gh_listIssues", True), "POST /repos/{owner}/issues": ("gh_createIssue", True),
        "POST /upload": ("gh_post__upload", False), "DELETE /signed": ("gh_dropSigned", False)}
    assert "not JSON" in report["POST /upload"]["reason"] and "header" in report["DELETE /signed"]["reason"]
    listed = client.get(f"{URL}/{report['GET /repos/{owner}/issues']['id']}").json()
    assert (listed["method"], listed["url"], listed["query"], listed["body"], listed["read_only"]) == (
        "GET", PUBLIC + "/v1/repos/{owner}/issues", {"state": "{state}"}, None, True)
    assert listed["input_schema"]["required"] == ["owner"] and listed["secret_names"] == ["token"]
    assert listed["input_schema"]["properties"]["state"]["enum"] == ["open", "closed"]
    created = client.get(f"{URL}/{report['POST /repos/{owner}/issues']['id']}").json()
    assert created["body"] == {"title": "{title}", "labels": "{labels}"}
    assert created["input_schema"]["required"] == ["owner", "title"]
    assert created["input_schema"]["properties"]["labels"]["items"] == {"$ref": "#/$defs/Label"}
    assert created["input_schema"]["$defs"]["Label"] == {"type": "string", "maxLength": 50}
    again = client.post(f"{URL}/import", {"document": OPENAPI, "prefix": "gh_", "operations": ["listIssues"]},
                        format="json").json()["operations"]
    assert [(e["operation"], e["created"]) for e in again] == [("GET /repos/{owner}/issues", False)]
    assert "exists" in again[0]["reason"]
    assert TOKEN not in response.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(("document", "field"), [
    ("a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\nopenapi: '3.0.0'\npaths: {}\n", "document"),
    ("openapi: 3.0.0\npaths: [1, 2]\n", "document"),
    ('{"swagger": "2.0", "paths": {}}', "document"),
    ("{not json", "document"),
    ("[" * 5000, "document"),
    ('{"openapi": "3.1.0", "paths": {}}', "base_url"),
])
def test_a_document_that_cannot_be_used_is_400(world, document, field):
    response = world.a.client("admin").post(f"{URL}/import", {"document": document}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"], response.json()
