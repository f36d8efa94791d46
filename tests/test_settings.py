"""Settings come from the environment; production refuses the development secret."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECRETS_KEY = "kJ0zvNL1GRvHnbR0EpwQX5kHRDEk8ET4H8DUlpGvZ2k="  # a Fernet key of this test only

PROBE = (
    "import json, sys; sys.path[:0] = ['platform', '.'];"
    "from toolkeeper import settings as s;"
    "print(json.dumps({'engine': s.DATABASES['default']['ENGINE'], 'debug': s.DEBUG,"
    " 'layer': s.CHANNEL_LAYERS['default']['BACKEND'], 'hosts': s.ALLOWED_HOSTS,"
    " 'data_dir': str(s.DATA_DIR), 'executor': s.TOOLKEEPER_EXECUTOR}))"
)


def load_settings(tmp_path, **env):
    clean = {k: v for k, v in os.environ.items()
             if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY", "TOOLKEEPER_EXECUTOR",
                          "TOOLKEEPER_SECRETS_KEY", "TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS"}}
    clean.update({"TOOLKEEPER_DATA_DIR": str(tmp_path / "data"), **env})
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=clean, capture_output=True, text=True)


def test_embedded_default_needs_no_configuration(tmp_path):
    result = load_settings(tmp_path)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded["engine"] == "common.sqlite3"  # SQLite with an in-process writer queue
    assert loaded["layer"] == "realtime.layers.InProcessChannelLayer"
    assert loaded["executor"] == "local"
    assert loaded["data_dir"] == str(tmp_path / "data")
    assert (tmp_path / "data").is_dir()
    assert loaded["debug"] is False  # friendly error pages, not Django's debug pages


def test_a_developer_asks_for_the_debug_pages(tmp_path):
    result = load_settings(tmp_path, DEBUG="1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["debug"] is True
    assert (tmp_path / "data" / "development-secrets.key").exists()  # still a development deployment


def test_distributed_services_come_from_the_environment(tmp_path):
    result = load_settings(tmp_path, DATABASE_URL="postgres://u@db.example:5432/tk", REDIS_URL="redis://r:6379/0",
                           ALLOWED_HOSTS="tk.example.com,api.example.com")
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded["engine"] == "django.db.backends.postgresql"
    assert loaded["layer"] == "realtime.layers.BatchedRedisChannelLayer"
    assert loaded["hosts"] == ["tk.example.com", "api.example.com"]


def test_production_refuses_the_development_secret(tmp_path):
    refused = load_settings(tmp_path, DEBUG="0")
    assert refused.returncode != 0
    assert "SECRET_KEY must be set" in refused.stderr
    started = load_settings(tmp_path, DEBUG="0", SECRET_KEY="a-real-secret-of-this-deployment",
                            TOOLKEEPER_SECRETS_KEY=SECRETS_KEY)
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["debug"] is False


def test_production_refuses_to_start_without_a_secrets_key(tmp_path):
    refused = load_settings(tmp_path, DEBUG="0", SECRET_KEY="a-real-secret-of-this-deployment")
    assert refused.returncode != 0
    assert "TOOLKEEPER_SECRETS_KEY must be set when DEBUG is off" in refused.stderr
    assert not (tmp_path / "data" / "development-secrets.key").exists()


def test_development_makes_its_secrets_key_once_and_says_so(tmp_path):
    first = load_settings(tmp_path)
    assert first.returncode == 0, first.stderr
    key_file = tmp_path / "data" / "development-secrets.key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    warnings = [line for line in first.stderr.splitlines() if "TOOLKEEPER_SECRETS_KEY is not set" in line]
    assert len(warnings) == 1 and str(key_file) in warnings[0]
    key = key_file.read_text()
    assert key.strip() not in first.stderr + first.stdout
    assert load_settings(tmp_path).returncode == 0 and key_file.read_text() == key


def test_unknown_executor_is_refused(tmp_path):
    result = load_settings(tmp_path, TOOLKEEPER_EXECUTOR="threads-on-mars")
    assert result.returncode != 0
    assert "TOOLKEEPER_EXECUTOR must be one of" in result.stderr


def test_upstream_arguments_are_never_logged_even_at_debug(tmp_path):
    """The MCP SDK logs what it sends at DEBUG (bound arguments too); LOG_LEVEL=DEBUG must not reach it."""
    probe = ("import logging, logging.config, sys; sys.path[:0] = ['platform', '.'];"
             "from toolkeeper import settings as s; logging.config.dictConfig(s.LOGGING);"
             "print(logging.getLogger('mcp.client.session').getEffectiveLevel(),"
             " logging.getLogger('toolkeeper').getEffectiveLevel())")
    env = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY"}}
    env.update({"TOOLKEEPER_DATA_DIR": str(tmp_path / "data"), "LOG_LEVEL": "DEBUG"})
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["20", "10"]  # mcp at INFO; our own loggers follow LOG_LEVEL


def test_a_tool_process_starts_without_the_mcp_client(tmp_path):
    """Processes of `isolation="process"` tools run Python tools only: they skip the MCP SDK's slow import."""
    probe = ("import os, sys; sys.path[:0] = ['platform', '.'];"
             "os.environ['DJANGO_SETTINGS_MODULE'] = 'toolkeeper.settings';"
             "import django; django.setup(); from tools.catalog.registry import source_for;"
             "print('mcp' in sys.modules, source_for('mcp') is not None)")
    env = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"}}
    env["TOOLKEEPER_DATA_DIR"] = str(tmp_path / "data")
    seen = {}
    for flag in ("1", ""):
        result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, "TOOLKEEPER_TOOL_PROCESS": flag},
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        seen[flag] = result.stdout.split()
    assert seen == {"1": ["False", "False"], "": ["True", "True"]}
