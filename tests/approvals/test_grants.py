"""Grants from a decision (docs/governance.md, Grants): each scope, expiry, revocation, a deny still wins, other
agents, sessions and tenants unaffected, the grant named on the call's decision and timeline, the checks."""
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import grants as grants_reads
from approvals import services
from approvals.models import ApprovalRequest, Grant, GrantScope, RequestStatus
from approvals.selectors import evaluate, simulate
from audit.models import Event
from common.errors import Conflict, ServiceError
from tests.tools.support import install_tool
from tools.calls.submit import calls_submit
from tools.models import CallEvent, CallStatus, ToolCall

pytestmark = pytest.mark.django_db


@pytest.fixture
def asking(world, gov_shell, gov_queue, gov_rule):
    """Tenant A asks before every `shell` call, in a queue of its own; tenant B has the same tool and rule."""
    queue = gov_queue(name="ops")
    return gov_rule("ask", gov_shell.name, queue=queue, note="shell needs a human")


def ask(session, gov_shell, command="git push") -> ToolCall:
    [call] = calls_submit(session=session, calls=[{"name": gov_shell.name, "input": {"command": command}}])
    return call


def request_for(call) -> ApprovalRequest:
    return ApprovalRequest.objects.for_tenant(call.tenant_id).get(call=call)


def approve(call, reviewer, grant=None, **extra) -> ApprovalRequest:
    return services.request_decide(request=request_for(call), reviewer=reviewer, decision=extra.pop("decision",
                                   "approve"), grant=grant, **extra)


def fresh(call) -> ToolCall:
    return ToolCall.objects.for_tenant(call.tenant_id).get(pk=call.pk)


def test_once_creates_no_grant(world, gov_shell, asking, gov_member, gov_session):
    session = gov_session()
    first = ask(session, gov_shell)
    assert first.status == CallStatus.AWAITING_APPROVAL
    approve(first, gov_member(), grant={"scope": "once"})
    assert not Grant.objects.for_tenant(world.a.tenant).exists()
    assert ask(session, gov_shell).status == CallStatus.AWAITING_APPROVAL


def test_session_grant_holds_for_its_session_only(world, gov_shell, asking, gov_member, gov_session):
    session, other = gov_session(), gov_session()
    reviewer = gov_member()
    approve(ask(session, gov_shell), reviewer, grant={"scope": "session"})
    grant = Grant.objects.for_tenant(world.a.tenant).get()
    assert (grant.scope, grant.session_id, grant.expires_at, grant.ask_rule) == ("session", session.pk, None, asking.pk)
    assert grant.created_by == reviewer and grant.agent == "ops-bot" and grant.tool_name == gov_shell.name

    again = ask(session, gov_shell, "rm -rf /tmp/x")
    assert again.status != CallStatus.AWAITING_APPROVAL
    assert again.decision == {"behavior": "allow", "rule": asking.pk, "grant": grant.pk,
                              "reason": again.decision["reason"]}
    assert f"grant #{grant.pk} (this session, by {reviewer.username}" in again.decision["reason"]
    # the timeline names the grant, before the call moves on
    events = list(CallEvent.objects.for_tenant(world.a.tenant).filter(call=again).order_by("seq"))
    assert events[0].kind == "log" and events[0].data["grant"] == grant.pk
    assert events[0].data["text"] == again.decision["reason"]
    grant.refresh_from_db()
    assert grant.uses == 1 and grant.last_used_at is not None

    # another session of the same agent still asks
    assert ask(other, gov_shell).status == CallStatus.AWAITING_APPROVAL


def test_duration_grant_expires_by_itself(world, gov_shell, asking, gov_member, gov_session):
    approve(ask(gov_session(), gov_shell), gov_member(), grant={"scope": "duration", "duration_s": 7200})
    grant = Grant.objects.for_tenant(world.a.tenant).get()
    assert grant.session_id is None
    assert timedelta(minutes=119) < grant.expires_at - timezone.now() <= timedelta(hours=2)
    # another session of the agent is covered, for two hours
    assert ask(gov_session(), gov_shell).decision["grant"] == grant.pk
    found = grants_reads.grant_applying(tenant_id=world.a.tenant.pk, agent="ops-bot", tool_name=gov_shell.name,
                                        ask_rule=asking.pk, effective_input={"command": "x"},
                                        now=timezone.now() + timedelta(hours=1, minutes=59))
    assert found is not None and found.id == grant.pk
    assert grants_reads.grant_applying(tenant_id=world.a.tenant.pk, agent="ops-bot", tool_name=gov_shell.name,
                                       ask_rule=asking.pk, effective_input={"command": "x"},
                                       now=timezone.now() + timedelta(hours=2, seconds=1)) is None
    # two hours later (its end moved to the past): calls ask again
    ended = timezone.now() - timedelta(seconds=1)
    Grant.objects.for_tenant(world.a.tenant).filter(pk=grant.pk).update(expires_at=ended)
    assert ask(gov_session(), gov_shell).status == CallStatus.AWAITING_APPROVAL
    assert not grants_reads.grants_list(tenant=world.a.tenant, active=True).exists()
    assert list(grants_reads.grants_list(tenant=world.a.tenant, active=False)) == [grant]


def test_pattern_grant_allows_matching_input_only(world, gov_shell, asking, gov_member, gov_session):
    call = ask(gov_session(), gov_shell, "git push origin main")
    assert services.grant_pattern_prefill(request_for(call)) == {"command": "git push origin main"}
    approve(call, gov_member(), grant={"scope": "pattern", "arg_match": {"command": "git push *"},
                                       "duration_s": 3600})
    grant = Grant.objects.for_tenant(world.a.tenant).get()
    assert grant.scope == GrantScope.PATTERN and grant.arg_match == {"command": "git push *"}
    assert ask(gov_session(), gov_shell, "git push origin dev").decision["grant"] == grant.pk
    assert ask(gov_session(), gov_shell, "git pull").status == CallStatus.AWAITING_APPROVAL
    assert ask(gov_session(), gov_shell, "git push; rm -rf /").status == CallStatus.AWAITING_APPROVAL


def test_pattern_without_duration_expires_after_a_day(world, gov_shell, asking, gov_member, gov_session):
    approve(ask(gov_session(), gov_shell), gov_member(), grant={"scope": "pattern", "arg_match": {"command": "git *"}})
    grant = Grant.objects.for_tenant(world.a.tenant).get()
    assert timedelta(hours=23) < grant.expires_at - timezone.now() <= grants_reads.PATTERN_DEFAULT_DURATION


def test_revoking_stops_the_grant(world, gov_shell, asking, gov_member, gov_session):
    session = gov_session()
    reviewer = gov_member()
    approve(ask(session, gov_shell), reviewer, grant={"scope": "session"})
    grant = Grant.objects.for_tenant(world.a.tenant).get()
    assert ask(session, gov_shell).decision.get("grant") == grant.pk
    services.grant_revoke(grant=grant, actor=reviewer)
    assert grant.revoked_at is not None and grant.revoked_by == reviewer
    assert ask(session, gov_shell).status == CallStatus.AWAITING_APPROVAL
    with pytest.raises(Conflict):
        services.grant_revoke(grant=grant, actor=reviewer)
    verbs = list(Event.objects.filter(tenant=world.a.tenant, target=f"grant:{grant.pk}").values_list("verb", flat=True))
    assert sorted(verbs) == ["grant.created", "grant.revoked"]


def test_a_deny_rule_still_wins(world, gov_shell, asking, gov_member, gov_session, gov_rule):
    session = gov_session()
    approve(ask(session, gov_shell), gov_member(), grant={"scope": "session"})
    gov_rule("deny", gov_shell.name, arg_match={"command": "rm *"})
    denied = ask(session, gov_shell, "rm -rf /")
    assert denied.status == CallStatus.DENIED and "grant" not in denied.decision
    assert ask(session, gov_shell, "ls").decision.get("grant") is not None


def test_a_grant_stands_in_for_its_ask_rule_only(world, gov_shell, asking, gov_member, gov_session, gov_rule,
                                                gov_queue):
    session = gov_session()
    approve(ask(session, gov_shell), gov_member(), grant={"scope": "session"})
    strict = gov_rule("ask", gov_shell.name, arg_match={"command": "sudo *"}, priority=5,
                      queue=gov_queue(name="security"))
    held = ask(session, gov_shell, "sudo reboot")
    assert held.status == CallStatus.AWAITING_APPROVAL and held.decision["rule"] == strict.pk


def test_other_agents_and_tenants_are_unaffected(world, gov_shell, asking, gov_member, gov_session, gov_rule):
    approve(ask(gov_session(), gov_shell), gov_member(), grant={"scope": "duration", "duration_s": 3600})
    assert ask(gov_session(agent="other-bot"), gov_shell).status == CallStatus.AWAITING_APPROVAL
    # tenant B: the same tool name, agent and rule
    install_tool(world.b.tenant, gov_shell.name)
    gov_rule("ask", gov_shell.name, tenant=world.b.tenant)
    b_session = gov_session(tenant=world.b.tenant)
    assert ask(b_session, gov_shell).status == CallStatus.AWAITING_APPROVAL
    decision = evaluate(tenant=world.b.tenant, tool_name=gov_shell.name, effective_input={"command": "git push"},
                        agent="ops-bot")
    assert decision.behavior == "ask" and decision.grant is None


def test_grant_checks(world, gov_shell, asking, gov_member, gov_session, gov_queue, gov_rule):
    reviewer = gov_member()
    call = ask(gov_session(), gov_shell, "git push")
    request = request_for(call)
    refused = [
        {"scope": "forever"},
        {"scope": "session", "extra": 1},
        {"scope": "duration"},
        {"scope": "duration", "duration_s": 40 * 86400},
        {"scope": "duration", "duration_s": True},
        {"scope": "pattern"},
        {"scope": "pattern", "arg_match": {"command": 5}},
        {"scope": "pattern", "arg_match": {"command": "ls *"}},  # does not cover the approved input
        "session",
    ]
    for spec in refused:
        with pytest.raises(ServiceError) as caught:
            services.request_decide(request=request, reviewer=reviewer, decision="approve", grant=spec)
        assert "grant" in caught.value.fields, spec
    with pytest.raises(ServiceError):
        services.request_decide(request=request, reviewer=reviewer, decision="reject", grant={"scope": "session"})
    request.refresh_from_db()
    assert request.status == RequestStatus.PENDING and not request.votes.exists()  # nothing recorded
    assert not Grant.objects.for_tenant(world.a.tenant).exists()

    # a queue that needs two approvals grants nothing; a four-eyes queue grants for the session only
    pair = gov_queue(name="pair", required_approvals=2)
    gov_rule("ask", gov_shell.name, agents=["pair-bot"], queue=pair, priority=9)
    paired = ask(gov_session(agent="pair-bot"), gov_shell)
    with pytest.raises(ServiceError, match="2 approvals"):
        approve(paired, reviewer, grant={"scope": "session"})
    gov_member(), gov_member()
    eyes = gov_queue(name="eyes", four_eyes=True)
    gov_rule("ask", gov_shell.name, agents=["eyes-bot"], queue=eyes, priority=9)
    watched = ask(gov_session(agent="eyes-bot"), gov_shell)
    with pytest.raises(ServiceError, match="this session only"):
        approve(watched, reviewer, grant={"scope": "duration", "duration_s": 3600})
    approve(watched, reviewer, grant={"scope": "session"})
    assert Grant.objects.for_tenant(world.a.tenant).get().agent == "eyes-bot"


def test_an_edit_grants_for_the_edited_input(world, gov_shell, asking, gov_member, gov_session):
    session = gov_session()
    call = ask(session, gov_shell, "git push --force")
    with pytest.raises(ServiceError, match="does not match"):
        approve(call, gov_member(), decision="edit", new_input={"command": "git push"},
                grant={"scope": "pattern", "arg_match": {"command": "git push --force"}})
    approve(call, gov_member(), decision="edit", new_input={"command": "git push"},
            grant={"scope": "pattern", "arg_match": {"command": "git push"}})
    assert ask(session, gov_shell, "git push").decision.get("grant") is not None
    assert ask(session, gov_shell, "git push --force").status == CallStatus.AWAITING_APPROVAL


def test_simulate_and_evaluate_report_the_grant(world, gov_shell, asking, gov_member, gov_session):
    session = gov_session()
    approve(ask(session, gov_shell), gov_member(), grant={"scope": "session"})
    grant = Grant.objects.for_tenant(world.a.tenant).get()
    with_session = simulate(tenant=world.a.tenant, tool_name=gov_shell.name, tool_input={"command": "ls"},
                            agent="ops-bot", session=session)
    assert (with_session.behavior, with_session.grant) == ("allow", grant.pk)
    without = simulate(tenant=world.a.tenant, tool_name=gov_shell.name, tool_input={"command": "ls"}, agent="ops-bot")
    assert (without.behavior, without.grant) == ("ask", None)
    assert grants_reads.grants_in_force(tenant=world.a.tenant, agent="ops-bot", session=session) == [grant]
    assert grants_reads.grants_in_force(tenant=world.a.tenant, agent="ops-bot") == []
    # simulating is not a use
    grant.refresh_from_db()
    assert grant.uses == 0
