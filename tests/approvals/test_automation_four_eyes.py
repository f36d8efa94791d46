"""An admin API key decides for automation (docs/notes/governance.md, Governance): a key is not a person, so it is
never the session's user, and four-eyes never keeps it out of a queue it may decide in. Every check that compares
a reviewer with someone answers for a key as it does for a person, and never fails on the fields only people
have (a key has no e-mail address, no user id)."""
import pytest
from django.contrib.auth import get_user_model

from approvals.models import RequestStatus, Vote
from approvals.services import _same_person, decide_refusals, request_decide, reviewer_may_decide
from tenancy.entry.authentication import ApiKeyPrincipal
from tenancy.services import apikey_create
from tests.approvals.conftest import console_api
from tests.approvals.test_decide_refusals import NOT_NAMED, VOTED, pending_rows
from tools.models import CallStatus


def decide(client, request_id, decision: str = "approve"):
    return client.post(f"/api/v1/approvals/{request_id}/decide", {"decision": decision}, format="json")


@pytest.mark.parametrize("session_user", ["alice@example.com", "apikey:admin", "APIKEY:Admin "])
def test_an_admin_key_decides_a_four_eyes_request_whatever_user_the_session_names(world, inbox_pending, gov_queue,
                                                                                 session_user):
    queue = gov_queue(name="sensitive", four_eyes=True)
    (pending,) = inbox_pending(1, queue=queue, user=session_user)
    response = decide(world.a.client("admin"), pending.pk)
    assert response.status_code == 200, response.content
    assert response.json()["status"] == RequestStatus.APPROVED
    pending.refresh_from_db()
    assert pending.call.status == CallStatus.QUEUED
    [vote] = Vote.objects.for_tenant(world.a.tenant).filter(request=pending)
    assert (vote.reviewer_id, vote.reviewer_label) == (None, "apikey:admin")


def test_an_admin_key_voting_in_a_four_eyes_quorum_waits_for_a_person_and_cannot_vote_twice(world, inbox_pending,
                                                                                            gov_queue):
    queue = gov_queue(name="pair", four_eyes=True, required_approvals=2)
    (pending,) = inbox_pending(1, queue=queue, user="alice@example.com")
    key = world.a.client("admin")
    first = decide(key, pending.pk)
    assert first.status_code == 200, first.content
    assert first.json()["status"] == RequestStatus.PENDING
    again = decide(key, pending.pk)
    assert again.status_code == 409, again.content
    assert again.json()["error"]["message"] == "you have already voted on this request"
    second = decide(console_api(world.a.users["reviewer"], world.a.tenant), pending.pk)
    assert second.status_code == 200, second.content
    assert second.json()["status"] == RequestStatus.APPROVED


def test_an_admin_key_is_refused_a_four_eyes_queue_that_names_reviewers_with_a_403(world, inbox_pending, gov_queue,
                                                                                   gov_member):
    queue = gov_queue(name="named", four_eyes=True, reviewers=[gov_member(), gov_member()])
    (pending,) = inbox_pending(1, queue=queue, user="alice@example.com")
    response = decide(world.a.client("admin"), pending.pk)
    assert response.status_code == 403, response.content
    assert response.json()["error"]["message"] == "you are not a reviewer of this request's queue"


# --- at the service level ----------------------------------------------------------------------------------


@pytest.fixture
def key_principal(world) -> ApiKeyPrincipal:
    return ApiKeyPrincipal(world.a.key_objects["admin"])


@pytest.mark.parametrize("session_user", ["", "alice@example.com", "apikey:admin", " ApiKey:Admin\t", "admin"])
def test_a_key_is_never_the_sessions_user(key_principal, session_user):
    assert _same_person(key_principal, session_user) is False


def test_a_person_without_an_email_address_is_still_compared_safely():
    imported = get_user_model()(username="Dora", email=None)  # an account imported without an address
    assert _same_person(imported, " dora ") is True
    assert _same_person(imported, "") is False
    assert _same_person(imported, "none") is False


def test_decide_refusals_answers_for_a_key_as_deciding_would(world, inbox_pending, gov_queue, gov_member,
                                                             key_principal):
    tenant = world.a.tenant
    (open_four_eyes,) = inbox_pending(1, agent="open-bot", queue=gov_queue(name="open", four_eyes=True,
                                                                             required_approvals=2),
                                      user="apikey:admin")
    (named,) = inbox_pending(1, agent="named-bot", queue=gov_queue(name="named", reviewers=[gov_member()]))
    rows = pending_rows(tenant)
    assert decide_refusals(requests=rows, user=key_principal) == {named.pk: NOT_NAMED}
    assert {row.pk for row in rows if not reviewer_may_decide(request=row, user=key_principal)} == {named.pk}
    # once the key has voted, its vote stands: the list says so, as deciding again would
    request_decide(request=open_four_eyes, reviewer=key_principal, decision="approve")
    rows = pending_rows(tenant)
    assert decide_refusals(requests=rows, user=key_principal) == {open_four_eyes.pk: VOTED, named.pk: NOT_NAMED}
    # a person's refusals are not confused with the key's vote
    assert decide_refusals(requests=rows, user=world.a.users["reviewer"]) == {named.pk: NOT_NAMED}


def test_one_keys_vote_is_not_anothers(world, inbox_pending, gov_queue, key_principal):
    other = ApiKeyPrincipal(apikey_create(tenant=world.a.tenant, name="second-admin", scopes=["admin"], agent="",
                                          created_by=world.a.users["admin"]).api_key)
    (pending,) = inbox_pending(1, queue=gov_queue(name="pair", required_approvals=2))
    request_decide(request=pending, reviewer=key_principal, decision="approve")
    rows = pending_rows(world.a.tenant)
    assert decide_refusals(requests=rows, user=key_principal) == {pending.pk: VOTED}
    assert decide_refusals(requests=rows, user=other) == {}
    assert request_decide(request=rows[0], reviewer=other, decision="approve").status == RequestStatus.APPROVED


@pytest.mark.parametrize(("reviewer", "session_user"), [
    (get_user_model()(username="xxxx", email="x@example.com"), ""),  # no user named: nobody, whatever the names
    (get_user_model()(username="bob", email=""), "XXXX"),  # no address: no name to match
])
def test_an_absent_name_matches_no_one(reviewer, session_user):
    assert _same_person(reviewer, session_user) is False
