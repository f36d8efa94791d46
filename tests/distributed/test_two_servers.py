"""Two server processes of one deployment (one database, one Redis, one broker): whichever process a
request lands on, calls, waits, WebSocket streams and the approval inbox behave as with one process.

`A` is the stack's daphne, `B` a second daphne of the same deployment. The last two tests start a
deployment's processes with one command (`manage.py serve_cluster`): two daphne processes on one listening
socket, a Celery worker and beat, stopped together.
"""
import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.distributed.stack import WORKER_OPTIONS as STACK_WORKER_OPTIONS
from tests.distributed.stack import children_of
from tests.distributed.support import Api, console_login, is_terminal, progress, statuses, ws_collect, ws_connect
from tests.live.server import ROOT, venv_executable
from tools.calls.runtime import WORKER_OPTIONS

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]

COUNTDOWN_S = 3


@pytest.fixture(scope="module")
def second(deployment):
    """Server B: another daphne process on the deployment's database and Redis."""
    with deployment.stack.another_daphne() as server:
        yield server


@pytest.fixture
def on_a(deployment):
    with Api(deployment.url, deployment.a.api_key) as api:
        yield api


@pytest.fixture
def on_b(deployment, second):
    with Api(second.url, deployment.a.api_key) as api:
        yield api


def test_a_wait_on_either_server_hears_the_worker_settle_the_call(on_a, on_b):
    session = on_b.new_session("two-servers-bot")
    # Submitted and waited for on A, the session made on B: the worker's result reaches the waiting request.
    waited = on_a.submit(session, "countdown", {"seconds": 1}, wait=60)
    assert waited["status"] == "succeeded", waited
    assert waited["result"]["content"][0]["text"] == "counted down 1 seconds"

    # Submitted on A without waiting, then read and waited for on B.
    submitted = on_a.submit(session, "countdown", {"seconds": COUNTDOWN_S})
    assert submitted["status"] in {"queued", "running"}, submitted
    assert on_b.call(submitted["id"])["id"] == submitted["id"]
    response = on_b.http.get(f"/api/v1/calls/{submitted['id']}", params={"wait": 60})
    assert response.status_code == 200, response.text
    call = response.json()
    assert call["status"] == "succeeded", call
    assert call["result"]["content"][0]["text"] == f"counted down {COUNTDOWN_S} seconds"


def test_a_socket_on_one_server_streams_a_call_submitted_on_the_other(deployment, second, on_a, on_b):
    session = on_a.new_session("two-servers-stream-bot")
    url = f"{second.url.replace('http://', 'ws://', 1)}/ws/api/sessions/{session}/?after=0"

    async def scenario():
        # Connected to B before the call exists; `after=0` covers the moment between accept and joining the group.
        socket_b = await ws_connect(url, headers={"Authorization": f"Bearer {deployment.a.api_key}"})
        call = await asyncio.to_thread(on_a.submit, session, "countdown", {"seconds": COUNTDOWN_S})
        seen = await ws_collect(socket_b, lambda m: m and is_terminal(m[-1]), 60, call=call["id"])
        await socket_b.close()
        return call["id"], seen

    call_id, seen = asyncio.run(scenario())
    stored = on_b.events(call_id)
    assert statuses(stored) == ["queued", "running", "succeeded"]
    assert len(progress(stored)) == COUNTDOWN_S + 1
    assert [(m["seq"], m["kind"], m["data"]) for m in seen] == [(e["seq"], e["kind"], e["data"]) for e in stored]


def test_an_approval_asked_on_one_server_is_listed_and_decided_once_on_the_other(deployment, second, on_a):
    """support-bot's slow_write asks (the demo tenant's rule). Asked on A, it shows in B's inbox stream and
    list; approved on B, the request waiting on A gets the result; a second decision, on A, answers 409."""
    tenant = deployment.a
    session = on_a.new_session("support-bot")
    cookie = console_login(second.url, tenant.username, tenant.password)
    inbox_url = f"{second.url.replace('http://', 'ws://', 1)}/ws/console/{tenant.slug}/inbox/"

    def of_call(call_id, change):
        return lambda messages: any(m["call"] == call_id and m["change"] == change for m in messages)

    async def scenario():
        inbox_b = await ws_connect(inbox_url, headers={"Cookie": cookie, "Origin": second.url})
        asked = await asyncio.to_thread(on_a.submit, session, "slow_write", {"text": "exactly once", "seconds": 1})
        assert asked["status"] == "awaiting_approval", asked
        await ws_collect(inbox_b, of_call(asked["id"], "opened"), 30)

        waiting_on_a = asyncio.create_task(asyncio.to_thread(
            on_a.http.get, f"/api/v1/calls/{asked['id']}", params={"wait": 60}))
        await asyncio.sleep(1)  # precondition, not a measurement: A's request is waiting by now
        assert not waiting_on_a.done()
        with Api(second.url, tenant.admin_key) as admin_b, Api(deployment.url, tenant.admin_key) as admin_a:
            listed = await asyncio.to_thread(admin_b.http.get, "/api/v1/approvals", params={"limit": 500})
            approval = asked["approval"]["id"]
            decided = await asyncio.to_thread(admin_b.http.post, f"/api/v1/approvals/{approval}/decide",
                                              json={"decision": "approve", "message": "decided on B"})
            again = await asyncio.to_thread(admin_a.http.post, f"/api/v1/approvals/{approval}/decide",
                                            json={"decision": "approve", "message": "decided on A too"})
        released = await asyncio.wait_for(waiting_on_a, 90)
        await ws_collect(inbox_b, of_call(asked["id"], "approved"), 30)
        await inbox_b.close()
        return asked, listed, decided, again, released

    asked, listed, decided, again, released = asyncio.run(scenario())
    assert listed.status_code == 200, listed.text
    assert asked["approval"]["id"] in [r["id"] for r in listed.json()["results"]]
    assert decided.status_code == 200, decided.text
    assert decided.json()["status"] == "approved"
    assert again.status_code == 409, again.text
    assert again.json()["error"]["code"] == "conflict"

    assert released.status_code == 200, released.text
    call = released.json()
    assert call["status"] == "succeeded", call
    # The write ran once: the session's notes hold one note, and the call ran once with one vote.
    assert call["result"]["structured"] == {"notes": 1, "appended": "exactly once"}
    assert statuses(on_a.events(asked["id"])).count("running") == 1
    assert [vote["decision"] for vote in call["approval"]["votes"]] == ["approve"]


# -- one command ------------------------------------------------------------------------------------

def _listening_inode(port: int) -> str:
    """The inode of the IPv4 socket listening on `port` (Linux /proc/net/tcp)."""
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
            return fields[9]
    raise AssertionError(f"nothing listens on port {port}")


def _server_side_inode(port: int, client_port: int) -> str | None:
    """The inode of the server's end of the connection from `client_port` to `port`."""
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        local, remote = fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]
        if int(local, 16) == port and int(remote, 16) == client_port:
            return fields[9]
    return None


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    return inodes


def _serving_pid(port: int, pids: list[int]) -> int | None:
    """Make one request on a new connection; the pid of the server process that accepted it."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(b"GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert conn.recv(12).startswith(b"HTTP/1.1"), "no HTTP answer"
        inode = _server_side_inode(port, conn.getsockname()[1])
        return next((pid for pid in pids if inode in _socket_inodes(pid)), None)


def _descendants(pid: int) -> list[int]:
    found = []
    for child in children_of(pid):
        found += [child, *_descendants(child)]
    return found


def _ended(pid: int) -> bool:
    """Gone, or a zombie (ended; its reaper has not looked yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")


def _read_until(path: Path, pattern: str, process: subprocess.Popen, timeout: float = 60) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text(errors="replace"))
        if found:
            return found
        assert process.poll() is None, f"the command exited ({process.returncode}):\n{path.read_text()[-4000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no {pattern!r} in the command's output:\n{path.read_text()[-4000:]}")


@contextlib.contextmanager
def cluster(deployment, output: Path, *args: str):
    """`manage.py serve_cluster` on the stack's database, with a Redis database of its own (so its worker
    alone takes the calls its servers send); its output goes to `output`. Yields the command's process."""
    stack = deployment.stack
    env = {**stack.env(), "REDIS_URL": stack.redis.url(1)}
    with output.open("wb") as log:
        command = subprocess.Popen(
            [venv_executable("python"), str(ROOT / "manage.py"), "serve_cluster", "--host", "127.0.0.1",
             "--port", "0", *args],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _read_until(output, r"SIGTERM stops them all", command)  # the last line of what it started
        yield command
    finally:
        if command.poll() is None:
            for pid in children_of(command.pid):  # each leads a process group of its own
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            command.kill()
            command.wait(timeout=30)


def printed_pids(output: Path) -> dict[str, int]:
    return {name: int(pid) for name, pid in re.findall(r"^  (server \d|worker \d|beat): pid (\d+)$",
                                                         output.read_text(), re.M)}


def test_one_command_starts_two_servers_on_one_socket_a_worker_and_beat_and_stops_them(deployment, tmp_path):
    output = tmp_path / "cluster.log"
    with cluster(deployment, output, "--servers", "2", "--concurrency", "1") as command:
        url = re.search(r"listening on (http://127\.0\.0\.1:\d+)", output.read_text()).group(1)
        port = int(url.rsplit(":", 1)[1])
        printed = printed_pids(output)
        assert sorted(printed) == ["beat", "server 1", "server 2", "worker 1"]
        assert sorted(printed.values()) == sorted(children_of(command.pid))
        servers = [printed["server 1"], printed["server 2"]]
        assert all("daphne --fd" in _cmdline(pid) for pid in servers)
        assert "worker" in _cmdline(printed["worker 1"]) and "beat" in _cmdline(printed["beat"])
        # Workers start as this stack starts them: without the parts that can leave one idle after Redis restarts.
        assert all(option in _cmdline(printed["worker 1"]) for option in WORKER_OPTIONS)
        assert set(WORKER_OPTIONS) == set(STACK_WORKER_OPTIONS)

        with urllib.request.urlopen(f"{url}/login/", timeout=60) as response:  # answered once a server runs
            assert response.status == 200
        # Both servers hold the one listening socket; the command passed it on and kept no copy.
        listening = _listening_inode(port)
        assert all(listening in _socket_inodes(pid) for pid in servers)
        assert listening not in _socket_inodes(command.pid)
        # New connections reach both (a bounded wait: the second server may still be loading).
        served_by: set[int] = set()
        deadline = time.monotonic() + 60
        while served_by != set(servers) and time.monotonic() < deadline:
            served_by.add(_serving_pid(port, servers))
        assert served_by == set(servers)

        with Api(url, deployment.a.api_key) as api:
            session = api.new_session("cluster-bot")
            call = api.submit(session, "countdown", {"seconds": 1}, wait=60)
        assert call["status"] == "succeeded", call

        everything = _descendants(command.pid)
        command.send_signal(signal.SIGTERM)
        assert command.wait(timeout=60) == 0, output.read_text()[-4000:]
        _assert_all_ended(everything)


def test_when_one_process_ends_the_command_stops_the_others_and_fails(deployment, tmp_path):
    output = tmp_path / "cluster.log"
    with cluster(deployment, output, "--servers", "2", "--workers", "0", "--no-beat") as command:
        printed = printed_pids(output)
        assert sorted(printed) == ["server 1", "server 2"]
        everything = _descendants(command.pid)
        os.kill(printed["server 1"], signal.SIGKILL)
        assert command.wait(timeout=60) == 1
        _assert_all_ended(everything)
    assert f"CommandError: server 1 (pid {printed['server 1']}) exited with code -9: stopped the others" \
        in output.read_text()


def _assert_all_ended(pids: list[int]) -> None:
    """Bounded wait: helper processes notice that their parent is gone."""
    deadline = time.monotonic() + 30
    while not all(_ended(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [pid for pid in pids if not _ended(pid)] == []
