"""Operators change things through the console; viewers and reviewers cannot; bad input is a form error."""
import json
import re
from html import unescape

import pytest

from audit.models import Event
from tools.catalog.services import binding_set
from tools.models import BoundArgument, Tool, ToolGroup

pytestmark = pytest.mark.django_db


def schema_on_page(html: str, label: str) -> dict:
    match = re.search(rf'<pre data-schema="{re.escape(label)}">(.*?)</pre>', html, re.S)
    assert match, f"no schema {label!r} on the page"
    return json.loads(unescape(match.group(1)))


# --- tools -------------------------------------------------------------------------------------

def test_tool_page_shows_the_schema_without_bound_arguments(world):
    tool = world.a.tools["current_time"]
    assert "timezone" in tool.input_schema["properties"]
    client = world.a.console("viewer")
    page = client.get(f"/t/acme/tools/{tool.pk}/").content.decode()
    # the world binds timezone for the agent support-bot only: tenant-wide it is still the model's to fill
    assert "timezone" in schema_on_page(page, "tenant")["properties"]
    agent_view = schema_on_page(page, "agent:support-bot")
    assert "timezone" not in agent_view.get("properties", {})
    assert "timezone" not in agent_view.get("required", [])
    assert "Asia/Tokyo" not in page  # viewers do not see bound values

    binding_set(tenant=world.a.tenant, tool=tool, name="timezone", value="Europe/Berlin")
    page = client.get(f"/t/acme/tools/{tool.pk}/").content.decode()
    tenant_view = schema_on_page(page, "tenant")
    assert "timezone" not in tenant_view["properties"]
    assert "timezone" not in tenant_view.get("required", [])
    operator_page = world.a.console("operator").get(f"/t/acme/tools/{tool.pk}/").content.decode()
    assert "Europe/Berlin" in operator_page


def test_tool_schema_matches_what_the_api_gives_the_model(world):
    tool = world.a.tools["current_time"]
    binding_set(tenant=world.a.tenant, tool=tool, name="timezone", value="UTC")
    session = world.a.client("agent").post("/api/v1/sessions", {"agent": "other-bot"}, format="json").json()
    tools = world.a.client("agent").get(f"/api/v1/sessions/{session['id']}/tools?format=openai").json()["tools"]
    api_schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == "current_time")
    page = world.a.console("viewer").get(f"/t/acme/tools/{tool.pk}/").content.decode()
    assert schema_on_page(page, "tenant") == api_schema


def test_operator_disables_and_enables_a_tool(world):
    tool = world.a.tools["calculate"]
    client = world.a.console("operator")
    response = client.post(f"/t/acme/tools/{tool.pk}/", {"enabled": "false"}, follow=True)
    assert response.status_code == 200 and "is now disabled" in response.content.decode()
    assert not Tool.objects.for_tenant(world.a.tenant).get(pk=tool.pk).enabled
    assert Event.objects.for_tenant(world.a.tenant).filter(verb="tool.updated", actor_label="acme-operator").exists()
    client.post(f"/t/acme/tools/{tool.pk}/", {"enabled": "true"})
    assert Tool.objects.for_tenant(world.a.tenant).get(pk=tool.pk).enabled


# Who may post to which form, and that nothing changes when refused: tests/console/test_form_pages.py.

@pytest.mark.parametrize("role", ["viewer", "reviewer"])
def test_readers_get_no_buttons_that_would_only_answer_403(world, role):
    page = world.a.console(role).get(f"/t/acme/tools/{world.a.tools['calculate'].pk}/").content.decode()
    assert "Disable this tool" not in page


def test_operators_are_not_offered_new_api_keys(world):
    assert "New API key" not in world.a.console("operator").get("/t/acme/keys/").content.decode()


# --- groups ------------------------------------------------------------------------------------

def test_group_create_edit_delete(world):
    client = world.a.console("operator")
    tools = world.a.tools
    response = client.post("/t/acme/groups/new/", {
        "name": "research", "description": "Look things up.", "notes": "Cite sources.", "switchable": "on",
        "tools": [tools["calculate"].pk, tools["current_time"].pk],
    })
    assert response.status_code == 302
    group = ToolGroup.objects.for_tenant(world.a.tenant).get(name="research")
    assert group.switchable and not group.default_active and group.notes == "Cite sources."
    assert {t.name for t in group.tools.all()} == {"calculate", "current_time"}

    edit = client.get(f"/t/acme/groups/{group.pk}/").content.decode()
    assert "Cite sources." in edit and "checked" in edit
    client.post(f"/t/acme/groups/{group.pk}/", {"name": "research2", "description": "", "notes": "",
                                                "default_active": "on", "tools": [tools["calculate"].pk]})
    group.refresh_from_db()
    assert group.name == "research2" and group.default_active and not group.switchable
    assert [t.name for t in group.tools.all()] == ["calculate"]

    assert client.get(f"/t/acme/groups/{group.pk}/delete/").status_code == 200
    assert client.post(f"/t/acme/groups/{group.pk}/delete/").status_code == 302
    assert not ToolGroup.objects.for_tenant(world.a.tenant).filter(pk=group.pk).exists()
    verbs = set(Event.objects.for_tenant(world.a.tenant).filter(actor_label="acme-operator")
                .values_list("verb", flat=True))
    assert {"group.created", "group.updated", "group.deleted"} <= verbs


def test_the_basic_group_cannot_be_renamed_or_deleted(world):
    client = world.a.console("admin")
    basic = world.a.groups["basic"]
    response = client.post(f"/t/acme/groups/{basic.pk}/", {
        "name": "renamed", "default_active": "on", "tools": [t.pk for t in basic.tools.all()],
    })
    assert response.status_code == 400
    assert "always active" in response.content.decode()
    response = client.post(f"/t/acme/groups/{basic.pk}/delete/")
    assert response.status_code == 400
    assert "cannot be deleted" in response.content.decode()
    basic.refresh_from_db()
    assert basic.name == "basic"
    # its notes and tools can still change
    response = client.post(f"/t/acme/groups/{basic.pk}/", {"name": "basic", "default_active": "on",
                                                           "notes": "Always here.", "tools": []})
    assert response.status_code == 302
    basic.refresh_from_db()
    assert basic.notes == "Always here." and not basic.tools.exists()


# --- bindings ----------------------------------------------------------------------------------

def test_binding_create_and_delete(world):
    client = world.a.console("operator")
    tool = world.a.tools["current_time"]
    response = client.post("/t/acme/bindings/new/", {"tool": tool.pk, "agent": "", "name": "timezone",
                                                     "value": '"America/New_York"'})
    assert response.status_code == 302
    binding = BoundArgument.objects.for_tenant(world.a.tenant).get(tool=tool, agent="")
    assert binding.value == "America/New_York"
    listing = client.get("/t/acme/bindings/").content.decode()
    assert "America/New_York" in listing and "Asia/Tokyo" in listing
    assert client.post(f"/t/acme/bindings/{binding.pk}/delete/").status_code == 302
    assert not BoundArgument.objects.for_tenant(world.a.tenant).filter(pk=binding.pk).exists()
    assert "America/New_York" not in world.a.console("viewer").get("/t/acme/bindings/").content.decode()


def test_a_binding_is_chosen_from_the_schema_and_its_value_checked_against_it(world):
    """A value the tool's schema refuses would fail every call, on an argument the model cannot see."""
    client = world.a.console("operator")
    tool = world.a.tools["current_time"]
    page = client.get(f"/t/acme/bindings/new/?tool={tool.pk}").content.decode()
    assert '<select name="name"' in page and '<option value="timezone">timezone (string)' in page
    assert 'id="schema-preview"' in page and "&quot;timezone&quot;" in page  # what the model sees now
    assert 'id="choose-tool"' not in page
    assert 'id="choose-tool"' in client.get("/t/acme/bindings/new/").content.decode()

    refused = client.post("/t/acme/bindings/new/", {"tool": tool.pk, "agent": "", "name": "timezone", "value": "42"})
    assert refused.status_code == 400
    assert "current_time refuses it: timezone: 42 is not of type &#x27;string&#x27;" in refused.content.decode()
    unknown = client.post("/t/acme/bindings/new/", {"tool": tool.pk, "agent": "", "name": "tz", "value": '"UTC"'})
    assert unknown.status_code == 400
    assert "Select a valid choice. tz is not one of the available choices." in unknown.content.decode()
    assert not BoundArgument.objects.for_tenant(world.a.tenant).filter(tool=tool, agent="").exists()

    # The API refuses the same value, on the same field.
    admin = world.a.client("admin")
    response = admin.post("/api/v1/bindings", {"tool": tool.name, "name": "timezone", "value": 42}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["fields"]["value"] == [
        "current_time refuses it: timezone: 42 is not of type 'string'"]


def test_revoke_unbind_and_disable_each_confirm_first_and_name_their_impact(world):
    """The list buttons open a confirmation page that says what stops; only its POST changes anything."""
    from tenancy.models import ApiKey

    admin = world.a.console("admin")
    key = world.a.key_objects["agent"]
    page = admin.get(f"/t/acme/keys/{key.pk}/revoke/").content.decode()
    assert ApiKey.objects.for_tenant(world.a.tenant).get(pk=key.pk).revoked_at is None  # looking is harmless
    assert "Every app that uses it is refused at once" in page
    assert "1 session was opened with it" in page  # the world's session
    assert f'href="/t/acme/keys/{key.pk}/revoke/"' in admin.get("/t/acme/keys/").content.decode()
    assert admin.post(f"/t/acme/keys/{key.pk}/revoke/").status_code == 302
    assert ApiKey.objects.for_tenant(world.a.tenant).get(pk=key.pk).revoked_at is not None

    operator = world.a.console("operator")
    binding = world.a.binding
    page = operator.get(f"/t/acme/bindings/{binding.pk}/delete/").content.decode()
    assert f"The server stops setting <code>{binding.name}</code> on calls of <code>{binding.tool.name}</code>" in page
    assert "The model sees the argument in the tool's schema again and chooses its value" in page
    assert BoundArgument.objects.for_tenant(world.a.tenant).filter(pk=binding.pk).exists()
    assert operator.post(f"/t/acme/bindings/{binding.pk}/delete/").status_code == 302
    assert not BoundArgument.objects.for_tenant(world.a.tenant).filter(pk=binding.pk).exists()

    tool = world.a.tools["current_time"]
    detail = operator.get(f"/t/acme/tools/{tool.pk}/").content.decode()
    assert f'href="/t/acme/tools/{tool.pk}/disable/" id="disable-tool"' in detail
    page = operator.get(f"/t/acme/tools/{tool.pk}/disable/").content.decode()
    assert "No session lists it any more, though 1 group lists it: <code>basic</code>" in page
    tool.refresh_from_db()
    assert tool.enabled
    response = operator.post(f"/t/acme/tools/{tool.pk}/disable/", {"enabled": "false"})
    assert response.status_code == 302 and response["Location"] == f"/t/acme/tools/{tool.pk}/"
    tool.refresh_from_db()
    assert not tool.enabled
    assert world.a.console("reviewer").get(f"/t/acme/tools/{tool.pk}/disable/").status_code == 403
