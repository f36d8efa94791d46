"""Migration walks in one Django process on a database of their own.

A walk takes many steps (down to a migration, up again, a look at the tables between), and each `manage.py` run
pays seconds of imports before its first statement: one process takes the steps in order instead, each as
`manage.py` would run it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Read by a fresh interpreter: the steps come as JSON on stdin, what each printed goes back as JSON after MARK.
_RUNNER = """
import contextlib, io, json, sys, traceback
sys.path[:0] = [sys.argv[1] + "/platform", sys.argv[1]]
import django
django.setup()
from django.core.management import call_command
outputs = []
for step in json.load(sys.stdin):
    out = io.StringIO()
    try:
        if step[0] == "shell":
            with contextlib.redirect_stdout(out):
                exec(step[1], {})
        else:
            call_command(*step, stdout=out)
    except BaseException:
        sys.stderr.write(f"step {step!r} failed:\\n{traceback.format_exc()}")
        sys.exit(1)
    outputs.append(out.getvalue())
print(sys.argv[2] + json.dumps(outputs))
"""
_MARK = "--- outputs ---"


def database_env(tmp_path: Path, database_url: str) -> dict[str, str]:
    """The environment of a walk on `database_url`, embedded mode, data dir in `tmp_path`."""
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "TOOLKEEPER_EXECUTOR"}}
    env.update({"DATABASE_URL": database_url, "TOOLKEEPER_DATA_DIR": str(tmp_path), "DEBUG": "1",
                "DJANGO_SETTINGS_MODULE": "toolkeeper.settings"})
    return env


def run_steps(env: dict[str, str], steps: list[list[str]]) -> list[str]:
    """Take `steps` in order in one process: `[command, *args]` runs a management command as `manage.py command
    args` would, `["shell", code]` runs Python code. Returns what each step printed; a failing step fails the
    walk with its traceback."""
    result = subprocess.run([sys.executable, "-c", _RUNNER, str(ROOT), _MARK], cwd=ROOT, env=env,
                            input=json.dumps(steps), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.rsplit(_MARK, 1)[1])
