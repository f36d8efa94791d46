"""Environment variables a tenant may never set for a command the platform starts (a stdio MCP server).

The platform admin's allow-list (`TOOLKEEPER_MCP_STDIO_SERVERS`, each entry's `tenant_env`) says which names
a tenant may set; this is its backstop, one rule read where the allow-list is read (settings, the MCP
client), where a tenant saves (`tools.upstream.servers`) and where the command starts (`tools.upstream.client`). A
name is refused when it is not a plain name, or when it changes what the command or its runtime loads and
runs, where it reads its settings, or whom its connections trust and pass through: such a value turns "set
my API token" into "run my code next to the admin's credentials". docs/notes/mcp.md ("MCP servers —
client") gives the reasons name by name. Names compare case-insensitively (`http_proxy` is read as well as
`HTTP_PROXY`).
"""
import re

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
ENV_NAME_RULE = "letters, digits and '_', not starting with a digit, at most 128"

RUNS_CODE = "it changes which code the command or its runtime loads and runs"
READS_SETTINGS = "it changes where the command reads its settings and files"
TRUST = "it changes whom the command's connections trust or where they go"

# Exact names (upper case) and why each is refused.
REFUSED_NAMES = {
    # what runs: the search path, shells and the programs a library starts on its own
    "PATH": RUNS_CODE, "SHELL": RUNS_CODE, "ENV": RUNS_CODE, "BASH_ENV": RUNS_CODE, "IFS": RUNS_CODE,
    "PS4": RUNS_CODE, "PROMPT_COMMAND": RUNS_CODE, "SHELLOPTS": RUNS_CODE, "BASHOPTS": RUNS_CODE,
    "CDPATH": RUNS_CODE, "BROWSER": RUNS_CODE, "EDITOR": RUNS_CODE, "VISUAL": RUNS_CODE, "PAGER": RUNS_CODE,
    "MANPAGER": RUNS_CODE,
    # runtimes' own options and module paths
    "NODE_OPTIONS": RUNS_CODE, "NODE_PATH": RUNS_CODE, "JAVA_TOOL_OPTIONS": RUNS_CODE,
    "_JAVA_OPTIONS": RUNS_CODE, "JDK_JAVA_OPTIONS": RUNS_CODE, "CLASSPATH": RUNS_CODE, "JAVA_HOME": RUNS_CODE,
    "RUBYOPT": RUNS_CODE, "RUBYLIB": RUNS_CODE, "GEM_HOME": RUNS_CODE, "GEM_PATH": RUNS_CODE,
    "BUNDLE_GEMFILE": RUNS_CODE, "GOFLAGS": RUNS_CODE, "GOROOT": RUNS_CODE, "GOPATH": RUNS_CODE,
    "GOPROXY": RUNS_CODE, "GOTOOLCHAIN": RUNS_CODE, "PHPRC": RUNS_CODE, "PHP_INI_SCAN_DIR": RUNS_CODE,
    # the C library's own (glibc ignores these for setuid programs for the same reason)
    "GCONV_PATH": RUNS_CODE, "GETCONF_DIR": RUNS_CODE, "GLIBC_TUNABLES": RUNS_CODE, "LOCPATH": RUNS_CODE,
    "NLSPATH": RUNS_CODE, "HOSTALIASES": TRUST, "LOCALDOMAIN": TRUST, "RES_OPTIONS": TRUST,
    "RESOLV_HOST_CONF": TRUST, "NIS_PATH": TRUST, "TZDIR": READS_SETTINGS, "TMPDIR": READS_SETTINGS,
    # where settings and per-user code are read
    "HOME": READS_SETTINGS, "ZDOTDIR": READS_SETTINGS, "INPUTRC": READS_SETTINGS,
    # trust anchors and proxies
    "REQUESTS_CA_BUNDLE": TRUST, "CURL_CA_BUNDLE": TRUST, "HTTP_PROXY": TRUST, "HTTPS_PROXY": TRUST,
    "ALL_PROXY": TRUST, "NO_PROXY": TRUST, "FTP_PROXY": TRUST,
}
# Prefixes (upper case): whole families of a runtime's or tool's variables.
REFUSED_PREFIXES = {
    "LD_": RUNS_CODE, "DYLD_": RUNS_CODE, "PYTHON": RUNS_CODE, "NODE_": RUNS_CODE, "NPM_CONFIG_": RUNS_CODE,
    "YARN_": RUNS_CODE, "PIP_": RUNS_CODE, "PIPX_": RUNS_CODE, "UV_": RUNS_CODE, "PERL": RUNS_CODE,
    "LUA_": RUNS_CODE, "DOTNET_": RUNS_CODE, "COMPLUS_": RUNS_CODE, "CORECLR_": RUNS_CODE, "MALLOC_": RUNS_CODE,
    "GIT_": RUNS_CODE, "OPENSSL_": RUNS_CODE, "XDG_": READS_SETTINGS, "SSH_": TRUST, "SSL_CERT_": TRUST,
}


def env_name_refusal(name) -> str | None:
    """Why a tenant may never set the environment variable `name`, in words for the tenant or the admin (the
    name shown escaped); None when the allow-list may let a tenant set it."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return f"{str(name)[:60]!r} is not an environment variable name ({ENV_NAME_RULE} characters)"
    upper = name.upper()
    reason = REFUSED_NAMES.get(upper) or next(
        (why for prefix, why in REFUSED_PREFIXES.items() if upper.startswith(prefix)), None)
    if reason is None:
        return None
    return f"{name} cannot be set by a tenant: {reason}"
