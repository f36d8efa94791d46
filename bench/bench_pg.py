"""A PostgreSQL cluster of the benchmark's own, so that all of its CPU is the measured stack's.

The machine's PostgreSQL serves other work too (tests, other benchmarks), and the server process opens a
connection per request (CONN_MAX_AGE 0): a backend that ends inside a measuring window takes its CPU with
it, and the cluster's shared processes work for every database. A private cluster (initdb into a temporary
directory, default settings, trust on a free port) has only the stack's backends; the CPU of the ones that
ended is in the postmaster's cutime/cstime, which `bench_http.cpu_by_process(…, reaped=True)` reads.

    with PrivatePostgres() as pg:
        env = {"TEST_PG_ADMIN_URL": pg.admin_url}   # tests/live/server.py's temporary_pg_database uses it
        pids = pg.pids()                            # the postmaster and its children
"""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

from bench_http import process_tree


def postgres_bin() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError("PostgreSQL's initdb is not installed")
    return os.path.dirname(initdb)


class PrivatePostgres:
    """initdb + postgres on a free port of 127.0.0.1, as the `postgres` user when run as root."""

    def __init__(self, port: int | None = None):
        from mcp_proxy import free_port

        self.port = port or free_port()
        self.dir = ""
        self.process: subprocess.Popen | None = None
        self.bin = postgres_bin()

    @property
    def admin_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _run_as(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        return ["runuser", "-u", "postgres", "--"]

    def _chown(self, path: str) -> None:
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(path, user.pw_uid, user.pw_gid)

    def start(self) -> PrivatePostgres:
        self.dir = tempfile.mkdtemp(prefix="tk-bench-pg-")
        self._chown(self.dir)
        data = os.path.join(self.dir, "data")
        subprocess.run([*self._run_as(), f"{self.bin}/initdb", "-D", data, "-U", "postgres", "-A", "trust",
                        "--no-sync", "-E", "UTF8"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.process = subprocess.Popen(
            [*self._run_as(), f"{self.bin}/postgres", "-D", data, "-p", str(self.port), "-k", self.dir,
             "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=300"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, "log"), "ab"),  # noqa: SIM115
            start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = subprocess.run([f"{self.bin}/pg_isready", "-h", "127.0.0.1", "-p", str(self.port)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if ready.returncode == 0:
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("the private PostgreSQL did not start")

    def postmaster(self) -> int | None:
        """The postmaster's pid (under runuser, the child of the process started here)."""
        if self.process is None:
            return None
        for pid in process_tree(self.process.pid):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as handle:
                if handle.read().strip() == "postgres":
                    return pid
        return None

    def pids(self) -> list[int]:
        postmaster = self.postmaster()
        return process_tree(postmaster) if postmaster else []

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)  # fast shutdown
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    def __enter__(self) -> PrivatePostgres:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
