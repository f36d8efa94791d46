"""Run Toolkeeper as a real daphne process: fresh data dir, migrate, bootstrap, serve, stop.

Plain Python (no pytest) so that bench/ can start servers the same way the live tests do.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
DEFAULT_PG_ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"
TEMPLATE_DIR = ROOT / "var" / "test-templates"
PG_TEMPLATES_LOCK = 0x746B_7470_6C00  # the advisory lock of the PostgreSQL templates (temporary_pg_database)


def venv_executable(name: str) -> str:
    """A console script of the project's venv, or of the running interpreter's environment."""
    for candidate in (BIN / name, Path(sys.executable).parent / name):
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed (run `make install`)")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class ServerError(RuntimeError):
    pass


def migrations_digest(settings_module: str) -> str:
    """Names a database migrated with these settings and the migration files as they are now."""
    digest = hashlib.sha256(settings_module.encode())
    for path in sorted(ROOT.glob("*/migrations/*.py")) + sorted(ROOT.glob("platform/*/migrations/*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:20]


@contextlib.contextmanager
def templates_lock():
    """Parallel workers: one builds a migrated template, the others wait and copy it."""
    TEMPLATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(TEMPLATE_DIR / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@dataclass
class LiveServer:
    """A daphne process serving Toolkeeper. Use as a context manager, or call start()/stop()."""

    database_url: str = ""  # empty: embedded SQLite inside the data dir
    database_name: str = ""  # informational, for tests that inspect the database
    redis_url: str = ""  # empty: the in-process channel layer
    settings_module: str = "toolkeeper.settings"
    extra_pythonpath: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    daphne_args: list[str] = field(default_factory=list)
    asgi_app: str = "toolkeeper.asgi:application"  # what daphne serves; a test may wrap the product's application
    startup_timeout: float = 60.0
    # Another virtualenv's bin dir to run from (its python; daphne as `python -m daphne`); None: the project's.
    bin_dir: Path | None = None

    url: str = ""
    port: int = 0
    data_dir: Path | None = None
    credentials: dict = field(default_factory=dict)
    process: subprocess.Popen | None = None
    _log_file: object = None
    owns_data_dir: bool = True  # a sibling shares its first server's data dir and leaves it to that one
    migrated: bool = False  # the database is a copy of one already migrated (temporary_pg_database's migrated_for)

    # -- environment ------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DJANGO_", "TOOLKEEPER_", "PYTEST_", "PROMETHEUS_")) and k not in {
                   "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS"}}
        paths = [*self.extra_pythonpath, str(ROOT), str(ROOT / "platform")]
        env.update({
            "PYTHONPATH": os.pathsep.join(paths),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": self.settings_module,
            "TOOLKEEPER_DATA_DIR": str(self.data_dir),
            "DATABASE_URL": self.database_url or f"sqlite:///{self.data_dir / 'common.sqlite3'}",
            "REDIS_URL": self.redis_url,
            "TOOLKEEPER_EXECUTOR": "local",
            "LOG_LEVEL": "WARNING",
        })
        if self.url:
            env["TOOLKEEPER_PUBLIC_URL"] = self.url  # the links it makes (notifications, invitations) lead back to it
        env.update(self.extra_env)
        return env

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def manage(self, *args: str, timeout: float = 300) -> str:
        result = subprocess.run(
            [*self._command("python"), str(ROOT / "manage.py"), *args],
            cwd=ROOT, env=self.env(), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise ServerError(f"manage.py {' '.join(args)} failed ({result.returncode}):\n"
                              f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
        return result.stdout

    def _command(self, name: str) -> list[str]:
        if self.bin_dir is None:
            return [venv_executable(name)]
        python = str(self.bin_dir / "python")
        return [python] if name == "python" else [python, "-m", name]

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> LiveServer:
        self.data_dir = Path(tempfile.mkdtemp(prefix="tk-live-"))
        try:
            self._migrate()
            for attempt in range(3):
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
                self.manage("bootstrap", "--url", self.url)
                if self._serve():
                    break
                if attempt == 2:
                    raise ServerError(f"daphne did not start:\n{self.log_tail()}")
            self.credentials = json.loads((self.data_dir / "demo-credentials.json").read_text())
        except BaseException:
            self.stop()
            raise
        return self

    def _migrate(self) -> None:
        """An embedded server starts from a copy of a database migrated once per set of migrations: migrating
        takes seconds and most live tests start a server of their own."""
        if self.migrated:
            return
        if self.database_url or self.bin_dir is not None or self.extra_pythonpath:
            self.manage("migrate", "--noinput")
            return
        template = self._migrated_template()
        with sqlite3.connect(template) as source, sqlite3.connect(self.data_dir / "common.sqlite3") as target:
            source.backup(target)

    def _migrated_template(self) -> Path:
        template = TEMPLATE_DIR / f"{migrations_digest(self.settings_module)}.sqlite3"
        with templates_lock():
            if not template.exists():
                build_dir = Path(tempfile.mkdtemp(prefix="tk-template-"))
                try:
                    replace(self, data_dir=build_dir).manage("migrate", "--noinput")
                    os.replace(build_dir / "common.sqlite3", template)
                finally:
                    shutil.rmtree(build_dir, ignore_errors=True)
        return template

    def join(self) -> LiveServer:
        """Serve a database that another server already migrated and seeded: one more server process of the
        same deployment (its own data dir and port)."""
        self.data_dir = Path(tempfile.mkdtemp(prefix="tk-live-"))
        for _ in range(3):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            if self._serve():
                return self
        log = self.log_tail()
        self.stop()
        raise ServerError(f"daphne did not start:\n{log}")

    def _serve(self) -> bool:
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            [*self._command("daphne"), "-b", "127.0.0.1", "-p", str(self.port), *self.daphne_args,
             self.asgi_app],
            cwd=ROOT, env=self.env(), stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._kill()
                return False
            if self._answers():
                return True
            time.sleep(0.1)
        self._kill()
        return False

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/login/", timeout=2) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return True  # it answered
        except OSError:
            return False

    def _kill(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def sibling(self) -> LiveServer:
        """One more server process on this one's database and data dir, on a port of its own: what a
        deployment of several server processes behind one address looks like to each request."""
        other = replace(self, process=None, _log_file=None, credentials=dict(self.credentials), owns_data_dir=False)
        for _ in range(3):
            other.port = free_port()
            other.url = f"http://127.0.0.1:{other.port}"
            if other._serve():
                return other
        raise ServerError(f"a second daphne did not start:\n{self.log_tail()}")

    def stop(self) -> None:
        self._kill()
        if self.data_dir is not None and self.owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- convenience ------------------------------------------------------------------------
    @property
    def api_key(self) -> str:
        return self.credentials["api_key"]

    @property
    def admin_api_key(self) -> str:
        return self.credentials["admin_api_key"]

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.api_key}"}


# -- PostgreSQL: a throw-away database per server -------------------------------------------------

def pg_admin_url() -> str:
    return os.environ.get("TEST_PG_ADMIN_URL", DEFAULT_PG_ADMIN_URL)


def pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(pg_admin_url(), connect_timeout=3):
            return True
    except Exception:
        return False


def database_url_for(admin_url: str, name: str) -> str:
    base, _, _ = admin_url.rpartition("/")
    return f"{base}/{name}"


@contextlib.contextmanager
def temporary_pg_database(prefix: str = "tk_live", *, migrated_for: str | None = None):
    """Create a fresh database, yield (name, url), drop it (terminating leftover connections). With `migrated_for`
    (a settings module), the database starts as a copy of one migrated with those settings once per set of
    migration files, so its server is started with `migrated=True` and skips the migrations' seconds."""
    import psycopg
    from psycopg import sql

    name = f"{prefix}_{secrets.token_hex(6)}"
    admin_url = pg_admin_url()
    if migrated_for is None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    else:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            # One builder and one copy at a time across the cluster (every checkout's tests, every worker): a
            # template may not be copied while anyone is connected to it, its builder included.
            conn.execute("SELECT pg_advisory_lock(%s)", [PG_TEMPLATES_LOCK])
            template = _pg_migrated_template(conn, admin_url, migrated_for)
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)))
    try:
        yield name, database_url_for(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


def _pg_migrated_template(conn, admin_url: str, settings_module: str) -> str:
    """The name of a database migrated with `settings_module`, built now if this set of migration files has none
    (the templates of its other sets are dropped). `conn` is the admin connection holding PG_TEMPLATES_LOCK."""
    from psycopg import sql

    family = f"tk_template_{hashlib.sha256(settings_module.encode()).hexdigest()[:8]}_"
    template = family + migrations_digest(settings_module)
    names = [row[0] for row in conn.execute(
        "SELECT datname FROM pg_database WHERE datname LIKE %s", [family.replace("_", r"\_") + "%"])]
    if template in names:
        return template
    for stale in names:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(stale)))
    building = f"tk_building_{secrets.token_hex(6)}"
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
    build_dir = Path(tempfile.mkdtemp(prefix="tk-template-"))
    try:
        LiveServer(database_url=database_url_for(admin_url, building), settings_module=settings_module,
                   data_dir=build_dir).manage("migrate", "--noinput")
        conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
            sql.Identifier(building), sql.Identifier(template)))
    except BaseException:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(building)))
        raise
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    return template
