"""The console page where a verified person answers their own calls' questions (docs/calls.md, "Questions for the
user"): listed only to that person, Accept runs the call, Decline rejects it, another member cannot see or answer
it, and what a tool's name or input says is shown as text."""
import pytest
from django.urls import reverse

from approvals.services import rule_create
from tests.tools.support import install_tool, poll, registered_tool, unique_name
from tools.calls.submit import calls_submit
from tools.catalog.services import session_create
from tools.models import CallStatus, ToolCall
from tools.python.decorators import ToolContext

HOSTILE = '<script>alert("x")</script>'


@pytest.fixture
def person(world):
    return world.a.users["reviewer"]


@pytest.fixture
def confirmed_tool(world, fresh_rule_index):
    ran = []

    def wipe(target: str, ctx: ToolContext) -> dict:
        """Wipe a <b>target</b> & tell nobody.

        Args:
            target: What to wipe.
        """
        ran.append(target)
        return {"wiped": target}

    name = unique_name("wipe")
    with registered_tool(wipe, name=name):
        tool = install_tool(world.a.tenant, name)
        rule_create(tenant=world.a.tenant, behavior="confirm", tool_pattern=name)
        yield tool, ran


def waiting(world, tool, user, target=HOSTILE) -> ToolCall:
    session = session_create(tenant=world.a.tenant, agent="ops-bot", user=user.email or user.username,
                             user_verified=True, person=user, api_key=world.a.key_objects["agent"])
    [call] = calls_submit(session=session, calls=[{"name": tool.name, "input": {"target": target}}])
    assert call.status == CallStatus.AWAITING_USER, (call.status, call.decision)
    return call


def page(world, role="reviewer"):
    return world.a.console(role).get(reverse("console:confirmations", kwargs={"tenant": world.a.tenant.slug}))


def answer(world, call, action, role="reviewer"):
    url = reverse("console:confirmation_answer", kwargs={"tenant": world.a.tenant.slug, "call_id": call.pk})
    return world.a.console(role).post(url, {"action": action})


def status(call) -> str:
    return ToolCall.objects.for_tenant(call.tenant_id).get(pk=call.pk).status


@pytest.mark.django_db
def test_the_page_lists_the_persons_own_questions_escaped(world, person, confirmed_tool):
    tool, _ = confirmed_tool
    mine = waiting(world, tool, person)
    theirs = waiting(world, tool, world.a.users["operator"], target="someone else's")
    text = page(world).content.decode()
    assert f'id="confirmation-{mine.pk}"' in text and f'id="confirmation-{theirs.pk}"' not in text
    assert "someone else" not in text
    assert HOSTILE not in text and "&lt;script&gt;" in text
    assert "<b>target</b>" not in text and "Accept" in text and "Decline" in text
    assert reverse("console:confirmations", kwargs={"tenant": world.a.tenant.slug}) in text  # the navigation
    other = page(world, "operator").content.decode()
    assert f'id="confirmation-{theirs.pk}"' in other and f'id="confirmation-{mine.pk}"' not in other


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_accept_runs_the_call(world, person, confirmed_tool):
    tool, ran = confirmed_tool
    call = waiting(world, tool, person, target="build")
    response = answer(world, call, "accept")
    assert response.status_code == 302
    poll(lambda: status(call) == CallStatus.SUCCEEDED)
    assert ran == ["build"]
    assert f'id="confirmation-{call.pk}"' not in page(world).content.decode()


@pytest.mark.django_db
def test_decline_rejects_and_another_member_cannot_answer(world, person, confirmed_tool):
    tool, ran = confirmed_tool
    call = waiting(world, tool, person)
    for role in ("operator", "admin", "viewer"):
        assert answer(world, call, "accept", role=role).status_code == 403
    assert status(call) == CallStatus.AWAITING_USER
    assert world.a.console("reviewer").get(reverse(
        "console:confirmation_answer", kwargs={"tenant": world.a.tenant.slug, "call_id": call.pk})).status_code == 405
    assert answer(world, call, "decline").status_code == 302
    assert status(call) == CallStatus.REJECTED and ran == []
    second = answer(world, call, "accept")
    assert second.status_code == 302 and status(call) == CallStatus.REJECTED


@pytest.mark.django_db
def test_another_tenants_member_gets_404(world, person, confirmed_tool):
    tool, _ = confirmed_tool
    call = waiting(world, tool, person)
    url = reverse("console:confirmation_answer", kwargs={"tenant": world.b.tenant.slug, "call_id": call.pk})
    assert world.b.console("admin").post(url, {"action": "accept"}).status_code == 404
    assert status(call) == CallStatus.AWAITING_USER


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_a_tools_question_is_answered_with_its_forms_fields(world, person):
    from tests.tools import isolated_tools

    name = unique_name("ask_for_name")
    with registered_tool(isolated_tools.ask_for_name, name=name):
        tool = install_tool(world.a.tenant, name)
        session = session_create(tenant=world.a.tenant, agent="ops-bot", user=person.username, user_verified=True,
                                 person=person, api_key=world.a.key_objects["agent"])
        [call] = calls_submit(session=session, calls=[{"name": tool.name, "input": {"greeting": "Hello"}}])
        poll(lambda: status(call) == CallStatus.AWAITING_USER)
        text = page(world).content.decode()
        assert "Hello: what is your name?" in text and 'name="name"' in text
        url = reverse("console:confirmation_answer", kwargs={"tenant": world.a.tenant.slug, "call_id": call.pk})
        assert world.a.console("reviewer").post(url, {"action": "accept", "name": "Ada"}).status_code == 302
        poll(lambda: status(call) == CallStatus.SUCCEEDED)
        done = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk)
        assert done.result["structured"] == {"heard": "accept", "greeting": "Hello, Ada!"}
