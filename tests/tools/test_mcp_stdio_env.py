"""A stdio MCP server's environment: the names a tenant may set are allowed, never filtered (docs/notes/mcp.md,
"MCP servers — client"). A name that changes what the command loads or runs, where it reads its settings or whom
it trusts is refused where the platform admin's allow-list is read, where a tenant saves, and where the command
is started; nothing is dropped in silence."""
import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from common.command_env import env_name_refusal
from common.errors import ServiceError
from toolkeeper.settings import mcp_stdio_servers
from tools.models import McpServer
from tools.upstream.client import UpstreamRefused, endpoint_of, stdio_allow_list
from tools.upstream.servers import mcp_server_create

pytestmark = pytest.mark.django_db

ENV_SECRET = "sk-env-5ecret-31c9"  # noqa: S105
URL = "/api/v1/mcp-servers"
REFUSED = [
    "LD_PRELOAD", "LD_LIBRARY_PATH", "ld_audit", "DYLD_INSERT_LIBRARIES", "PATH", "PYTHONPATH", "PYTHONSTARTUP",
    "PYTHONWARNINGS", "PYTHONHOME", "PYTHONBREAKPOINT", "NODE_OPTIONS", "NODE_PATH", "NODE_TLS_REJECT_UNAUTHORIZED",
    "NPM_CONFIG_REGISTRY", "npm_config_registry", "PIP_INDEX_URL", "UV_INDEX_URL", "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "PERL5LIB", "PERL5OPT", "RUBYOPT", "RUBYLIB",
    "BROWSER", "EDITOR", "VISUAL", "PAGER", "SHELL", "ENV", "BASH_ENV", "IFS", "PS4", "PROMPT_COMMAND", "HOME",
    "XDG_CONFIG_HOME", "GCONV_PATH", "GLIBC_TUNABLES", "MALLOC_CHECK_", "GIT_SSH_COMMAND", "GIT_CONFIG_GLOBAL",
    "SSH_AUTH_SOCK", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "OPENSSL_CONF",
    "HTTP_PROXY", "https_proxy", "ALL_PROXY", "NO_PROXY",
]
NOT_NAMES = ["", "1ST", "API TOKEN", "API=TOKEN", "API-TOKEN", "API\x00", "ÄPI", "X" * 129]
ALLOWED = ["API_TOKEN", "GITHUB_TOKEN", "MCP_TEST_TOKEN", "LOG_LEVEL", "TZ", "LANG", "_PRIVATE", "A" * 128]


def allow_list(*tenant_env: str) -> dict:
    return {"files": {"command": "/usr/bin/env", "args": ["mcp-files"], "env": {"ROOT": "/srv"},
                      "tenant_env": list(tenant_env)}}


# --- the rule -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", REFUSED)
def test_names_that_change_what_runs_are_refused_with_the_reason(name):
    refusal = env_name_refusal(name)
    assert refusal is not None and name in refusal and "tenant" in refusal


@pytest.mark.parametrize("name", NOT_NAMES)
def test_what_is_no_plain_name_is_refused(name):
    refusal = env_name_refusal(name)
    assert refusal is not None and "not an environment variable name" in refusal
    assert "\x00" not in refusal  # shown escaped


@pytest.mark.parametrize("name", ALLOWED)
def test_plain_names_of_settings_and_tokens_are_not(name):
    assert env_name_refusal(name) is None


def test_a_name_that_is_no_text_is_refused():
    assert "not an environment variable name" in env_name_refusal(42)


# --- where the allow-list is read ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["LD_PRELOAD", "PATH", "PYTHONWARNINGS", "BROWSER", "JAVA_TOOL_OPTIONS", "1X"])
def test_the_settings_refuse_an_allow_list_that_lets_tenants_set_a_refused_name(name):
    with pytest.raises(ImproperlyConfigured) as raised:
        mcp_stdio_servers(json.dumps(allow_list("API_TOKEN", name)))
    message = str(raised.value)
    assert message.startswith("TOOLKEEPER_MCP_STDIO_SERVERS['files']: tenant_env: ") and name in message
    assert "cannot be set by a tenant" in message or "not an environment variable name" in message


def test_the_settings_take_an_allow_list_of_plain_names():
    assert mcp_stdio_servers(json.dumps(allow_list("API_TOKEN", "LOG_LEVEL"))) == allow_list("API_TOKEN", "LOG_LEVEL")


def test_the_settings_refuse_a_tenant_env_that_is_no_list_of_names():
    for tenant_env in ("API_TOKEN", [1], {"API_TOKEN": 1}):
        with pytest.raises(ImproperlyConfigured, match=r"\['files'\].*tenant_env"):
            mcp_stdio_servers(json.dumps({"files": {"command": "c", "tenant_env": tenant_env}}))


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTHONWARNINGS", "HTTPS_PROXY"])
def test_the_client_refuses_such_an_allow_list_too(name):
    """Settings set another way than the environment (a settings module, a test) meet the same check."""
    with override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=allow_list("API_TOKEN", name)), \
            pytest.raises(ImproperlyConfigured) as raised:
        stdio_allow_list()
    assert "['files']" in str(raised.value) and f"{name} cannot be set by a tenant" in str(raised.value)


# --- where a tenant saves --------------------------------------------------------------------------

def create(client, env: dict):
    return client.post(URL, {"name": "files", "transport": "stdio", "command": "files", "env": env}, format="json")


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PATH", "PYTHONWARNINGS", "BROWSER", "JAVA_TOOL_OPTIONS",
                                  "HTTPS_PROXY"])
def test_a_save_is_refused_on_env_naming_the_variable_even_when_the_entry_lists_it(world, name):
    """The admin's list is the rule, the refused names its backstop: listing one by mistake opens nothing."""
    with override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=allow_list("API_TOKEN", name)):
        answer = create(world.a.client("admin"), {"API_TOKEN": ENV_SECRET, name: "/tmp/x"})
    assert answer.status_code == 400, answer.content
    messages = answer.json()["error"]["fields"]["env"]
    assert any(name in text and "cannot be set by a tenant" in text for text in messages), messages
    assert ENV_SECRET not in answer.content.decode()
    assert not McpServer.objects.for_tenant(world.a.tenant).exists()


def test_a_refused_name_is_not_offered_as_allowed(world):
    with override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=allow_list("API_TOKEN", "LD_PRELOAD")):
        answer = create(world.a.client("admin"), {"OTHER": "x"})
    (message,) = answer.json()["error"]["fields"]["env"]
    assert "(allowed: API_TOKEN)" in message


def test_a_patch_is_refused_the_same_way(world):
    with override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=allow_list("API_TOKEN", "PYTHONWARNINGS")):
        client = world.a.client("admin")
        created = create(client, {"API_TOKEN": ENV_SECRET})
        assert created.status_code == 201, created.content
        answer = client.patch(f"{URL}/{created.json()['id']}", {"env": {"PYTHONWARNINGS": "x"}}, format="json")
    assert answer.status_code == 400 and "PYTHONWARNINGS" in " ".join(answer.json()["error"]["fields"]["env"])
    server = McpServer.objects.for_tenant(world.a.tenant).get()
    assert dict(server.env) == {"API_TOKEN": ENV_SECRET}


# --- a NUL in a name or a value: a 400 on `env` naming the variable ----------------------------------

@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=allow_list("API_TOKEN"))
def test_a_nul_in_a_value_is_refused_naming_the_variable(world):
    with pytest.raises(ServiceError) as raised:
        mcp_server_create(tenant=world.a.tenant, name="files", transport="stdio", command="files",
                          env={"API_TOKEN": ENV_SECRET + "\x00"})
    (message,) = raised.value.fields["env"]
    assert "API_TOKEN" in message and "NUL" in message and ENV_SECRET not in message
    assert raised.value.status == 400


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=allow_list("API_TOKEN"))
def test_a_nul_in_a_name_is_refused_on_env(world):
    with pytest.raises(ServiceError) as raised:
        mcp_server_create(tenant=world.a.tenant, name="files", transport="stdio", command="files",
                          env={"API_TOKEN\x00": "x"})
    (message,) = raised.value.fields["env"]
    assert "'API_TOKEN\\x00'" in message and "not an environment variable name" in message


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=allow_list("API_TOKEN"))
@pytest.mark.parametrize("method", ["post", "patch"])
def test_a_nul_through_the_api_is_a_400_and_nothing_is_stored(world, method):
    client = world.a.client("admin")
    if method == "post":
        answer = create(client, {"API_TOKEN": ENV_SECRET + "\x00"})
    else:
        created = create(client, {"API_TOKEN": ENV_SECRET})
        answer = client.patch(f"{URL}/{created.json()['id']}", {"env": {"API_TOKEN": "x\x00y"}}, format="json")
    assert answer.status_code == 400, answer.content
    assert ENV_SECRET not in answer.content.decode()
    assert answer.json()["error"]["fields"] == {"env": ["JSON strings may not contain the NUL character (\\u0000)"]}
    stored = [dict(server.env) for server in McpServer.objects.for_tenant(world.a.tenant)]
    assert stored == ([] if method == "post" else [{"API_TOKEN": ENV_SECRET}])


# --- where the command is started ------------------------------------------------------------------

def stored(env: dict) -> McpServer:
    """A server as saved earlier (not written: `endpoint_of` reads only its fields)."""
    return McpServer(id=7, name="files", transport="stdio", command="files", env=env, timeout_s=20)


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=allow_list("API_TOKEN"))
def test_the_allowed_values_reach_the_command_with_the_entrys_own():
    endpoint = endpoint_of(stored({"API_TOKEN": ENV_SECRET}))
    assert dict(endpoint.env) == {"ROOT": "/srv", "API_TOKEN": ENV_SECRET}


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=allow_list("API_TOKEN"))
@pytest.mark.parametrize("name", ["LD_PRELOAD", "PATH", "NO_LONGER_LISTED"])
def test_a_stored_name_no_longer_allowed_refuses_the_start_instead_of_being_dropped(name, caplog):
    """Stored before the rule (or before the admin took the name off the list): the command is not started
    without it as if nothing happened; the refusal says which variable and what to do."""
    with pytest.raises(UpstreamRefused) as raised:
        endpoint_of(stored({"API_TOKEN": ENV_SECRET, name: "/tmp/evil"}))
    message = str(raised.value)
    assert name in message and "save" in message and "files" in message
    assert ENV_SECRET not in message and "/tmp/evil" not in message + caplog.text
