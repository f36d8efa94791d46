"""Every console form that reads JSON refuses what could not be stored and read back (a lone surrogate,
NUL, nesting past 64 levels, NaN) with a 400 naming the problem, stores nothing, and never answers 500
(Django's JSON form field and json.loads let all of these through, and overflowed on deep nesting).

The forms: a binding's value, a rule's argument match (new and edited), a reviewer's edited input, an
external result, the rule simulator's input, the knowledge upload's metadata and search scope filter,
and the Django admin's JSON fields.
"""
import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from approvals.models import ApprovalRequest, PermissionRule, RequestStatus, Vote
from knowledge.models import Dataset, Document
from tools.calls.submit import calls_submit
from tools.catalog.services import tool_external_create
from tools.models import BoundArgument, CallStatus, ToolCall, ToolGroup

pytestmark = pytest.mark.django_db

# JSON objects as a person types them into a text area; each must be refused.
UNSTORABLE = {
    "a lone surrogate": ('{"command": "\\ud800"}', "lone surrogate"),
    "a lone surrogate in a key": ('{"\\udc00": "x"}', "lone surrogate"),
    "NUL": ('{"command": "a\\u0000b"}', "NUL character"),
    "nesting past the cap": ('{"command": ' + "[" * 64 + "]" * 64 + "}", "levels deep"),
    "nesting that overflows json.loads": ('{"command": ' + "[" * 100_000 + "]" * 100_000 + "}", "levels deep"),
    "NaN": ('{"command": NaN}', "not a JSON number"),
}
cases = pytest.mark.parametrize("text, message", UNSTORABLE.values(), ids=UNSTORABLE.keys())


def _refused(response, message: str) -> None:
    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert message in response.content.decode()


def _url(namespace: str, name: str, tenant, **kwargs) -> str:
    return reverse(f"{namespace}:{name}", kwargs={"tenant": tenant.slug, **kwargs})


@cases
def test_binding_value(world, text, message):
    bindings = BoundArgument.objects.for_tenant(world.a.tenant)
    before = list(bindings.values_list("pk", "value"))
    response = world.a.console("operator").post(_url("console", "binding_create", world.a.tenant), {
        "tool": world.a.tools["current_time"].pk, "agent": "", "name": "timezone", "value": text})
    _refused(response, message)
    assert list(bindings.values_list("pk", "value")) == before


@cases
def test_rule_argument_match_new_and_edited(world, gov_rule, text, message):
    rule = gov_rule("deny", "shell", arg_match={"command": "rm *"})
    client = world.a.console("operator")
    form = {"behavior": "deny", "tool_pattern": "shell", "arg_match": text, "priority": 0, "enabled": "on"}
    _refused(client.post(_url("inbox", "rule_create", world.a.tenant), form), message)
    _refused(client.post(_url("inbox", "rule_edit", world.a.tenant, rule_id=rule.pk), form), message)
    assert list(PermissionRule.objects.for_tenant(world.a.tenant).values_list("arg_match", flat=True)) == [
        {"command": "rm *"}]


@cases
def test_reviewers_edited_input(world, inbox_pending, text, message):
    (pending,) = inbox_pending(1)
    response = world.a.console("reviewer").post(_url("inbox", "inbox_request", world.a.tenant, request_id=pending.pk),
                                                {"decision": "edit", "input": text})
    _refused(response, message)
    assert ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=pending.pk).status == RequestStatus.PENDING
    assert not Vote.objects.for_tenant(world.a.tenant).exists()


@pytest.fixture
def external_call(world, gov_session):
    tool = tool_external_create(tenant=world.a.tenant, name="book_room", description="By hand.",
                                input_schema={"properties": {"room": {"type": "string"}}})
    ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").tools.add(tool)
    (call,) = calls_submit(session=gov_session(), calls=[{"name": "book_room", "input": {"room": "Everest"}}])
    assert call.status == CallStatus.AWAITING_EXTERNAL
    return call


@cases
def test_external_result(world, external_call, text, message):
    respond = _url("inbox", "inbox_external_respond", world.a.tenant, call_id=str(external_call.pk))
    response = world.a.console("reviewer").post(respond, {"text": "", "structured": text, "state": "success"})
    _refused(response, message)
    call = ToolCall.objects.for_tenant(world.a.tenant).get(pk=external_call.pk)
    assert call.status == CallStatus.AWAITING_EXTERNAL and call.result is None


@cases
def test_rule_simulator_input(world, text, message):
    response = world.a.console("viewer").get(_url("inbox", "rule_list", world.a.tenant),
                                             {"tool": "shell", "input": text})
    assert response.status_code == 200  # a GET form: the page shows the error next to the input
    assert message in response.content.decode()


@cases
def test_knowledge_upload_metadata(world, text, message):
    dataset = Dataset.objects.create(tenant=world.a.tenant, name="handbook")
    response = world.a.console("operator").post(
        _url("knowledge", "dataset_upload", world.a.tenant, dataset_id=dataset.pk),
        {"files": [SimpleUploadedFile("a.txt", b"Some text.")], "metadata": text})
    _refused(response, message)
    assert not Document.objects.for_tenant(world.a.tenant).exists()


@cases
def test_knowledge_scope_filter(world, text, message):
    bindings = BoundArgument.objects.for_tenant(world.a.tenant)
    before = list(bindings.values_list("pk", "value"))
    response = world.a.console("operator").post(_url("knowledge", "bindings", world.a.tenant),
                                                {"agent": "", "all_datasets": "on", "filter": text})
    _refused(response, message)
    assert list(bindings.values_list("pk", "value")) == before


@cases
def test_admin_json_fields(world, client, text, message):
    client.force_login(get_user_model().objects.create_superuser(username="root", password="x", email=""))
    key = world.a.key_objects["agent"]
    response = client.post(f"/admin/tenancy/apikey/{key.pk}/change/", {
        "tenant": world.a.tenant.pk, "name": key.name, "scopes": text, "agent": "", "created_by": ""})
    assert response.status_code == 200  # the admin shows its form again, with the error
    assert message in response.content.decode()
    key.refresh_from_db()
    assert key.scopes == ["agent"]
