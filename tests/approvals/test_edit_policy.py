"""A reviewer's edit goes through the rules again (docs/governance.md): a deny refuses it, an ask of another queue
refuses it, and the decision that let the edited input run is the one on the call. Approvals count only for
the input that runs, and "always allow … only for this input" is never broader than that input.

Both entry points are exercised: `POST /api/v1/approvals/{id}/decide` and the console's request page.
"""
import json

import pytest
from django.urls import reverse

from approvals.models import ApprovalRequest, PermissionRule, RequestStatus, Vote
from tenancy.models import Role
from tests.approvals.conftest import console_api
from tests.approvals.test_approvals_flow import default_asks  # noqa: F401 (a fixture)
from tests.tools.support import install_tool, registered_tool, unique_name
from tools.api.serializers import call_data
from tools.calls.submit import calls_submit
from tools.catalog.services import binding_set
from tools.models import CallStatus, ToolCall
from tools.python.decorators import ToolContext


def ask(world, tool_name: str, call_input: dict, session=None) -> ApprovalRequest:
    [call] = calls_submit(session=session or world.a.session, calls=[{"name": tool_name, "input": call_input}])
    assert call.status == CallStatus.AWAITING_APPROVAL, (call.status, call.decision, call.error)
    return ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)


def decide_api(world, user, request, decision: str = "approve", **body):
    return console_api(user, world.a.tenant).post(f"/api/v1/approvals/{request.pk}/decide",
                                                  {"decision": decision, **body}, format="json")


def decide_console(world, request, decision: str = "approve", new_input=None, role: str = "reviewer"):
    body = {"decision": decision}
    if new_input is not None:
        body["input"] = json.dumps(new_input)
    target = reverse("inbox:inbox_request", kwargs={"tenant": world.a.tenant.slug, "request_id": request.pk})
    return world.a.console(role).post(target, body)


def fresh_call(request) -> ToolCall:
    return ToolCall.objects.for_tenant(request.tenant_id).get(pk=request.call_id)


def still_pending(request) -> bool:
    request = ApprovalRequest.objects.for_tenant(request.tenant_id).get(pk=request.pk)
    return request.status == RequestStatus.PENDING and fresh_call(request).status == CallStatus.AWAITING_APPROVAL


@pytest.fixture
def ask_shell(gov_shell, gov_rule):
    """Every `shell` call asks (default queue); `rm *` is denied outright."""
    asking = gov_rule("ask", gov_shell.name, note="shell needs a human")
    deny = gov_rule("deny", gov_shell.name, arg_match={"command": "rm *"}, note="no deletions")
    return asking, deny


# --- a deny refuses the edit -------------------------------------------------------------------

@pytest.mark.parametrize("entry", ["api", "console"])
def test_an_edit_into_a_denied_input_is_refused(world, gov_shell, ask_shell, gov_member, entry):
    _, deny = ask_shell
    request = ask(world, gov_shell.name, {"command": "ls"})
    edited = {"command": "rm -rf /data"}
    if entry == "api":
        response = decide_api(world, gov_member(), request, "edit", input=edited)
        assert response.status_code == 400, response.content
        [problem] = response.json()["error"]["fields"]["input"]
    else:
        response = decide_console(world, request, "edit", new_input=edited)
        assert response.status_code == 400
        problem = response.content.decode()
    assert f"rule #{deny.id}" in problem and "no deletions" in problem
    assert still_pending(request)
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=request).exists()
    assert gov_shell.counter.count == 0
    assert fresh_call(request).decision["behavior"] == "ask"


def test_a_deny_on_a_bound_argument_refuses_the_edit(world, gov_shell, gov_rule, gov_member):
    """The rules see the edited input after binding, as they see a call."""
    gov_rule("ask", gov_shell.name)
    request = ask(world, gov_shell.name, {"command": "ls"})
    deny = gov_rule("deny", gov_shell.name, arg_match={"command": "make *", "cwd": "/prod/*"})
    binding_set(tenant=world.a.tenant, tool=gov_shell.tool, name="cwd", value="/prod/api")
    response = decide_api(world, gov_member(), request, "edit", input={"command": "make deploy"})
    assert response.status_code == 400, response.content
    assert f"rule #{deny.id}" in response.json()["error"]["fields"]["input"][0]
    assert still_pending(request)


def test_white_space_does_not_dodge_the_deny(world, gov_shell, ask_shell, gov_member):
    _, deny = ask_shell
    request = ask(world, gov_shell.name, {"command": "ls"})
    response = decide_api(world, gov_member(), request, "edit", input={"command": " \trm -rf /data"})
    assert response.status_code == 400, response.content
    assert f"rule #{deny.id}" in response.json()["error"]["fields"]["input"][0]


# --- an ask elsewhere refuses it; the same queue takes it ----------------------------------------

def test_an_edit_another_queue_must_approve_is_refused(world, gov_shell, gov_rule, gov_queue, gov_member):
    gov_rule("ask", gov_shell.name)
    payments = gov_queue(name="payments")
    other = gov_rule("ask", gov_shell.name, arg_match={"command": "pay *"}, queue=payments, priority=10)
    request = ask(world, gov_shell.name, {"command": "ls"})
    response = decide_api(world, gov_member(), request, "edit", input={"command": "pay 100"})
    assert response.status_code == 400, response.content
    [problem] = response.json()["error"]["fields"]["input"]
    assert "'payments'" in problem and f"rule #{other.id}" in problem
    assert still_pending(request)


def test_an_edit_that_still_asks_in_this_queue_runs_and_says_so(world, gov_shell, gov_rule):
    asking = gov_rule("ask", gov_shell.name, arg_match={"command": "git *"})
    request = ask(world, gov_shell.name, {"command": "git push --force"})
    response = decide_console(world, request, "edit", new_input={"command": "git push"})
    assert response.status_code == 302, response.content.decode()[-2000:]
    call = fresh_call(request)
    assert call.status == CallStatus.QUEUED
    assert call.effective_input == {"command": "git push"}
    assert (call.decision["behavior"], call.decision["rule"]) == ("ask", asking.id)
    assert "edit" in call.decision["reason"] and f"needs approval by rule #{asking.id}" in call.decision["reason"]
    assert world.a.users["reviewer"].username in call.decision["reason"]


# --- the recorded decision -----------------------------------------------------------------------

def test_an_edit_an_allow_rule_permits_runs_with_that_decision_on_record(world, gov_shell, gov_rule, gov_member):
    gov_rule("ask", gov_shell.name, arg_match={"command": "git push *"})
    allow = gov_rule("allow", gov_shell.name, arg_match={"command": "git status"}, note="harmless")
    request = ask(world, gov_shell.name, {"command": "git push --force"})
    reviewer = gov_member()
    response = decide_api(world, reviewer, request, "edit", input={"command": "git status"})
    assert response.status_code == 200, response.content
    call = fresh_call(request)
    assert call.status == CallStatus.QUEUED
    assert call.effective_input == {"command": "git status"}
    shown = call_data(call)
    assert set(shown["decision"]) == {"behavior", "rule", "reason"}
    assert shown["decision"]["rule"] == allow.id
    assert f"allowed by rule #{allow.id}" in shown["decision"]["reason"]
    assert reviewer.username in shown["decision"]["reason"]
    assert shown["approval"]["status"] == "approved"


# --- quorum: approvals count for the input that runs ---------------------------------------------

@pytest.fixture
def two_keys(gov_shell, gov_rule, gov_queue):
    queue = gov_queue(name="two-keys", required_approvals=2)
    return gov_rule("ask", gov_shell.name, queue=queue)


def test_an_edit_after_one_approval_restarts_the_count(world, gov_shell, two_keys, gov_member):
    request = ask(world, gov_shell.name, {"command": "git push --force"})
    first, second, third = gov_member(), gov_member(), gov_member()
    assert decide_api(world, first, request, "approve").status_code == 200
    response = decide_api(world, second, request, "edit", input={"command": "git push"})
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "pending"
    assert still_pending(request)
    assert decide_api(world, third, request, "approve").status_code == 200
    call = fresh_call(request)
    assert call.status == CallStatus.QUEUED and call.effective_input == {"command": "git push"}


def test_a_reviewer_whose_approval_an_edit_replaced_may_approve_again(world, gov_shell, two_keys, gov_member):
    request = ask(world, gov_shell.name, {"command": "git push --force"})
    first, second = gov_member(), gov_member()
    assert decide_api(world, first, request, "approve").status_code == 200
    assert decide_api(world, second, request, "edit", input={"command": "git push"}).status_code == 200
    # The second reviewer's vote still stands: no second vote for them.
    assert decide_api(world, second, request, "approve").status_code == 409
    page = reverse("inbox:inbox_request", kwargs={"tenant": world.a.tenant.slug, "request_id": request.pk})
    assert "1 of 2 needed" in world.a.console("operator").get(page).content.decode()
    assert decide_api(world, first, request, "approve").status_code == 200
    call = fresh_call(request)
    assert call.status == CallStatus.QUEUED and call.effective_input == {"command": "git push"}
    votes = Vote.objects.for_tenant(world.a.tenant).filter(request=request).order_by("at")
    assert [(v.reviewer_label, v.decision, v.input) for v in votes] == [
        (second.username, "edit", {"command": "git push"}), (first.username, "approve", {"command": "git push"})]


def test_two_different_edits_do_not_add_up(world, gov_shell, two_keys, gov_member):
    request = ask(world, gov_shell.name, {"command": "git push --force"})
    assert decide_api(world, gov_member(), request, "edit", input={"command": "git push"}).status_code == 200
    assert decide_api(world, gov_member(), request, "edit", input={"command": "git status"}).status_code == 200
    assert still_pending(request)
    assert decide_api(world, gov_member(), request, "edit", input={"command": "git status"}).status_code == 200
    assert fresh_call(request).effective_input == {"command": "git status"}


# --- "always allow … only for this input" -----------------------------------------------------------

@pytest.fixture
def resize_tool(world):
    def resize(target: str, count: int, ctx: ToolContext, force: bool = False) -> dict:
        """Resize a deployment (pretend).

        Args:
            target: What to resize.
            count: How many replicas.
            force: Skip the checks.
        """
        return {"target": target, "count": count, "force": force}

    name = unique_name("resize")
    with registered_tool(resize, name=name):
        yield install_tool(world.a.tenant, name)


def approve_narrowed(world, gov_member, request):
    response = decide_api(world, gov_member(Role.OPERATOR), request, "approve", add_rule=True, narrow_to_input=True)
    assert response.status_code == 200, response.content
    return PermissionRule.objects.for_tenant(world.a.tenant).get(behavior="allow", tool_pattern=request.tool_name)


def decision_for(world, tool_name: str, call_input: dict) -> str:
    [call] = calls_submit(session=world.a.session, calls=[{"name": tool_name, "input": call_input}])
    return call.decision["behavior"]


@pytest.mark.usefixtures("default_asks")
def test_narrowing_matches_a_star_exactly(world, gov_shell, gov_member):
    request = ask(world, gov_shell.name, {"command": "rm *", "cwd": "/tmp"})
    rule = approve_narrowed(world, gov_member, request)
    assert rule.arg_match == {"command": {"equals": "rm *"}, "cwd": "/tmp"}
    assert decision_for(world, gov_shell.name, {"command": "rm *", "cwd": "/tmp"}) == "allow"
    assert decision_for(world, gov_shell.name, {"command": "rm -rf /", "cwd": "/tmp"}) == "ask"
    assert decision_for(world, gov_shell.name, {"command": "rm *", "cwd": "/"}) == "ask"


@pytest.mark.usefixtures("default_asks")
def test_narrowing_matches_non_strings_exactly(world, resize_tool, gov_member):
    request = ask(world, resize_tool.name, {"target": "api", "count": 3, "force": True})
    rule = approve_narrowed(world, gov_member, request)
    assert rule.arg_match == {"target": "api", "count": {"equals": 3}, "force": {"equals": True}}
    assert decision_for(world, resize_tool.name, {"target": "api", "count": 3, "force": True}) == "allow"
    assert decision_for(world, resize_tool.name, {"target": "api", "count": 300, "force": True}) == "ask"
    assert decision_for(world, resize_tool.name, {"target": "api", "count": 3, "force": False}) == "ask"


@pytest.mark.usefixtures("default_asks")
def test_narrowing_leaves_out_what_the_input_left_out(world, gov_shell, gov_member):
    """An argument the approved input did not set may not be added later (the tool's default was approved)."""
    request = ask(world, gov_shell.name, {"command": "ls"})
    rule = approve_narrowed(world, gov_member, request)
    assert rule.arg_match == {"command": "ls", "cwd": {"absent": True}}
    assert decision_for(world, gov_shell.name, {"command": "ls"}) == "allow"
    assert decision_for(world, gov_shell.name, {"command": "ls", "cwd": "/prod"}) == "ask"


@pytest.mark.usefixtures("default_asks")
def test_narrowing_keeps_odd_white_space_exact(world, gov_shell, gov_member):
    request = ask(world, gov_shell.name, {"command": "echo  two  spaces"})
    rule = approve_narrowed(world, gov_member, request)
    assert rule.arg_match == {"command": {"equals": "echo  two  spaces"}, "cwd": {"absent": True}}
    assert decision_for(world, gov_shell.name, {"command": "echo two spaces"}) == "ask"


@pytest.mark.usefixtures("default_asks")
def test_narrowing_after_an_edit_takes_the_edited_input(world, gov_shell, gov_member):
    request = ask(world, gov_shell.name, {"command": "git push --force"})
    response = decide_api(world, gov_member(Role.OPERATOR), request, "edit", input={}, add_rule=True,
                          narrow_to_input=True)
    assert response.status_code == 400  # `command` is required: the edit is refused before any rule is added
    assert not PermissionRule.objects.for_tenant(world.a.tenant).exists()
    response = decide_api(world, gov_member(Role.OPERATOR), request, "edit", input={"command": "git push"},
                          add_rule=True, narrow_to_input=True)
    assert response.status_code == 200, response.content
    rule = PermissionRule.objects.for_tenant(world.a.tenant).get(behavior="allow")
    assert rule.arg_match == {"command": "git push", "cwd": {"absent": True}}
