"""What a session's resource subscriptions keep (docs/mcp.md, "Resources and subscriptions"): at most 100 resources
the session may read, remembered in the session; and when a subscribed resource counts as changed: a new version
that changes its file, or a skill the session no longer sees; a new version that leaves the file as it was does
not. The notifications themselves are tests/mcp/test_subscriptions.py's."""
import pytest
from mcp.shared.exceptions import MCPError

from skills.archives import package_from_upload
from skills.models import Skill
from skills.services import skill_update, skill_upload
from tools.catalog.services import session_create
from tools.gateway.protocol import (
    MAX_SUBSCRIPTIONS,
    mcp_resource_subscribe,
    mcp_resource_unsubscribe,
    resource_stamps,
    session_subscriptions,
)
from tools.models import AgentSession

pytestmark = pytest.mark.django_db


def publish(tenant, name: str, body: str, **files: str):
    front = f"---\nname: {name}\ndescription: Many notes.\n---\n{body}\n"
    package = package_from_upload([("SKILL.md", front.encode()), *((p, t.encode()) for p, t in files.items())])
    return skill_upload(tenant=tenant, package=package, actor="test")


def fresh(session) -> AgentSession:
    row = AgentSession.objects.for_tenant(session.tenant_id).get(pk=session.pk)
    row.tenant = session.tenant
    return row


def refused(session, uri: str) -> str:
    with pytest.raises(MCPError) as error:
        mcp_resource_subscribe(session, uri)
    assert error.value.code == -32602
    return error.value.error.message


def test_at_most_a_hundred_readable_resources_are_remembered_and_unsubscribing_makes_room(world):
    tenant = world.a.tenant
    publish(tenant, "many-notes", "v1", **{f"n{i:03}.md": f"note {i}" for i in range(MAX_SUBSCRIPTIONS)})
    session = session_create(tenant=tenant, agent="sub-bot")
    uris = [f"skill://many-notes/n{i:03}.md" for i in range(MAX_SUBSCRIPTIONS)]
    for uri in uris:
        mcp_resource_subscribe(session, uri)
    assert sorted(session_subscriptions(fresh(session))) == uris
    assert "at most 100" in refused(session, "skill://many-notes/SKILL.md")
    mcp_resource_subscribe(session, uris[0])  # subscribing again takes no room
    mcp_resource_unsubscribe(session, uris[1])
    mcp_resource_unsubscribe(session, uris[1])  # not subscribed any more: fine
    mcp_resource_subscribe(session, "skill://many-notes/SKILL.md")
    kept = session_subscriptions(fresh(session))
    assert len(kept) == MAX_SUBSCRIPTIONS and uris[1] not in kept and "skill://many-notes/SKILL.md" in kept
    for uri in list(kept):
        mcp_resource_unsubscribe(session, uri)
    assert "mcp_resource_subscriptions" not in fresh(session).context  # nothing left behind


def test_another_tenants_resource_is_refused_as_a_missing_one_is(world):
    publish(world.b.tenant, "b-notes", "tenant B's")
    session = session_create(tenant=world.a.tenant, agent="sub-bot")
    foreign, missing = "skill://b-notes/SKILL.md", "skill://a-nothing/SKILL.md"
    assert refused(session, foreign).replace(foreign, "") == refused(session, missing).replace(missing, "")
    assert "1000 characters" in refused(session, "skill://b-notes/" + "x" * 1000)
    assert session_subscriptions(fresh(session)) == {}


def test_a_resource_changes_with_its_file_or_when_its_skill_is_out_of_sight(world):
    tenant = world.a.tenant
    publish(tenant, "watched", "v1", **{"same.md": "same", "edited.md": "first"})
    session = session_create(tenant=tenant, agent="sub-bot")
    uris = ["skill://watched/SKILL.md", "skill://watched/same.md", "skill://watched/edited.md",
            "skill://watched/gone.md"]
    before = resource_stamps(session, uris)
    publish(tenant, "watched", "v2", **{"same.md": "same", "edited.md": "second"})
    after = resource_stamps(session, uris)
    assert [before[uri] == after[uri] for uri in uris[:3]] == [False, True, False]
    assert before[uris[3]] is None and after[uris[3]] is None
    skill_update(skill=Skill.objects.for_tenant(tenant).get(name="watched"), agents=["another-bot"])
    assert set(resource_stamps(session, uris).values()) == {None}  # no longer seen: changed, and unreadable
