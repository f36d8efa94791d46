"""The review of untrusted servers' tools (docs/governance.md, the decision): its place in the engine's order,
which tools it covers, and what the console says of their calls."""
import html
import re

import pytest

from approvals import selectors
from approvals.engine import UNTRUSTED_REVIEW, RuleIndex, decide
from approvals.models import ApprovalRequest
from approvals.services import request_decide, rule_from_approval
from tenancy.services import tenant_governance_set
from tests.approvals.test_engine import rule
from tools.calls.submit import calls_submit
from tools.catalog.selectors import declared_exposed
from tools.models import CallStatus, ToolGroup
from tools.upstream.client import UpstreamTool
from tools.upstream.servers import mcp_server_create, mcp_server_update, mcp_tools_reconcile

pytestmark = pytest.mark.django_db

PUBLIC_URL = "https://93.184.215.14/mcp"  # a literal public address: never reached here
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}


def run(rules=(), *, review: bool = True, default: str = "allow", tool: str = "mcp__loose__write", **query):
    return decide(RuleIndex(rules), tool_name=tool, effective_input=query.pop("effective_input", {}), agent="bot",
                  user="", read_only_trusted=False, auto_allow_read_only=True, default_behavior=default,
                  review_untrusted=review, **query)


# --- the engine ------------------------------------------------------------------------------------------

def test_a_reviewed_tool_that_no_rule_decides_asks_where_the_default_allows():
    decision = run()
    assert (decision.behavior, decision.rule, decision.queue) == ("ask", None, None)
    assert decision.reason == UNTRUSTED_REVIEW
    assert run(review=False).as_dict() == {"behavior": "allow", "rule": None,
                                           "reason": "no rule matched: the tenant's default is allow"}


def test_a_stricter_default_is_kept():
    assert run(default="deny").behavior == "deny"
    assert run(default="ask").reason == "no rule matched: the tenant's default is ask"


def test_explicit_rules_decide_before_the_review():
    allow = rule("allow", "mcp__loose__*")
    assert (run([allow]).behavior, run([allow]).rule) == ("allow", allow.id)
    deny = rule("deny", "mcp__loose__write")
    assert (run([allow, deny]).behavior, run([allow, deny]).rule) == ("deny", deny.id)
    queue_ask = rule("ask", "mcp__loose__write", queue=7)
    decided = run([queue_ask])
    assert (decided.behavior, decided.rule, decided.queue) == ("ask", queue_ask.id, 7)
    # a rule whose conditions miss decides nothing: the review does
    narrow = rule("allow", "mcp__loose__write", arg_match={"path": "/tmp/*"})
    assert run([narrow], effective_input={"path": "/etc/passwd"}).reason == UNTRUSTED_REVIEW
    assert run([narrow], effective_input={"path": "/tmp/x"}).rule == narrow.id


# --- which tools: through the catalog ---------------------------------------------------------------------

@pytest.fixture
def catalog(world):
    """Tenant A's untrusted server `loose` and trusted server `vetted`, synced from the same listing, their tools
    in `basic`."""
    tenant = world.a.tenant
    listed = [UpstreamTool(name="write", description="Writes a file.", input_schema=SCHEMA,
                           annotations={"readOnlyHint": False, "destructiveHint": False})]
    tools = {}
    for name, trusted in (("loose", False), ("vetted", True)):
        server = mcp_server_create(tenant=tenant, name=name, transport="streamable_http", url=PUBLIC_URL,
                                   trusted=trusted)
        mcp_tools_reconcile(server=server, listed=listed)
        tools[name] = server.tools.get()
        ToolGroup.objects.for_tenant(tenant).get(name="basic").tools.add(tools[name])
    return tools


def decided(world, name: str, call_input: dict | None = None) -> dict:
    call_input = {"path": "/tmp/a"} if call_input is None else call_input
    [call] = calls_submit(session=world.a.session, calls=[{"name": name, "input": call_input}])
    call.refresh_from_db()
    return {"status": call.status, **call.decision}


@pytest.mark.usefixtures("fresh_rule_index")
def test_only_the_tools_of_untrusted_servers_are_reviewed(world, catalog):
    tenant = world.a.tenant
    assert tenant.review_untrusted and tenant.default_behavior == "allow"
    held = decided(world, "mcp__loose__write")
    assert (held["status"], held["behavior"], held["reason"]) == (CallStatus.AWAITING_APPROVAL, "ask",
                                                                  UNTRUSTED_REVIEW)
    assert decided(world, "mcp__vetted__write")["behavior"] == "allow"
    assert decided(world, "calculate", {"expression": "1+1"})["behavior"] == "allow"  # the platform's own tools
    # an app's own declared tool is not a server's: never trusted, yet the app performs it, so not reviewed
    declared = declared_exposed({"name": "lookup_order", "description": "", "input_schema": {"type": "object"}},
                                "session").tool
    assert selectors.evaluate(tenant=tenant, tool_name="lookup_order", effective_input={}, tool=declared,
                              agent="bot").behavior == "allow"
    # another tenant's setting is its own
    tenant_governance_set(tenant=world.b.tenant, review_untrusted=False)
    assert decided(world, "mcp__loose__write")["behavior"] == "ask"


@pytest.mark.usefixtures("fresh_rule_index")
def test_a_server_trusted_later_is_trusted_at_once_from_its_accepted_definitions(world, catalog):
    """The tool's own record of its flags decides, never the server's word alone: trust granted applies at once
    from the annotations the tool was accepted with (its pinned definition, docs/mcp.md), and is taken back at
    once too."""
    server = catalog["loose"].mcp_server
    assert decided(world, "mcp__loose__write")["behavior"] == "ask"
    mcp_server_update(server=server, trusted=True)
    assert decided(world, "mcp__loose__write")["behavior"] == "allow"
    mcp_server_update(server=server, trusted=False)
    assert decided(world, "mcp__loose__write")["behavior"] == "ask"


# --- what the console says ----------------------------------------------------------------------------------

def outcome_badges(page: str) -> dict[str, str]:
    """{tool name: the text of its outcome badge} of a page that lists tools in rows or cards."""
    found = {}
    for block in re.split(r"<tr>|<div class=\"card\"", page)[1:]:
        name = re.search(r"<code>(mcp__[^<]+)</code>", block)
        badge = re.search(r'data-outcome="(\w+)"[^>]*>([^<]+)</span>', block)
        if name and badge:
            found[name.group(1)] = html.unescape(badge.group(2))
    return found


@pytest.mark.usefixtures("fresh_rule_index")
def test_the_tool_list_says_what_happens_to_calls_of_untrusted_servers_tools(world, catalog, gov_rule):
    console = world.a.console("viewer")

    def badges() -> dict[str, str]:
        return outcome_badges(console.get("/t/acme/tools/").content.decode())

    assert badges() == {"mcp__loose__write": "asks a reviewer"}  # a trusted server's tool has no such badge
    allow = gov_rule("allow", "mcp__loose__*", note="<b>vetted by hand</b>")
    page = console.get("/t/acme/tools/").content.decode()
    assert outcome_badges(page) == {"mcp__loose__write": "runs without review"}
    assert f"allowed by rule #{allow.pk}" in page and "<b>vetted" not in page  # the note is escaped
    gov_rule("deny", "mcp__loose__write", agents=["intern-bot"])
    assert badges() == {"mcp__loose__write": "runs without review unless a rule with conditions decides otherwise"}

    allow.delete()
    selectors.index_cache.clear()
    tenant_governance_set(tenant=world.a.tenant, review_untrusted=False)
    assert badges() == {"mcp__loose__write": "runs without review unless a rule with conditions decides otherwise"}
    tenant_governance_set(tenant=world.a.tenant, default_behavior="deny")
    assert badges()["mcp__loose__write"].startswith("refused")


@pytest.mark.usefixtures("fresh_rule_index")
def test_the_tool_page_and_the_server_page_say_it_too(world, catalog):
    console = world.a.console("viewer")
    loose = catalog["loose"]
    page = console.get(f"/t/acme/tools/{loose.pk}/").content.decode()
    outcome = page[page.index('id="call-outcome"'):].split("</dd>", 1)[0]
    assert "asks a reviewer" in outcome and html.escape(UNTRUSTED_REVIEW, quote=True) in outcome
    server_page = console.get(f"/t/acme/mcp-servers/{loose.mcp_server_id}/").content.decode()
    assert outcome_badges(server_page) == {"mcp__loose__write": "asks a reviewer"}
    assert "the tenant reviews such tools" in server_page
    vetted = console.get(f"/t/acme/tools/{catalog['vetted'].pk}/").content.decode()
    assert 'id="call-outcome"' not in vetted

    tenant_governance_set(tenant=world.a.tenant, review_untrusted=False)
    server_page = console.get(f"/t/acme/mcp-servers/{loose.mcp_server_id}/").content.decode()
    assert outcome_badges(server_page) == {"mcp__loose__write": "runs without review"}
    assert "the tenant does not review such tools" in server_page


@pytest.mark.usefixtures("fresh_rule_index")
def test_the_agents_eye_view_decides_as_the_call(world, catalog, gov_rule):
    """The tool list's preview of a session's surface shows the decision its calls get."""
    console = world.a.console("viewer")

    def seen_decision(name: str) -> str:
        page = console.get("/t/acme/tools/", {"agent": "mcp-bot"}).content.decode()
        row = page[page.index(f'data-seen-tool="{name}"'):].split("</tr>", 1)[0]
        return re.search(r'class="tag b-(\w+)"', row).group(1)

    assert seen_decision("mcp__loose__write") == "ask"
    assert seen_decision("mcp__vetted__write") == "allow"
    assert decided(world, "mcp__loose__write")["behavior"] == "ask"
    gov_rule("allow", "mcp__loose__write", agents=["mcp-bot"])
    assert seen_decision("mcp__loose__write") == "allow"


@pytest.mark.usefixtures("fresh_rule_index")
def test_approving_with_a_rule_lets_the_agents_next_calls_run(world, catalog):
    [call] = calls_submit(session=world.a.session, calls=[{"name": "mcp__loose__write", "input": {"path": "/a"}}])
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    rule = rule_from_approval(request=request, actor=world.a.users["operator"])  # offered: no ask rule decided it
    request_decide(request=request, reviewer=world.a.users["operator"], decision="approve")
    again = decided(world, "mcp__loose__write")
    assert (again["behavior"], again["rule"]) == ("allow", rule.pk)
