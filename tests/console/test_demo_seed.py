"""The demo tenant `make run` seeds shows governance: an ask rule with a queue, a deny rule, an external tool,
skill-bound groups."""
import pytest
from django.contrib.auth import get_user_model

from approvals.models import ApprovalRequest, PermissionRule, Queue
from approvals.selectors import simulate
from approvals.services import reviewer_may_decide
from console.management.commands.bootstrap import DEMO_TENANT, seed_demo
from tenancy.models import Tenant
from tools.calls.submit import calls_submit
from tools.catalog.selectors import session_tools
from tools.catalog.services import session_create
from tools.models import ToolGroup, ToolSource

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo():
    credentials = seed_demo()
    return Tenant.objects.get(slug=DEMO_TENANT), credentials


def test_support_bots_writes_wait_in_a_queue_the_reviewer_works(demo):
    tenant, credentials = demo
    decision = simulate(tenant=tenant, tool_name="slow_write", tool_input={"text": "x"}, agent="support-bot")
    assert decision.behavior == "ask"
    queue = Queue.objects.for_tenant(tenant).get(pk=decision.queue)
    assert queue.name == "changes"
    # The demo's reviewer login works the queue.
    session = session_create(tenant=tenant, agent="support-bot")
    session.active_groups = ["ops"]
    session.save()
    [call] = calls_submit(session=session, calls=[{"name": "slow_write", "input": {"text": "x"}}])
    assert call.status == "awaiting_approval"
    request = ApprovalRequest.objects.for_tenant(tenant).get(call=call)
    assert request.queue == queue
    reviewer = get_user_model().objects.get(username=credentials["reviewer"]["username"])
    assert reviewer_may_decide(request=request, user=reviewer)
    # Other agents write without asking (the tenant allows by default); guest-bot never writes.
    assert simulate(tenant=tenant, tool_name="slow_write", tool_input={"text": "x"}, agent="ops-bot").behavior \
        == "allow"
    assert simulate(tenant=tenant, tool_name="slow_write", tool_input={"text": "x"}, agent="guest-bot").behavior \
        == "deny"


def test_the_deny_rule_keeps_the_tool_off_the_guests_surface(demo):
    tenant, _ = demo
    guest = session_create(tenant=tenant, agent="guest-bot")
    guest.active_groups = ["ops"]
    other = session_create(tenant=tenant, agent="ops-bot")
    other.active_groups = ["ops"]
    names = {t["name"] for t in session_tools(other, "anthropic")}
    assert {"slow_write", "countdown"} <= names
    assert {t["name"] for t in session_tools(guest, "anthropic")} == names - {"slow_write"}


def test_refunds_are_an_external_tool_in_their_own_group(demo):
    tenant, _ = demo
    billing = ToolGroup.objects.for_tenant(tenant).get(name="billing")
    (refund,) = billing.tools.all()
    assert (refund.name, refund.source, refund.destructive) == ("issue_refund", ToolSource.EXTERNAL, True)
    assert set(refund.input_schema["required"]) == {"order_id", "amount_eur", "reason"}
    assert billing.switchable and billing.notes


def test_skills_switch_on_their_groups(demo):
    tenant, _ = demo
    bound = dict(ToolGroup.objects.for_tenant(tenant).exclude(skill_ref="").values_list("name", "skill_ref"))
    assert bound == {"knowledge": "incident-triage", "reports": "call-history-review"}
    assert PermissionRule.objects.for_tenant(tenant).filter(behavior="deny", agents=["guest-bot"]).count() == 1
