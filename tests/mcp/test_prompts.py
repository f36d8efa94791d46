"""The prompts of a tenant's MCP servers (docs/mcp.md#prompts, docs/governance.md#prompts): a sync stores them
from a real server (stdio, started by the client), named as tools are, and follows what it adds and removes;
/mcp/'s prompt handlers offer them to the sessions that see the server's tools, hide those a deny rule always
refuses, refuse bad arguments, get them upstream with the server's credential and audit each get; the console
shows them escaped. The same over a real SDK client against a live /mcp/: tests/mcp/test_prompts_live.py."""
import asyncio

import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from approvals.services import rule_create, rule_update
from audit.models import Event
from tests.accounts.stand_in import StandIn
from tests.accounts.test_accounts import LOCAL, connected_account
from tests.mcp.support import mcp_server
from tools.catalog.services import group_tools_add, session_create
from tools.gateway import prompts as gateway_prompts
from tools.models import Tool, ToolGroup, UpstreamPrompt
from tools.upstream.client import ListedPrompt
from tools.upstream.servers import mcp_prompts_reconcile, mcp_server_create, mcp_server_sync, mcp_tool_name

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_rule_index")]


@pytest.fixture
def synced(world, stdio_servers, upstream, tmp_path):
    """Tenant A's stdio server `local` synced (its tools in no group yet), and the file that changes its prompts."""
    prompt_file = tmp_path / "prompts.txt"
    server = mcp_server(world.a.tenant, env={"MCP_TEST_STATE": str(upstream.path),
                                             "MCP_TEST_PROMPT_FILE": str(prompt_file)})
    result = mcp_server_sync(server=server)
    assert result["status"] == "ok", result
    return server, prompt_file, result


def session_of(world, tenant="a", agent="prompt-bot"):
    side = getattr(world, tenant)
    return session_create(tenant=side.tenant, agent=agent, api_key=side.key_objects["agent"])


def offer(server, group_name="basic"):
    """An operator puts the server's `echo` tool in a group."""
    group = ToolGroup.objects.for_tenant(server.tenant).get(name=group_name)
    group_tools_add(group=group, tools=[Tool.objects.for_tenant(server.tenant).get(name="mcp__local__echo")])


def listed(session) -> dict[str, types.Prompt]:
    return {p.name: p for p in asyncio.run(gateway_prompts.list_prompts(session)).prompts}


def get(session, name, arguments=None) -> types.GetPromptResult:
    params = types.GetPromptRequestParams(name=name, arguments=arguments)
    return asyncio.run(gateway_prompts.get_prompt(session, "apikey:agent", params))


def test_a_sync_stores_the_servers_prompts_named_as_tools_are(synced):
    server, _, result = synced
    assert result["prompts"] == {"added": 4, "updated": 0, "removed": 0, "skipped": []}
    rows = {p.upstream_name: p for p in UpstreamPrompt.objects.for_tenant(server.tenant).filter(mcp_server=server)}
    assert set(rows) == {"greet", "picture", "brief", "docs.search"}
    assert rows["greet"].name == "mcp__local__greet" and rows["greet"].title == "Greeting"
    assert rows["greet"].arguments == [{"name": "name", "description": "Whom to greet.", "required": True},
                                       {"name": "mood", "description": "How.", "required": False}]
    dotted = rows["docs.search"].name
    assert dotted == mcp_tool_name("local", "docs.search") and dotted.startswith("mcp__local__docs_search_")


def test_the_sync_picks_up_added_and_removed_prompts(synced):
    server, prompt_file, _ = synced
    prompt_file.write_text("+fresh\n-picture\n")
    result = mcp_server_sync(server=server)
    assert result["prompts"] == {"added": 1, "updated": 0, "removed": 1, "skipped": []}
    names = set(UpstreamPrompt.objects.for_tenant(server.tenant).values_list("name", flat=True))
    assert names == {"mcp__local__greet", "mcp__local__brief", mcp_tool_name("local", "docs.search"),
                     "mcp__local__fresh"}
    prompt_file.write_text("")
    assert mcp_server_sync(server=server)["prompts"]["removed"] == 1  # fresh went; picture came back
    assert mcp_server_sync(server=server)["prompts"] == {"added": 0, "updated": 0, "removed": 0, "skipped": []}


def test_reconcile_skips_prompts_it_cannot_offer_and_bounds_hostile_text(world, stdio_servers):
    server = mcp_server(world.a.tenant)
    hostile = ListedPrompt(name="ok", title="t" * 900, description="d" * 9000 + "\x00",
                           arguments=[{"name": "q", "description": "x" * 5000, "required": True}])
    counts = mcp_prompts_reconcile(server=server, listed=[
        hostile,
        ListedPrompt(name="ok", title="", description="", arguments=[]),
        ListedPrompt(name="", title="", description="", arguments=[]),
        ListedPrompt(name="bad-arg", title="", description="", arguments=[{"name": "a b"}]),
        ListedPrompt(name="twice-arg", title="", description="", arguments=[{"name": "a"}, {"name": "a"}]),
        ListedPrompt(name="many", title="", description="", arguments=[{"name": f"a{i}"} for i in range(40)]),
    ])
    assert counts["added"] == 1 and [name for name, _ in counts["skipped"]] == [
        "ok", "(no usable name)", "bad-arg", "twice-arg", "many"]
    row = UpstreamPrompt.objects.for_tenant(server.tenant).get()
    assert len(row.title) == 200 and row.description == ""  # NUL: not stored
    assert len(row.arguments[0]["description"]) == 1000
    # a server that no longer declares prompts has none
    assert mcp_prompts_reconcile(server=server, listed=None)["removed"] == 1


def test_a_session_sees_a_servers_prompts_only_with_its_tools_and_another_tenant_never(world, synced):
    server, _, _ = synced
    session = session_of(world)
    assert listed(session) == {}
    with pytest.raises(MCPError) as refused:
        get(session, "mcp__local__greet", {"name": "Ada"})
    assert refused.value.error.code == types.INVALID_PARAMS
    offer(server)
    prompts = listed(session)
    assert set(prompts) == {"mcp__local__greet", "mcp__local__picture", "mcp__local__brief",
                            mcp_tool_name("local", "docs.search")}
    greet = prompts["mcp__local__greet"]
    assert greet.description == "Greets someone." and greet.title == "Greeting"
    assert [(a.name, a.required) for a in greet.arguments] == [("name", True), ("mood", False)]
    other = session_of(world, "b")
    assert listed(other) == {}
    with pytest.raises(MCPError) as foreign:
        get(other, "mcp__local__greet", {"name": "Ada"})
    assert foreign.value.error.code == types.INVALID_PARAMS
    server.enabled = False
    server.save()
    assert listed(session) == {}


def test_a_get_is_proxied_with_the_servers_credential_and_passed_through_and_audited(world, synced, upstream):
    server, _, _ = synced
    offer(server)
    session = session_of(world)
    greeting = get(session, "mcp__local__greet", {"name": "Ada", "mood": "cheerful"})
    assert greeting.description == "A greeting."
    assert [(m.role, m.content.text) for m in greeting.messages] == [("user", "Hello Ada, cheerful")]
    picture = get(session, "mcp__local__picture")
    assert picture.messages[0].content.type == "image" and picture.messages[0].content.mime_type == "image/png"
    brief = get(session, "mcp__local__brief", {"topic": "tides"})
    assert brief.messages[0].content.resource.text == "notes on tides"
    assert brief.messages[1].role == "assistant"
    dotted = get(session, mcp_tool_name("local", "docs.search"))
    assert dotted.messages[0].content.text == "the prompt docs.search"  # the upstream name, mapped back
    assert [(e["name"], e["arguments"]) for e in upstream.events("prompt")] == [
        ("greet", {"name": "Ada", "mood": "cheerful"}), ("picture", {}), ("brief", {"topic": "tides"}),
        ("docs.search", {})]
    audited = Event.objects.filter(tenant=world.a.tenant, verb="mcp_prompt.got").order_by("id")
    assert [(e.target, e.data["prompt"], e.data["arguments"], e.data["ok"]) for e in audited][:1] == [
        ("mcp_server:local", "mcp__local__greet", ["mood", "name"], True)]
    assert audited.count() == 4
    assert "Ada" not in str([e.data for e in audited])  # argument values are not kept


@pytest.mark.parametrize(("arguments", "says"), [
    ({}, "needs the argument 'name'"),
    ({"mood": "x"}, "needs the argument 'name'"),
    ({"name": "Ada", "colour": "red"}, "takes no argument 'colour'"),
    ({"name": "x" * 20_000}, "longer than"),
])
def test_bad_arguments_are_refused_before_anything_reaches_the_server(world, synced, upstream, arguments, says):
    server, _, _ = synced
    offer(server)
    with pytest.raises(MCPError) as refused:
        get(session_of(world), "mcp__local__greet", arguments)
    assert refused.value.error.code == types.INVALID_PARAMS and says in refused.value.error.message
    assert upstream.events("prompt") == []


def test_a_deny_rule_hides_a_prompt_and_refuses_its_get_and_its_removal_gives_it_back(world, synced):
    server, _, _ = synced
    offer(server)
    session = session_of(world)
    rule = rule_create(tenant=world.a.tenant, behavior="deny", tool_pattern="mcp__local__gr*")
    assert "mcp__local__greet" not in listed(session) and "mcp__local__brief" in listed(session)
    with pytest.raises(MCPError) as refused:
        get(session, "mcp__local__greet", {"name": "Ada"})
    assert refused.value.error.code == types.INVALID_PARAMS
    # a deny rule for another agent, or with argument conditions, hides nothing
    rule_update(rule=rule, agents=["someone-else"])
    assert "mcp__local__greet" in listed(session)
    rule_update(rule=rule, agents=[], enabled=False)
    assert get(session, "mcp__local__greet", {"name": "Ada"}).messages


def test_an_upstream_refusal_is_a_clear_error_and_audited(world, synced, upstream, tmp_path):
    server, prompt_file, _ = synced
    offer(server)
    session = session_of(world)
    assert "mcp__local__picture" in listed(session)
    prompt_file.write_text("-picture\n")  # gone upstream, not yet synced
    with pytest.raises(MCPError) as failed:
        get(session, "mcp__local__picture")
    assert failed.value.error.code == types.INTERNAL_ERROR
    assert "refused the prompt" in failed.value.error.message and "Traceback" not in failed.value.error.message
    event = Event.objects.filter(tenant=world.a.tenant, verb="mcp_prompt.got").get()
    assert event.data["ok"] is False and "refused the prompt" in event.data["error"]


def test_the_servers_page_shows_its_prompts_escaped(world, synced, client):
    server, prompt_file, _ = synced
    prompt_file.write_text("+<script>alert(1)</script>\n")
    mcp_server_sync(server=server)
    client.force_login(world.a.users["operator"])
    page = client.get(f"/t/{world.a.tenant.slug}/mcp-servers/{server.pk}/").content.decode()
    assert 'data-prompt="mcp__local__greet"' in page and "Whom to greet." in page and "(required)" in page
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_prompt_of_a_server_of_peoples_own_accounts_is_got_with_the_sessions_persons_token(world):
    """docs/accounts.md: the session's verified person's own token goes upstream (the stand-in server answers
    every MCP request 401, so the get fails, after showing what it was sent)."""
    stand_in = StandIn()
    try:
        tenant, reviewer = world.a.tenant, world.a.users["reviewer"]
        with LOCAL:
            server = mcp_server_create(tenant=tenant, name="files", transport="streamable_http",
                                       url=stand_in.resource, accounts="person")
        tool = Tool.objects.create(tenant=tenant, name="mcp__files__read", source="mcp", source_ref="read",
                                   mcp_server=server, input_schema={"type": "object"})
        group_tools_add(group=ToolGroup.objects.for_tenant(tenant).get(name="basic"), tools=[tool])
        mcp_prompts_reconcile(server=server, listed=[ListedPrompt("summarise", "", "Summarise.", [])])
        asserted = session_create(tenant=tenant, agent="bot", user=reviewer.username)
        with pytest.raises(MCPError) as refused:
            get(asserted, "mcp__files__summarise")
        assert refused.value.error.code == types.INTERNAL_ERROR and "verified person" in refused.value.error.message
        assert not [path for _, path, _ in stand_in.requests if path.startswith("/mcp")]

        connected_account(world, server, stand_in, role="reviewer")
        verified = session_create(tenant=tenant, agent="bot", user=reviewer.username, user_verified=True,
                                  person=reviewer)
        before = len(stand_in.requests)  # connecting asked /mcp too, without a token, to discover its server
        with LOCAL, pytest.raises(MCPError) as failed:
            get(verified, "mcp__files__summarise")
        assert failed.value.error.code == types.INTERNAL_ERROR
        sent = [headers for headers, (_, path, _) in zip(stand_in.headers[before:], stand_in.requests[before:],
                                                         strict=True) if path.startswith("/mcp")]
        assert sent and {h.get("Authorization") for h in sent} == {"Bearer access-1"}
    finally:
        stand_in.stop()
