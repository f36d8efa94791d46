"""Bulk decisions in the console inbox (docs/governance.md, "Approvals"; docs/notes/console.md): a checkbox per
pending row, "select all on this page", Approve selected / Reject selected in one post (CSRF, reviewing roles
only), and the outcome said request by request."""
import html
import re

import pytest
from django.test import Client
from django.urls import reverse

from approvals.models import ApprovalRequest, RequestStatus, Vote
from approvals.services import BULK_MAX
from tests.approvals.test_isolation import ask_everything
from tools.models import CallStatus


def inbox_url(tenant, **query) -> str:
    base = reverse("inbox:inbox", kwargs={"tenant": tenant.slug})
    return base + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def status_of(request) -> str:
    return ApprovalRequest.objects.for_tenant(request.tenant_id).get(pk=request.pk).status


def seen_of(body: str) -> list[str]:
    """The `seen` values (`<id>:<digest>`) the page sends with its bulk form."""
    return re.findall(r'name="seen" value="(\d+:[0-9a-f]+)" form="bulk"', body)


def ticked(body: str) -> set[int]:
    return {int(i) for i in re.findall(r'name="ids" value="(\d+)" form="bulk" checked', body)}


def test_reviewers_get_a_checkbox_per_row_and_the_bulk_form_viewers_do_not(world, inbox_pending):
    requests = inbox_pending(2)
    body = world.a.console("reviewer").get(inbox_url(world.a.tenant)).content.decode()
    assert '<form method="post" id="bulk"' in body and "Approve selected" in body and "Reject selected" in body
    assert 'name="csrfmiddlewaretoken"' in body
    assert re.findall(r'name="ids" value="(\d+)" form="bulk"', body) == [str(r.pk) for r in requests]
    assert [s.split(":")[0] for s in seen_of(body)] == [str(r.pk) for r in requests]
    assert ticked(body) == set()
    viewer = world.a.console("viewer").get(inbox_url(world.a.tenant)).content.decode()
    assert '<form method="post" id="bulk"' not in viewer and 'name="ids" value=' not in viewer


def test_select_all_on_the_page_works_without_script_and_keeps_the_filters(world, inbox_pending):
    mine = inbox_pending(2, agent="ops-bot")
    inbox_pending(1, agent="other-bot")
    client = world.a.console("reviewer")
    body = client.get(inbox_url(world.a.tenant, agent="ops-bot")).content.decode()
    link = html.unescape(re.search(r'href="\?([^"]*)" id="select-page"', body).group(1))
    assert "agent=ops-bot" in link and "select=all" in link
    selected = client.get(inbox_url(world.a.tenant) + "?" + link).content.decode()
    assert ticked(selected) == {r.pk for r in mine}
    # The bulk form posts back to the filtered list, without "select all".
    action = html.unescape(re.search(r'<form method="post" id="bulk" class="bulk" action="([^"]*)"', selected).group(1))
    assert action == inbox_url(world.a.tenant, agent="ops-bot")


def test_approve_selected_decides_each_and_lists_the_skipped_with_reasons_escaped(world, inbox_pending, gov_queue):
    tenant, reviewer = world.a.tenant, world.a.users["reviewer"]
    first, second = inbox_pending(2, agent="ops-bot")
    (own,) = inbox_pending(1, agent="own-bot", user=reviewer.username, queue=gov_queue(name="strict", four_eyes=True))
    (theirs,) = ask_everything(world.b, 1)
    client = world.a.console("reviewer")
    body = client.get(inbox_url(tenant)).content.decode()
    response = client.post(inbox_url(tenant, page=1), {
        "decision": "approve", "ids": [first.pk, second.pk, own.pk, theirs.pk, "<b>x</b>"], "seen": seen_of(body)})
    assert response.status_code == 302
    assert response["Location"] == inbox_url(tenant, page=1)
    page = client.get(response["Location"]).content.decode()
    assert status_of(first) == status_of(second) == RequestStatus.APPROVED
    assert status_of(own) == RequestStatus.PENDING
    assert ApprovalRequest.objects.for_tenant(world.b.tenant).get(pk=theirs.pk).status == RequestStatus.PENDING
    shell = inbox_pending.shell.name
    calls = {r.pk: ApprovalRequest.objects.for_tenant(tenant).select_related("call").get(pk=r.pk).call.call_id
             for r in (first, second, own)}
    assert f"Approved 2: #{first.pk} {shell} ({calls[first.pk]}), #{second.pk} {shell} ({calls[second.pk]})." in page
    assert (f"Skipped #{own.pk} {shell} ({calls[own.pk]}): "
            "four-eyes: you cannot decide a call made in your own session." in page)
    assert f"Skipped request {theirs.pk}: not found." in page
    assert "Skipped request &lt;b&gt;x&lt;/b&gt;: not found." in page and "<b>x</b>" not in page
    assert "globex" not in page.lower()


def test_reject_selected_sends_the_one_message_and_a_quorum_vote_is_said_to_wait(world, inbox_pending, gov_queue):
    tenant = world.a.tenant
    rejected = inbox_pending(2, agent="ops-bot")
    (paired,) = inbox_pending(1, agent="pair-bot", queue=gov_queue(name="pair", required_approvals=2))
    client = world.a.console("reviewer")
    response = client.post(inbox_url(tenant), {"decision": "reject", "ids": [r.pk for r in rejected],
                                               "message": "  stop: incident 7  "}, follow=True)
    for request in rejected:
        call = ApprovalRequest.objects.for_tenant(tenant).select_related("call").get(pk=request.pk).call
        assert call.status == CallStatus.REJECTED and call.error["error"] == "stop: incident 7"
    assert "Rejected 2:" in response.content.decode()
    body = client.get(inbox_url(tenant)).content.decode()
    response = client.post(inbox_url(tenant), {"decision": "approve", "ids": [paired.pk], "seen": seen_of(body)},
                           follow=True)
    assert "Your vote is recorded on 1, which wait for more approvals" in response.content.decode()
    assert status_of(paired) == RequestStatus.PENDING


def test_the_post_needs_its_csrf_token(world, inbox_pending):
    (pending,) = inbox_pending(1)
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.a.users["reviewer"])
    response = client.post(inbox_url(world.a.tenant), {"decision": "reject", "ids": [pending.pk]})
    assert response.status_code == 403
    assert status_of(pending) == RequestStatus.PENDING


@pytest.mark.parametrize("role", ["viewer"])
def test_viewers_never_decide_in_bulk(world, inbox_pending, role):
    (pending,) = inbox_pending(1)
    response = world.a.console(role).post(inbox_url(world.a.tenant), {"decision": "reject", "ids": [pending.pk]})
    assert response.status_code == 403
    assert status_of(pending) == RequestStatus.PENDING
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=pending).exists()


def test_too_many_or_no_decision_is_a_400_on_the_list_with_the_rows_still_ticked(world, inbox_pending):
    requests = inbox_pending(2)
    client = world.a.console("reviewer")
    ids = [r.pk for r in requests] + list(range(10 ** 6, 10 ** 6 + BULK_MAX))
    response = client.post(inbox_url(world.a.tenant), {"decision": "approve", "ids": ids})
    assert response.status_code == 400
    body = response.content.decode()
    assert f"at most {BULK_MAX} requests at a time ({BULK_MAX + 2} were selected)" in body
    assert ticked(body) == {r.pk for r in requests}
    assert {status_of(r) for r in requests} == {RequestStatus.PENDING}
    for data in ({"ids": [requests[0].pk]}, {"decision": "respond", "ids": [requests[0].pk]},
                 {"decision": "approve"}):
        response = client.post(inbox_url(world.a.tenant), data)
        assert response.status_code == 400, data
    assert {status_of(r) for r in requests} == {RequestStatus.PENDING}
