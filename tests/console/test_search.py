"""Finding things (docs/notes/console.md, "Search"): the calls list by id, agent, user, session, tool, status,
decision and days; the sessions list by agent, user and days; the header's box, straight to what an id or a
name names; a constant number of queries for the lists at 100,000 calls."""
import re
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import ApprovalRequest
from approvals.services import rule_create
from tenancy.people.services import profile_update
from tests.bulk import copy_rows
from tools.calls.submit import calls_submit
from tools.catalog.services import session_create
from tools.models import AgentSession, Tool, ToolCall

pytestmark = pytest.mark.django_db

BERLIN = ZoneInfo("Europe/Berlin")


def _listed_calls(response) -> set[str]:
    assert response.status_code == 200, response.content.decode()[:2000]
    return set(re.findall(r'<tr data-call="([0-9a-f-]+)"', response.content.decode()))


def _listed_sessions(response) -> set[str]:
    assert response.status_code == 200, response.content.decode()[:2000]
    return set(re.findall(r'<tr data-id="([0-9a-f-]+)"', response.content.decode()))


@pytest.fixture
def calls(world):
    """Three calls of tenant A that differ in each thing a filter reads (and B's, which no filter finds)."""
    tenant = world.a.tenant
    ops = session_create(tenant=tenant, agent="ops-bot", user="carol@example.com")
    made = calls_submit(session=ops, calls=[{"name": "current_time", "input": {}, "id": "night-run"},
                                            {"name": "calculate", "input": {"expression": "1+1"}, "id": "sum"}])
    night, total = made
    support = world.a.calls[0]
    rows = ToolCall.objects.for_tenant(tenant)
    rows.filter(pk=night.pk).update(created_at=datetime(2026, 3, 1, 23, 30, tzinfo=BERLIN),
                                    decision={"behavior": "deny", "rule": 1, "reason": "night"})
    rows.filter(pk=total.pk).update(created_at=datetime(2026, 3, 2, 0, 30, tzinfo=BERLIN),
                                    decision={"behavior": "ask", "rule": 2, "reason": "sums"})
    rows.filter(pk=support.pk).update(created_at=datetime(2026, 3, 3, 12, 0, tzinfo=BERLIN))
    return {"night": str(night.pk), "total": str(total.pk), "support": str(support.pk), "ops": ops}


def test_each_call_filter_finds_its_calls_and_no_other_tenants(world, calls):
    client = world.a.console("viewer")
    profile_update(user=world.a.users["viewer"], name="", email="", time_zone="Europe/Berlin")
    support_call = ToolCall.objects.for_tenant(world.a.tenant).get(pk=calls["support"])
    ops = calls["ops"]

    def listed(query: str) -> set[str]:
        return _listed_calls(client.get("/t/acme/calls/?" + query)) & {calls["night"], calls["total"],
                                                                        calls["support"]}

    assert listed(f"id={calls['night']}") == {calls["night"]}
    assert listed("id=sum") == {calls["total"]}  # the id the app gave
    assert listed(f"id={support_call.call_id}") == {calls["support"]}
    assert listed("tool=calc") == {calls["total"]}  # part of the name
    assert listed("agent=OPS") == {calls["night"], calls["total"]}
    assert listed("user=carol") == {calls["night"], calls["total"]}
    assert listed(f"session={ops.pk}") == {calls["night"], calls["total"]}
    assert listed("decision=deny") == {calls["night"]}
    assert listed("decision=ask") == {calls["total"]}
    # Days in the viewer's zone: 23:30 in Berlin on 1 March is 22:30 UTC, still 1 March in either.
    assert listed("since=2026-03-02&until=2026-03-02") == {calls["total"]}  # 00:30 Berlin, 23:30 UTC on 1 March
    assert listed("until=2026-03-01") == {calls["night"]}
    assert listed("since=2026-03-03") == {calls["support"]}
    assert listed("agent=ops&decision=ask&tool=calculate") == {calls["total"]}
    assert listed("status=succeeded&agent=ops") <= {calls["night"], calls["total"]}
    b_call = world.b.calls[0]
    assert _listed_calls(client.get(f"/t/acme/calls/?id={b_call.pk}")) == set()
    assert _listed_calls(client.get(f"/t/acme/calls/?session={world.b.session.pk}")) == set()


def test_a_bad_call_filter_is_said_and_lists_nothing(world, calls):
    client = world.a.console("viewer")
    for query, message in [("session=not-a-uuid", "Enter a valid UUID"),
                           ("since=2026-03-05&until=2026-03-01", "the last day comes after the first"),
                           ("decision=maybe", "Select a valid choice"),
                           ("since=tomorrow", "Enter a valid date"),
                           ("agent=" + "x" * 201, "at most 200 characters"),
                           ("agent=a%00b", "Null characters are not allowed")]:
        response = client.get("/t/acme/calls/?" + query)
        html = response.content.decode()
        assert response.status_code == 400 and message in html, query
        assert "Nothing is listed until the filter is fixed" in html and 'aria-invalid="true"' in html
        assert not re.search(r'<tr data-call="', html), query


def test_the_filters_stay_on_the_pager_and_the_live_rows(world, calls):
    client = world.a.console("viewer")
    html = client.get("/t/acme/calls/?agent=ops-bot&decision=ask").content.decode()
    assert "fragment=rows&amp;agent=ops-bot&amp;decision=ask" in html
    assert 'value="ops-bot"' in html and '<option value="ask" selected>' in html
    rows = client.get(f"/t/acme/calls/?fragment=rows&agent=ops-bot&decision=ask&call={calls['total']}")
    assert _listed_calls(rows) == {calls["total"]}
    hidden = client.get(f"/t/acme/calls/?fragment=rows&agent=ops-bot&decision=deny&call={calls['total']}")
    assert _listed_calls(hidden) == set()  # a live row the filters exclude is not added


def test_sessions_filter_by_agent_user_and_days(world, calls):
    client = world.a.console("viewer")
    ops = calls["ops"]
    sessions = AgentSession.objects.for_tenant(world.a.tenant)
    sessions.filter(pk=ops.pk).update(created_at=datetime(2026, 2, 1, 9, 0, tzinfo=BERLIN))
    support = world.a.session
    assert _listed_sessions(client.get("/t/acme/sessions/?agent=ops")) == {str(ops.pk)}
    assert _listed_sessions(client.get("/t/acme/sessions/?user=ALICE")) == {str(support.pk)}
    assert str(ops.pk) in _listed_sessions(client.get("/t/acme/sessions/?until=2026-02-01"))
    assert str(support.pk) not in _listed_sessions(client.get("/t/acme/sessions/?until=2026-02-01"))
    assert _listed_sessions(client.get(f"/t/acme/sessions/?agent={world.b.session.agent}&user=b")) == set()
    bad = client.get("/t/acme/sessions/?since=2026-02-02&until=2026-02-01")
    assert bad.status_code == 400 and "the last day comes after the first" in bad.content.decode()


# --- the header's box ------------------------------------------------------------------------------

def _find(client, text: str):
    return client.get("/t/acme/search/", {"q": text})


def test_an_id_goes_straight_to_what_it_names(world, calls):
    client = world.a.console("viewer")
    call = ToolCall.objects.for_tenant(world.a.tenant).get(pk=calls["total"])
    assert _find(client, calls["total"]).url == f"/t/acme/calls/{call.pk}/"
    assert _find(client, " sum ").url == f"/t/acme/calls/{call.pk}/"  # the app's id, spaces aside
    assert _find(client, str(calls["ops"].pk)).url == f"/t/acme/sessions/{calls['ops'].pk}/"
    rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern="current_time")
    asked = calls_submit(session=calls["ops"], calls=[{"name": "current_time", "input": {}}])
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=asked[0])
    assert _find(client, str(request.pk)).url == f"/t/acme/inbox/{request.pk}/"
    assert _find(client, "0" + str(request.pk)).url == f"/t/acme/inbox/{request.pk}/"
    assert 'id="found-nothing"' in _find(client, str(request.pk + 1000)).content.decode()


def test_a_name_lists_tools_and_sessions(world, calls):
    client = world.a.console("viewer")
    tool = Tool.objects.for_tenant(world.a.tenant).get(name="calculate")
    assert _find(client, "calculate").url == f"/t/acme/tools/{tool.pk}/"  # one tool by that name
    listed = _find(client, "c").content.decode()  # several tools hold a c
    assert f'href="/t/acme/tools/{tool.pk}/"' in listed and 'data-kind="tool"' in listed
    agent = _find(client, "ops-bot")
    assert agent.status_code == 200 and 'href="/t/acme/sessions/?agent=ops-bot"' in agent.content.decode()


def test_the_box_finds_nothing_of_another_tenant_and_refuses_bad_text(world, calls):
    client = world.a.console("viewer")
    for text in [str(world.b.calls[0].pk), world.b.calls[0].call_id, str(world.b.session.pk)]:
        response = _find(client, text)
        if world.b.calls[0].call_id == text and ToolCall.objects.for_tenant(world.a.tenant).filter(call_id=text):
            continue  # A has a call of that id too: that one is A's
        assert response.status_code == 200 and 'id="found-nothing"' in response.content.decode(), text
    assert world.b.tenant.slug not in _find(client, "current_time").content.decode()
    for text, message in [("a\x00b", "Null characters are not allowed"), ("x" * 201, "at most 200 characters"),
                          ("", "This field is required")]:
        response = _find(client, text)
        assert response.status_code == 400 and message in response.content.decode(), repr(text)


def test_the_header_holds_the_box_on_every_tenant_page(world):
    html = world.a.console("viewer").get("/t/acme/tools/").content.decode()
    assert 'action="/t/acme/search/"' in html and 'role="search"' in html


# --- a constant number of queries at scale ----------------------------------------------------------

def _queries(client, path: str) -> int:
    client.get(path)  # a page viewed again: the viewer's zone, kept by a first view, stays kept
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path)
        assert response.status_code in (200, 302), (path, response.status_code)  # an id found goes to its page
    return len(captured)


def test_the_call_and_session_lists_take_as_many_queries_at_100k_calls_as_at_10(world, calls):
    client = world.a.console("operator")
    paths = ["/t/acme/calls/", "/t/acme/calls/?agent=ops&decision=ask&since=2026-01-01&page=2",
             "/t/acme/calls/?tool=calc&status=running", "/t/acme/sessions/?agent=ops&page=2",
             "/t/acme/search/?q=sum"]
    total = ToolCall.objects.for_tenant(world.a.tenant).get(pk=calls["total"])
    copy_rows(total, 10, {"call_id": ("'copy-' || n", [])})
    copy_rows(calls["ops"], 10, {"agent": ("'ops-copy-' || n", [])})
    few = [_queries(client, path) for path in paths]
    copy_rows(total, 100_000, {"call_id": ("'bulk-' || n", [])})
    copy_rows(calls["ops"], 2_000, {"agent": ("'ops-bulk-' || n", [])})
    assert ToolCall.objects.for_tenant(world.a.tenant).count() > 100_000
    assert [_queries(client, path) for path in paths] == few
    assert [_queries(client, path.replace("page=2", "page=1500")) for path in paths] == few
