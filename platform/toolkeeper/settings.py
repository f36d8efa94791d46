"""Toolkeeper settings. Everything that differs between deployments comes from the environment.

Embedded default (no variables set): SQLite under TOOLKEEPER_DATA_DIR, the in-process channel
layer and the local thread-pool executor. Distributed: DATABASE_URL (PostgreSQL), REDIS_URL,
TOOLKEEPER_EXECUTOR=celery.
"""
import base64
import binascii
import contextlib
import json
import logging
import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from common.command_env import env_name_refusal

BASE_DIR = Path(__file__).resolve().parent.parent.parent  # the repository root


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


DEV_SECRET_KEY = "toolkeeper-dev-secret-do-not-use-in-production"
# `DEBUG=0` marks a production deployment: it refuses the development secrets (here and below). Django's
# debug pages (a traceback on a 500, every URL on a 404) are for a developer who asks with `DEBUG=1`; left
# unset, a development deployment (`make run`) serves the friendly error pages too.
DEVELOPMENT = env_bool("DEBUG", True)
DEBUG = env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY") or DEV_SECRET_KEY
if not DEVELOPMENT and SECRET_KEY == DEV_SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set to a secret value when DEBUG is off.")

ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]

DATA_DIR = Path(os.environ.get("TOOLKEEPER_DATA_DIR") or BASE_DIR / "var")
DATA_DIR.mkdir(parents=True, exist_ok=True)

DEV_SECRETS_KEY_FILE = "development-secrets.key"


def development_secrets_key(path: Path) -> str:
    """The key in `path`, created there (readable by this user only) if there is none yet. Processes
    starting together agree: the key is written aside and linked into place, never over another."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(base64.urlsafe_b64encode(os.urandom(32)).decode() + "\n")
        with contextlib.suppress(FileExistsError):  # another process was first: its key is the key
            os.link(draft, path)
    finally:
        draft.unlink()
    return path.read_text().strip()


def secrets_keys(value: str, *, debug: bool, data_dir: Path) -> list[str]:
    """The keys of the credentials stored encrypted (common.secrets), from TOOLKEEPER_SECRETS_KEY:
    comma-separated Fernet keys, the first encrypts and all decrypt (rotation). Unset, a development
    process uses a key generated once into the data dir; a production one (DEBUG off) refuses to start.
    It is never derived from SECRET_KEY: rotating one must not make the other unreadable."""
    keys = [k.strip() for k in value.split(",") if k.strip()]
    if not keys:
        if not debug:
            raise ImproperlyConfigured(
                "TOOLKEEPER_SECRETS_KEY must be set when DEBUG is off (stored credentials are encrypted with it); make "
                "one with: python -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())'")
        path = data_dir / DEV_SECRETS_KEY_FILE
        keys = [development_secrets_key(path)]
        logging.getLogger("toolkeeper.settings").warning(
            "TOOLKEEPER_SECRETS_KEY is not set: stored credentials are encrypted with the development key in %s", path)
    for position, key in enumerate(keys, 1):
        try:
            valid = len(base64.urlsafe_b64decode(key.encode("ascii"))) == 32
        except (binascii.Error, UnicodeError, ValueError):
            valid = False
        if not valid:
            raise ImproperlyConfigured(f"TOOLKEEPER_SECRETS_KEY: key {position} of {len(keys)} is not a Fernet key "
                                       "(32 bytes in URL-safe base64, 44 characters)")
    return keys


TOOLKEEPER_SECRETS_KEYS = secrets_keys(os.environ.get("TOOLKEEPER_SECRETS_KEY", ""), debug=DEVELOPMENT,
                                       data_dir=DATA_DIR)


def mcp_stdio_servers(value: str) -> dict:
    """The stdio MCP servers tenants may pick (tools.upstream.client), from TOOLKEEPER_MCP_STDIO_SERVERS: a JSON
    object, or the path of a file holding one: {"name": {"command": "...", "args": [...], "env": {...},
    "tenant_env": ["NAMES", "a tenant may set"]}}. A tenant names an entry; it never gives a command."""
    value = value.strip()
    if not value:
        return {}
    try:
        text = value if value.startswith("{") else Path(value).read_text()
        servers = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ImproperlyConfigured(f"TOOLKEEPER_MCP_STDIO_SERVERS: not a JSON object nor a file holding one ({exc})") \
            from None
    if not isinstance(servers, dict):
        raise ImproperlyConfigured("TOOLKEEPER_MCP_STDIO_SERVERS: a JSON object of name → {command, args, env, "
                                   "tenant_env}")
    for name, entry in servers.items():
        tenant_env = entry.get("tenant_env", []) if isinstance(entry, dict) else []
        if not isinstance(tenant_env, list):
            raise ImproperlyConfigured(f"TOOLKEEPER_MCP_STDIO_SERVERS[{name!r}]: tenant_env lists names")
        for variable in tenant_env:
            # the names a tenant may set are allowed, never filtered later: a refused one stops the start
            if refusal := env_name_refusal(variable):
                raise ImproperlyConfigured(f"TOOLKEEPER_MCP_STDIO_SERVERS[{name!r}]: tenant_env: {refusal}")
    return servers

# Set by tools.python.isolation in the processes it starts for `isolation="process"` tools.
TOOLKEEPER_TOOL_PROCESS = os.environ.get("TOOLKEEPER_TOOL_PROCESS") == "1"
INSTALLED_APPS = [
    "daphne",
    # A tool process (tools.python.isolation) runs Python tools only and must start fast: no admin modules to
    # discover (they load the MCP client, whose SDK alone takes seconds to import).
    "django.contrib.admin.apps.SimpleAdminConfig" if TOOLKEEPER_TOOL_PROCESS else "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "tenancy",
    "audit",
    "realtime",
    "tools",
    "approvals",
    "knowledge",
    "skills",
    "console",
]

MIDDLEWARE = [
    "common.middleware.ApiErrorMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "common.csp.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "tenancy.people.zones.TimeZoneMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
# Requests that present an API key (toolkeeper.handlers): no cookies, so no session, CSRF, auth or
# messages layer; Django's security, common and X-Frame-Options hooks run on the event loop.
API_KEY_MIDDLEWARE = [
    "common.middleware.ApiErrorMiddleware",
    "common.middleware.SecurityHeadersMiddleware",
    "common.middleware.CommonRequestMiddleware",
    "common.middleware.FrameOptionsMiddleware",
]
# Long-lived threads (each with its database connection) that API-key requests borrow.
TOOLKEEPER_API_THREADS = int(os.environ.get("TOOLKEEPER_API_THREADS", 16))

ROOT_URLCONF = "toolkeeper.urls"
ASGI_APPLICATION = "toolkeeper.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.navigation",
            ],
        },
    },
]


def database_from_url(url: str) -> dict:
    config = dj_database_url.parse(url, conn_max_age=0)
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["ENGINE"] = "common.sqlite3"
        config["OPTIONS"] = {
            # IMMEDIATE: writers queue on the lock up front instead of failing to upgrade it.
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    return config


DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'common.sqlite3'}"
DATABASES = {"default": database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from redis.retry import Retry

    CHANNEL_LAYERS = {
        "default": {
            # channels_redis, reading each server process's messages in batches (realtime.layers).
            "BACKEND": "realtime.layers.BatchedRedisChannelLayer",
            "CONFIG": {"hosts": [{
                "address": REDIS_URL,
                # No socket timeout: a receive blocks for up to 5 s by design, and redis-py's own
                # default of 5 s would turn every quiet wait into an error.
                "socket_timeout": None,
                # After a Redis restart, pooled connections are dead: retry on a fresh one.
                "retry": Retry(ExponentialBackoff(cap=0.5, base=0.05), 3),
                "retry_on_error": [RedisConnectionError, RedisTimeoutError],
                "health_check_interval": 5,
            }]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "realtime.layers.InProcessChannelLayer"}}

# The rate limits' counters (tenancy.entry.limits): shared by every server process through Redis in the
# distributed mode, in-process otherwise. Short timeouts: a slow Redis must not hold requests up.
if REDIS_URL:
    CACHES = {"default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "toolkeeper",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    }}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
AUTHENTICATION_BACKENDS = ["tenancy.signin.backends.AccountBackend"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "console:home"
LOGOUT_REDIRECT_URL = "login"

# Single sign-on (tenancy.signin, docs/identity.md): OpenID Connect's authorization code flow with PKCE, on when an
# issuer is set. The provider's URLs are the platform admin's configuration, like the database's.
TOOLKEEPER_OIDC_ISSUER = os.environ.get("TOOLKEEPER_OIDC_ISSUER", "").strip().rstrip("/")
TOOLKEEPER_OIDC_CLIENT_ID = os.environ.get("TOOLKEEPER_OIDC_CLIENT_ID", "").strip()
TOOLKEEPER_OIDC_CLIENT_SECRET = os.environ.get("TOOLKEEPER_OIDC_CLIENT_SECRET", "")
TOOLKEEPER_OIDC_NAME = os.environ.get("TOOLKEEPER_OIDC_NAME", "").strip() or "your identity provider"
TOOLKEEPER_OIDC_SCOPES = os.environ.get("TOOLKEEPER_OIDC_SCOPES", "").strip() or "openid email profile"
# Only people whose verified email address is at one of these domains may sign in; empty: any domain.
TOOLKEEPER_OIDC_ALLOWED_DOMAINS = [
    d.strip().lower().lstrip("@") for d in os.environ.get("TOOLKEEPER_OIDC_ALLOWED_DOMAINS", "").split(",") if d.strip()
]
# A claim whose values grant memberships: "<prefix><tenant>:<role>", for example "toolkeeper:acme:reviewer".
TOOLKEEPER_OIDC_ROLES_CLAIM = os.environ.get("TOOLKEEPER_OIDC_ROLES_CLAIM", "").strip()
TOOLKEEPER_OIDC_ROLE_PREFIX = os.environ.get("TOOLKEEPER_OIDC_ROLE_PREFIX", "toolkeeper:")
# The client ids (at the provider) of the apps whose end users' ID tokens verify a session's user; empty: the console's.
TOOLKEEPER_OIDC_ID_TOKEN_AUDIENCES = [
    a.strip() for a in os.environ.get("TOOLKEEPER_OIDC_ID_TOKEN_AUDIENCES", "").split(",") if a.strip()
]
# Some providers (Entra ID among them) send no `email_verified`: trust their addresses only when told to.
TOOLKEEPER_OIDC_TRUST_UNVERIFIED_EMAIL = env_bool("TOOLKEEPER_OIDC_TRUST_UNVERIFIED_EMAIL", False)
TOOLKEEPER_OIDC_TIMEOUT_S = float(os.environ.get("TOOLKEEPER_OIDC_TIMEOUT_S", 10))
# Local passwords: off leaves single sign-on as the only way in (the console's and the admin site's).
TOOLKEEPER_PASSWORD_LOGIN = env_bool("TOOLKEEPER_PASSWORD_LOGIN", True)
if TOOLKEEPER_OIDC_ISSUER and not TOOLKEEPER_OIDC_CLIENT_ID:
    raise ImproperlyConfigured("TOOLKEEPER_OIDC_CLIENT_ID must be set with TOOLKEEPER_OIDC_ISSUER.")
if not TOOLKEEPER_PASSWORD_LOGIN and not TOOLKEEPER_OIDC_ISSUER:
    raise ImproperlyConfigured("TOOLKEEPER_PASSWORD_LOGIN=0 needs single sign-on: set TOOLKEEPER_OIDC_ISSUER.")

# OAuth for MCP clients (tenancy.oauth, docs/identity.md): "builtin" makes Toolkeeper the authorization server of
# /mcp/ (over HTTPS, or HTTP on a loopback address), "external" trusts another one's tokens, "off" takes API keys only.
TOOLKEEPER_MCP_OAUTH = os.environ.get("TOOLKEEPER_MCP_OAUTH", "").strip().lower() or "builtin"
if TOOLKEEPER_MCP_OAUTH not in {"builtin", "external", "off"}:
    raise ImproperlyConfigured("TOOLKEEPER_MCP_OAUTH must be builtin, external or off.")
# Requests a minute from one network address to the OAuth endpoints, which anyone may reach (0: no limit).
TOOLKEEPER_ADDRESS_REQUESTS_PER_MINUTE = int(os.environ.get("TOOLKEEPER_ADDRESS_REQUESTS_PER_MINUTE", 120))
# "external": the authorization server whose JWT access tokens /mcp/ takes, their audience (the MCP endpoint's URL
# by default) and the scope they must carry.
TOOLKEEPER_MCP_OAUTH_ISSUER = os.environ.get("TOOLKEEPER_MCP_OAUTH_ISSUER", "").strip().rstrip("/")
TOOLKEEPER_MCP_OAUTH_AUDIENCE = os.environ.get("TOOLKEEPER_MCP_OAUTH_AUDIENCE", "").strip()
TOOLKEEPER_MCP_OAUTH_SCOPE = os.environ.get("TOOLKEEPER_MCP_OAUTH_SCOPE", "").strip() or "agent"
if TOOLKEEPER_MCP_OAUTH == "external" and not TOOLKEEPER_MCP_OAUTH_ISSUER:
    raise ImproperlyConfigured("TOOLKEEPER_MCP_OAUTH=external needs TOOLKEEPER_MCP_OAUTH_ISSUER.")
TOOLKEEPER_OAUTH_ACCESS_TOKEN_S = int(os.environ.get("TOOLKEEPER_OAUTH_ACCESS_TOKEN_S", 900))
TOOLKEEPER_OAUTH_REFRESH_TOKEN_S = int(os.environ.get("TOOLKEEPER_OAUTH_REFRESH_TOKEN_S", 30 * 24 * 3600))

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# Notifications (approvals.notifications): links in messages start with the public URL; email goes through
# Django's backend, the console by default, SMTP when EMAIL_HOST is set (EMAIL_PORT, EMAIL_HOST_USER,
# EMAIL_HOST_PASSWORD, EMAIL_USE_TLS from the environment too).
TOOLKEEPER_PUBLIC_URL = os.environ.get("TOOLKEEPER_PUBLIC_URL", "http://127.0.0.1:8000")
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "toolkeeper@localhost")
if os.environ.get("EMAIL_HOST"):
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_HOST = os.environ["EMAIL_HOST"]
    EMAIL_PORT = int(os.environ.get("EMAIL_PORT", 587))
    EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
    EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
    EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", True)
    EMAIL_TIMEOUT = int(os.environ.get("EMAIL_TIMEOUT", 15))  # a silent mail server must not hold a sender
else:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"

# Every request body is capped (tenancy.entry.bodies); larger ones get 413, before they are read.
TOOLKEEPER_MAX_BODY_BYTES = int(os.environ.get("TOOLKEEPER_MAX_BODY_BYTES", 1024 * 1024))
# …except a multipart upload to a console page: the knowledge upload takes up to 1,000 files of 1 MiB.
TOOLKEEPER_MAX_UPLOAD_BYTES = int(os.environ.get("TOOLKEEPER_MAX_UPLOAD_BYTES", 1024 * 1024 * 1024))
DATA_UPLOAD_MAX_NUMBER_FILES = 1000  # large uploads to the knowledge console run as work
DATA_UPLOAD_MAX_MEMORY_SIZE = TOOLKEEPER_MAX_BODY_BYTES

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenancy.entry.authentication.ApiKeyAuthentication",
        "tenancy.entry.authentication.ConsoleSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tenancy.permissions.HasTenant"],
    "DEFAULT_PARSER_CLASSES": ["common.api.LimitedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "common.api.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["tenancy.entry.admission.RestAdmission"],
    "DEFAULT_SCHEMA_CLASS": "toolkeeper.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "common.api.Pagination",
    "PAGE_SIZE": 50,
    "UNAUTHENTICATED_USER": None,
    "URL_FORMAT_OVERRIDE": None,  # `format` is ours: the tool-list format (docs/api.md)
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Toolkeeper API",
    "DESCRIPTION": "Governed tool calls for AI agents.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": "/api/v1",  # tags and operation ids from what follows: sessions, calls, …
    # Swagger UI's files come from the installed package, not from a CDN at page load.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
}

# Characters of result text a model receives at most, unless the tool sets its own cap.
TOOLKEEPER_MAX_RESULT_CHARS = int(os.environ.get("TOOLKEEPER_MAX_RESULT_CHARS", 100_000))
# The mode, decided here once: the runtime (tools.calls.runtime) owns what differs between the modes (the
# executor, how requests wait for calls, the periodic jobs, start-up recovery); code asks it, not this.
TOOLKEEPER_EXECUTOR = os.environ.get("TOOLKEEPER_EXECUTOR", "local")
TOOLKEEPER_MODES = {
    "local": ("tools.calls.runtime.EmbeddedRuntime", "tools.calls.executors.LocalExecutor"),
    "celery": ("tools.calls.runtime.DistributedRuntime", "tools.calls.executors.CeleryExecutor"),
}
if TOOLKEEPER_EXECUTOR not in TOOLKEEPER_MODES:
    raise ImproperlyConfigured(f"TOOLKEEPER_EXECUTOR must be one of: {', '.join(TOOLKEEPER_MODES)}")
TOOLKEEPER_RUNTIME, TOOLKEEPER_EXECUTOR_CLASS = TOOLKEEPER_MODES[TOOLKEEPER_EXECUTOR]
TOOLKEEPER_LOCAL_WORKERS = int(os.environ.get("TOOLKEEPER_LOCAL_WORKERS", 8))
# Idle child processes kept ready for tools declared with @tool(isolation="process"), per server process.
TOOLKEEPER_TOOL_PROCESSES = int(os.environ.get("TOOLKEEPER_TOOL_PROCESSES", 2))
# Modules whose @tool functions are loaded at start-up besides the entry points `toolkeeper.tools`
# (tools.python.plugins).
TOOLKEEPER_TOOL_MODULES = [m.strip() for m in os.environ.get("TOOLKEEPER_TOOL_MODULES", "").split(",") if m.strip()]
TOOLKEEPER_MAX_WAIT_S = 60
# With a key, the audit log's hash chain is keyed (HMAC-SHA256): database access alone cannot rewrite it.
TOOLKEEPER_AUDIT_KEY = os.environ.get("TOOLKEEPER_AUDIT_KEY", "")
TOOLKEEPER_MAX_BATCH = 64
# The largest response body (or event of an event stream) an outbound request takes (common.outbound).
TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES = int(os.environ.get("TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES", 16 * 1024 * 1024))
# Outbound requests to addresses tenants give (common.outbound) reach public addresses only; these
# host names, IP addresses and networks (CIDR) are opened by the admin, e.g. an internal MCP server.
# A certificate authority (a PEM file) that outbound TLS trusts besides the public ones: a company's own, for its
# internal MCP servers and the like.
TOOLKEEPER_OUTBOUND_CA_FILE = os.environ.get("TOOLKEEPER_OUTBOUND_CA_FILE", "").strip()
TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS", "").split(",") if h.strip()
]
# Decisions from Slack (approvals.slack): the hosts a Slack interaction's response_url may name (replies are posted
# there, through the outbound guard too).
TOOLKEEPER_SLACK_RESPONSE_HOSTS = [
    h.strip() for h in os.environ.get("TOOLKEEPER_SLACK_RESPONSE_HOSTS", "hooks.slack.com").split(",") if h.strip()
]
# Tenants' MCP servers (tools.upstream.client, tools.upstream.source): the stdio servers tenants may pick (the admin's
# allow-list, see mcp_stdio_servers above), how often each enabled server's tools are synced, and how long
# an unused pooled session stays open.
TOOLKEEPER_MCP_STDIO_SERVERS = mcp_stdio_servers(os.environ.get("TOOLKEEPER_MCP_STDIO_SERVERS", ""))
TOOLKEEPER_MCP_SYNC_INTERVAL_S = float(os.environ.get("TOOLKEEPER_MCP_SYNC_INTERVAL_S", 300))
TOOLKEEPER_MCP_SESSION_IDLE_S = float(os.environ.get("TOOLKEEPER_MCP_SESSION_IDLE_S", 900))
# How long a tools/call on /mcp/ waits for its call to settle (a reviewer's approval, a long tool) before it
# answers `pending_approval` (or the status it is in); a retry of the same call waits again.
TOOLKEEPER_MCP_MAX_WAIT_S = float(os.environ.get("TOOLKEEPER_MCP_MAX_WAIT_S", 300))
# How long a question to a session's own user (a confirm rule's, a tool's `ctx.ask_user`) waits for the answer before
# it expires, unless the confirm rule's queue sets `expires_after` (docs/calls.md, "Questions for the user").
TOOLKEEPER_CONFIRM_EXPIRES_S = float(os.environ.get("TOOLKEEPER_CONFIRM_EXPIRES_S", 600))
# While it waits, a progress notification this often keeps the client's request alive.
TOOLKEEPER_MCP_HEARTBEAT_S = float(os.environ.get("TOOLKEEPER_MCP_HEARTBEAT_S", 10))
# Resumable streams (docs/mcp.md, "Streams"): how long an event id of /mcp/ can be resumed with Last-Event-ID, the
# reconnection delay its streams suggest (the SSE `retry` field, milliseconds), and after how long a tools/call
# whose client can resume ends its stream and lets the client come back for the result ("0": never; SSE polling).
TOOLKEEPER_MCP_RESUME_S = float(os.environ.get("TOOLKEEPER_MCP_RESUME_S", 600))
TOOLKEEPER_MCP_RETRY_MS = int(os.environ.get("TOOLKEEPER_MCP_RETRY_MS", 1000))
TOOLKEEPER_MCP_POLL_AFTER_S = float(os.environ.get("TOOLKEEPER_MCP_POLL_AFTER_S", 0))
# The lean reader of /mcp/ (docs/notes/mcp.md, "MCP endpoint — server"): a 2026-era tools/call, tools/list or ping
# answered by one JSON reply is answered without the SDK's transport; "0" sends every request through the SDK.
TOOLKEEPER_MCP_LEAN = os.environ.get("TOOLKEEPER_MCP_LEAN", "1") != "0"
# Each server or worker process keeps its MCP sessions in a helper process of its own ("0": in a thread).
TOOLKEEPER_MCP_CLIENT_PROCESS = os.environ.get("TOOLKEEPER_MCP_CLIENT_PROCESS", "1") != "0"
# Set by tools.upstream.client in that helper process.
TOOLKEEPER_MCP_HOST_PROCESS = os.environ.get("TOOLKEEPER_MCP_HOST_PROCESS") == "1"

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or REDIS_URL or "memory://"
CELERY_TASK_ACKS_LATE = True
CELERY_BEAT_SCHEDULER = "tools.tasks:RuntimeScheduler"  # the runtime's periodic jobs
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fixup otherwise closes a worker's database connection before and after every task
# (a new PostgreSQL backend per call); toolkeeper.celery refreshes it per task as Django does per request.
CELERY_DB_REUSE_MAX = 1000
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A submit while the broker is down must not hang: the call stays queued and is sent later.
CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_connect_timeout": 2, "socket_timeout": 5, "max_retries": 0}
if TOOLKEEPER_EXECUTOR == "celery" and CELERY_BROKER_URL == "memory://":
    raise ImproperlyConfigured("TOOLKEEPER_EXECUTOR=celery needs REDIS_URL (or CELERY_BROKER_URL)")

# Metrics (common.metrics, docs/observability.md): prometheus_client's multiprocess mode keeps each process's values
# in this directory, one per host (set before any process imports prometheus_client: every process loads these
# settings first). `/metrics` answers with a bearer token, or on a separate bind address; neither set: 404.
PROMETHEUS_MULTIPROC_DIR = os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(DATA_DIR / "metrics"))
Path(PROMETHEUS_MULTIPROC_DIR).mkdir(parents=True, exist_ok=True)
TOOLKEEPER_METRICS_TOKEN = os.environ.get("TOOLKEEPER_METRICS_TOKEN", "")
TOOLKEEPER_METRICS_ADDR = os.environ.get("TOOLKEEPER_METRICS_ADDR", "").strip()
# a host of Celery workers alone: their sums on an address of its own (the servers' address has the database gauges)
TOOLKEEPER_WORKER_METRICS_ADDR = os.environ.get("TOOLKEEPER_WORKER_METRICS_ADDR", "").strip()

# Logs (docs/observability.md, "Logs"): TOOLKEEPER_LOG_FORMAT=json makes each record one JSON object a line, with the
# call it was logged for (call_id, tenant, trace_id, step); anything else keeps Python's plain lines.
TOOLKEEPER_LOG_FORMAT = "json" if os.environ.get("TOOLKEEPER_LOG_FORMAT", "").strip().lower() == "json" else "text"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "common.logs.JsonFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler",
                             **({"formatter": "json"} if TOOLKEEPER_LOG_FORMAT == "json" else {})}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
    "loggers": {
        "toolkeeper": {"level": os.environ.get("LOG_LEVEL", "INFO")},
        # The MCP SDK logs the arguments it sends upstream at DEBUG, bound ones included (they may be secrets):
        # never below INFO, whatever LOG_LEVEL says.
        "mcp": {"level": "INFO"},
    },
}
