"""The inbox filters are one selector (`approvals.selectors.inbox_requests`): the inbox, its history and the
approvals API list filter by queue, agent and tool, and order, the same way."""
import re

from django.urls import reverse

from approvals import selectors
from approvals.models import ApprovalRequest, RequestStatus
from approvals.services import request_decide


def _ids(response) -> list[int]:
    return [int(pk) for pk in re.findall(r'/inbox/(\d+)/"', response.content.decode())]


def _decided(world, inbox_pending, gov_queue):
    """Five rejected requests: three of ops-bot in the default queue, two of deploy-bot in `ops`; the first
    one decided without a recorded time (rows from before decision times were kept)."""
    ops = gov_queue(name="ops")
    requests = inbox_pending(3, agent="ops-bot") + inbox_pending(2, agent="deploy-bot", queue=ops)
    for request in requests:
        request_decide(request=request, reviewer=world.a.users["reviewer"], decision="reject", message="no")
    ApprovalRequest.objects.for_tenant(world.a.tenant).filter(pk=requests[0].pk).update(decided_at=None)
    return requests


def test_one_selector_filters_every_status(world, inbox_pending, gov_queue):
    requests = _decided(world, inbox_pending, gov_queue)
    pending = inbox_pending(2, agent="deploy-bot")
    tenant, shell = world.a.tenant, inbox_pending.shell.name

    def ids(**filters):
        return [request.pk for request in selectors.inbox_requests(tenant=tenant, **filters)]

    assert ids() == [r.pk for r in pending]  # pending: oldest first
    decided = selectors.DECIDED_STATUSES
    newest_first = [r.pk for r in reversed(requests[1:])] + [requests[0].pk]  # no decision time: last
    assert ids(statuses=decided) == newest_first
    assert ids(statuses=decided, queue="ops") == newest_first[:2]
    assert ids(statuses=decided, agent="ops-bot", tool=shell) == newest_first[2:]
    assert ids(statuses=[RequestStatus.APPROVED]) == []
    assert ids(agent="deploy-bot", queue="ops") == [r.pk for r in pending]  # the ops rule names deploy-bot
    choices = selectors.inbox_filter_choices(tenant=tenant, statuses=decided)
    assert choices == {"queue": ["default", "ops"], "agent": ["deploy-bot", "ops-bot"], "tool": [shell]}
    assert selectors.inbox_filter_choices(tenant=tenant, statuses=[RequestStatus.PENDING])["agent"] == ["deploy-bot"]


def test_the_history_and_the_api_list_filter_and_order_alike(world, inbox_pending, gov_queue):
    _decided(world, inbox_pending, gov_queue)
    history = reverse("inbox:inbox_history", kwargs={"tenant": world.a.tenant.slug})
    console, api = world.a.console("reviewer"), world.a.client("admin")
    for filters in ({}, {"queue": "ops"}, {"agent": "ops-bot"}, {"tool": inbox_pending.shell.name},
                    {"agent": "ops-bot", "queue": "default"}):
        page = _ids(console.get(history, {"status": "rejected", **filters}))
        listed = api.get("/api/v1/approvals", {"status": "rejected", **filters})
        assert listed.status_code == 200
        assert page == [row["id"] for row in listed.json()["results"]], filters
        assert page, filters


def test_a_filter_value_that_matches_nothing_now_stays_chosen(world, inbox_pending):
    (request,) = inbox_pending(1, agent="lonely-bot")
    request_decide(request=request, reviewer=world.a.users["reviewer"], decision="reject", message="no")
    inbox = reverse("inbox:inbox", kwargs={"tenant": world.a.tenant.slug})
    page = world.a.console("reviewer").get(inbox, {"agent": "lonely-bot"}).content.decode()
    assert '<option value="lonely-bot" selected>' in page and 'class="errorlist' not in page
    unknown_queue = world.a.console("reviewer").get(inbox, {"queue": "nowhere"}).content.decode()
    assert "Select a valid choice" in unknown_queue
