"""The live console, server side: pages name their sockets and mark what the client updates; the rows
fragment a live list asks for is scoped like every console page; the nav's inbox badge counts.

The browser half (sockets really updating the pages) is tests/console/test_live_browser.py.
"""
import re
import uuid

import pytest
from django.test import Client

from approvals.models import ApprovalRequest
from tools.calls.events import call_event_append
from tools.models import CallStatus, ToolCall

pytestmark = pytest.mark.django_db


def _html(client, url) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def _attr(html: str, name: str, element: str = "") -> list[str]:
    """The values of attribute `name` (on elements whose opening tag contains `element`)."""
    tags = re.findall(r"<[a-z]+\b[^>]*>", html)
    return [m.group(1) for tag in tags if element in tag for m in [re.search(rf'\s{name}="([^"]*)"', tag)] if m]


def _rows_url(html: str) -> str:
    (url,) = _attr(html, "data-live-rows")
    return url.replace("&amp;", "&")


def test_the_calls_list_follows_the_tenants_call_stream(world):
    html = _html(world.a.console("viewer"), "/t/acme/calls/")
    assert _attr(html, "data-live-stream", 'data-live="calls"') == ["/ws/console/acme/calls/"]
    assert _attr(html, "data-live-new") == ["prepend"]
    assert _rows_url(html) == "/t/acme/calls/?fragment=rows"
    for call in world.a.calls:  # every row names its call, the last event it shows and its status
        assert re.search(rf'<tr data-call="{call.pk}" data-seq="{call.event_seq}" data-status="{call.status}">', html)
    assert html.count("data-call-status>") == len(world.a.calls)
    assert 'id="live-indicator"' in html
    assert html.count("window.toolkeeperLive") == 1  # the client, once per page


def test_a_filtered_list_asks_rows_with_its_filters_and_an_older_page_only_shows_a_notice(world):
    client = world.a.console("viewer")
    filtered = _html(client, "/t/acme/calls/?status=failed&tool=no_such_tool")
    assert _rows_url(filtered) == "/t/acme/calls/?fragment=rows&status=failed&tool=no_such_tool"
    from tools.calls.submit import calls_submit

    calls_submit(session=world.a.session, calls=[{"name": "no_such_tool", "input": {}} for _ in range(50)])
    assert _attr(_html(client, "/t/acme/calls/"), "data-live-new") == ["prepend"]
    older = _html(client, "/t/acme/calls/?page=2")
    assert _attr(older, "data-live-new") == ["notice"]
    assert "data-live-notice hidden" in older


def test_dashboard_and_session_page_follow_their_streams(world):
    client = world.a.console("viewer")
    dashboard = _html(client, "/t/acme/")
    assert _attr(dashboard, "data-live-stream", 'data-live="calls"') == ["/ws/console/acme/calls/"]
    assert _attr(dashboard, "data-live-max") == ["10"]
    session = world.a.session
    page = _html(client, f"/t/acme/sessions/{session.pk}/")
    assert _attr(page, "data-live-stream", 'data-live="calls"') == [f"/ws/console/acme/sessions/{session.pk}/"]
    assert _rows_url(page) == "/t/acme/calls/?fragment=rows&hide_session=1"
    # pages that are not live do not open call streams
    tool = world.a.tools["current_time"]
    assert _attr(_html(client, f"/t/acme/tools/{tool.pk}/"), "data-live-stream", 'data-live="calls"') == []


def test_a_running_calls_page_resumes_its_stream_after_the_last_event_it_shows(world):
    call = ToolCall.objects.create(tenant=world.a.tenant, session=world.a.session, call_id="call_long",
                                   tool_name="countdown", status=CallStatus.RUNNING)
    for done in range(3):
        call_event_append(call=call, kind="progress", data={"text": f"{3 - done} s left", "progress": done / 4})
    call_event_append(call=call, kind="output", data={"text": "a line of <output>"})
    html = _html(world.a.console("viewer"), f"/t/acme/calls/{call.pk}/")
    (live,) = re.findall(r'<div class="call-page"[^>]*>', html)
    assert f'data-live-call="{call.pk}"' in live
    assert 'data-live-after="4"' in live
    assert f'data-live-stream="/ws/console/acme/calls/{call.pk}/"' in live
    # the server renders what the socket will extend: the progress so far, the output lines, the timeline
    assert re.search(r'<progress class="bar" data-live-progress max="1" value="0.5000"', html)
    assert "data-live-progress-label>50%<" in html
    assert "data-live-progress-section hidden" not in html
    lines = re.findall(r'<div class="line">([^<]*)</div>', html)
    assert lines == ["3 s left", "2 s left", "1 s left", "a line of &lt;output&gt;"]
    assert [int(seq) for seq in _attr(html, "data-seq")] == [1, 2, 3, 4]
    assert {"call-audit", "call-facts", "call-outcome"} <= set(_attr(html, "data-live-region"))


def test_a_finished_calls_page_opens_no_socket_and_hides_empty_live_parts(world):
    call = world.a.calls[1]  # failed, no progress
    html = _html(world.a.console("viewer"), f"/t/acme/calls/{call.pk}/")
    (live,) = re.findall(r'<div class="call-page"[^>]*>', html)
    assert "data-live-stream" not in live
    assert f'data-live-after="{call.event_seq}"' in live
    assert "data-live-progress-section hidden" in html
    assert "data-live-output-section hidden" in html
    assert "ToolNotAvailable" in html  # the error, inside its reloadable region
    assert re.search(r'<div data-live-region="call-outcome">.*<h2>Error</h2>.*ToolNotAvailable.*</div>', html, re.S)


# --- the rows fragment --------------------------------------------------------------------------------

def test_the_rows_fragment_returns_the_named_calls_of_the_tenant(world):
    client = world.a.console("viewer")
    first, second = world.a.calls
    response = client.get("/t/acme/calls/", {"fragment": "rows", "call": [str(second.pk), str(first.pk)]})
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html and "<table" not in html  # rows only
    assert _attr(html, "data-call") == [str(second.pk), str(first.pk)]  # newest first, as the list
    assert "/t/acme/sessions/" in html  # the session column
    hidden = _html(client, f"/t/acme/calls/?fragment=rows&call={first.pk}&hide_session=1")
    assert "/t/acme/sessions/" not in hidden
    # the page's filters apply: a call that does not match is left out
    assert _attr(_html(client, f"/t/acme/calls/?fragment=rows&status=failed&call={first.pk}"), "data-call") == []


def test_the_rows_fragment_is_scoped_like_every_console_page(world):
    own = world.a.calls[0].pk
    foreign = world.b.calls[0].pk
    client = world.a.console("admin")
    assert client.get(f"/t/acme/calls/?fragment=rows&call={foreign}").status_code == 404
    assert client.get(f"/t/acme/calls/?fragment=rows&call={own}&call={foreign}").status_code == 404
    assert client.get(f"/t/acme/calls/?fragment=rows&call={uuid.uuid4()}").status_code == 404
    assert client.get("/t/acme/calls/?fragment=rows&call=not-a-uuid").status_code == 404
    assert client.get("/t/acme/calls/?fragment=rows").status_code == 404
    too_many = "&".join(f"call={own}" if i == 0 else f"call={uuid.uuid4()}" for i in range(51))
    assert client.get(f"/t/acme/calls/?fragment=rows&{too_many}").status_code == 404
    # a member of B only, asking A's page for A's call: 404, as every console page; anonymous: the login page
    assert world.b.console("admin").get(f"/t/acme/calls/?fragment=rows&call={own}").status_code == 404
    anonymous = Client().get(f"/t/acme/calls/?fragment=rows&call={own}")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
    # under B's own URL, B's call is fine
    assert world.b.console("viewer").get(f"/t/globex/calls/?fragment=rows&call={foreign}").status_code == 200


# --- the nav: inbox links and the pending count -------------------------------------------------------

def _badge(html: str) -> str:
    (match,) = re.findall(r'<span class="count( zero)?"[^>]*data-live="inbox-count"[^>]*>(\d+)</span>', html)
    return match[1] + (" zero" if match[0] else "")


def test_the_nav_badge_counts_pending_approvals_and_follows_the_inbox_stream(world):
    a, b = world.a, world.b
    client = a.console("viewer")
    html = _html(client, "/t/acme/tools/")
    assert _badge(html) == "0 zero"
    assert _attr(html, "data-live-stream", 'data-live="inbox-count"') == ["/ws/console/acme/inbox/"]
    for href in ("/t/acme/inbox/", "/t/acme/rules/", "/t/acme/queues/"):
        assert f'href="{href}"' in html

    for call, status in zip(a.calls, ("pending", "approved"), strict=True):
        ApprovalRequest.objects.create(tenant=a.tenant, call=call, status=status, agent=a.session.agent,
                                       tool_name=call.tool_name)
    ApprovalRequest.objects.create(tenant=b.tenant, call=b.calls[0], agent=b.session.agent, tool_name="x")
    for url in ("/t/acme/", "/t/acme/calls/", f"/t/acme/calls/{a.calls[0].pk}/"):
        assert _badge(_html(client, url)) == "1"  # A's one pending request, not the approved one nor B's
    assert _badge(_html(b.console("viewer"), "/t/globex/")) == "1"


def test_pages_without_a_tenant_open_no_sockets(world):
    login = _html(Client(), "/login/")
    assert "data-live-stream" not in login and "toolkeeperLive" not in login
