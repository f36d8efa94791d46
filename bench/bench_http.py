"""What the HTTP benchmarks share: a keep-alive API client, sessions, percentiles."""
from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable


class Client:
    """One keep-alive HTTP connection with the API key; POSTs JSON and can time each request."""

    def __init__(self, port: int, key: str):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def post(self, path: str, body: dict) -> tuple[int, bytes]:
        self.conn.request("POST", path, body=json.dumps(body), headers=self.headers)
        response = self.conn.getresponse()
        return response.status, response.read()

    def timed(self, path: str, body: dict, check) -> float:
        start = time.perf_counter()
        status, payload = self.post(path, body)
        elapsed = time.perf_counter() - start
        check(status, payload)
        return elapsed

    def close(self) -> None:
        self.conn.close()


def new_session(client: Client, n: int) -> str:
    status, payload = client.post("/api/v1/sessions", {"agent": f"bench-{n}", "user": "bench@example.com"})
    if status != 201:
        raise RuntimeError(f"could not create a session: {status} {payload[:300]!r}")
    return json.loads(payload)["id"]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def run_together(calls: list[Callable[[], float]], per_client: int) -> tuple[list[float], float]:
    """Every client at once, a thread each, released together: each makes `per_client` timed calls
    (`calls[n]()` returns one call's seconds). The samples of all, and the wall time from the release."""
    collected: list[list[float]] = [[] for _ in calls]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(calls) + 1)

    def worker(n: int) -> None:
        barrier.wait()
        try:
            for _ in range(per_client):
                collected[n].append(calls[n]())
        except BaseException as exc:  # raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return [sample for per in collected for sample in per], wall
