"""The queues page of the console: pending counts, create/edit/delete by operators and admins."""
from datetime import timedelta

from django.urls import reverse

from approvals.models import Queue
from tenancy.models import Role


def url(name, tenant, **kwargs):
    return reverse(f"inbox:{name}", kwargs={"tenant": tenant.slug, **kwargs})


def text(response) -> str:
    return response.content.decode()


def queue_body(**values) -> dict:
    body = {"name": "security", "description": "", "required_approvals": "1", "expires_after_minutes": "",
            "escalate_after_minutes": ""}
    body.update(values)
    return body


def test_queues_are_listed_with_their_pending_counts(world, inbox_pending, gov_queue):
    ops = gov_queue(name="ops", required_approvals=2, four_eyes=True, expires_after=timedelta(hours=1),
                    reviewers=[world.a.users["reviewer"], world.a.users["operator"], world.a.users["admin"]])
    inbox_pending(2)
    inbox_pending(3, agent="deploy-bot", queue=ops)
    body = text(world.a.console("viewer").get(url("queue_list", world.a.tenant)))
    ops_row = body[body.index(f'id="queue-{ops.pk}"'):]
    ops_row = ops_row[:ops_row.index("</tr>")]
    assert "?queue=ops\">3</a>" in ops_row and "acme-reviewer" in ops_row and "<td>1 h</td>" in ops_row
    default = Queue.objects.for_tenant(world.a.tenant).get(is_default=True)
    default_row = body[body.index(f'id="queue-{default.pk}"'):]
    assert "?queue=default\">2</a>" in default_row[:default_row.index("</tr>")]
    assert "New queue" not in body


def test_an_admin_creates_edits_and_deletes_a_queue(world):
    client = world.a.console("admin")
    tenant = world.a.tenant
    reviewer, operator = world.a.users["reviewer"], world.a.users[Role.OPERATOR]
    page = text(client.get(url("queue_create", tenant)))
    assert "acme-reviewer" in page and "globex" not in page  # reviewers are chosen among the tenant's members
    response = client.post(url("queue_create", tenant), queue_body(
        reviewers=[reviewer.pk], escalation_reviewers=[operator.pk], required_approvals="1", four_eyes="on",
        expires_after_minutes="90", escalate_after_minutes="15", description="Risky changes"))
    assert response.status_code == 302, text(response)
    queue = Queue.objects.for_tenant(tenant).get(name="security")
    assert list(queue.reviewers.all()) == [reviewer]
    assert list(queue.escalation_reviewers.all()) == [operator]
    assert (queue.required_approvals, queue.four_eyes) == (1, True)
    assert (queue.expires_after, queue.escalate_after) == (timedelta(minutes=90), timedelta(minutes=15))

    response = client.post(url("queue_edit", tenant, queue_id=queue.pk), queue_body(
        reviewers=[], required_approvals="1", expires_after_minutes="", escalate_after_minutes="15",
        is_default="on"))
    assert response.status_code == 302, text(response)
    queue.refresh_from_db()
    assert (queue.required_approvals, queue.expires_after, queue.is_default) == (1, None, True)
    assert not queue.reviewers.exists()
    # The default queue cannot be deleted: a clear message, and it stays.
    response = client.post(url("queue_delete", tenant, queue_id=queue.pk))
    assert response.status_code == 400
    assert "make another queue the default first" in text(response)
    other = Queue.objects.create(tenant=tenant, name="other")
    assert client.post(url("queue_delete", tenant, queue_id=other.pk)).status_code == 302
    assert not Queue.objects.for_tenant(tenant).filter(name="other").exists()


def test_a_queue_whose_quorum_its_reviewers_cannot_reach_is_refused(world, gov_queue):
    """Four-eyes keeps the session's own user out: two named reviewers cannot give two approvals."""
    client = world.a.console("admin")
    tenant = world.a.tenant
    reviewer, operator = world.a.users["reviewer"], world.a.users[Role.OPERATOR]
    refused = client.post(url("queue_create", tenant), queue_body(
        reviewers=[reviewer.pk, operator.pk], required_approvals="2", four_eyes="on"))
    assert refused.status_code == 400
    assert ("2 approvals with four-eyes (which keeps out the session&#x27;s own user) need 3 members who review, "
            "and only 2 of the reviewers it names can") in text(refused)
    assert not Queue.objects.for_tenant(tenant).filter(name="security").exists()
    # a viewer named as a reviewer cannot vote, and escalation reviewers count only when the queue escalates
    viewer = world.a.users[Role.VIEWER]
    refused = client.post(url("queue_create", tenant), queue_body(
        reviewers=[reviewer.pk, viewer.pk], escalation_reviewers=[operator.pk], required_approvals="2"))
    assert refused.status_code == 400
    assert "2 approvals need 2 members who review, and only 1 of the reviewers it names can" in text(refused)
    assert client.post(url("queue_create", tenant), queue_body(
        reviewers=[reviewer.pk, viewer.pk], escalation_reviewers=[operator.pk], required_approvals="2",
        escalate_after_minutes="15")).status_code == 302

    # An edit that would make an existing queue impossible is refused too, and leaves it as it was.
    queue = gov_queue(name="pair", required_approvals=2, reviewers=[reviewer, operator])
    refused = client.post(url("queue_edit", tenant, queue_id=queue.pk), queue_body(
        name="pair", reviewers=[reviewer.pk, operator.pk], required_approvals="2", four_eyes="on"))
    assert refused.status_code == 400
    queue.refresh_from_db()
    assert queue.four_eyes is False
    # The API says the same, on the field.
    admin = world.a.client("admin")
    response = admin.post("/api/v1/queues", {"name": "all-hands", "required_approvals": 4}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["required_approvals"] == [
        "4 approvals need 4 members who review, and only 3 in the tenant can: "
        "name more reviewers or ask for fewer approvals"]


def test_editing_keeps_a_duration_that_is_not_whole_minutes(world, gov_queue):
    queue = gov_queue(name="fast", expires_after=timedelta(seconds=30))
    client = world.a.console("operator")
    response = client.post(url("queue_edit", world.a.tenant, queue_id=queue.pk), queue_body(
        name="fast", description="renamed only", expires_after_minutes="1"))
    assert response.status_code == 302
    queue.refresh_from_db()
    assert queue.expires_after == timedelta(seconds=30) and queue.description == "renamed only"


