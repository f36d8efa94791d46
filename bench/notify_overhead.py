#!/usr/bin/env python
"""Does a slow notification receiver slow the call path? Ratios, measured in one run.

Starts daphne in the embedded mode (fresh data dir, migrate, bootstrap) and two webhook receivers in this
process: a fast one, and a slow one that answers each message after SLOW_S seconds. The demo tenant gets a
queue, an ask rule on `current_time` for the benchmark's agent, and a webhook channel taking new requests.
Then 8 clients submit calls that each open an approval request (no wait: the answer is `awaiting_approval`),
in rounds that rotate three modes, so all of them see the same machine:

- off:  the channel disabled (no message is written)
- fast: the channel sending to the fast receiver
- slow: the channel sending to the slow receiver (messages pile up; the background threads are held)

Prints p50/p99 of each mode, the ratios slow/fast (what a slow receiver costs a call: the claim) and fast/off
(what writing a message costs a call), what reached the receivers and the delivery log's statuses at the end;
writes JSON (--json PATH). Target: slow/fast p50 ≤ 1.2, every run.

    .venv/bin/python bench/notify_overhead.py [--quick] [--json PATH] [--log CHARS]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))

from tests.live.server import LiveServer  # noqa: E402

sys.path.insert(0, str(BENCH_DIR))
from bench_http import Client, percentile, run_together  # noqa: E402

SLOW_S = 2.0
CLIENTS = 8
AGENT = "bench-notify"
TARGET_RATIO_P50 = 1.2


class Receiver:
    """A webhook receiver that answers each message after `delay_s`; counts messages and the most held at once."""

    def __init__(self, delay_s: float):
        self.received = 0
        self.holding = 0
        self.most_held = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.received += 1
                    receiver.holding += 1
                    receiver.most_held = max(receiver.most_held, receiver.holding)
                time.sleep(delay_s)
                with receiver.lock:
                    receiver.holding -= 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def request(client: Client, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    client.conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=client.headers)
    response = client.conn.getresponse()
    payload = response.read()
    return response.status, json.loads(payload) if payload else {}


def expect(status: int, payload: dict, wanted: int, what: str) -> dict:
    if status != wanted:
        raise RuntimeError(f"{what} answered {status}: {json.dumps(payload)[:300]}")
    return payload


def set_up(server: LiveServer, receiver: Receiver) -> int:
    """The queue, the rule and the (disabled) channel; returns the channel's id."""
    admin = Client(server.port, server.admin_api_key)
    expect(*request(admin, "POST", "/api/v1/queues", {"name": "bench-notify"}), 201, "creating the queue")
    expect(*request(admin, "POST", "/api/v1/rules", {
        "behavior": "ask", "tool_pattern": "current_time", "agents": [AGENT], "queue": "bench-notify",
        "priority": 100}), 201, "creating the rule")
    channel = expect(*request(admin, "POST", "/api/v1/notify-channels", {
        "queue": "bench-notify", "name": "slow", "kind": "webhook", "events": ["requested"], "url": receiver.url,
        "signing_secret": "bench-signing-secret", "enabled": False}), 201, "creating the channel")
    admin.close()
    return channel["id"]


def switch(server: LiveServer, channel_id: int, receiver: Receiver | None) -> None:
    """The channel off (None), or on and sending to `receiver`."""
    admin = Client(server.port, server.admin_api_key)
    change = {"enabled": False} if receiver is None else {"enabled": True, "url": receiver.url}
    expect(*request(admin, "PATCH", f"/api/v1/notify-channels/{channel_id}", change), 200, "switching the channel")
    admin.close()


def check_call(status: int, payload: bytes) -> None:
    if status != 200:
        raise RuntimeError(f"the call answered {status}: {payload[:300]!r}")
    call = json.loads(payload)["calls"][0]
    if call["status"] != "awaiting_approval":
        raise RuntimeError(f"the call is {call['status']}, not awaiting_approval: {payload[:300]!r}")


def deliveries(server: LiveServer) -> dict:
    admin = Client(server.port, server.admin_api_key)
    counts: dict = {}
    page = "/api/v1/notify-deliveries?limit=500"
    while page:
        body = expect(*request(admin, "GET", page), 200, "reading the delivery log")
        for row in body["results"]:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
            if row["attempts"]:
                key = f"{row['status']} after {row['attempts']} attempt(s)"
                counts[key] = counts.get(key, 0) + 1
            if row["last_error"]:
                errors = counts.setdefault("errors", {})
                errors[row["last_error"][:80]] = errors.get(row["last_error"][:80], 0) + 1
        page = body.get("next")
        if page:
            page = page.split(f":{server.port}", 1)[1]
    admin.close()
    return counts


MODES = ("off", "fast", "slow")


def measure(server: LiveServer, channel_id: int, receivers: dict, rounds: int, per_client: int) -> dict:
    pool = [Client(server.port, server.api_key) for _ in range(CLIENTS)]
    paths = []
    for n, client in enumerate(pool):
        status, session = request(client, "POST", "/api/v1/sessions", {"agent": AGENT, "user": f"b{n}@example.com"})
        paths.append(f"/api/v1/sessions/{expect(status, session, 201, 'a session')['id']}/calls")
    calls = [lambda c=c, p=p: c.timed(p, {"name": "current_time", "input": {}}, check_call)
             for c, p in zip(pool, paths, strict=True)]
    run_together(calls, 3)  # warm-up
    samples = {mode: [] for mode in MODES}
    walls = dict.fromkeys(MODES, 0.0)
    for n in range(rounds):
        for mode in MODES[n % 3:] + MODES[:n % 3]:  # each mode first in turn
            switch(server, channel_id, receivers.get(mode))
            taken, wall = run_together(calls, per_client)
            samples[mode] += taken
            walls[mode] += wall
    for client in pool:
        client.close()
    result = {}
    for mode, taken in samples.items():
        result[mode] = {"calls": len(taken), "p50_ms": round(percentile(taken, 50) * 1000, 2),
                        "p99_ms": round(percentile(taken, 99) * 1000, 2),
                        "calls_per_s": round(len(taken) / walls[mode], 1)}
    for name, (over, under) in {"slow_over_fast": ("slow", "fast"), "fast_over_off": ("fast", "off")}.items():
        result[name] = {q: round(result[over][f"{q}_ms"] / result[under][f"{q}_ms"], 3) for q in ("p50", "p99")}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (well under a minute)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--log", type=int, default=0, help="print this many characters of the server's log")
    args = parser.parse_args()
    rounds, per_client = (6, 10) if args.quick else (12, 25)

    receivers = {"fast": Receiver(0.0), "slow": Receiver(SLOW_S)}
    server = LiveServer(extra_env={
        "DEBUG": "0", "SECRET_KEY": "bench-only-" + "x" * 40, "LOG_LEVEL": "WARNING",
        "TOOLKEEPER_SECRETS_KEY": "YmVuY2gtb25seS14eHh4eHh4eHh4eHh4eHh4eHh4eHg=",
        "TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1"}, daphne_args=["-v", "0"])
    print("starting daphne (embedded mode)…", flush=True)
    with server:
        channel_id = set_up(server, receivers["fast"])
        result = measure(server, channel_id, receivers, rounds, per_client)
        result["receivers"] = {mode: {"messages": r.received, "most_held_at_once": r.most_held}
                               for mode, r in receivers.items()}
        result["delivery_log"] = deliveries(server)
        if args.log:
            print(server.log_tail(args.log))
    for receiver in receivers.values():
        receiver.stop()
    result["target"] = {"slow_over_fast_p50": TARGET_RATIO_P50}
    result["config"] = {"quick": args.quick, "clients": CLIENTS, "rounds": rounds, "per_client": per_client,
                        "python": platform.python_version(), "mode": "embedded (SQLite, in-process layer)"}

    print(f"\n{'mode':<8}{'calls':>8}{'p50 ms':>10}{'p99 ms':>10}{'calls/s':>10}")
    for mode in MODES:
        row = result[mode]
        print(f"{mode:<8}{row['calls']:>8}{row['p50_ms']:>10}{row['p99_ms']:>10}{row['calls_per_s']:>10}")
    print(f"slow receiver over fast: p50 {result['slow_over_fast']['p50']} (target ≤ {TARGET_RATIO_P50}), "
          f"p99 {result['slow_over_fast']['p99']}")
    print(f"notifying at all (fast receiver over no channel): p50 {result['fast_over_off']['p50']}, "
          f"p99 {result['fast_over_off']['p99']}")
    print(f"receivers: {result['receivers']} (the slow one answers after {SLOW_S} s)")
    print(f"delivery log at the end: {result['delivery_log']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    met = result["slow_over_fast"]["p50"] <= TARGET_RATIO_P50
    print("target met" if met else "TARGET MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
