"""The distributed mode as real processes: a private redis-server, a fresh PostgreSQL database,
daphne (TOOLKEEPER_EXECUTOR=celery), a Celery worker and Celery beat.

Plain Python (no pytest) so that bench/ starts the same stack the distributed tests use. Every
process runs in a process group of its own and is killed (the whole group) at stop(); the broker
and the worker can be stopped and started again while the stack runs.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.live.server import (
    ROOT,
    LiveServer,
    ServerError,
    free_port,
    port_open,
    temporary_pg_database,
    venv_executable,
)

WORKER_READY_TIMEOUT_S = 60.0
# A deployment's worker options (tools.calls.runtime.WORKER_OPTIONS, which test_two_servers.py compares with these:
# the stack starts without Django set up, so it keeps its own copy).
WORKER_OPTIONS = ("--without-gossip", "--without-mingle", "--without-heartbeat")


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def kill_group(process: subprocess.Popen | None, sig: int = signal.SIGKILL, wait_s: float = 10) -> None:
    """Signal the process group the process leads (it was started with start_new_session) and reap it."""
    if process is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=wait_s)


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def children_of(pid: int) -> list[int]:
    """Direct children of a process (Linux /proc)."""
    found = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(p) for p in handle.read().split()]
    return found


class RedisServer:
    """A redis-server of our own on a free port: no persistence, can be stopped and restarted."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self._log = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise ServerError("redis-server is not installed")
        self._log = open(self.workdir / f"redis-{self.port}.log", "ab")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--dir", str(self.workdir)],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"redis-server on port {self.port} exited ({self.process.returncode})")
            if port_open("127.0.0.1", self.port, timeout=0.2):
                return
            time.sleep(0.05)
        raise ServerError(f"redis-server on port {self.port} did not start")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        process, self.process = self.process, None
        kill_group(process, sig)
        if self._log is not None:
            self._log.close()
            self._log = None
        deadline = time.monotonic() + 10
        while port_open("127.0.0.1", self.port, timeout=0.2) and time.monotonic() < deadline:
            time.sleep(0.05)


class DistributedStack:
    """daphne + Celery worker + beat on PostgreSQL and a private Redis. start()/stop() or a `with`."""

    def __init__(self, *, settings_module: str = "toolkeeper.settings", extra_pythonpath: list[str] | None = None,
                 extra_env: dict[str, str] | None = None, daphne_args: list[str] | None = None,
                 worker_concurrency: int = 2, worker_args: list[str] | None = None, beat: bool = True,
                 loglevel: str = "warning"):
        self.settings_module = settings_module
        self.extra_pythonpath = list(extra_pythonpath or [])
        self.extra_env = dict(extra_env or {})
        self.daphne_args = list(daphne_args or [])
        self.worker_concurrency = worker_concurrency
        self.worker_args = list(worker_args or [])
        self.with_beat = beat
        self.loglevel = loglevel
        self.workdir: Path | None = None
        self.redis: RedisServer | None = None
        self.server: LiveServer | None = None
        self.database_name = ""
        self.database_url = ""
        self.worker: subprocess.Popen | None = None
        self.beat: subprocess.Popen | None = None
        self._logs: list = []
        self._workers_started = 0
        self._exit = contextlib.ExitStack()

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> DistributedStack:
        try:
            self.workdir = Path(tempfile.mkdtemp(prefix="tk-dist-"))
            self.redis = RedisServer(self.workdir)
            self.redis.start()
            self._exit.callback(self.redis.stop)
            # a settings module found only on extra_pythonpath migrates its own database
            self.database_name, self.database_url = self._exit.enter_context(temporary_pg_database(
                "tk_dist", migrated_for=None if self.extra_pythonpath else self.settings_module))
            self.server = self._daphne()
            self._exit.enter_context(self.server)
            self._exit.callback(self._stop_celery)
            self.start_worker()
            if self.with_beat:
                self.start_beat()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._exit.close()
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> DistributedStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _stop_celery(self) -> None:
        self.stop_beat(signal.SIGKILL)
        self.kill_worker(signal.SIGKILL)

    # -- processes --------------------------------------------------------------------------
    def _daphne(self) -> LiveServer:
        return LiveServer(
            database_url=self.database_url, database_name=self.database_name, redis_url=self.redis.url(0),
            settings_module=self.settings_module, extra_pythonpath=self.extra_pythonpath,
            extra_env={"TOOLKEEPER_EXECUTOR": "celery", **self.extra_env}, daphne_args=self.daphne_args,
            migrated=not self.extra_pythonpath,
        )

    @contextlib.contextmanager
    def another_daphne(self):
        """A second daphne process of the deployment (the same database, Redis and settings), while in the block."""
        server = self._daphne().join()
        try:
            yield server
        finally:
            server.stop()

    def env(self) -> dict[str, str]:
        return self.server.env()

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
        log = open(self.workdir / log_name, "ab")  # noqa: SIM115 (closed in stop())
        self._logs.append(log)
        return subprocess.Popen(args, cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def start_worker(self, wait: bool = True) -> subprocess.Popen:
        """`celery -A toolkeeper worker --pool prefork`; waits until its pool processes run."""
        self._workers_started += 1
        self.worker = self._spawn(
            [venv_executable("celery"), "-A", "toolkeeper", "worker", "--concurrency", str(self.worker_concurrency),
             "--pool", "prefork", "-l", self.loglevel, "-n", f"w{self._workers_started}@%h",
             *WORKER_OPTIONS, *self.worker_args],
            f"worker-{self._workers_started}.log",
        )
        if wait:
            self.wait_worker_ready()
        return self.worker

    def wait_worker_ready(self, timeout: float = WORKER_READY_TIMEOUT_S) -> None:
        """Bounded wait until the worker's main process has forked its pool (and so has loaded Django)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.worker.poll() is not None:
                raise ServerError(f"the Celery worker exited ({self.worker.returncode}):\n{self.log_tail('worker')}")
            if len(self.worker_children()) >= self.worker_concurrency:
                return
            time.sleep(0.1)
        raise ServerError(f"the Celery worker did not start:\n{self.log_tail('worker')}")

    def worker_children(self) -> list[int]:
        return children_of(self.worker.pid) if self.worker is not None else []

    def kill_worker(self, sig: int = signal.SIGKILL) -> None:
        """The whole worker: main process and pool children (its process group)."""
        process, self.worker = self.worker, None
        kill_group(process, sig, wait_s=20)

    def start_beat(self, wait: bool = True) -> subprocess.Popen:
        """`celery -A toolkeeper beat`; waits until it has loaded and opened its schedule, so that its
        start-up (a few seconds of CPU) does not overlap what a test or benchmark measures next."""
        schedule = self.workdir / "beat-schedule"
        for left in self.workdir.glob(f"{schedule.name}*"):  # a restarted beat's old files must not end the wait
            left.unlink()
        self.beat = self._spawn(
            [venv_executable("celery"), "-A", "toolkeeper", "beat", "-l", self.loglevel, "-s", str(schedule)],
            "beat.log",
        )
        if wait:
            deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
            while not any(self.workdir.glob(f"{schedule.name}*")):
                if self.beat.poll() is not None or time.monotonic() > deadline:
                    raise ServerError(f"Celery beat did not start:\n{self.log_tail('beat')}")
                time.sleep(0.1)
        return self.beat

    def stop_beat(self, sig: int = signal.SIGTERM) -> None:
        process, self.beat = self.beat, None
        kill_group(process, sig)

    def restart_daphne(self) -> None:
        """Stop daphne and serve again on the same port and data dir (fresh connections to everything)."""
        self.server._kill()
        if not self.server._serve():
            raise ServerError(f"daphne did not come back:\n{self.server.log_tail()}")

    def restart_all(self) -> None:
        """Fresh worker, beat and daphne processes: no connection survives from before."""
        self.stop_beat(signal.SIGKILL)
        self.kill_worker(signal.SIGKILL)
        self.restart_daphne()
        self.start_worker()
        if self.with_beat:
            self.start_beat()

    # -- introspection ----------------------------------------------------------------------
    def log_tail(self, which: str = "all", chars: int = 6000) -> str:
        parts = []
        if self.workdir is not None:
            for path in sorted(self.workdir.glob("*.log")):
                if which == "all" or path.name.startswith(which):
                    parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-chars:]}")
        if self.server is not None and which in ("all", "server"):
            parts.append(f"--- daphne ---\n{self.server.log_tail(chars)}")
        return "\n".join(parts)

    def manage(self, *args: str, timeout: float = 120) -> str:
        return self.server.manage(*args, timeout=timeout)

    def shell(self, code: str, timeout: float = 120) -> dict:
        """Run Python in `manage.py shell -c`; the code prints one JSON line last, which is returned."""
        out = self.manage("shell", "-c", code, timeout=timeout)
        return json.loads(out.strip().splitlines()[-1])

    def sql(self, query: str, params: list | tuple = ()) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []
