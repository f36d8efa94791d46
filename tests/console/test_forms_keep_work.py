"""Forms that keep work (docs/notes/console.md, "Forms"): every error of a form in one answer, what was typed kept
(secrets said plainly to be typed again), constraints shown before submitting, typed inputs."""
import re

import pytest

from approvals import services as approvals
from approvals.models import NotificationChannel
from tenancy.editing import RETYPE_HINT
from tools.models import McpServer

pytestmark = pytest.mark.django_db

URL_SECRET = "https://hooks.example.com/services/T0/B0/tok-3f9a7c"  # a Slack URL holds its token
SHORT_SECRET = "short-5ecret"  # noqa: S105


@pytest.fixture
def channel_page(world):
    queue = approvals.queue_save(tenant=world.a.tenant, name="ops-q")
    return f"/t/acme/queues/{queue.pk}/notifications/"


def _errors(html: str) -> list[str]:
    summary = re.search(r'<div class="error-summary".*?</ul>', html, re.S).group(0)
    return re.findall(r"<li><a href=\"#id_(\w+)\">", summary)


def test_every_error_of_a_channel_comes_in_one_answer(world, channel_page):
    refused = world.a.console("operator").post(channel_page, {
        "name": "not a slug!", "kind": "webhook", "events": ["requested"], "url": "http://169.254.169.254/latest",
        "signing_secret": SHORT_SECRET, "quiet_from": "22:00", "enabled": "on"})
    html = refused.content.decode()
    assert refused.status_code == 400
    assert sorted(_errors(html)) == ["name", "quiet_until", "signing_secret", "url"]
    assert "at least 16 characters" in html and "quiet hours need both a start and an end" in html
    assert "http://169.254.169.254/latest" not in html and SHORT_SECRET not in html  # never sent back…
    assert html.count(RETYPE_HINT) == 2  # …and the page says so, next to each
    assert 'value="not a slug!"' in html and 'value="22:00"' in html  # the rest is kept as typed
    assert not NotificationChannel.objects.for_tenant(world.a.tenant).exists()


def test_the_channel_form_shows_its_constraints_and_typed_inputs(world, channel_page):
    html = world.a.console("operator").get(channel_page).content.decode()
    assert re.search(r'<input type="password" name="signing_secret"[^>]*minlength="16"', html)
    assert re.search(r'<input type="url" name="url"', html)
    assert re.search(r'<input type="time" name="quiet_from"', html)
    assert "at least 16 characters" in html and "in UTC" in html
    assert RETYPE_HINT not in html


def test_a_refused_mcp_server_keeps_its_url_and_asks_for_its_headers_again(world):
    operator = world.a.console("operator")
    refused = operator.post("/t/acme/mcp-servers/new/", {
        "name": "Not Valid", "transport": "streamable_http", "url": "https://93.184.215.14/mcp",
        "headers": "Authorization: Bearer tok-77aa", "timeout_s": "0"})
    html = refused.content.decode()
    assert refused.status_code == 400 and sorted(_errors(html)) == ["name", "timeout_s"]
    assert 'value="https://93.184.215.14/mcp"' in html and "tok-77aa" not in html
    assert html.count(RETYPE_HINT) == 1
    assert not McpServer.objects.for_tenant(world.a.tenant).exists()
