"""Concurrent decisions on one request (docs/calls.md, docs/governance.md): exactly one wins, the rest get 409, the
call runs once.

Real transactions on PostgreSQL: each decision runs in a thread of its own with its own connection.
"""
import os
import threading

import pytest
from django.db import connection, connections
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, RequestStatus, Vote
from approvals.services import request_decide
from common.errors import Conflict
from tenancy.services import apikey_create
from tests.tools.support import wait_terminal
from tools.calls.submit import calls_submit
from tools.models import CallStatus, ToolCall

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]

DECIDERS = 20


@pytest.fixture(autouse=True)
def gov_needs_postgres(db):
    if connection.vendor != "postgresql":
        if os.environ.get("TOOLKEEPER_REQUIRE_SERVICES") == "1":
            pytest.fail("PostgreSQL is required (TOOLKEEPER_REQUIRE_SERVICES=1)")
        pytest.skip("concurrent decisions need PostgreSQL")


@pytest.fixture
def pending(world, gov_shell, gov_queue, gov_rule, gov_session):
    """One call of the counting tool, waiting in a queue that names no reviewers."""
    queue = gov_queue(name="race")
    gov_rule("ask", gov_shell.name, queue=queue)
    [call] = calls_submit(session=gov_session(), calls=[{"name": gov_shell.name, "input": {"command": "deploy"}}])
    assert call.status == CallStatus.AWAITING_APPROVAL
    return call, ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)


def run_together(workers) -> list:
    """Start every worker at once (a barrier); each returns an outcome. Threads close their connections."""
    barrier = threading.Barrier(len(workers))
    outcomes: list = [None] * len(workers)

    def run(position, work):
        try:
            barrier.wait(timeout=10)
            outcomes[position] = work()
        except Exception as exc:  # an unexpected error is an outcome the test reports
            outcomes[position] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, w)) for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "a decision never returned"
    return outcomes


def assert_ran_once(world, gov_shell, call):
    finished = wait_terminal(call.pk, tenant=world.a.tenant)
    assert finished.status == CallStatus.SUCCEEDED, (finished.status, finished.error)
    assert finished.attempts == 1
    assert gov_shell.counter.count == 1
    statuses = [e.data["status"] for e in finished.events.order_by("seq") if e.kind == "status"]
    assert statuses == ["awaiting_approval", "queued", "running", "succeeded"], statuses


def test_twenty_reviewers_at_once_through_the_service(world, gov_shell, pending, gov_member):
    call, request = pending
    reviewers = [gov_member() for _ in range(DECIDERS)]

    def decider(reviewer):
        def work():
            mine = ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=request.pk)
            try:
                request_decide(request=mine, reviewer=reviewer, decision="approve")
            except Conflict:
                return 409
            return 200
        return work

    outcomes = run_together([decider(r) for r in reviewers])
    assert sorted(outcomes, key=str) == [200] + [409] * (DECIDERS - 1), outcomes
    request.refresh_from_db()
    assert request.status == RequestStatus.APPROVED
    assert Vote.objects.for_tenant(world.a.tenant).filter(request=request).count() == 1
    assert_ran_once(world, gov_shell, call)


def test_twenty_admin_keys_at_once_through_the_api(world, gov_shell, pending):
    call, request = pending
    keys = [apikey_create(tenant=world.a.tenant, name=f"robot-{i}", scopes=["admin"]).key for i in range(DECIDERS)]

    def decider(key):
        def work():
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
            response = client.post(f"/api/v1/approvals/{request.pk}/decide", {"decision": "approve"}, format="json")
            if response.status_code == 409:
                assert response.json()["error"]["code"] == "conflict"
            return response.status_code
        return work

    outcomes = run_together([decider(k) for k in keys])
    assert sorted(outcomes, key=str) == [200] + [409] * (DECIDERS - 1), outcomes
    assert Vote.objects.for_tenant(world.a.tenant).filter(request=request).count() == 1
    assert_ran_once(world, gov_shell, call)


def test_mixed_concurrent_decisions_settle_once(world, gov_shell, pending, gov_member):
    """Approve, reject and respond race: one wins and the call's end state is that decision's."""
    call, request = pending
    choices = ["approve", "reject", "respond", "edit"] * (DECIDERS // 4)
    reviewers = [gov_member() for _ in choices]

    def decider(reviewer, decision):
        def work():
            mine = ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=request.pk)
            try:
                request_decide(request=mine, reviewer=reviewer, decision=decision, message="answer",
                               new_input={"command": "deploy --dry-run"} if decision == "edit" else None)
            except Conflict:
                return None
            return decision
        return work

    outcomes = run_together([decider(r, d) for r, d in zip(reviewers, choices, strict=True)])
    winners = [o for o in outcomes if o is not None]
    assert len(winners) == 1 and isinstance(winners[0], str), outcomes
    request.refresh_from_db()
    expected = {"approve": RequestStatus.APPROVED, "edit": RequestStatus.APPROVED, "reject": RequestStatus.REJECTED,
                "respond": RequestStatus.RESPONDED}[winners[0]]
    assert request.status == expected
    finished = wait_terminal(call.pk, tenant=world.a.tenant)
    expected_call = {"approve": CallStatus.SUCCEEDED, "edit": CallStatus.SUCCEEDED, "reject": CallStatus.REJECTED,
                     "respond": CallStatus.SUCCEEDED}[winners[0]]
    assert finished.status == expected_call
    assert gov_shell.counter.count == (1 if winners[0] in ("approve", "edit") else 0)


def test_a_decision_racing_the_expiry_sweep(world, gov_shell, pending, gov_member):
    """A reviewer and the expiry job at the same moment: the call ends either expired or run once, never both."""
    from datetime import timedelta

    from django.utils import timezone

    from approvals.services import requests_expire_due

    call, request = pending
    ApprovalRequest.objects.for_tenant(world.a.tenant).filter(pk=request.pk).update(
        expires_at=timezone.now() + timedelta(milliseconds=50))
    reviewer = gov_member()

    def approve():
        mine = ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=request.pk)
        try:
            request_decide(request=mine, reviewer=reviewer, decision="approve")
        except Conflict:
            return 409
        return 200

    def sweep():
        return requests_expire_due(now=timezone.now() + timedelta(seconds=1))

    decided, swept = run_together([approve, sweep])
    assert decided in (200, 409), decided
    assert swept in (0, 1), swept
    assert not (decided == 200 and swept == 1), (decided, swept)  # never both
    final = wait_terminal(call.pk, tenant=world.a.tenant)
    request.refresh_from_db()
    if decided == 200:
        assert final.status == CallStatus.SUCCEEDED and gov_shell.counter.count == 1
        assert request.status == RequestStatus.APPROVED
    else:  # the sweep, or the late decision itself, expired the request
        assert final.status == CallStatus.EXPIRED and gov_shell.counter.count == 0
        assert request.status == RequestStatus.EXPIRED
        assert final.error["errorType"] == "ApprovalExpired"
    assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk).attempts <= 1
