"""Metrics (docs/observability.md): each hook changes the counts and histograms it should, once, with bounded labels;
`TOOLKEEPER_METRICS_TENANT_LABELS=0` folds tenants into `_all`; with metrics off nothing is recorded; `/metrics`
answers only its token (404 when none is configured) and reads the database in a constant number of queries.

Values are read from this process's own files in the multiprocess directory: other test processes write theirs.
"""
import glob
import os
import time
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from prometheus_client.multiprocess import MultiProcessCollector

from approvals.models import ApprovalRequest
from approvals.services import request_decide, rule_create
from audit.models import Event
from audit.selectors import audit_chains_watch
from common import metrics
from common.errors import RateLimited
from tenancy.entry import limits
from tenancy.entry.admission import Entry, admit
from tenancy.models import Tenant
from tenancy.services import tenant_create
from toolkeeper.metrics import DatabaseGauges
from tools.calls.executors import LocalExecutor
from tools.calls.submit import calls_submit
from tools.catalog.services import session_create
from tools.models import CallStatus, ToolCall

TOKEN = "metrics-token-for-tests"


def sample(name: str, **labels) -> float:
    """The value of one sample in this process's files (0 when it was never recorded)."""
    files = glob.glob(os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], f"*_{os.getpid()}.db"))
    total = 0.0
    for family in MultiProcessCollector.merge(files, accumulate=True):
        for found in family.samples:
            if found.name == name and all(found.labels.get(k) == v for k, v in labels.items()):
                total += found.value
    return total


class Delta:
    """The change of samples across a block."""

    def __init__(self, *specs):
        self.specs = specs

    def __enter__(self):
        self.before = [sample(name, **labels) for name, labels in self.specs]
        return self

    def __exit__(self, *exc_info):
        self.after = [sample(name, **labels) for name, labels in self.specs]

    @property
    def changes(self) -> list[float]:
        return [after - before for before, after in zip(self.before, self.after, strict=True)]


@pytest.fixture
def session(world):
    return session_create(tenant=world.a.tenant, agent="metrics-bot", user="m@example.com")


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """Run a block's on-commit callbacks as its commit would (the settle counts wait for the commit)."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


def test_a_denied_call_is_counted_once_with_its_source_status_and_decision(world, session, committed):
    rule_create(tenant=world.a.tenant, behavior="deny", tool_pattern="current_time", note="never")
    source = world.a.tools["current_time"].source
    labels = {"tenant": "acme", "source": source, "status": "denied"}
    with Delta(("toolkeeper_calls_total", {**labels, "decision": "deny"}),
               ("toolkeeper_call_duration_seconds_count", labels),
               ("toolkeeper_call_step_seconds_count", {"step": "policy", "source": source})) as delta, committed():
        [call] = calls_submit(session=session, calls=[{"name": "current_time", "input": {}}])
    assert call.status == CallStatus.DENIED
    assert delta.changes == [1, 1, 1]


@pytest.mark.parametrize(("spec", "source", "status", "decision"), [
    ({"name": "no_such_tool", "input": {}}, "none", "failed", "none"),  # refused by the first step
    ({"name": "reset_tools", "input": {"ops": True}}, "meta", "succeeded", "allow"),  # a meta tool, run inline
])
def test_calls_settled_in_the_request_are_labelled_by_what_they_called(session, committed, spec, source, status,
                                                                       decision):
    with Delta(("toolkeeper_calls_total", {"tenant": "acme", "source": source, "status": status,
                                           "decision": decision})) as delta, committed():
        [call] = calls_submit(session=session, calls=[spec])
    assert call.status == status
    assert delta.changes == [1]


def test_a_move_rolled_back_is_not_counted(session, committed):
    with Delta(("toolkeeper_calls_total", {"tenant": "acme", "status": "failed"})) as delta, committed(), \
            pytest.raises(RuntimeError), transaction.atomic():
        calls_submit(session=session, calls=[{"name": "no_such_tool", "input": {}}])
        raise RuntimeError("the request failed after the call settled")
    assert delta.changes == [0]


def test_tenant_labels_switched_off_fold_every_tenant_into_all(session, committed, monkeypatch):
    monkeypatch.setattr(metrics, "TENANT_LABELS", False)
    with Delta(("toolkeeper_calls_total", {"tenant": "_all", "source": "none"}),
               ("toolkeeper_calls_total", {"tenant": "acme", "source": "none"})) as delta, committed():
        calls_submit(session=session, calls=[{"name": "no_such_tool", "input": {}}])
    assert delta.changes == [1, 0]


def test_with_metrics_off_no_hook_records_anything(world, session, committed, monkeypatch):
    monkeypatch.setattr(metrics, "ENABLED", False)
    assert metrics.stopwatch("policy") is metrics.IDLE
    assert metrics.upstream_request("http", tenant="acme", server="s") is metrics.NO_REQUEST
    with Delta(("toolkeeper_calls_total", {}), ("toolkeeper_call_step_seconds_count", {}),
               ("toolkeeper_rate_limit_refusals_total", {})) as delta, committed():
        calls_submit(session=session, calls=[{"name": "no_such_tool", "input": {}}])
        admit(entry=Entry.REST, api_key=world.a.key_objects["agent"])
        metrics.rate_limit_refused(tenant="acme", limit="key_requests")
    assert delta.changes == [0, 0, 0]


def test_admission_is_timed_for_every_request(world):
    with Delta(("toolkeeper_call_step_seconds_count", {"step": "admission", "source": "none"})) as delta:
        admit(entry=Entry.REST, api_key=world.a.key_objects["agent"])
        admit(entry=Entry.REST, api_key=world.a.key_objects["agent"])
    assert delta.changes == [2]


def test_a_reviewers_decision_records_the_approval_wait_in_its_bucket(world, session, committed):
    rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern="current_time", note="ask")
    [call] = calls_submit(session=session, calls=[{"name": "current_time", "input": {}}])
    assert call.status == CallStatus.AWAITING_APPROVAL
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    # it waited ten minutes: over the 300 s bucket, under the 900 s one
    ApprovalRequest.objects.for_tenant(world.a.tenant).filter(pk=request.pk).update(
        opened_at=timezone.now() - timedelta(minutes=10))
    source = world.a.tools["current_time"].source
    step = {"step": "approval_wait", "source": source}
    with Delta(("toolkeeper_call_step_seconds_bucket", {**step, "le": "300.0"}),
               ("toolkeeper_call_step_seconds_bucket", {**step, "le": "900.0"}),
               ("toolkeeper_call_step_seconds_count", step),
               ("toolkeeper_calls_total", {"tenant": "acme", "source": source, "status": "rejected",
                                           "decision": "ask"})) as delta, committed():
        request_decide(request=request, reviewer=world.a.users["reviewer"], decision="reject", message="no")
    assert delta.changes == [0, 1, 1, 1]


def test_rate_limit_refusals_are_counted_by_the_limit_that_refused(world, monkeypatch):
    limits.counter_store().clear()
    monkeypatch.setattr(limits.time, "time", lambda: 1_800_000_030.0)
    tenant = Tenant.objects.get(pk=world.a.tenant.pk)
    tenant.key_requests_per_minute, tenant.tenant_calls_in_flight = 1, 2
    key = world.a.key_objects["agent"]
    with Delta(("toolkeeper_rate_limit_refusals_total", {"tenant": "acme", "limit": "key_requests"}),
               ("toolkeeper_rate_limit_refusals_total", {"tenant": "acme", "limit": "tenant_calls_in_flight"})) \
            as delta:
        limits.requests_admit(tenant=tenant, api_key=key)
        with pytest.raises(RateLimited):
            limits.requests_admit(tenant=tenant, api_key=key)
        limits.calls_admit(tenant=tenant, api_key=key, adding=1, in_flight=lambda: (1, 0))
        with pytest.raises(RateLimited):
            limits.calls_admit(tenant=tenant, api_key=key, adding=2, in_flight=lambda: (1, 0))
    limits.counter_store().clear()
    assert delta.changes == [1, 1]


def test_upstream_requests_count_errors_and_time_each_request():
    server = {"kind": "http", "server": "weather"}
    with Delta(("toolkeeper_upstream_requests_total", {**server, "tenant": "acme", "outcome": "ok"}),
               ("toolkeeper_upstream_requests_total", {**server, "tenant": "acme", "outcome": "error"}),
               ("toolkeeper_upstream_request_seconds_count", server)) as delta:
        with metrics.upstream_request("http", tenant="acme", server="weather"):
            pass
        with pytest.raises(ConnectionError), metrics.upstream_request("http", tenant="acme", server="weather"):
            raise ConnectionError("refused")
        with metrics.upstream_request("http", tenant="acme", server="weather") as sent:
            sent.failed()  # a 5xx answer
    assert delta.changes == [1, 2, 3]


def test_the_local_executor_reports_its_capacity_and_the_calls_it_runs():
    executor = LocalExecutor(workers=3)
    assert sample("toolkeeper_executor_capacity", executor="local") == 3

    class Job:
        call_id, tenant_id, session_id, concurrency_safe = "c1", 1, "s1", True

    executor._count_running(Job())
    assert sample("toolkeeper_executor_busy", executor="local") == 1
    executor._uncount_running(Job())
    assert sample("toolkeeper_executor_busy", executor="local") == 0


@pytest.mark.django_db(transaction=True)
def test_a_call_run_by_the_executor_times_its_execution_and_after_steps(world, drain_calls):
    session = session_create(tenant=world.a.tenant, agent="metrics-bot", user="m@example.com")
    source = world.a.tools["current_time"].source
    with Delta(("toolkeeper_call_step_seconds_count", {"step": "execution", "source": source}),
               ("toolkeeper_call_step_seconds_count", {"step": "after_steps", "source": source}),
               ("toolkeeper_calls_total", {"tenant": "acme", "source": source, "status": "succeeded",
                                           "decision": "allow"})) as delta:
        [call] = calls_submit(session=session, calls=[{"name": "current_time", "input": {}}])
        deadline = time.monotonic() + 30
        while ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk).status != CallStatus.SUCCEEDED:
            assert time.monotonic() < deadline, "the call did not run"
            time.sleep(0.02)
        while sample("toolkeeper_calls_total", tenant="acme", source=source, status="succeeded") <= delta.before[2]:
            assert time.monotonic() < deadline, "the settled call was not counted"
            time.sleep(0.02)
    assert delta.changes == [1, 1, 1]


def test_the_audit_chain_watch_sets_the_gauge_of_a_broken_chain(world):
    cache.clear()
    statuses = audit_chains_watch()
    assert statuses["acme"] != "broken"
    assert sample("toolkeeper_audit_chain_broken", tenant="acme") == 0
    entry = Event.objects.for_tenant(world.a.tenant).order_by("id").first()
    Event.objects.for_tenant(world.a.tenant).filter(pk=entry.pk).update(verb="rewritten")
    cache.clear()  # the next full walk (a resumed one reads only what came after its last walk)
    assert audit_chains_watch()["acme"] == "broken"
    assert sample("toolkeeper_audit_chain_broken", tenant="acme") == 1
    assert sample("toolkeeper_audit_chain_broken", tenant="globex") == 0


# --- the scrape ---------------------------------------------------------------------------------------------------

def _gauges() -> dict:
    found = {}
    for family in DatabaseGauges().collect():
        for one in family.samples:
            found[(one.name, tuple(sorted(one.labels.items())))] = one.value
    return found


def test_the_scrape_reads_approvals_and_waiting_calls_in_two_queries_whatever_the_tenants(
        world, session, django_assert_num_queries):
    rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern="current_time", note="ask")
    calls_submit(session=session, calls=[{"name": "current_time", "input": {}}] * 2)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).first()
    queue = request.queue.name
    ApprovalRequest.objects.for_tenant(world.a.tenant).filter(pk=request.pk).update(
        opened_at=timezone.now() - timedelta(hours=2), expires_at=timezone.now() - timedelta(hours=1))
    with django_assert_num_queries(2):
        found = _gauges()
    labels = (("queue", queue), ("tenant", "acme"))
    assert found[("toolkeeper_approvals_pending", labels)] == 2
    assert found[("toolkeeper_approvals_overdue", labels)] == 1
    assert found[("toolkeeper_approvals_oldest_age_seconds", labels)] >= 7200
    for number in range(3):  # more tenants, each with a request waiting: the same two queries
        tenant = tenant_create(slug=f"more-{number}", default_behavior="allow")
        rule_create(tenant=tenant, behavior="ask", tool_pattern="current_time", note="ask")
        more = session_create(tenant=tenant, agent="support-bot", user="u@example.com")
        [call] = calls_submit(session=more, calls=[{"name": "current_time", "input": {}}])
        assert call.status == CallStatus.AWAITING_APPROVAL, call.error
    with django_assert_num_queries(2):
        found = _gauges()
    assert sum(value for (name, _), value in found.items() if name == "toolkeeper_approvals_pending") == 5


def test_the_scrape_folds_tenants_into_all_when_their_labels_are_off(world, session, monkeypatch):
    rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern="current_time", note="ask")
    calls_submit(session=session, calls=[{"name": "current_time", "input": {}}])
    monkeypatch.setattr(metrics, "TENANT_LABELS", False)
    tenants = {dict(labels).get("tenant") for (_, labels) in _gauges()}
    assert tenants == {"_all"}


@override_settings(TOOLKEEPER_METRICS_TOKEN="")
def test_metrics_is_not_found_without_a_token(client):
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 404
    assert b"toolkeeper_" not in response.content


@override_settings(TOOLKEEPER_METRICS_TOKEN=TOKEN)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer "])
def test_metrics_refuses_a_missing_or_wrong_token_without_saying_more(client, authorization):
    headers = {"HTTP_AUTHORIZATION": authorization} if authorization is not None else {}
    response = client.get("/metrics", **headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"toolkeeper_" not in response.content and TOKEN.encode() not in response.content


@override_settings(TOOLKEEPER_METRICS_TOKEN=TOKEN)
def test_metrics_refuses_a_tenants_api_key(world, client):
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {world.a.keys['admin']}")
    assert response.status_code == 401


@override_settings(TOOLKEEPER_METRICS_TOKEN=TOKEN)
def test_metrics_answers_its_token_with_every_process_and_the_database(world, session, client, committed):
    with committed():
        calls_submit(session=session, calls=[{"name": "no_such_tool", "input": {}}])
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert 'toolkeeper_calls_total{decision="none",source="none",status="failed",tenant="acme"}' in text
    assert "# TYPE toolkeeper_approvals_pending gauge" in text
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code in (403, 405)


def test_the_sweep_removes_only_files_of_processes_that_ended(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    ended, running = 2**22 + 12345, os.getppid()  # above the usual pid range: no process has it
    for name in (f"counter_{ended}.db", f"gauge_livesum_{ended}.db", f"counter_{running}.db",
                 f"gauge_livesum_{running}.db", f"counter_{os.getpid()}.db"):
        (tmp_path / name).write_bytes(b"")
    assert metrics.sweep(live_only=True) == 1
    assert not (tmp_path / f"gauge_livesum_{ended}.db").exists()
    assert (tmp_path / f"counter_{ended}.db").exists()
    assert metrics.sweep() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"counter_{running}.db", f"gauge_livesum_{running}.db", f"counter_{os.getpid()}.db"])


@pytest.mark.parametrize(("value", "address"), [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)), (":9464", ("127.0.0.1", 9464)), ("[::1]:9464", ("::1", 9464)),
])
def test_the_separate_address_is_read_as_host_and_port(value, address):
    assert metrics.side_address(value) == address
