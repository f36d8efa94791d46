"""Grants through the API and the console (docs/api.md, Grants; docs/governance.md, Grants): decide's `grant`, the
list and its filters, revoke, foreign ids, the inbox form, the grants page, the session page, the simulator."""
import pytest

from approvals import services
from approvals.models import ApprovalRequest, Grant
from audit.models import Event
from tests.approvals.conftest import console_api
from tools.api.serializers import call_data
from tools.calls.submit import calls_submit
from tools.models import CallEvent, CallStatus, ToolCall

pytestmark = pytest.mark.django_db


@pytest.fixture
def asking(world, gov_shell, gov_queue, gov_rule):
    return gov_rule("ask", gov_shell.name, queue=gov_queue(name="ops"), note="shell needs a human")


def ask(session, gov_shell, command="git push"):
    [call] = calls_submit(session=session, calls=[{"name": gov_shell.name, "input": {"command": command}}])
    assert call.status == CallStatus.AWAITING_APPROVAL
    return ApprovalRequest.objects.for_tenant(call.tenant_id).get(call=call)


def session_grant(session, gov_shell, reviewer) -> Grant:
    """A reviewer approves a call of the session with a grant for the session."""
    services.request_decide(request=ask(session, gov_shell), reviewer=reviewer, decision="approve",
                            grant={"scope": "session"})
    return Grant.objects.for_tenant(session.tenant_id).get(session=session)


def test_decide_with_a_grant_then_list_and_revoke(world, gov_shell, asking, gov_member, gov_session):
    session = gov_session()
    reviewer = gov_member()
    client = console_api(reviewer, world.a.tenant)
    request = ask(session, gov_shell)
    refused = client.post(f"/api/v1/approvals/{request.pk}/decide",
                          {"decision": "approve", "grant": {"scope": "pattern", "arg_match": {"command": "ls *"}}},
                          format="json")
    assert refused.status_code == 400 and "grant" in refused.json()["error"]["fields"]
    response = client.post(f"/api/v1/approvals/{request.pk}/decide",
                           {"decision": "approve", "grant": {"scope": "session"}}, format="json")
    assert response.status_code == 200, response.content
    grant = Grant.objects.for_tenant(world.a.tenant).get()

    listed = client.get("/api/v1/grants", {"session": str(session.pk), "active": "true"}).json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [row["id"] for row in rows] == [grant.pk]
    assert rows[0]["scope"] == "session" and rows[0]["active"] is True and rows[0]["created_by"] == reviewer.username
    assert rows[0]["call"] == str(request.call_id)
    other = client.get("/api/v1/grants", {"session": str(gov_session().pk)}).json()
    assert (other["results"] if isinstance(other, dict) else other) == []
    assert client.get("/api/v1/grants", {"session": "not-a-uuid"}).status_code == 400
    assert client.get("/api/v1/grants", {"active": "maybe"}).status_code == 400

    # the call's decision names the grant
    [call] = calls_submit(session=session, calls=[{"name": gov_shell.name, "input": {"command": "ls"}}])
    shown = call_data(ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk))
    assert shown["decision"]["grant"] == grant.pk and shown["decision"]["behavior"] == "allow"
    first = CallEvent.objects.for_tenant(world.a.tenant).filter(call=call).order_by("seq").first()
    assert first.kind == "log" and first.data["grant"] == grant.pk

    revoked = client.post(f"/api/v1/grants/{grant.pk}/revoke")
    assert revoked.status_code == 200 and revoked.json()["active"] is False
    assert revoked.json()["revoked_by"] == reviewer.username
    assert client.post(f"/api/v1/grants/{grant.pk}/revoke").status_code == 409
    assert client.get("/api/v1/grants", {"active": "true"}).json()["results"] == []


def test_foreign_grants_are_404(world, gov_shell, asking, gov_member, gov_session):
    grant = session_grant(gov_session(), gov_shell, gov_member())
    outsider = world.b.client("admin")
    assert outsider.get(f"/api/v1/grants/{grant.pk}").status_code == 404
    assert outsider.post(f"/api/v1/grants/{grant.pk}/revoke").status_code == 404
    assert outsider.get("/api/v1/grants").json()["results"] == []
    assert world.b.console("admin").get(f"/t/{world.a.tenant.slug}/grants/").status_code == 404
    assert world.b.console("admin").get(f"/t/{world.b.tenant.slug}/grants/{grant.pk}/revoke/").status_code == 404
    grant.refresh_from_db()
    assert grant.revoked_at is None
    # the session filter names only the tenant's own sessions
    assert world.b.client("admin").get("/api/v1/grants", {"session": str(grant.session_id)}).status_code == 400


def test_evaluate_reports_the_grant_of_a_session(world, gov_shell, asking, gov_member, gov_session):
    session = gov_session()
    grant = session_grant(session, gov_shell, gov_member())
    admin = world.a.client("admin")
    body = {"tool": gov_shell.name, "input": {"command": "ls"}}
    assert admin.post("/api/v1/rules/evaluate", body, format="json").json()["behavior"] == "ask"
    decided = admin.post("/api/v1/rules/evaluate", {**body, "session": str(session.pk)}, format="json").json()
    assert decided["behavior"] == "allow" and decided["grant"] == grant.pk and decided["rule"] == asking.pk
    mismatch = admin.post("/api/v1/rules/evaluate", {**body, "session": str(session.pk), "agent": "x"}, format="json")
    assert mismatch.status_code == 400
    foreign = world.b.client("admin").post("/api/v1/rules/evaluate", {**body, "session": str(session.pk)},
                                           format="json")
    assert foreign.status_code == 400 and "session" in foreign.json()["error"]["fields"]


def test_the_inbox_form_grants_with_an_edited_pattern(world, gov_shell, asking, gov_member, gov_session):
    reviewer = gov_member()
    client = world.a.console("reviewer")
    client.force_login(reviewer)
    request = ask(gov_session(), gov_shell, "git push <b>origin</b>")
    url = f"/t/{world.a.tenant.slug}/inbox/{request.pk}/"
    page = client.get(url).content.decode()
    assert 'name="grant_scope" value="pattern"' in page and 'id="id_grant_pattern"' in page
    assert "git push &lt;b&gt;origin&lt;/b&gt;" in page and "<b>origin</b>" not in page  # prefilled, escaped
    bad = client.post(url, {"decision": "approve", "grant_scope": "pattern", "grant_pattern": "{broken",
                            "grant_duration": "3600"})
    assert bad.status_code == 400 and not Grant.objects.for_tenant(world.a.tenant).exists()
    done = client.post(url, {"decision": "approve", "grant_scope": "pattern", "grant_duration": "7200",
                             "grant_pattern": '{"command": "git push *"}'})
    assert done.status_code == 302
    grant = Grant.objects.for_tenant(world.a.tenant).get()
    assert grant.arg_match == {"command": "git push *"} and grant.created_by == reviewer
    assert grant.expires_at is not None
    assert Event.objects.filter(tenant=world.a.tenant, verb="grant.created", target=f"grant:{grant.pk}").exists()


def test_grants_page_session_page_and_revoke(world, gov_shell, asking, gov_member, gov_session):
    session = gov_session(agent="ops-<i>bot</i>")
    grant = session_grant(session, gov_shell, gov_member())
    viewer = world.a.console("viewer")
    slug = world.a.tenant.slug
    listed = viewer.get(f"/t/{slug}/grants/").content.decode()
    assert f'id="grant-{grant.pk}"' in listed and "ops-&lt;i&gt;bot&lt;/i&gt;" in listed and "<i>bot" not in listed
    assert "revoke" not in listed.split(f'id="grant-{grant.pk}"')[1].split("</tr>")[0]  # a viewer cannot
    assert f'id="grant-{grant.pk}"' in viewer.get(f"/t/{slug}/grants/?session={session.pk}").content.decode()
    assert f'id="grant-{grant.pk}"' not in viewer.get(
        f"/t/{slug}/grants/?session={gov_session().pk}").content.decode()
    assert viewer.get(f"/t/{slug}/grants/?session=nope").status_code == 404
    detail = viewer.get(f"/t/{slug}/sessions/{session.pk}/").content.decode()
    assert 'id="session-grants"' in detail and f'id="grant-{grant.pk}"' in detail
    assert viewer.post(f"/t/{slug}/grants/{grant.pk}/revoke/").status_code == 403

    reviewer = world.a.console("reviewer")
    confirm = reviewer.get(f"/t/{slug}/grants/{grant.pk}/revoke/")
    assert confirm.status_code == 200 and 'id="grant-revoke"' in confirm.content.decode()
    grant.refresh_from_db()
    assert grant.revoked_at is None  # asking is not revoking
    assert reviewer.post(f"/t/{slug}/grants/{grant.pk}/revoke/").status_code == 302
    grant.refresh_from_db()
    assert grant.revoked_at is not None
    assert 'id="session-grants-none"' in viewer.get(f"/t/{slug}/sessions/{session.pk}/").content.decode()
    again = reviewer.post(f"/t/{slug}/grants/{grant.pk}/revoke/")
    assert again.status_code == 409 and "revoked already" in again.content.decode()


def test_the_simulator_shows_grants_in_force(world, gov_shell, asking, gov_member, gov_session):
    session = gov_session()
    grant = session_grant(session, gov_shell, gov_member())
    client = world.a.console("viewer")
    slug = world.a.tenant.slug
    query = {"tool": gov_shell.name, "input": '{"command": "ls"}', "agent": "ops-bot"}
    without = client.get(f"/t/{slug}/rules/", query).content.decode()
    assert 'id="grants-in-force"' in without and f'data-grant="{grant.pk}"' not in without
    assert 'id="decision-grant"' not in without
    page = client.get(f"/t/{slug}/rules/", {**query, "session": str(session.pk)}).content.decode()
    assert f'data-grant="{grant.pk}"' in page and 'id="decision-grant"' in page
    other = client.get(f"/t/{slug}/rules/", {**query, "session": str(session.pk), "agent": "someone-else"})
    assert "no such session of this agent" in other.content.decode()
