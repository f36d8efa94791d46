"""Helper processes of a server process: our own interpreter and code, started with one end of a socket pair.

A child runs `main_code` (Python source naming our own module's entry point) with the socket's file
descriptor and this process's pid as its arguments, the same settings module and import path, and `env`
added to this process's environment. Messages both ways are JSON objects, one per frame; the first a
child sends says it is ready. Nothing a tenant or a model sends reaches the command line.
"""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection

from django.conf import settings

READY_TIMEOUT_S = 120.0


class ChildGone(Exception):
    """The child process ended (killed, or it crashed) before it answered."""


class ChildProcess:
    def __init__(self, process: subprocess.Popen, conn: Connection):
        self.process = process
        self.conn = conn
        self.killed = False
        self.ready = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return not self.killed and self.process.poll() is None

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        if self.ready:
            return
        if not self.conn.poll(timeout_s):
            self.kill()
            raise ChildGone("the helper process did not start in time")
        if self.recv().get("ready") is not True:
            raise ChildGone("the helper process did not start")
        self.ready = True

    def send(self, message: dict) -> None:
        try:
            self.conn.send_bytes(json.dumps(message).encode())
        except OSError as exc:
            raise ChildGone(str(exc)) from exc

    def recv(self) -> dict:
        try:
            return json.loads(self.conn.recv_bytes())
        except (EOFError, OSError) as exc:
            raise ChildGone(str(exc)) from exc

    def kill(self) -> None:
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        self.conn.close()
        self.process.wait()


def start_child(main_code: str, *, env: dict[str, str]) -> ChildProcess:
    ours, theirs = socket.socketpair()
    child_env = dict(os.environ)
    # Under override_settings (a test's) the module is not named; the environment's is the same one.
    module = settings.SETTINGS_MODULE or os.environ.get("DJANGO_SETTINGS_MODULE")
    if module:
        child_env["DJANGO_SETTINGS_MODULE"] = module
    child_env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path and os.path.isdir(path))
    child_env.update(env)
    with theirs:
        process = subprocess.Popen(  # noqa: S603 (our interpreter and our own entry point)
            [sys.executable, "-c", main_code, str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()], env=child_env, stdin=subprocess.DEVNULL,
        )
    return ChildProcess(process, Connection(ours.detach()))


class ChildSide:
    """The child's end: JSON frames on the socket it was given."""

    def __init__(self, fd: int):
        self.conn = Connection(fd)

    def send(self, message: dict) -> None:
        self.conn.send_bytes(json.dumps(message).encode())

    def recv(self) -> dict | None:
        """The next message, or None once the parent is gone."""
        try:
            return json.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            return None
