"""The reviewer's inbox in the console (issue 3, point 5): pages, decisions, roles, isolation, queries."""
import json
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from approvals.models import ApprovalRequest, PermissionRule, RequestStatus, Vote
from approvals.services import request_decide
from audit.models import Event as AuditEvent
from tenancy.models import Membership, Role
from tests.tools.support import wait_terminal
from tools.calls.submit import calls_submit
from tools.catalog.services import binding_set, tool_external_create
from tools.models import AgentSession, CallStatus, Tool, ToolCall, ToolGroup


def url(name, tenant, **kwargs):
    return reverse(f"inbox:{name}", kwargs={"tenant": tenant.slug, **kwargs})


def text(response) -> str:
    return response.content.decode()


def fresh(request) -> ApprovalRequest:
    return ApprovalRequest.objects.for_tenant(request.tenant_id).select_related("call").get(pk=request.pk)


# --- pages -------------------------------------------------------------------------------------

@pytest.mark.parametrize("role", ["admin", "operator", "reviewer", "viewer"])
def test_every_page_renders_for_every_member(world, inbox_pending, role):
    (pending,) = inbox_pending(1)
    client = world.a.console(role)
    tenant = world.a.tenant
    for name, kwargs in [("inbox", {}), ("inbox_history", {}), ("inbox_external", {}),
                         ("inbox_request", {"request_id": pending.pk}), ("rule_list", {}), ("queue_list", {})]:
        response = client.get(url(name, tenant, **kwargs))
        assert response.status_code == 200, (name, response.status_code)
        assert "Toolkeeper" in text(response)


def test_inbox_lists_pending_requests_oldest_first_with_what_a_reviewer_needs(world, inbox_pending):
    requests = inbox_pending(3, user="dora@example.com", command="rm -rf")
    response = world.a.console("reviewer").get(url("inbox", world.a.tenant))
    body = text(response)
    assert "3 pending" in body
    rows = re.findall(r'data-id="(\d+)"', body)
    assert rows == [str(r.pk) for r in requests]  # oldest first
    shell = inbox_pending.shell.name
    for expected in (shell, "ops-bot", "dora@example.com", "default", "needs approval by rule", "shell needs a human"):
        assert expected in body
    assert "j</kbd>/<kbd>k</kbd> move" in body  # the shortcuts are documented on the page


def test_inbox_filters_by_queue_agent_and_tool(world, inbox_pending, gov_queue):
    ops = gov_queue(name="ops")
    in_default = inbox_pending(2, agent="ops-bot")
    in_ops = inbox_pending(1, agent="deploy-bot", queue=ops)
    assert in_ops[0].queue == ops and in_default[0].queue.is_default
    client = world.a.console("reviewer")
    base = url("inbox", world.a.tenant)

    def ids(**params):
        body = text(client.get(base, params))
        return {int(i) for i in re.findall(r'data-id="(\d+)"', body)}

    assert ids() == {r.pk for r in in_default + in_ops}
    assert ids(queue="ops") == {in_ops[0].pk}
    assert ids(queue="default") == {r.pk for r in in_default}
    assert ids(agent="deploy-bot") == {in_ops[0].pk}
    assert ids(tool=inbox_pending.shell.name) == {r.pk for r in in_default + in_ops}
    assert ids(tool="calculate") == set()
    assert "1 pending matching the filters" in text(client.get(base, {"agent": "deploy-bot"}))


# --- decisions ---------------------------------------------------------------------------------

def test_approve_runs_the_call_and_moves_on_to_the_next_request(world, inbox_pending,
                                                                django_capture_on_commit_callbacks):
    first, second = inbox_pending(2)
    client = world.a.console("reviewer")
    response = client.post(url("inbox_request", world.a.tenant, request_id=first.pk), {"decision": "approve"})
    assert response.status_code == 302
    assert response["Location"] == url("inbox_request", world.a.tenant, request_id=second.pk)
    first = fresh(first)
    assert first.status == RequestStatus.APPROVED
    assert first.call.status in (CallStatus.QUEUED, CallStatus.RUNNING, CallStatus.SUCCEEDED)
    vote = Vote.objects.for_tenant(world.a.tenant).get(request=first)
    assert (vote.reviewer, vote.decision) == (world.a.users["reviewer"], "approve")
    # The last one leads back to the (now empty) list, with a message.
    response = client.post(url("inbox_request", world.a.tenant, request_id=second.pk), {"decision": "approve"},
                           follow=True)
    assert response.redirect_chain[-1][0] == url("inbox", world.a.tenant)
    assert "0 pending" in text(response)
    assert "approved" in text(response)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_edit_runs_the_call_with_the_edited_input(world, inbox_pending):
    (pending,) = inbox_pending(1, command="rm -rf /")
    client = world.a.console("reviewer")
    page = client.get(url("inbox_request", world.a.tenant, request_id=pending.pk))
    assert "rm -rf /" in text(page)  # readable and in the editor
    assert 'id="id_input"' in text(page)
    for key in ("<kbd>a</kbd> approve", "<kbd>e</kbd> edit the input", "<kbd>r</kbd> write a rejection"):
        assert key in text(page)  # the shortcuts are documented where they work
    # Approving a changed input counts as an edit: what runs is what the reviewer saw.
    response = client.post(url("inbox_request", world.a.tenant, request_id=pending.pk),
                           {"decision": "approve", "input": json.dumps({"command": "ls /tmp"})})
    assert response.status_code == 302
    call = wait_terminal(pending.call_id, tenant=world.a.tenant)
    assert call.status == CallStatus.SUCCEEDED, call.error
    assert call.result["structured"]["ran"] == "ls /tmp"
    assert call.input == {"command": "rm -rf /"}  # what the model sent is kept
    assert inbox_pending.shell.counter.inputs == [{"command": "ls /tmp", "cwd": "/"}]
    vote = Vote.objects.for_tenant(world.a.tenant).get(request=pending)
    assert (vote.decision, vote.input) == ("edit", {"command": "ls /tmp"})


@pytest.mark.parametrize("edited, expected", [
    ('{"command": "ls", ', "not valid JSON"),
    ('["ls"]', "must be a JSON object"),
    ('{"command": 5}', "command: 5 is not of type"),
    ('{"cwd": "/"}', "&#x27;command&#x27; is a required property"),
])
def test_an_invalid_edit_shows_its_errors_and_changes_nothing(world, inbox_pending, edited, expected):
    (pending,) = inbox_pending(1)
    response = world.a.console("reviewer").post(url("inbox_request", world.a.tenant, request_id=pending.pk),
                                                {"decision": "edit", "input": edited})
    assert response.status_code == 400
    body = text(response)
    assert expected in body
    assert 'id="input-errors"' in body
    assert edited.replace('"', "&quot;") in body  # the reviewer's text is kept for fixing
    pending = fresh(pending)
    assert pending.status == RequestStatus.PENDING
    assert pending.call.status == CallStatus.AWAITING_APPROVAL
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=pending).exists()


def test_an_edit_cannot_set_a_bound_argument(world, inbox_pending):
    (pending,) = inbox_pending(1)
    binding_set(tenant=world.a.tenant, tool=inbox_pending.shell.tool, name="cwd", value="/srv", agent="ops-bot")
    response = world.a.console("reviewer").post(url("inbox_request", world.a.tenant, request_id=pending.pk), {
        "decision": "edit", "input": json.dumps({"command": "ls", "cwd": "/etc"})})
    assert response.status_code == 400
    assert "cwd: fixed by the server" in text(response)
    assert fresh(pending).status == RequestStatus.PENDING


def test_reject_message_reaches_the_calls_error(world, inbox_pending):
    (pending,) = inbox_pending(1)
    response = world.a.console("reviewer").post(url("inbox_request", world.a.tenant, request_id=pending.pk), {
        "decision": "reject", "message": "Never delete production data."})
    assert response.status_code == 302
    pending = fresh(pending)
    assert pending.status == RequestStatus.REJECTED
    assert pending.call.status == CallStatus.REJECTED
    assert pending.call.error["errorType"] == "Rejected"
    assert pending.call.error["error"] == "Never delete production data."


def test_respond_answer_becomes_the_result(world, inbox_pending):
    (pending,) = inbox_pending(1)
    client = world.a.console("reviewer")
    empty = client.post(url("inbox_request", world.a.tenant, request_id=pending.pk), {"decision": "respond"})
    assert empty.status_code == 400
    assert "write the answer" in text(empty)
    response = client.post(url("inbox_request", world.a.tenant, request_id=pending.pk), {
        "decision": "respond", "message": "The disk is 80% full."})
    assert response.status_code == 302
    pending = fresh(pending)
    assert pending.status == RequestStatus.RESPONDED
    assert pending.call.status == CallStatus.SUCCEEDED
    assert pending.call.result["content"] == [{"type": "text", "text": "The disk is 80% full."}]


def test_a_second_decision_gets_a_conflict_message_not_an_error(world, inbox_pending):
    (pending,) = inbox_pending(1)
    target = url("inbox_request", world.a.tenant, request_id=pending.pk)
    assert world.a.console("reviewer").post(target, {"decision": "approve"}).status_code == 302
    late = world.a.console("operator").post(target, {"decision": "reject", "message": "no"})
    assert late.status_code == 409
    assert "Your decision was not recorded" in text(late)
    assert "already approved" in text(late)
    assert fresh(pending).status == RequestStatus.APPROVED
    assert Vote.objects.for_tenant(world.a.tenant).filter(request=pending).count() == 1


def test_four_eyes_refusal_is_shown_as_403(world, inbox_pending, gov_queue, gov_member):
    queue = gov_queue(name="sensitive", four_eyes=True)
    (pending,) = inbox_pending(1, agent="ops-bot", user="carol@example.com", queue=queue)
    carol = gov_member(Role.REVIEWER, username="carol", email="carol@example.com")
    client = world.a.console()
    client.force_login(carol)
    response = client.post(url("inbox_request", world.a.tenant, request_id=pending.pk), {"decision": "approve"})
    assert response.status_code == 403
    assert "four-eyes" in text(response)
    assert fresh(pending).status == RequestStatus.PENDING


def _quick_approve_rows(page: str) -> int:
    return page.count('class="inline quick-approve"')


def test_a_four_eyes_request_says_so_to_the_sessions_own_user_and_hides_its_buttons(world, inbox_pending, gov_queue,
                                                                                    gov_member):
    queue = gov_queue(name="sensitive", four_eyes=True)
    (own,) = inbox_pending(1, agent="ops-bot", user="carol@example.com", queue=queue, command="rm -rf /srv")
    (other,) = inbox_pending(1, agent="ops-bot", user="dave@example.com", queue=queue)
    carol = gov_member(Role.REVIEWER, username="carol", email="carol@example.com")
    client = world.a.console()
    client.force_login(carol)
    listing = text(client.get(url("inbox", world.a.tenant)))
    assert listing.count("Four-eyes: you cannot decide a call made in your own session") == 2  # title and text
    assert _quick_approve_rows(listing) == 1  # dave's request only
    page = text(client.get(url("inbox_request", world.a.tenant, request_id=own.pk)))
    assert 'id="cannot-decide"' in page and 'id="decide"' not in page and "decide-approve" not in page
    assert 'id="decide"' in text(client.get(url("inbox_request", world.a.tenant, request_id=other.pk)))


def test_a_refused_approve_as_is_shows_the_input_it_would_have_run(world, inbox_pending, gov_queue, gov_member):
    """An Approve that sends no input: the refusal must not come back with an empty editor."""
    queue = gov_queue(name="sensitive", four_eyes=True)
    (own,) = inbox_pending(1, agent="ops-bot", user="carol@example.com", queue=queue, command="rm -rf /srv")
    carol = gov_member(Role.REVIEWER, username="carol", email="carol@example.com")
    client = world.a.console()
    client.force_login(carol)
    target = url("inbox_request", world.a.tenant, request_id=own.pk)
    refused = client.post(target, {"decision": "approve", "return_to": url("inbox", world.a.tenant)})
    assert refused.status_code == 403
    page = text(refused)
    editor = re.search(r'<textarea id="id_input"[^>]*>(.*?)</textarea>', page, re.S)
    assert editor is not None, page
    assert json.loads(editor.group(1).replace("&quot;", '"')) == {"command": "rm -rf /srv"}
    edited = client.post(target, {"decision": "edit", "input": '{"command": "ls"}', "message": "only look"})
    page = text(edited)
    assert "{&quot;command&quot;: &quot;ls&quot;}</textarea>" in page
    assert ">only look</textarea>" in page
    assert fresh(own).status == RequestStatus.PENDING


def test_a_reviewer_who_voted_is_told_it_waits_for_the_others(world, inbox_pending, gov_queue):
    queue = gov_queue(name="pair", required_approvals=2)
    (pending,) = inbox_pending(1, queue=queue)
    reviewer = world.a.console("reviewer")
    target = url("inbox_request", world.a.tenant, request_id=pending.pk)
    assert reviewer.post(target, {"decision": "approve"}).status_code == 302
    assert fresh(pending).status == RequestStatus.PENDING
    listing = text(reviewer.get(url("inbox", world.a.tenant)))
    assert "You have voted; it waits for the other reviewers" in listing
    assert _quick_approve_rows(listing) == 0
    page = text(reviewer.get(target))
    assert 'id="cannot-decide"' in page and 'id="decide"' not in page
    operator = text(world.a.console("operator").get(target))  # not yet voted: may decide
    assert 'id="decide"' in operator and 'id="cannot-decide"' not in operator
    # an edit by someone else asks again: the first reviewer's approval no longer counts
    world.a.console("operator").post(target, {"decision": "edit", "input": '{"command": "ls"}'})
    assert 'id="decide"' in text(reviewer.get(target))


def test_a_queue_with_named_reviewers_is_decided_by_them_only(world, inbox_pending, gov_queue):
    queue = gov_queue(name="payments", reviewers=[world.a.users["reviewer"]])
    (pending,) = inbox_pending(1, queue=queue)
    target = url("inbox_request", world.a.tenant, request_id=pending.pk)
    operator = world.a.console("operator")
    page = text(operator.get(target))
    assert 'id="cannot-decide"' in page and 'id="decide"' not in page
    assert "not a reviewer of this request&#x27;s queue. Only the reviewers of the queue" in page
    response = operator.post(target, {"decision": "approve"})
    assert response.status_code == 403
    assert "not a reviewer of this request" in text(response)
    assert fresh(pending).status == RequestStatus.PENDING
    assert 'id="decide"' in text(world.a.console("reviewer").get(target))


def test_quorum_keeps_the_request_pending_after_the_first_vote(world, inbox_pending, gov_queue):
    queue = gov_queue(name="two-keys", required_approvals=2)
    (pending,) = inbox_pending(1, queue=queue)
    target = url("inbox_request", world.a.tenant, request_id=pending.pk)
    response = world.a.console("reviewer").post(target, {"decision": "approve"}, follow=True)
    assert "more approvals are needed" in text(response)
    assert fresh(pending).status == RequestStatus.PENDING
    assert "1 of 2 needed" in text(world.a.console("operator").get(target))
    world.a.console("operator").post(target, {"decision": "approve"})
    assert fresh(pending).status == RequestStatus.APPROVED


def test_quick_approve_from_the_list_returns_to_the_filtered_list(world, inbox_pending):
    first, _ = inbox_pending(2)
    back = url("inbox", world.a.tenant) + "?agent=ops-bot"
    response = world.a.console("reviewer").post(url("inbox_request", world.a.tenant, request_id=first.pk),
                                                {"decision": "approve", "return_to": back})
    assert response["Location"] == back
    # Never to another site.
    _, other = inbox_pending(2)
    response = world.a.console("reviewer").post(url("inbox_request", world.a.tenant, request_id=other.pk),
                                                {"decision": "approve", "return_to": "https://evil.example/"})
    assert "evil" not in response["Location"]


def test_approving_can_add_the_suggested_rule(world, inbox_pending):
    first, second = inbox_pending(2, agent="ops-bot", by_default=True)  # asked by the tenant's default
    shell = inbox_pending.shell.name
    page = text(world.a.console("operator").get(url("inbox_request", world.a.tenant, request_id=first.pk)))
    assert f"Also always allow <code>{shell}</code> for <strong>ops-bot</strong>" in page
    response = world.a.console("operator").post(url("inbox_request", world.a.tenant, request_id=first.pk), {
        "decision": "approve", "add_rule": "on", "narrow_to_input": "on"}, follow=True)
    rule = PermissionRule.objects.for_tenant(world.a.tenant).get(behavior="allow", tool_pattern=shell)
    assert rule.agents == ["ops-bot"]
    assert rule.arg_match == {"command": "ls -la 0", "cwd": {"absent": True}}
    assert f"Rule #{rule.pk} added" in text(response)
    # A reviewer who is not an operator is not offered the suggestion, and cannot add it by hand.
    reviewer = world.a.console("reviewer")
    assert "Also always allow" not in text(reviewer.get(url("inbox_request", world.a.tenant, request_id=second.pk)))
    response = reviewer.post(url("inbox_request", world.a.tenant, request_id=second.pk),
                             {"decision": "approve", "add_rule": "on"}, follow=True)
    assert "Only operators and admins add rules" in text(response)
    assert PermissionRule.objects.for_tenant(world.a.tenant).filter(behavior="allow").count() == 1
    assert fresh(second).status == RequestStatus.APPROVED


def test_no_suggestion_when_an_ask_rule_asked(world, inbox_pending):
    """An allow rule can never beat the ask rule that asked (ask beats allow): the console does not offer one."""
    (pending,) = inbox_pending(1, agent="ops-bot")
    page = text(world.a.console("operator").get(url("inbox_request", world.a.tenant, request_id=pending.pk)))
    assert "Also always allow" not in page
    response = world.a.console("operator").post(url("inbox_request", world.a.tenant, request_id=pending.pk), {
        "decision": "approve", "add_rule": "on"}, follow=True)
    assert "The suggested rule was not added" in text(response)
    assert not PermissionRule.objects.for_tenant(world.a.tenant).filter(behavior="allow").exists()
    assert fresh(pending).status == RequestStatus.APPROVED


# --- roles and isolation -----------------------------------------------------------------------

def test_a_viewer_reads_but_cannot_decide(world, inbox_pending):
    (pending,) = inbox_pending(1)
    viewer = world.a.console("viewer")
    page = viewer.get(url("inbox_request", world.a.tenant, request_id=pending.pk))
    assert page.status_code == 200
    assert 'id="decide"' not in text(page)
    assert "reads only" in text(page)
    response = viewer.post(url("inbox_request", world.a.tenant, request_id=pending.pk), {"decision": "approve"})
    assert response.status_code == 403
    assert fresh(pending).status == RequestStatus.PENDING
    assert 'class="inline quick-approve"' not in text(viewer.get(url("inbox", world.a.tenant)))


def test_another_tenants_requests_are_404_and_never_listed(world, inbox_pending, gov_shell):
    (mine,) = inbox_pending(1)
    from approvals.services import rule_create
    from tests.tools.support import install_tool
    from tools.catalog.services import session_create

    install_tool(world.b.tenant, gov_shell.name)
    rule_create(tenant=world.b.tenant, behavior="ask", tool_pattern=gov_shell.name, note="B-SECRET-NOTE")
    b_session = session_create(tenant=world.b.tenant, agent="globex-bot", user="bea@globex.example")
    (b_call,) = calls_submit(session=b_session, calls=[{"name": gov_shell.name, "input": {"command": "B-ONLY"}}])
    theirs = ApprovalRequest.objects.for_tenant(world.b.tenant).get(call=b_call)
    b_rule = PermissionRule.objects.for_tenant(world.b.tenant).get()
    client = world.a.console("admin")
    a, b = world.a.tenant, world.b.tenant
    assert client.get(url("inbox_request", a, request_id=theirs.pk)).status_code == 404
    assert client.post(url("inbox_request", a, request_id=theirs.pk), {"decision": "approve"}).status_code == 404
    assert client.get(url("rule_edit", a, rule_id=b_rule.pk)).status_code == 404
    assert client.post(url("rule_delete", a, rule_id=b_rule.pk)).status_code == 404
    assert client.get(url("queue_edit", a, queue_id=theirs.queue_id)).status_code == 404
    assert client.post(url("queue_delete", a, queue_id=theirs.queue_id)).status_code == 404
    assert client.post(url("inbox_external_respond", a, call_id=str(b_call.pk)),
                       {"text": "x", "state": "success"}).status_code == 404
    assert client.get(url("inbox", b)).status_code == 404  # not a member of B
    assert client.get(url("inbox_request", b, request_id=theirs.pk)).status_code == 404
    for name in ("inbox", "inbox_history", "inbox_external", "rule_list", "queue_list"):
        body = text(client.get(url(name, a)))
        assert "B-ONLY" not in body and "globex-bot" not in body and "B-SECRET-NOTE" not in body
    assert "1 pending" in text(client.get(url("inbox", a)))
    assert fresh(theirs).status == RequestStatus.PENDING and fresh(mine).status == RequestStatus.PENDING


# --- history -----------------------------------------------------------------------------------

def test_history_shows_who_decided_when_and_why_newest_first(world, inbox_pending):
    first, second, third = inbox_pending(3)
    world.a.console("reviewer").post(url("inbox_request", world.a.tenant, request_id=first.pk), {
        "decision": "reject", "message": "Too risky on a Friday."})
    world.a.console("operator").post(url("inbox_request", world.a.tenant, request_id=second.pk),
                                     {"decision": "approve"})
    client = world.a.console("viewer")
    body = text(client.get(url("inbox_history", world.a.tenant)))
    rows = re.findall(r'/inbox/(\d+)/"', body)
    assert rows == [str(second.pk), str(first.pk)]  # newest first; the pending one is not history
    assert "acme-reviewer</strong> reject" in body and "Too risky on a Friday." in body
    assert "acme-operator</strong> approve" in body
    only_rejected = text(client.get(url("inbox_history", world.a.tenant), {"status": "rejected"}))
    assert re.findall(r'/inbox/(\d+)/"', only_rejected) == [str(first.pk)]
    assert str(third.pk) not in re.findall(r'/inbox/(\d+)/"', body)


# --- external tasks ----------------------------------------------------------------------------

@pytest.fixture
def inbox_external_call(world, gov_session):
    tool = tool_external_create(tenant=world.a.tenant, name="book_meeting_room",
                                description="A person books the room by hand.",
                                input_schema={"properties": {"room": {"type": "string"}}, "required": ["room"]})
    ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").tools.add(tool)
    session = gov_session()
    (call,) = calls_submit(session=session, calls=[{"name": "book_meeting_room", "input": {"room": "Everest"}}])
    assert call.status == CallStatus.AWAITING_EXTERNAL
    return call


def test_a_person_completes_an_external_task(world, inbox_external_call):
    call = inbox_external_call
    client = world.a.console("reviewer")
    page = text(client.get(url("inbox_external", world.a.tenant)))
    assert "book_meeting_room" in page and "Everest" in page and "A person books the room by hand." in page
    respond = url("inbox_external_respond", world.a.tenant, call_id=str(call.pk))
    bad = client.post(respond, {"text": "", "structured": "{oops", "state": "success"})
    assert bad.status_code == 400 and "not valid JSON" in text(bad)
    assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk).status == CallStatus.AWAITING_EXTERNAL
    response = client.post(respond, {"text": "Booked for 10:00.", "structured": '{"booking": 17}',
                                      "state": "success"}, follow=True)
    assert "result recorded" in text(response)
    call.refresh_from_db()
    assert call.status == CallStatus.SUCCEEDED
    assert call.result["content"] == [{"type": "text", "text": "Booked for 10:00."}]
    assert call.result["structured"] == {"booking": 17}
    assert "book_meeting_room" not in text(client.get(url("inbox_external", world.a.tenant)))
    # A second answer is refused with a message, not a crash.
    again = client.post(respond, {"text": "twice", "state": "success"}, follow=True)
    assert "not recorded" in text(again)


def test_an_external_task_can_fail_and_viewers_cannot_answer(world, inbox_external_call):
    respond = url("inbox_external_respond", world.a.tenant, call_id=str(inbox_external_call.pk))
    assert world.a.console("viewer").post(respond, {"text": "x", "state": "success"}).status_code == 403
    world.a.console("operator").post(respond, {"text": "The room is closed.", "state": "error"})
    inbox_external_call.refresh_from_db()
    assert inbox_external_call.status == CallStatus.FAILED
    assert inbox_external_call.error["error"] == "The room is closed."


# --- queries -----------------------------------------------------------------------------------

def _inbox_queries(client, tenant, name="inbox") -> int:
    """The queries of a page viewed again: what a first view keeps in the cache (the viewer's zone) is kept."""
    client.get(url(name, tenant))
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url(name, tenant))
    assert response.status_code == 200
    return len(captured.captured_queries)


def test_the_inbox_list_runs_a_constant_number_of_queries(world, inbox_pending, gov_queue):
    client = world.a.console("reviewer")
    inbox_pending(2)
    inbox_pending(1, agent="deploy-bot", queue=gov_queue(name="deploys"))
    few = _inbox_queries(client, world.a.tenant)
    inbox_pending(27, user="erin@example.com")
    inbox_pending(3, agent="deploy-bot", queue=ApprovalRequest.objects.for_tenant(world.a.tenant)
                  .exclude(queue__is_default=True).first().queue)
    assert ApprovalRequest.objects.for_tenant(world.a.tenant).filter(status="pending").count() == 33
    many = _inbox_queries(client, world.a.tenant)
    assert many == few, f"{few} queries for 3 requests, {many} for 33"
    assert many <= 16


def test_the_history_runs_a_constant_number_of_queries(world, inbox_pending):
    from approvals.services import request_decide

    def decide_all(requests):
        for i, pending in enumerate(requests):
            request_decide(request=pending, reviewer=world.a.users["reviewer" if i % 2 else "operator"],
                           decision="reject", message=f"no {i}")

    client = world.a.console("viewer")
    decide_all(inbox_pending(3))
    few = _inbox_queries(client, world.a.tenant, "inbox_history")
    decide_all(inbox_pending(30, agent="deploy-bot"))
    many = _inbox_queries(client, world.a.tenant, "inbox_history")
    assert many == few, f"{few} queries for 3 decided requests, {many} for 33"


def test_inbox_lists_do_not_read_json_columns_they_do_not_show(world, inbox_pending, inbox_external_call):
    def columns(model, *names):
        return [f'"{model._meta.db_table}"."{model._meta.get_field(name).column}"' for name in names]

    call_json = columns(ToolCall, "effective_input", "decision", "result", "error")
    unread = {
        # The list shows inputs, cut by the database (`with_shown_input`): no other read of them.
        "inbox": [*call_json, *columns(AgentSession, "context", "state")],
        "inbox_history": [*call_json, *columns(ToolCall, "input"), *columns(AgentSession, "context", "state"),
                          *columns(Vote, "input")],
        "inbox_external": [*call_json, *columns(AgentSession, "context", "state"),
                           *columns(Tool, "input_schema", "output_schema")],  # the task shows its input
    }
    first, _ = inbox_pending(2)
    request_decide(request=first, reviewer=world.a.users["reviewer"], decision="reject", message="no")
    client = world.a.console("reviewer")
    for name, names in unread.items():
        with CaptureQueriesContext(connection) as captured:
            assert client.get(url(name, world.a.tenant)).status_code == 200
        sql = "\n".join(query["sql"] for query in captured.captured_queries)
        assert not [column for column in names if column in sql], name
        if name == "inbox":  # the call's input and the standing edit's, each only as the start the list shows
            reads = [sql[max(0, found.start() - 30):found.start()] for found in re.finditer(r'\."input"', sql)]
            assert len(reads) == 2 and all(re.search(r"(LEFT|SUBSTR)\(", before) for before in reads), reads


# --- no dead ends -------------------------------------------------------------------------------

def test_an_operator_stops_a_call_whose_request_nobody_can_decide(world, inbox_pending, gov_queue, gov_member):
    """A queue can lose the reviewers its quorum needs after it was saved (here: one leaves the tenant). The
    operator stops the call from its page: the request leaves the inbox, and the audit trail says who."""
    first, second = gov_member(), gov_member()
    queue = gov_queue(name="pair", required_approvals=2, reviewers=[first, second])
    (pending,) = inbox_pending(1, queue=queue)
    Membership.objects.filter(tenant=world.a.tenant, user=second).delete()
    call = pending.call
    operator = world.a.console("operator")
    call_page = reverse("console:call_detail", kwargs={"tenant": world.a.tenant.slug, "call_id": call.pk})
    stop_page = reverse("console:call_cancel", kwargs={"tenant": world.a.tenant.slug, "call_id": call.pk})
    assert f'href="{stop_page}" id="stop-call"' in text(operator.get(call_page))
    assert 'id="stop-call"' not in text(world.a.console("reviewer").get(call_page))
    assert world.a.console("reviewer").post(stop_page).status_code == 403

    confirm = text(operator.get(stop_page))
    assert "It never runs; it ends as <strong>cancelled</strong>." in confirm
    assert "Its approval request leaves the inbox of the queue <strong>pair</strong>" in confirm

    response = operator.post(stop_page)
    assert response.status_code == 302 and response["Location"] == call_page
    assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk).status == CallStatus.CANCELLED
    assert fresh(pending).status == RequestStatus.CANCELLED
    assert pending.pk not in {r.pk for r in ApprovalRequest.objects.for_tenant(world.a.tenant).filter(
        status=RequestStatus.PENDING)}
    audit = AuditEvent.objects.for_tenant(world.a.tenant).filter( verb="call.cancelled", target=f"call:{call.pk}").get()
    assert audit.actor == world.a.users["operator"]
    page = text(operator.get(call_page))
    assert "Call " in page and "stopped." in page and 'id="stop-call"' not in page

    # Stopping it again changes nothing and says why.
    again = operator.post(stop_page)
    assert again.status_code == 400
    assert "the call is already cancelled" in text(again)


def test_each_vote_is_an_event_on_the_calls_timeline_with_what_an_edit_changed(world, inbox_pending, gov_queue):
    from tools.models import CallEvent

    queue = gov_queue(name="pair", required_approvals=2)
    (pending,) = inbox_pending(1, queue=queue, command="rm -rf /tmp/x")
    target = url("inbox_request", world.a.tenant, request_id=pending.pk)
    assert world.a.console("reviewer").post(target, {"decision": "approve"}).status_code == 302
    world.a.console("operator").post(target, {"decision": "edit", "input": '{"command": "ls /tmp/x"}'})
    # the edit asked everyone again: the reviewer's second approval completes the quorum, and the call runs
    assert world.a.console("reviewer").post(target, {"decision": "approve"}).status_code == 302
    events = list(CallEvent.objects.for_tenant(world.a.tenant).filter(call=pending.call).order_by("seq"))
    assert [event.data for event in events if event.kind == "log"] == [
        {"text": "approved by acme-reviewer", "reviewer": "acme-reviewer", "decision": "approve"},
        {"text": "approved by acme-operator (edited)", "reviewer": "acme-operator", "decision": "edit",
         "changes": ['- command: "rm -rf /tmp/x"', '+ command: "ls /tmp/x"']},
        {"text": "approved by acme-reviewer", "reviewer": "acme-reviewer", "decision": "approve"},
    ]
    # on the timeline between the wait and the run it led to
    statuses = [(event.seq, event.data["status"]) for event in events if event.kind == "status"]
    logs = [event.seq for event in events if event.kind == "log"]
    assert statuses[0][1] == "awaiting_approval" and statuses[1][1] != "awaiting_approval"
    assert statuses[0][0] < min(logs) and max(logs) < statuses[1][0]
    page = text(world.a.console("operator").get(
        reverse("console:call_detail", kwargs={"tenant": world.a.tenant.slug, "call_id": pending.call.pk})))
    assert "approved by acme-operator (edited)" in page
