#!/usr/bin/env python
"""The shape of the code, in the figures docs/architecture.md reasons about.

- modules per folder (the largest folders), and each package's share of the source lines;
- the stops of one allowed call, followed from `CallSubmitView.post` until it settled: every entry into a
  function of another of the project's modules than the one the thread was last in, on every thread the
  call touches; "returns" are the stops into a module the thread had already left. With `--approval` the
  same for a call that waits for a reviewer (submitted, then approved through the API).

Runs in-process on a fresh embedded data dir (migrate, bootstrap), so it needs no server.

    .venv/bin/python bench/code_map.py [--approval] [--verbose]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = [ROOT / "platform", ROOT / "tools", ROOT / "approvals", ROOT / "knowledge", ROOT / "skills"]
PERIODIC_THREADS = {"toolkeeper-embedded"}  # the embedded runtime's periodic jobs: not the call's work
SKIPPED = {"migrations", "__pycache__", "templatetags", "management"}


def _source_files():
    for root in SOURCE_ROOTS:
        for path in root.rglob("*.py"):
            if not SKIPPED.intersection(path.relative_to(ROOT).parts):
                yield path


def _package_of(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    return parts[1] if parts[0] == "platform" else parts[0]


def static_counts() -> None:
    modules = Counter()
    lines = Counter()
    for path in _source_files():
        if path.name != "__init__.py":
            modules[str(path.parent.relative_to(ROOT))] += 1
        lines[_package_of(path)] += len(path.read_text().splitlines())
    total = sum(lines.values())
    print("modules per folder (largest 8):")
    for folder, count in modules.most_common(8):
        print(f"  {folder:40} {count:4}")
    print(f"\nsource lines per package (total {total:,}):")
    for package, count in lines.most_common():
        print(f"  {package:40} {count:6,}  {count / total:6.1%}")


class PathTracer:
    """Counts the module changes of every thread from the moment `start_code` is entered.

    Python 3.11 cannot reach threads that already run, so the profile hook is installed before any
    starts (`install`), and counts only inside `with tracer:`.
    """

    def __init__(self):
        self.start_code = None
        self.active = False
        self.entries: Counter = Counter()
        self.quiet_threads: set[int] = set()
        self.lock = threading.Lock()
        self.stops = 0
        self.returns = 0
        self.modules: set[str] = set()
        self.by_thread: dict[int, tuple[str | None, set[str]]] = {}

    @staticmethod
    def _module(frame) -> str | None:
        filename = frame.f_code.co_filename
        for root in SOURCE_ROOTS:
            if filename.startswith(str(root) + os.sep):
                return str(Path(filename).relative_to(ROOT).with_suffix(""))
        return None

    def profile(self, frame, event, arg):
        if event != "call" or self.start_code is None:
            return
        if frame.f_code is self.start_code:
            self.active = True
        if not self.active:
            return
        module = self._module(frame)
        if module is None:
            return
        thread = threading.get_ident()
        if thread in self.quiet_threads or threading.current_thread().name in PERIODIC_THREADS:
            return
        with self.lock:
            last, left = self.by_thread.get(thread, (None, set()))
            if module != last:
                self.stops += 1
                self.modules.add(module)
                self.entries[module] += 1
                if module in left:
                    self.returns += 1
                if last is not None:
                    left.add(last)
                self.by_thread[thread] = (module, left)

    def install(self) -> None:
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)

    def following(self, start_code) -> PathTracer:
        self.start_code, self.active, self.stops, self.returns = start_code, False, 0, 0
        self.modules, self.by_thread, self.entries = set(), {}, Counter()
        return self

    def __enter__(self):
        return self

    @contextlib.contextmanager
    def quiet(self):
        """This thread's work is not the call's (the script waiting for it to settle)."""
        self.quiet_threads.add(threading.get_ident())
        try:
            yield
        finally:
            self.quiet_threads.discard(threading.get_ident())

    def __exit__(self, *exc):
        self.start_code, self.active = None, False

    def line(self, title: str, verbose: bool) -> str:
        text = f"{title:42} {self.stops:4} stops in {len(self.modules):3} modules, {self.returns:3} returning"
        if verbose:
            text += "".join(f"\n    {count:4}  {module}" for module, count in self.entries.most_common(15))
        return text


def call_paths(approval: bool, verbose: bool) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="tk-codemap-"))
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "toolkeeper.settings", "TOOLKEEPER_DATA_DIR": str(data_dir),
        "DATABASE_URL": f"sqlite:///{data_dir / 'common.sqlite3'}", "TOOLKEEPER_EXECUTOR": "local",
        "REDIS_URL": "", "LOG_LEVEL": "WARNING", "ALLOWED_HOSTS": "testserver",
    })
    sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
    tracer = PathTracer()
    tracer.install()
    import django

    django.setup()
    import json

    from django.core.management import call_command
    from django.test import Client

    from tools.api.views import CallSubmitView

    call_command("migrate", verbosity=0)
    call_command("bootstrap", stdout=open(os.devnull, "w"))  # noqa: SIM115
    credentials = json.loads((data_dir / "demo-credentials.json").read_text())
    agent = Client(headers={"Authorization": f"Bearer {credentials['api_key']}"})
    admin = Client(headers={"Authorization": f"Bearer {credentials['admin_api_key']}"})

    def new_session() -> str:
        answer = agent.post("/api/v1/sessions", {"agent": "code-map"}, content_type="application/json")
        assert answer.status_code == 201, answer.content
        return answer.json()["id"]

    def settled(call_id: str) -> dict:
        with tracer.quiet():
            return _settled(call_id)

    def _settled(call_id: str) -> dict:
        for _ in range(500):
            call = agent.get(f"/api/v1/calls/{call_id}").json()
            if call["status"] in {"succeeded", "failed", "denied", "cancelled", "timed_out", "interrupted"}:
                return call
            time.sleep(0.01)
        raise RuntimeError(f"call {call_id} did not settle")

    def submit(session: str, name: str) -> str:
        answer = agent.post(f"/api/v1/sessions/{session}/calls", {"name": name, "input": {}},
                            content_type="application/json")
        assert answer.status_code == 200, answer.content
        return answer.json()["calls"][0]["id"]

    session = new_session()
    settled(submit(session, "current_time"))  # warm: imports, caches, the executor's threads
    with tracer.following(CallSubmitView.post.__code__):
        call = settled(submit(session, "current_time"))
    assert call["status"] == "succeeded", call
    print(tracer.line("an allowed call (current_time)", verbose))
    if not approval:
        return
    from approvals.models import ApprovalRequest
    from approvals.services import rule_create
    from tenancy.models import Tenant

    tenant = Tenant.objects.get(slug="demo")
    rule_create(tenant=tenant, tool_pattern="current_time", behavior="ask",
                priority=1000)
    with tracer.following(CallSubmitView.post.__code__):
        call_id = submit(session, "current_time")
        with tracer.quiet():
            request = ApprovalRequest.objects.for_tenant(tenant).get(call__pk=call_id)
        answer = admin.post(f"/api/v1/approvals/{request.pk}/decide", {"decision": "approve"},
                            content_type="application/json")
        assert answer.status_code == 200, answer.content
        call = settled(call_id)
    assert call["status"] == "succeeded", call
    print(tracer.line("a call approved by a reviewer", verbose))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--approval", action="store_true", help="also follow a call through an approval")
    parser.add_argument("--verbose", action="store_true", help="the modules entered most often")
    args = parser.parse_args()
    static_counts()
    print()
    call_paths(args.approval, args.verbose)


if __name__ == "__main__":
    main()
