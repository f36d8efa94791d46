"""What the HTTP benchmarks share: a keep-alive API client, sessions, percentiles."""
from __future__ import annotations

import http.client
import json
import os
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


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """A process and all its descendants (Linux /proc)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in _listdir(f"/proc/{current}/task"):
            try:
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    todo += [int(p) for p in handle.read().split()]
            except OSError:
                continue
    return found


def processes_named(name: str) -> list[int]:
    """Every process whose command name is `name` (PostgreSQL's backends, a redis-server)."""
    found = []
    for entry in _listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as handle:
                    if handle.read().strip() == name:
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def cpu_by_process(pids: list[int], *, reaped: bool = False) -> dict[int, float]:
    """Each live process's user + system CPU so far, in seconds; with `reaped`, also that of its children it has
    reaped (cutime, cstime): a PostgreSQL backend or a recycled pool process that ended still counts, in its
    parent. A process gone since is left out."""
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = sum(int(f) for f in fields[11:15 if reaped else 13]) / CLOCK_TICKS
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU the processes have used so far (a process gone since counts nothing)."""
    return sum(cpu_by_process(pids).values())


class CpuMeter:
    """CPU per component over a window: `components` maps a name to a function listing its pids, asked
    again at each reading (PostgreSQL starts a backend per connection)."""

    def __init__(self, components: dict[str, Callable[[], list[int]]]):
        self.components = components
        self._start: dict[str, dict[int, float]] = {}
        self.used: dict[str, float] = {}

    def _read(self) -> dict[str, dict[int, float]]:
        return {name: {pid: cpu_seconds([pid]) for pid in pids()} for name, pids in self.components.items()}

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> dict[str, float]:
        end = self._read()
        # a process started inside the window counts from zero
        self.used = {name: sum(cpu - self._start[name].get(pid, 0.0) for pid, cpu in end[name].items())
                     for name in end}
        return self.used

    def per_call_ms(self, calls: int) -> dict[str, float]:
        return {name: used * 1000 / calls for name, used in self.used.items()} if calls else {}
