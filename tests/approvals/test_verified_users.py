"""Verified users in governance (docs/identity.md, "Verified users"; docs/governance.md): a rule can hold only for
calls of a verified user, or only for calls without one, and a queue can approve only verified users' calls, so
that an app naming someone else cannot slip past four-eyes. A session's user is verified when an MCP client's
signed-in person made it, or an ID token vouched for them; otherwise it is a name the app asserts."""
import pytest

from approvals.engine import compile_rule
from approvals.models import ApprovalRequest, PermissionRule
from tests.approvals.conftest import console_api
from tools.calls.submit import calls_submit
from tools.catalog.selectors import visible_tools
from tools.catalog.services import session_create
from tools.models import CallStatus

pytestmark = pytest.mark.django_db


def verified_session(world, user="alice@example.com"):
    return session_create(tenant=world.a.tenant, agent="support-bot", user=user, user_verified=True,
                          api_key=world.a.key_objects["agent"])


def shell_call(session, tool):
    [call] = calls_submit(session=session, calls=[{"name": tool.name, "input": {"command": "git push"}}])
    return call


@pytest.mark.parametrize("condition, verified, asserted", [(None, True, True), (True, True, False),
                                                           (False, False, True)])
def test_a_rules_verified_condition_picks_the_calls_it_holds_for(condition, verified, asserted):
    rule = compile_rule(PermissionRule(id=1, behavior="deny", tool_pattern="shell", user_verified=condition))
    common = {"tool_name": "shell", "effective_input": {}, "agent": "a", "user": "alice@example.com"}
    assert rule.matches(**common, user_verified=True) is verified
    assert rule.matches(**common, user_verified=False) is asserted
    said = {None: "", True: "the user is verified", False: "the user is not verified"}[condition]
    assert said in rule.describe()


def test_only_verified_people_may_run_a_tool_and_only_they_see_it(world, gov_shell, gov_rule):
    gov_rule("deny", gov_shell.name, user_verified=False, note="only people we verified may run shell")
    asserted = shell_call(world.a.session, gov_shell)  # alice, as the app names her
    assert asserted.status == CallStatus.DENIED
    assert "the user is not verified" in str(asserted.error)
    verified = verified_session(world)
    assert shell_call(verified, gov_shell).status != CallStatus.DENIED
    # the listing follows the rule: the asserted session is not shown a tool it could never call
    assert gov_shell.name not in [t.name for t in visible_tools(world.a.session)]
    assert gov_shell.name in [t.name for t in visible_tools(verified)]


def test_a_queue_of_verified_requesters_approves_only_verified_users_calls(world, gov_shell, gov_queue, gov_rule):
    queue = gov_queue(verified_requesters=True)
    gov_rule("ask", gov_shell.name, queue=queue)
    reviewer = console_api(world.a.users["reviewer"], world.a.tenant)

    asserted = shell_call(world.a.session, gov_shell)
    assert asserted.status == CallStatus.AWAITING_APPROVAL
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=asserted)
    refused = reviewer.post(f"/api/v1/approvals/{request.pk}/decide", {"decision": "approve"}, format="json")
    assert refused.status_code == 403
    assert "only calls of a verified user" in refused.json()["error"]["message"]
    rejected = reviewer.post(f"/api/v1/approvals/{request.pk}/decide", {"decision": "reject"}, format="json")
    assert rejected.status_code == 200

    verified = shell_call(verified_session(world, user="carol@example.com"), gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=verified)
    approved = reviewer.post(f"/api/v1/approvals/{request.pk}/decide", {"decision": "approve"}, format="json")
    assert approved.status_code == 200, approved.content


def test_the_rules_api_takes_the_condition(world, api):
    admin = console_api(world.a.users["admin"], world.a.tenant)
    made = admin.post("/api/v1/rules", {"behavior": "deny", "tool_pattern": "calc*", "user_verified": False},
                      format="json")
    assert made.status_code == 201, made.content
    assert made.json()["user_verified"] is False
    assert PermissionRule.objects.for_tenant(world.a.tenant).get(pk=made.json()["id"]).user_verified is False
    default = admin.post("/api/v1/rules", {"behavior": "deny", "tool_pattern": "calc2*"}, format="json")
    assert default.json()["user_verified"] is None
    bad = admin.post("/api/v1/rules", {"behavior": "deny", "tool_pattern": "x", "user_verified": "maybe"},
                     format="json")
    assert bad.status_code == 400 and "user_verified" in bad.json()["error"]["fields"]


def test_the_console_shows_whether_a_user_is_verified(world):
    console = world.a.console("operator")
    verified = verified_session(world, user="carol@example.com")
    page = console.get(f"/t/{world.a.tenant.slug}/sessions/{verified.pk}/").content.decode()
    assert "carol@example.com" in page and 'class="tag verified"' in page
    page = console.get(f"/t/{world.a.tenant.slug}/sessions/{world.a.session.pk}/").content.decode()
    assert "alice@example.com" in page and "asserted" in page and 'class="tag verified"' not in page
