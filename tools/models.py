import uuid

from django.conf import settings
from django.db import models

from common.secrets import EncryptedJSONField
from tenancy.scoping import TenantOwned

RESERVED_GROUP = "basic"


SOURCE_KIND_MAX = 32


class ToolSource(models.TextChoices):
    """The kinds of the shipped sources. The field takes any kind a registered source claims
    (`tools.catalog.registry.register_source`): a new source needs no change here."""

    PYTHON = "python"
    MCP = "mcp"
    EXTERNAL = "external"
    BUILTIN = "builtin"
    HTTP = "http"


class McpTransport(models.TextChoices):
    STREAMABLE_HTTP = "streamable_http", "streamable HTTP"
    SSE = "sse", "SSE"
    STDIO = "stdio", "stdio"


class AccountMode(models.TextChoices):
    """Whose account a server's calls act as upstream (docs/accounts.md)."""

    TENANT = "tenant", "one tenant credential"
    PERSON = "person", "each person connects their own account"
    SERVICE = "service", "a service account (client credentials)"  # HTTP tools' OAuth providers only


class McpStatus(models.TextChoices):
    NEW = "new", "not synced yet"
    OK = "ok", "ok"
    ERROR = "error", "error"


class McpServer(TenantOwned):
    """An MCP server a tenant registered; its tools enter the catalog as `mcp__{name}__{tool}`.

    HTTP servers are reached at `url` (with `headers`, encrypted); stdio servers are started from the
    platform admin's allow-list (`settings.TOOLKEEPER_MCP_STDIO_SERVERS`), which `command` names: a tenant
    never gives a command line. `env` holds values for the environment names that allow-list entry lets
    tenants set (encrypted).
    """

    name = models.CharField(max_length=24)
    transport = models.CharField(max_length=16, choices=McpTransport.choices)
    url = models.CharField(max_length=2000, blank=True, default="")
    headers = EncryptedJSONField(null=True, blank=True)
    command = models.CharField(max_length=64, blank=True, default="")
    env = EncryptedJSONField(null=True, blank=True)
    # `person`: each call carries its verified person's own OAuth token (tools.accounts); the server's headers
    # then hold no Authorization. `oauth_client`: the client Toolkeeper is at the server's authorization server
    # (an operator's pre-registered one, or what dynamic registration returned), encrypted.
    accounts = models.CharField(max_length=8, choices=AccountMode.choices, default=AccountMode.TENANT)
    oauth_client = EncryptedJSONField(null=True, blank=True)
    oauth_scopes = models.CharField(max_length=500, blank=True, default="")
    # The connection a sync lists the tools with, when each person connects their own (an operator's).
    listing_account = models.ForeignKey("UpstreamAccount", null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="+")
    enabled = models.BooleanField(default=True)
    timeout_s = models.FloatField(default=30)
    include = models.JSONField(default=list, blank=True, help_text="upstream tool names to take; empty: all")
    exclude = models.JSONField(default=list, blank=True, help_text="upstream tool names to leave out")
    trusted = models.BooleanField(default=False, help_text="its tools' annotations become their flags")
    accept_changes = models.BooleanField(default=False, help_text="a sync applies changed tool definitions and "
                                                                  "takes new tools without an operator's review")
    join_group = models.ForeignKey("ToolGroup", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                   help_text="the group each tool a sync adds joins")
    status = models.CharField(max_length=8, choices=McpStatus.choices, default=McpStatus.NEW)
    last_error = models.TextField(blank=True, default="")
    last_synced_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="mcp_server_name_per_tenant")]

    def __str__(self):
        return self.name


class UpstreamPrompt(TenantOwned):
    """A prompt an MCP server offers (`prompts/list`), as its last sync found it; `/mcp/` offers it under `name`
    (`mcp__{server}__{prompt}`, mapped like a tool's name) to the sessions that see the server's tools.
    `arguments` is `[{"name", "description", "required"}]`. A prompt the server no longer offers is deleted."""

    mcp_server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="prompts")
    name = models.CharField(max_length=64)
    upstream_name = models.CharField(max_length=255)
    title = models.CharField(max_length=200, blank=True, default="")
    description = models.TextField(blank=True, default="")
    arguments = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="upstream_prompt_name_per_tenant")]

    def __str__(self):
        return self.name


class Tool(TenantOwned):
    """A tool in a tenant's catalog, synced from its source."""

    name = models.CharField(max_length=128)
    description = models.TextField(blank=True, default="")
    input_schema = models.JSONField(default=dict)
    output_schema = models.JSONField(null=True, blank=True)
    source = models.CharField(max_length=SOURCE_KIND_MAX)  # a registered source's kind
    source_ref = models.CharField(max_length=255, blank=True, default="")
    # MCP tools: the server they came from (source_ref holds the upstream name); kept, disabled, when it goes.
    mcp_server = models.ForeignKey(McpServer, null=True, blank=True, on_delete=models.SET_NULL, related_name="tools")
    read_only = models.BooleanField(default=False)
    trusted = models.BooleanField(default=True, help_text="its flags come from code or a trusted server, "
                                  "not from an untrusted server's annotations")
    destructive = models.BooleanField(default=False)
    idempotent = models.BooleanField(default=False)
    concurrency_safe = models.BooleanField(default=True)
    timeout_s = models.FloatField(default=30)
    enabled = models.BooleanField(default=True)
    # After-execution steps: an idempotent tool's call that failed with a transient error runs again, up to
    # `retry_max` more times, waiting `retry_backoff_s` doubled each time; a result longer than
    # `max_result_chars` (empty: the platform's cap) is cut with a note.
    retry_max = models.PositiveSmallIntegerField(default=0)
    retry_backoff_s = models.FloatField(default=0.5)
    max_result_chars = models.PositiveIntegerField(null=True, blank=True)
    # An upstream tool's definition as an operator last accepted it (tools.upstream.definitions), and the one a
    # sync found since that differs from it: while `proposed_hash` is set the tool is withheld from every session.
    pinned = models.JSONField(null=True, blank=True)
    pinned_hash = models.CharField(max_length=64, blank=True, default="")
    proposed = models.JSONField(null=True, blank=True)
    proposed_hash = models.CharField(max_length=64, blank=True, default="")
    proposed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="tool_name_per_tenant")]

    def __str__(self):
        return self.name


class ToolGroup(TenantOwned):
    name = models.SlugField(max_length=64)
    description = models.TextField(blank=True, default="")
    notes = models.TextField(blank=True, default="", help_text="Shown to the model when the group is active.")
    default_active = models.BooleanField(default=False)
    switchable = models.BooleanField(default=True)
    tools = models.ManyToManyField(Tool, blank=True, related_name="groups")
    skill_ref = models.CharField(max_length=200, blank=True, default="")
    agents = models.JSONField(default=list, blank=True, help_text="the agents that may see the group; empty: all")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="group_name_per_tenant")]

    def __str__(self):
        return self.name

    @property
    def is_reserved(self) -> bool:
        return self.name == RESERVED_GROUP


class OAuthProvider(TenantOwned):
    """An authorization server an operator configured for HTTP tools (docs/accounts.md): its endpoints, the client
    Toolkeeper is registered as there (encrypted, write-only) and whose account the tools that name it act as:
    each person's own (authorization code with PKCE) or one service account (client credentials)."""

    name = models.CharField(max_length=24)
    accounts = models.CharField(max_length=8, choices=AccountMode.choices, default=AccountMode.PERSON)
    # Where its tokens may go: an HTTP tool that names the provider calls URLs under this one only, so whoever
    # edits a tool cannot send people's tokens elsewhere.
    api_url = models.CharField(max_length=2000)
    issuer = models.CharField(max_length=2000, blank=True, default="")
    authorization_endpoint = models.CharField(max_length=2000, blank=True, default="")
    token_endpoint = models.CharField(max_length=2000)
    revocation_endpoint = models.CharField(max_length=2000, blank=True, default="")
    resource = models.CharField(max_length=2000, blank=True, default="")
    scopes = models.CharField(max_length=500, blank=True, default="")
    client = EncryptedJSONField()  # {"client_id", "client_secret"?}
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="oauth_provider_name_per_tenant")]

    def __str__(self):
        return self.name


class HttpEndpoint(TenantOwned):
    """How an HTTP tool (source `http`) calls its endpoint: the request is built from the call's arguments,
    `secrets` (encrypted, write-only) fill the headers that name them, and `response` says how the reply
    becomes the result. Requests go through the outbound SSRF guard (common.outbound)."""

    tool = models.OneToOneField(Tool, on_delete=models.CASCADE, related_name="http")
    method = models.CharField(max_length=7, default="POST")
    url_template = models.CharField(max_length=2000)
    query = models.JSONField(default=dict, blank=True)
    body = models.JSONField(null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    secrets = EncryptedJSONField(null=True, blank=True)
    # Set: each call carries a token of this provider as its Authorization (the caller's own, or the service
    # account's); unset: the headers and secrets are the tenant's one credential.
    oauth_provider = models.ForeignKey(OAuthProvider, null=True, blank=True, on_delete=models.RESTRICT,
                                       related_name="endpoints")
    response = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"{self.method} {self.url_template}"


class RedactionRule(TenantOwned):
    """A pattern whose matches are removed from results before the model sees them (after-execution steps).
    The unredacted result is kept, encrypted, only when every rule that matched it allows it."""

    name = models.CharField(max_length=64)
    pattern = models.CharField(max_length=500)
    replacement = models.CharField(max_length=100, default="[redacted]")
    tool_pattern = models.CharField(max_length=200, default="*")
    keep_original = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="redaction_rule_name_per_tenant")]

    def __str__(self):
        return self.name


class CatalogVersion(TenantOwned):
    """Bumped with every change to a tenant's tools, groups or bindings (see tools.catalog.snapshot)."""

    version = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant"], name="one_catalog_version_per_tenant")]


class BoundArgument(TenantOwned):
    """A value the server fixes for a tool's argument, for every agent or for one."""

    tool = models.ForeignKey(Tool, on_delete=models.CASCADE, related_name="bindings")
    agent = models.CharField(max_length=100, blank=True, default="")
    name = models.CharField(max_length=128)
    value = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tool__name", "name", "agent"]
        constraints = [
            models.UniqueConstraint(fields=["tool", "agent", "name"], name="one_binding_per_tool_agent_name")
        ]

    def __str__(self):
        return f"{self.tool.name}.{self.name}" + (f" ({self.agent})" if self.agent else "")


class AgentSession(TenantOwned):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    api_key = models.ForeignKey("tenancy.ApiKey", null=True, blank=True, on_delete=models.SET_NULL)
    agent = models.CharField(max_length=100)
    user = models.CharField(max_length=200, blank=True, default="")
    # The user is a person Toolkeeper verified (an OAuth grant's, docs/identity.md), not a name the app asserts.
    user_verified = models.BooleanField(default=False)
    # The verified user's account here, when they have one: whose upstream accounts the calls use.
    person = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    context = models.JSONField(default=dict, blank=True)
    active_groups = models.JSONField(default=list, blank=True)
    loaded_skills = models.JSONField(default=list, blank=True)
    # Schema-only tools the app declared for this session (request-scoped tools), and whether they are added
    # to the session's surface or replace it.
    declared_tools = models.JSONField(default=list, blank=True)
    declared_mode = models.CharField(max_length=8, default="add")
    state = models.JSONField(default=dict, blank=True, help_text="Tool-owned session state, e.g. todos.")
    call_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "-created_at"])]

    def __str__(self):
        return f"{self.agent} {self.id}"


class CallStatus(models.TextChoices):
    RECEIVED = "received"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DENIED = "denied"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_EXTERNAL = "awaiting_external"
    AWAITING_USER = "awaiting_user"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    INTERRUPTED = "interrupted"


TERMINAL_STATUSES = frozenset({
    CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.DENIED, CallStatus.REJECTED, CallStatus.EXPIRED,
    CallStatus.CANCELLED, CallStatus.TIMED_OUT, CallStatus.INTERRUPTED,
})
HUMAN_WAIT_STATUSES = frozenset({CallStatus.AWAITING_APPROVAL, CallStatus.AWAITING_EXTERNAL, CallStatus.AWAITING_USER})
SETTLED_STATUSES = TERMINAL_STATUSES | HUMAN_WAIT_STATUSES


class ToolCall(TenantOwned):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="calls")
    call_id = models.CharField(max_length=128)
    tool = models.ForeignKey(Tool, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls")
    tool_name = models.CharField(max_length=128)
    # A request-scoped tool's declaration, as the app sent it with the call's request (the catalog has no row).
    declared_tool = models.JSONField(null=True, blank=True)
    input = models.JSONField(default=dict, blank=True)
    effective_input = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=20, choices=CallStatus.choices, default=CallStatus.RECEIVED)
    decision = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    # The result before redaction, encrypted, kept only where the redaction rules that matched allow it.
    unredacted_result = EncryptedJSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    # What the session's own user is asked while the call is `awaiting_user` (tools.calls.questions), and until
    # when; the time is cleared by the answer that wins, so two answers cannot both settle it.
    question = models.JSONField(null=True, blank=True)
    question_expires_at = models.DateTimeField(null=True, blank=True)
    event_seq = models.PositiveIntegerField(default=0)
    lease_until = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Its trace (docs/observability.md, "Traces"), chosen at submission; empty when it is not traced. The root span
    # (received → settled) is recorded when it settles, with this span id; later spans, in any process, are its
    # children. `trace_parent_id`: the app's span the root continues (a `traceparent` it sent), if any.
    trace_id = models.CharField(max_length=32, blank=True, default="")
    trace_span_id = models.CharField(max_length=16, blank=True, default="")
    trace_parent_id = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["session", "call_id"], name="call_id_per_session")]
        indexes = [
            models.Index(fields=["tenant", "-created_at"]),
            # The tenant's calls in a status (the calls in flight, on every submission), and a session's among
            # them: the retry's lookup of a waiting twin on every MCP call, an unsafe tool's claim. Without the
            # session, SQLite read all of the tenant's calls for the twin (docs/performance.md, "Flat with
            # history"); it replaces the (tenant, status) index, its prefix.
            models.Index(fields=["tenant", "status", "session"]),
            models.Index(fields=["status", "lease_until"]),
            models.Index(fields=["status", "question_expires_at"]),
        ]

    def __str__(self):
        return f"{self.tool_name} {self.call_id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class EventKind(models.TextChoices):
    STATUS = "status"
    PROGRESS = "progress"
    OUTPUT = "output"
    LOG = "log"


class CallEvent(TenantOwned):
    call = models.ForeignKey(ToolCall, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=EventKind.choices)
    data = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["call", "seq"]
        constraints = [models.UniqueConstraint(fields=["call", "seq"], name="event_seq_per_call")]

    def __str__(self):
        return f"{self.call_id}#{self.seq} {self.kind}"


class UpstreamAccount(TenantOwned):
    """A person's own account at an upstream (docs/accounts.md): the OAuth tokens Toolkeeper holds for them,
    encrypted, never shown. Where they came from (the token and revocation endpoints, the client) is kept beside
    them, so a refresh needs no discovery. The upstream is an MCP server or an HTTP tools' OAuth provider; a
    provider's service account is the one account without a person."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="upstream_accounts")
    mcp_server = models.ForeignKey(McpServer, null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="accounts_connected")
    oauth_provider = models.ForeignKey(OAuthProvider, null=True, blank=True, on_delete=models.CASCADE,
                                       related_name="accounts_connected")
    tokens = EncryptedJSONField()  # {"access_token", "refresh_token"?}
    issuer = models.CharField(max_length=2000, blank=True, default="")
    token_endpoint = models.CharField(max_length=2000)
    revocation_endpoint = models.CharField(max_length=2000, blank=True, default="")
    client_id = models.CharField(max_length=2000)
    resource = models.CharField(max_length=2000, blank=True, default="")
    scope = models.CharField(max_length=1000, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    connected_at = models.DateTimeField(auto_now_add=True)
    refreshed_at = models.DateTimeField(null=True, blank=True)
    refresh_count = models.PositiveIntegerField(default=0)
    # One refresh in flight per account, across processes: the process that set this refreshes; others wait.
    refresh_started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["mcp_server", "user"], name="one_upstream_account_per_person"),
            models.UniqueConstraint(fields=["oauth_provider", "user"], condition=models.Q(user__isnull=False),
                                    name="one_provider_account_per_person"),
            models.UniqueConstraint(fields=["oauth_provider"], condition=models.Q(user__isnull=True),
                                    name="one_service_account_per_provider"),
            models.CheckConstraint(
                condition=(models.Q(mcp_server__isnull=False, oauth_provider__isnull=True, user__isnull=False)
                           | models.Q(mcp_server__isnull=True, oauth_provider__isnull=False)),
                name="upstream_account_of_one_upstream"),
        ]

    @property
    def upstream(self):
        return self.mcp_server or self.oauth_provider

    def __str__(self):
        return f"{self.user or 'service account'} at {self.upstream}"
