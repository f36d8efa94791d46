"""The tenant's `tool_surface` setting (docs/governance.md#tool-search) through the admin API and the console's
settings page: validated, audited, and deciding what a new session is listed."""
import pytest

from audit.models import Event
from tools.catalog.selectors import visible_tools
from tools.catalog.services import session_create

pytestmark = pytest.mark.django_db


def names(session) -> set[str]:
    return {exposed.name for exposed in visible_tools(session)}


def test_the_api_reads_and_sets_it_and_the_audit_trail_says_who(world):
    admin = world.a.client("admin")
    read = admin.get("/api/v1/governance")
    assert read.status_code == 200
    assert read.json() == {"default_behavior": "allow", "auto_allow_read_only": True, "max_parallel_calls": 8,
                           "review_untrusted": True,
                           "tool_surface": "full"}
    changed = admin.patch("/api/v1/governance", {"tool_surface": "search"}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["tool_surface"] == "search"
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.tool_surface == "search"
    event = Event.objects.for_tenant(world.a.tenant).filter(verb="tenant.governance_set").get()
    assert event.data == {"tool_surface": "search"}
    assert "search_tools" in names(session_create(tenant=world.a.tenant, agent="support-bot"))
    world.b.tenant.refresh_from_db()
    assert world.b.tenant.tool_surface == "full"  # the other tenant's setting is its own


@pytest.mark.parametrize("body", [{"tool_surface": "some"}, {"tool_surface": None}, {"tool_surface": ["search"]},
                                  {"max_parallel_calls": 0}, {"default_behavior": "maybe"}])
def test_the_api_refuses_what_is_no_setting_value(world, body):
    refused = world.a.client("admin").patch("/api/v1/governance", body, format="json")
    assert refused.status_code == 400
    assert refused.json()["error"]["fields"]
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.tool_surface == "full"


def test_only_an_admin_key_or_an_operator_changes_it(world):
    assert world.a.client("agent").patch("/api/v1/governance", {"tool_surface": "search"},
                                         format="json").status_code == 403
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.tool_surface == "full"


def test_the_console_form_sets_it_and_keeps_it_when_not_sent(world):
    operator = world.a.console("operator")
    page = operator.get("/t/acme/settings/").content.decode()
    assert "Tools listed to a session" in page and "The basic group and a tool search" in page
    saved = operator.post("/t/acme/settings/", {"section": "governance", "default_behavior": "allow",
                                                "auto_allow_read_only": "on", "review_untrusted": "on",
                                                "max_parallel_calls": "8", "tool_surface": "search"})
    assert saved.status_code == 302
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.tool_surface == "search"
    event = Event.objects.for_tenant(world.a.tenant).filter(verb="tenant.governance_set").get()
    assert event.data == {"tool_surface": "search"} and event.actor == world.a.users["operator"]
    operator.post("/t/acme/settings/", {"section": "governance", "default_behavior": "allow",
                                        "auto_allow_read_only": "on", "review_untrusted": "on",
                                        "max_parallel_calls": "4"})
    world.a.tenant.refresh_from_db()
    assert (world.a.tenant.tool_surface, world.a.tenant.max_parallel_calls) == ("search", 4)
    bad = operator.post("/t/acme/settings/", {"section": "governance", "default_behavior": "allow",
                                              "max_parallel_calls": "4", "tool_surface": "<script>"})
    assert bad.status_code == 400 and b"<script>" not in bad.content
