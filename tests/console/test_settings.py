"""The settings page (docs/notes/console.md): decisions, parallel calls, rate limits and trust of MCP servers,
each section saved on its own, validated, audited, with its effect said beside it."""
import re

import pytest

from audit.models import Event
from tenancy.services import PARALLEL_MAX, ServiceError, tenant_governance_set
from tools.calls.submit import calls_submit
from tools.models import CallStatus, McpServer, Tool
from tools.upstream.servers import mcp_server_create

pytestmark = pytest.mark.django_db

PUBLIC_URL = "https://93.184.215.14/mcp"  # never reached: the servers here stay disabled


def _server(tw, name: str) -> McpServer:
    return mcp_server_create(tenant=tw.tenant, name=name, transport="streamable_http", url=PUBLIC_URL, enabled=False)


def test_the_page_says_what_each_setting_does(world):
    page = world.a.console("operator").get("/t/acme/settings/").content.decode()
    for said in ("Rules are read in this order", "Read-only tools run without asking", "Calls running at once",
                 "0 means no limit", "No MCP servers yet"):
        assert said in page
    _server(world.a, "docs")
    page = world.a.console("operator").get("/t/acme/settings/").content.decode()
    assert "annotations become its tools&#x27; flags" in page and "docs" in page


def test_the_decisions_set_in_the_console_decide_the_next_call(world):
    operator = world.a.console("operator")
    # calculate is read-only: with auto-allow off it falls through to the default
    saved = operator.post("/t/acme/settings/", {"section": "governance", "default_behavior": "deny",
                                                "max_parallel_calls": "4"})
    assert saved.status_code == 302 and saved["Location"] == "/t/acme/settings/"
    world.a.tenant.refresh_from_db()
    assert (world.a.tenant.default_behavior, world.a.tenant.max_parallel_calls) == ("deny", 4)
    event = Event.objects.for_tenant(world.a.tenant).filter(verb="tenant.governance_set").get()
    assert event.data == {"default_behavior": "deny", "auto_allow_read_only": False, "review_untrusted": False,
                          "max_parallel_calls": 4}
    assert event.actor == world.a.users["operator"]
    calculate = Tool.objects.for_tenant(world.a.tenant).get(name="calculate")
    assert calculate.read_only
    [call] = calls_submit(session=world.a.session, calls=[{"name": "calculate", "input": {"expression": "1+1"}}])
    call.refresh_from_db()
    assert call.status == CallStatus.DENIED
    assert "default is deny" in str(call.decision)


def test_the_review_of_untrusted_servers_tools_is_on_by_default_and_set_in_the_governance_section(world):
    operator = world.a.console("operator")
    assert world.a.tenant.review_untrusted
    page = operator.get("/t/acme/settings/").content.decode()
    assert "A reviewer looks at calls of untrusted servers&#x27; tools" in page
    assert re.search(r'<input type="checkbox" name="review_untrusted"[^>]* checked', page)
    section = {"section": "governance", "default_behavior": "allow", "auto_allow_read_only": "on",
               "max_parallel_calls": str(world.a.tenant.max_parallel_calls)}
    assert operator.post("/t/acme/settings/", section).status_code == 302  # the box left unticked
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.review_untrusted is False
    event = Event.objects.for_tenant(world.a.tenant).get(verb="tenant.governance_set")
    assert event.data == {"review_untrusted": False} and event.actor == world.a.users["operator"]
    assert operator.post("/t/acme/settings/", {**section, "review_untrusted": "on"}).status_code == 302
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.review_untrusted is True
    world.b.tenant.refresh_from_db()
    assert world.b.tenant.review_untrusted is True  # another tenant's own setting
    with pytest.raises(ServiceError) as refused:
        tenant_governance_set(tenant=world.a.tenant, review_untrusted="no")
    assert refused.value.detail == {"review_untrusted": ["true or false"]}


def test_a_refused_section_keeps_what_was_typed_and_saves_nothing(world):
    operator = world.a.console("operator")
    refused = operator.post("/t/acme/settings/", {"section": "governance", "default_behavior": "deny",
                                                  "max_parallel_calls": "0"})
    assert refused.status_code == 400
    page = refused.content.decode()
    assert "greater than or equal to 1" in page and 'value="0"' in page
    assert '<option value="deny" selected>' in page
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.default_behavior == "allow" and world.a.tenant.max_parallel_calls != 0
    assert not Event.objects.for_tenant(world.a.tenant).filter(verb="tenant.governance_set").exists()
    unnamed = operator.post("/t/acme/settings/", {"default_behavior": "deny", "max_parallel_calls": "2"}, follow=True)
    assert "did not say which settings" in unnamed.content.decode()
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.default_behavior == "allow"


def test_trust_is_chosen_per_server_and_only_among_the_tenants_own(world):
    docs, files = _server(world.a, "docs"), _server(world.a, "files")
    foreign = _server(world.b, "theirs")
    operator = world.a.console("operator")
    assert operator.post("/t/acme/settings/", {"section": "trust", "trusted": [docs.pk]}).status_code == 302
    docs.refresh_from_db()
    files.refresh_from_db()
    assert docs.trusted and not files.trusted
    updated = Event.objects.for_tenant(world.a.tenant).filter(verb="mcp_server.updated")
    assert [e.data["fields"] for e in updated] == [["trusted"]]
    refused = operator.post("/t/acme/settings/", {"section": "trust", "trusted": [docs.pk, foreign.pk]})
    assert refused.status_code == 400 and "Select a valid choice" in refused.content.decode()
    foreign.refresh_from_db()
    assert not foreign.trusted
    assert operator.post("/t/acme/settings/", {"section": "trust"}).status_code == 302  # none trusted
    docs.refresh_from_db()
    assert not docs.trusted


def test_reviewers_cannot_open_or_change_the_settings(world):
    reviewer = world.a.console("reviewer")
    assert reviewer.get("/t/acme/settings/").status_code == 403
    assert reviewer.post("/t/acme/settings/", {"section": "governance", "default_behavior": "allow",
                                               "max_parallel_calls": "9"}).status_code == 403


@pytest.mark.parametrize("values,field", [
    ({"default_behavior": "maybe"}, "default_behavior"),
    ({"auto_allow_read_only": "yes"}, "auto_allow_read_only"),
    ({"max_parallel_calls": 0}, "max_parallel_calls"),
    ({"max_parallel_calls": PARALLEL_MAX + 1}, "max_parallel_calls"),
    ({"max_parallel_calls": True}, "max_parallel_calls"),
    ({"slug": "other"}, "slug"),
])
def test_the_service_refuses_what_the_form_would(world, values, field):
    with pytest.raises(ServiceError) as refused:
        tenant_governance_set(tenant=world.a.tenant, **values)
    assert field in refused.value.fields
