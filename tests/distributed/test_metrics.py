"""`/metrics` of the distributed deployment sums every process: a call run by a Celery worker child and a call of an
MCP tool (its request made by the worker child's MCP host process) show in the counts and histograms the server
process answers with; the executors' live gauges add up over the worker's children (docs/observability.md)."""
import time
import uuid

import httpx
import pytest

from tests.distributed.conftest import METRICS_TOKEN, WORKER_METRICS_ADDR
from tests.distributed.test_mcp import http_mcp, mcp_tools  # noqa: F401  (the MCP upstream of the stack)
from tests.scrapes import samples_of, total

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]


def scrape(url: str) -> dict:
    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=30)
    return answered(response)


def answered(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return samples_of(response.text)



def test_the_scrape_sums_the_worker_and_the_mcp_host_processes(deployment, mcp_tools):  # noqa: F811
    names, _log = mcp_tools("streamable_http")
    server = names["echo"].split("__")[1]
    assert httpx.get(f"{deployment.url}/metrics", timeout=10).status_code == 401
    before = scrape(deployment.url)
    with deployment.api(deployment.b) as bravo, deployment.api(deployment.a) as demo:
        call = bravo.submit(bravo.new_session("metrics-mcp-bot", ops=False), names["echo"],
                            {"marker": uuid.uuid4().hex}, wait=60)
        assert call["status"] == "succeeded", call
        call = demo.submit(demo.new_session("metrics-dist-bot", ops=False), "current_time", {}, wait=60)
        assert call["status"] == "succeeded", call

    def delta(name: str, **labels) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    deadline = time.monotonic() + 30
    while True:  # a worker's count lands as its transaction commits, after the waiting request may have answered
        after = scrape(deployment.url)
        if delta("toolkeeper_calls_total", status="succeeded") >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.25)

    mcp = {"tenant": "bravo", "source": "mcp", "status": "succeeded"}
    assert delta("toolkeeper_calls_total", **mcp, decision="allow") == 1
    assert delta("toolkeeper_call_duration_seconds_count", **mcp) == 1
    assert delta("toolkeeper_calls_total", tenant="demo", status="succeeded") == 1
    assert delta("toolkeeper_call_duration_seconds_count", tenant="demo", status="succeeded") == 1
    # the steps the worker children ran
    assert delta("toolkeeper_call_step_seconds_count", step="execution", source="mcp") == 1
    assert delta("toolkeeper_call_step_seconds_count", step="execution") == 2
    assert delta("toolkeeper_call_step_seconds_count", step="after_steps") == 2
    # the upstream request, made by a worker child's MCP host process
    upstream = {"kind": "mcp", "server": server}
    assert delta("toolkeeper_upstream_requests_total", **upstream, tenant="bravo", outcome="ok") >= 1
    assert delta("toolkeeper_upstream_requests_total", **upstream, outcome="error") == 0
    assert delta("toolkeeper_upstream_request_seconds_count", **upstream) >= 1
    # one call at a time in each of the worker's children, summed over the living ones
    assert total(after, "toolkeeper_executor_capacity", executor="celery") == deployment.stack.worker_concurrency
    assert total(after, "toolkeeper_executor_busy", executor="celery") == 0


def test_a_host_of_workers_alone_is_scraped_on_the_workers_address(deployment):
    """TOOLKEEPER_WORKER_METRICS_ADDR: the worker's main process serves the sums of the multiprocess directory,
    without a token (a private address) and without the database's gauges (the servers' scrape has them)."""
    samples = answered(httpx.get(f"http://{WORKER_METRICS_ADDR}/metrics", timeout=30))
    assert total(samples, "toolkeeper_executor_capacity", executor="celery") == deployment.stack.worker_concurrency
    before = total(samples, "toolkeeper_call_step_seconds_count", step="execution")
    with deployment.api(deployment.a) as demo:
        call = demo.submit(demo.new_session("worker-scrape-bot", ops=False), "current_time", {}, wait=60)
        assert call["status"] == "succeeded", call
    deadline = time.monotonic() + 30
    while True:
        samples = answered(httpx.get(f"http://{WORKER_METRICS_ADDR}/metrics", timeout=30))
        if total(samples, "toolkeeper_call_step_seconds_count", step="execution") > before:
            break
        assert time.monotonic() < deadline, "the worker's run never showed on its address"
        time.sleep(0.25)
    assert not any(name == "toolkeeper_approvals_pending" for name, _ in samples)
    assert httpx.get(f"http://{WORKER_METRICS_ADDR}/elsewhere", timeout=10).status_code == 404
