"""Start the distributed mode's processes on this host with one command: several daphne server processes
on one listening socket, Celery workers and one Celery beat, stopped together.

The command binds HOST:PORT itself and hands that socket to every daphne process (`daphne --fd`): they all
accept connections from the one queue, so the kernel spreads the connections over them. They share the
database, the channel layer and the broker, so a request may land on any of them. SIGINT and SIGTERM are
passed on to every process; when one ends on its own, the others are stopped and the command fails.
"""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from tools.calls.runtime import WORKER_OPTIONS, DistributedRuntime, runtime

ASGI_APPLICATION = "toolkeeper.asgi:application"
BACKLOG = 1024  # connections the kernel queues while every server process is busy
POLL_S = 0.2
# A worker's warm shutdown waits for the calls it runs; after this it is killed, and the reaper settles
# the calls it held.
STOP_GRACE_S = 20.0


class Command(BaseCommand):
    help = ("Run the distributed mode on this host: daphne server processes sharing one socket on "
            "--host:--port, Celery workers and one beat. Ctrl-C or SIGTERM stops them all.")

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="IPv4 address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, help="port to listen on; 0 picks a free one")
        parser.add_argument("--servers", type=int, default=2, help="daphne processes (default 2)")
        parser.add_argument("--workers", type=int, default=1, help="Celery worker processes (default 1)")
        parser.add_argument("--concurrency", type=int, default=0,
                            help="calls each worker runs at once (default: one per CPU)")
        parser.add_argument("--no-beat", action="store_true",
                            help="start no beat (a deployment runs exactly one, maybe on another host)")

    def handle(self, *args, host, port, servers, workers, concurrency, no_beat, **options):
        check_deployment(port=port, servers=servers, workers=workers, concurrency=concurrency)
        try:
            listener = socket.create_server((host, port), backlog=BACKLOG)
        except OSError as exc:
            raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        received: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: received.append(signum))
        processes: list[tuple[str, subprocess.Popen]] = []
        ended = None
        try:
            with listener:  # the server processes hold it; this one needs it no longer
                address = listener.getsockname()
                for n in range(1, servers + 1):
                    processes.append((f"server {n}", spawn(["-m", "daphne", "--fd", str(listener.fileno()),
                                                            ASGI_APPLICATION], pass_fds=(listener.fileno(),))))
            for n in range(1, workers + 1):
                pool = ["--concurrency", str(concurrency)] if concurrency else []
                processes.append((f"worker {n}", spawn(["-m", "celery", "-A", "toolkeeper", "worker", "-l", "info",
                                                        "-n", f"worker{n}@%h", *WORKER_OPTIONS, *pool])))
            if not no_beat:
                settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
                processes.append(("beat", spawn(["-m", "celery", "-A", "toolkeeper", "beat", "-l", "info",
                                                 "--schedule", str(settings.DATA_DIR / "celerybeat-schedule")])))
            self.report(f"http://{address[0]}:{address[1]}", processes)
            ended = supervise(processes, received)
        finally:
            stop_all(processes, received[0] if received else signal.SIGTERM)
        if ended is not None:
            name, process = ended
            raise CommandError(f"{name} (pid {process.pid}) exited with code {process.returncode}: "
                               "stopped the others")

    def report(self, url: str, processes) -> None:
        out = self.stdout.write
        out(f"Toolkeeper (distributed mode) listening on {url}")
        for name, process in processes:
            out(f"  {name}: pid {process.pid}")
        out("Ctrl-C or SIGTERM stops them all.")
        self.stdout.flush()


def check_deployment(*, port: int | None, servers: int, workers: int, concurrency: int) -> None:
    """Refuse what cannot work: several server processes need the distributed mode, and its processes
    reach each other only through a shared database and Redis."""
    if not isinstance(runtime(), DistributedRuntime):
        raise CommandError("serve_cluster runs the distributed mode: set TOOLKEEPER_EXECUTOR=celery. The "
                           "embedded mode runs calls inside its one server process, so it serves a database "
                           "from exactly one process (`make run`).")
    if connection.vendor != "postgresql":
        raise CommandError("the distributed mode keeps its data in PostgreSQL: set DATABASE_URL=postgres://…")
    if not settings.REDIS_URL:
        raise CommandError("the processes share waits, WebSockets and the broker through Redis: set REDIS_URL")
    if port is None:
        raise CommandError("give the port to listen on: --port 8000 (0 picks a free one)")
    if not 0 <= port <= 65535:
        raise CommandError(f"--port {port} is not a port")
    if servers < 1 or workers < 0 or concurrency < 0:
        raise CommandError("--servers must be at least 1; --workers and --concurrency not negative")


def spawn(args: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """Our interpreter running a module, with this process's settings and import path. In a session of its
    own: a terminal's Ctrl-C reaches this command only, which passes it on once."""
    root = settings.BASE_DIR
    paths = [str(root), str(root / "platform"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.Popen([sys.executable, *args], cwd=root, env=env, pass_fds=pass_fds,  # noqa: S603
                            stdin=subprocess.DEVNULL, start_new_session=True)


def supervise(processes, received: list[int]):
    """Until a signal arrives (None) or a process ends on its own ((name, process))."""
    while not received:
        for name, process in processes:
            if process.poll() is not None:
                return name, process
        time.sleep(POLL_S)
    return None


def stop_all(processes, sig: int) -> None:
    for _name, process in processes:
        if process.poll() is None:
            process.send_signal(sig)
    deadline = time.monotonic() + STOP_GRACE_S
    for _name, process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    for _name, process in processes:
        if process.poll() is None:  # still running, so its process group is still ours
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
