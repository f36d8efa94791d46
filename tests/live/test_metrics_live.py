"""`/metrics` of a live embedded server (daphne, SQLite, the local executor) after governed calls, and a real
Prometheus server (Debian's `prometheus`) scraping it with the bearer token and answering a query through its HTTP
API (docs/observability.md)."""
import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.distributed.support import Api, is_terminal, ws_collect, ws_connect
from tests.live.server import LiveServer, free_port
from tests.scrapes import samples_of, total

pytestmark = [pytest.mark.live]

TOKEN = "live-scrape-token"
PROMETHEUS = os.environ.get("TOOLKEEPER_PROMETHEUS", "/usr/bin/prometheus")
CALLS = 3


def scrape(url: str, token: str = TOKEN) -> dict:
    """Every sample of the scrape: {(name, sorted labels): value}."""
    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert response.status_code == 200, response.text
    return samples_of(response.text)



@pytest.fixture(scope="module")
def server():
    with LiveServer(extra_env={"TOOLKEEPER_METRICS_TOKEN": TOKEN}) as live:
        yield live
        print(f"--- {live.url} server log (tail) ---\n{live.log_tail(20000)}")


def test_metrics_count_governed_calls_and_time_their_steps(server):
    assert httpx.get(f"{server.url}/metrics", timeout=10).status_code == 401
    assert httpx.get(f"{server.url}/metrics", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
    before = scrape(server.url)
    ws_url = server.url.replace("http://", "ws://", 1)
    with Api(server.url, server.api_key) as api:
        session = api.new_session("metrics-bot")  # one meta call (the ops tools)

        async def follow_one() -> None:
            socket = await ws_connect(f"{ws_url}/ws/api/sessions/{session}/",
                                      headers={"Authorization": f"Bearer {server.api_key}"})
            call = await asyncio.to_thread(api.submit, session, "current_time", {})
            await ws_collect(socket, lambda seen: any(is_terminal(m) for m in seen), call=call["id"])
            await socket.close()

        asyncio.run(follow_one())
        for _ in range(CALLS - 1):
            call = api.submit(session, "current_time", {}, wait=10)
            assert call["status"] == "succeeded", call
    deadline = time.monotonic() + 30
    while True:  # the last call's count lands as its transaction commits, after its answer may have left
        after = scrape(server.url)
        counted = (total(after, "toolkeeper_calls_total", tenant="demo", status="succeeded")
                   - total(before, "toolkeeper_calls_total", tenant="demo", status="succeeded"))
        if counted >= CALLS + 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    def delta(name: str, **labels) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("toolkeeper_calls_total", tenant="demo", status="succeeded", decision="allow") == CALLS + 1
    assert delta("toolkeeper_calls_total", tenant="demo", source="meta", status="succeeded") == 1
    assert delta("toolkeeper_call_duration_seconds_count", tenant="demo", status="succeeded") == CALLS + 1
    assert delta("toolkeeper_call_duration_seconds_bucket", tenant="demo", status="succeeded", le="+Inf") == CALLS + 1
    for step in ("execution", "after_steps"):
        assert delta("toolkeeper_call_step_seconds_count", step=step) == CALLS, step
    assert delta("toolkeeper_call_step_seconds_count", step="policy") >= CALLS + 1
    assert delta("toolkeeper_call_step_seconds_count", step="admission") >= CALLS + 2
    assert delta("toolkeeper_event_fanout_seconds_count") >= 1  # the followed call's events reached the socket
    assert total(after, "toolkeeper_executor_capacity", executor="local") > 0
    assert total(after, "toolkeeper_executor_busy", executor="local") == 0
    assert total(after, "toolkeeper_calls_queued") == 0


def _prometheus_or_skip() -> str:
    if shutil.which(PROMETHEUS) or Path(PROMETHEUS).exists():
        return PROMETHEUS
    if os.environ.get("TOOLKEEPER_REQUIRE_SERVICES") == "1":
        pytest.fail(f"Prometheus ({PROMETHEUS}, Debian's `prometheus` package) is required "
                    "(TOOLKEEPER_REQUIRE_SERVICES=1)")
    pytest.skip(f"Prometheus is not installed ({PROMETHEUS}; Debian's `prometheus` package)")


def test_a_real_prometheus_scrapes_with_the_token_and_answers_a_query(server):
    binary = _prometheus_or_skip()
    with Api(server.url, server.api_key) as api:
        session = api.new_session("prometheus-bot", ops=False)
        call = api.submit(session, "current_time", {}, wait=10)
        assert call["status"] == "succeeded", call
    work = Path(tempfile.mkdtemp(prefix="tk-prometheus-"))
    try:
        (work / "token").write_text(TOKEN)
        (work / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            "  - job_name: toolkeeper\n"
            "    metrics_path: /metrics\n"
            f"    authorization:\n      type: Bearer\n      credentials_file: {work / 'token'}\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{server.port}']\n")
        port = free_port()
        with open(work / "prometheus.log", "wb") as log:
            process = subprocess.Popen(
                [binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            found, deadline = None, time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    answer = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", timeout=5, params={
                        "query": 'sum(toolkeeper_calls_total{tenant="demo",status="succeeded"})'}).json()
                except (httpx.HTTPError, ValueError):
                    answer = None
                if answer and answer.get("status") == "success" and answer["data"]["result"]:
                    found = answer
                    break
                time.sleep(0.5)
            assert found is not None, (work / "prometheus.log").read_text()[-4000:]
            assert float(found["data"]["result"][0]["value"][1]) >= 1
            targets = httpx.get(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5).json()
            [target] = targets["data"]["activeTargets"]
            assert target["health"] == "up", target
        finally:
            process.terminate()
            process.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)
