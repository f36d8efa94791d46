"""Times (docs/notes/console.md, "Times"): every instant with its zone, in the viewer's time zone, one format
for instants and one for durations, the exact instant on hover."""
import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.template import Context, Template
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.services import rule_create
from tenancy.people.services import profile_update
from tenancy.web import duration_text
from tests.console.conftest import console_routes, console_url, page_text
from tools.calls.submit import calls_submit
from tools.models import ToolCall

pytestmark = pytest.mark.django_db

# A date with a time of day, as any format of ours or Django's would write one (the hover's too).
DATE_TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d")
TIME_ELEMENT = re.compile(r"<time [^>]*>.*?</time>", re.S)


@pytest.mark.parametrize("value,text", [
    (0, "0 s"), (0.35, "0.35 s"), (2.5, "2.5 s"), (5, "5 s"), (45.4, "45 s"), (60, "1 min"),
    (65, "1 min 5 s"), (3600, "1 h"), (3605, "1 h"), (3660, "1 h 1 min"), (90061, "1 d 1 h"),
    (timedelta(days=2, hours=3, minutes=4), "2 d 3 h"), (-65, "1 min 5 s"),
])
def test_one_format_for_durations(value, text):
    assert duration_text(value) == text


def _render(source: str, **context) -> str:
    return Template("{% load console_tags %}" + source).render(Context(context))


def test_an_instant_names_its_zone_and_shows_the_exact_instant_on_hover():
    at = datetime(2026, 7, 1, 10, 5, 7, 123456, tzinfo=ZoneInfo("UTC"))
    with timezone.override(ZoneInfo("Europe/Berlin")):
        html = _render("{{ at|instant }}", at=at)
    assert html == ('<time datetime="2026-07-01T12:05:07.123456+02:00" title="2026-07-01 12:05:07.123 CEST '
                    '(UTC+0200)">2026-07-01 12:05:07 CEST</time>')
    with timezone.override(ZoneInfo("America/New_York")):
        assert ">2026-07-01 06:05:07 EDT</time>" in _render("{{ at|instant }}", at=at)
    assert _render("{{ at|instant|default:'—' }}", at=None) == "—"


def test_relative_times_use_the_duration_format_and_hover_the_instant():
    now = timezone.now()
    soon = _render("{{ at|relative }}", at=now + timedelta(minutes=59, seconds=30))
    assert re.fullmatch(r'<time datetime="[^"]+" title="[^"]+">in 59 min( \d+ s)?</time>', soon)
    assert ">5 min ago</time>" in _render("{{ at|relative }}", at=now - timedelta(minutes=5, seconds=0.4))
    assert _render("{{ at|since_start:start }}", at=now + timedelta(seconds=0.35), start=now) == "+0.35 s"


def _pages(client, tenant_world) -> dict[str, str]:
    pages = {}
    for name, params in console_routes():
        if (response := client.get(console_url(name, params, tenant_world))).status_code == 200:
            pages[name] = page_text(response)
    approval = ApprovalRequest.objects.for_tenant(tenant_world.tenant).first()
    for url in ["/t/acme/inbox/", "/t/acme/inbox/history/", f"/t/acme/inbox/{approval.pk}/", "/t/acme/queues/",
                "/t/acme/inbox/external/"]:
        response = client.get(url)
        assert response.status_code == 200, url
        pages[url] = page_text(response)
    return pages


def test_every_page_shows_instants_in_the_viewers_zone_and_only_so(world):
    """No page writes a date and time outside a <time> element, and those show the viewer's zone."""
    tenant = world.a.tenant
    rule_create(tenant=tenant, behavior="ask", tool_pattern="current_time")
    asked = calls_submit(session=world.a.session, calls=[{"name": "current_time", "input": {}, "id": "asked"}])
    assert ToolCall.objects.for_tenant(tenant).get(pk=asked[0].pk).status == "awaiting_approval"
    admin = world.a.users["admin"]
    profile_update(user=admin, name="", email="admin@example.com", time_zone="Asia/Kolkata")
    pages = _pages(world.a.console("admin"), world.a)
    assert len(pages) > 30
    shown = 0
    for name, html in pages.items():
        if name.startswith("console:audit_export"):
            continue  # the exports are for machines: ISO 8601 with the offset
        for element in TIME_ELEMENT.findall(html):
            if DATE_TIME.search(re.sub(r"<[^>]+>", "", element)):
                assert re.search(r">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d IST</time>$", element), (name, element)
                assert 'title="' in element and "+05:30" in element, (name, element)
                shown += 1
        outside = DATE_TIME.findall(re.sub(r"<[^>]+>", " ", TIME_ELEMENT.sub("", html)))  # text, not attributes
        assert not outside, (name, outside)
    assert shown > 20
