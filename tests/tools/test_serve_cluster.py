"""`manage.py serve_cluster` refuses, in one line and without starting anything, what cannot work: several
server processes outside the distributed mode, the distributed mode without PostgreSQL or Redis, no port,
a port that is taken. (tests/distributed/test_two_servers.py runs it.)"""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POSTGRES = "postgres://postgres@127.0.0.1:5432/toolkeeper_unused"
REDIS = "redis://127.0.0.1:6379/0"
DISTRIBUTED = {"TOOLKEEPER_EXECUTOR": "celery", "DATABASE_URL": POSTGRES, "REDIS_URL": REDIS}


def serve_cluster(tmp_path, env: dict, *args: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TOOLKEEPER_")) and k not in {
        "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"}}
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), "serve_cluster", *args], cwd=ROOT,
                          env={**clean, "TOOLKEEPER_DATA_DIR": str(tmp_path), **env}, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("env", "args", "refusal"), [
    ({}, ["--servers", "2", "--port", "0"], "serve_cluster runs the distributed mode: set TOOLKEEPER_EXECUTOR=celery"),
    ({"TOOLKEEPER_EXECUTOR": "celery", "REDIS_URL": REDIS}, ["--port", "0"],
     "the distributed mode keeps its data in PostgreSQL: set DATABASE_URL"),
    ({"TOOLKEEPER_EXECUTOR": "celery", "DATABASE_URL": POSTGRES, "CELERY_BROKER_URL": REDIS}, ["--port", "0"],
     "the processes share waits, WebSockets and the broker through Redis: set REDIS_URL"),
    (DISTRIBUTED, [], "give the port to listen on: --port"),
    (DISTRIBUTED, ["--port", "0", "--servers", "0"], "--servers must be at least 1"),
])
def test_what_cannot_work_is_refused_in_one_line(tmp_path, env, args, refusal):
    result = serve_cluster(tmp_path, env, *args)
    assert result.returncode == 1
    assert f"CommandError: {refusal}" in result.stderr
    assert "Traceback" not in result.stderr
    assert "listening on" not in result.stdout


def test_a_taken_port_is_refused(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = serve_cluster(tmp_path, DISTRIBUTED, "--port", str(port))
    assert result.returncode == 1
    assert f"CommandError: cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "Traceback" not in result.stderr
