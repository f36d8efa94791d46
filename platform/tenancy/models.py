import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from common.secrets import EncryptedJSONField
from tenancy.scoping import TenantOwned


class Behavior(models.TextChoices):
    ASK = "ask"
    DENY = "deny"
    ALLOW = "allow"


class ToolSurface(models.TextChoices):
    """What a new session's model is listed (docs/governance.md#tool-search): every tool of its active groups, or
    the core (the `basic` group) and the tool search, through which it switches on the tools it needs."""
    FULL = "full"
    SEARCH = "search"


class Tenant(models.Model):
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=200)
    default_behavior = models.CharField(max_length=8, choices=Behavior.choices, default=Behavior.ASK)
    auto_allow_read_only = models.BooleanField(default=True)
    # A call of a tool from an untrusted MCP server waits for a reviewer unless a rule decides it, even when the
    # default is allow (docs/governance.md, the decision).
    review_untrusted = models.BooleanField(
        "review untrusted servers' tools", default=True,
        help_text="Calls of tools from untrusted MCP servers wait for a reviewer unless a rule decides them.")
    max_parallel_calls = models.PositiveIntegerField(default=8)
    tool_surface = models.CharField(max_length=8, choices=ToolSurface.choices, default=ToolSurface.FULL)
    # Limits on what apps may ask of the platform (tenancy.entry.limits); 0 means no limit.
    key_requests_per_minute = models.PositiveIntegerField(
        "requests a minute per API key",
        default=60_000, help_text="API requests one API key may make in a minute (0: no limit).")
    tenant_requests_per_minute = models.PositiveIntegerField(
        "requests a minute for the tenant",
        default=120_000,
        help_text="API requests all of the tenant's keys and members may make in a minute (0: no limit).")
    key_calls_in_flight = models.PositiveIntegerField(
        "calls in flight per API key",
        default=500, help_text="Calls of one API key's sessions that may be received, queued or running at once "
                               "(0: no limit).")
    tenant_calls_in_flight = models.PositiveIntegerField(
        "calls in flight for the tenant",
        default=2_000, help_text="Calls of the tenant that may be received, queued or running at once (0: no limit).")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self):
        return self.slug


class Role(models.TextChoices):
    ADMIN = "admin"
    OPERATOR = "operator"
    REVIEWER = "reviewer"
    VIEWER = "viewer"


# The roles that may vote on approval requests.
REVIEW_ROLES = (Role.ADMIN, Role.OPERATOR, Role.REVIEWER)


class MembershipQuerySet(models.QuerySet):
    def for_tenant(self, tenant):
        return self.filter(tenant=tenant)


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(default=timezone.now)
    # Granted by the identity provider's role claim at a sign-in (tenancy.signin): the next sign-in whose claim no
    # longer names the tenant takes it away again. Invited and hand-made memberships are left to the admins.
    from_claim = models.BooleanField(default=False)

    # A membership is read across tenants (a person's tenants), so its manager does not fail closed; pages
    # reach one through `for_tenant` like any tenant-owned row.
    objects = MembershipQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_tenant")]

    def __str__(self):
        return f"{self.user} @ {self.tenant} ({self.role})"

    @property
    def can_operate(self) -> bool:
        return self.role in (Role.ADMIN, Role.OPERATOR)

    @property
    def can_review(self) -> bool:
        return self.role in REVIEW_ROLES


class Scope(models.TextChoices):
    AGENT = "agent"
    EXTERNAL = "external"
    ADMIN = "admin"


KEY_PREFIX = "tk_"
# The agent of each tenant's system session, where work operators start runs: no app may use it.
SYSTEM_AGENT = "toolkeeper"
SYSTEM_AGENT_RESERVED = f"{SYSTEM_AGENT!r} is reserved for the tenant's system session"


def is_system_agent(agent: str) -> bool:
    return (agent or "").strip().casefold() == SYSTEM_AGENT


def hash_secret(secret: str) -> str:
    # Keys are 32 random bytes: a fast hash is safe and keeps the per-request cost negligible.
    return hashlib.sha256(secret.encode()).hexdigest()


def split_key(token: str) -> tuple[str, str] | None:
    """(prefix, secret) of a token shaped like an API key (`tk_<prefix>_<secret>`), or None."""
    if not token.startswith(KEY_PREFIX):
        return None
    prefix, _, secret = token[len(KEY_PREFIX):].partition("_")
    return (prefix, secret) if prefix and secret else None


def new_key_material() -> tuple[str, str, str]:
    """Returns (prefix, secret, full key). The key is `tk_<prefix>_<secret>`."""
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return prefix, secret, f"{KEY_PREFIX}{prefix}_{secret}"


class ApiKey(TenantOwned):
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    agent = models.CharField(max_length=100, blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.name} ({KEY_PREFIX}{self.prefix}_…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes

    def touch(self):
        now = timezone.now()
        if self.last_used_at is None or (now - self.last_used_at).total_seconds() > 60:
            ApiKey.all_tenants.filter(pk=self.pk).update(last_used_at=now)
            self.last_used_at = now


class Profile(models.Model):
    """A person's own settings, beside the account (which keeps the email address)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True,
                                related_name="profile")
    name = models.CharField(max_length=150, blank=True)
    time_zone = models.CharField(max_length=64, blank=True)  # an IANA name; empty: the server's (UTC)

    def __str__(self):
        return self.name or str(self.user)


class Identity(models.Model):
    """A person's account at an OpenID provider (tenancy.signin), by the provider's issuer and its subject: the
    stable name the provider gives them, which a change of email address leaves as it is."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="identities")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    email = models.EmailField(max_length=254, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="one_account_per_identity")]
        verbose_name_plural = "identities"

    def __str__(self):
        return f"{self.subject} at {self.issuer}"


class ProviderSession(models.Model):
    """A console session begun by single sign-on, with the provider's id of the person's session there (`sid`),
    so that the provider's back-channel logout can end it (tenancy.signin)."""

    identity = models.ForeignKey(Identity, on_delete=models.CASCADE, related_name="sessions")
    sid = models.CharField(max_length=255, blank=True, db_index=True)
    session_key = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"console session of {self.identity}"


class InvitationState(models.TextChoices):
    PENDING = "pending"
    ACCEPTED = "accepted"
    REVOKED = "revoked"
    EXPIRED = "expired"


class Invitation(TenantOwned):
    """An invitation to join a tenant with a role, sent to an email address as a one-time link
    (tenancy.people.invitations); only a hash of the link's secret is kept."""

    email = models.EmailField(max_length=254)
    role = models.CharField(max_length=10, choices=Role.choices)
    secret_hash = models.CharField(max_length=64)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.email} ({self.role})"

    @property
    def state(self) -> str:
        if self.accepted_at is not None:
            return InvitationState.ACCEPTED
        if self.revoked_at is not None:
            return InvitationState.REVOKED
        if self.expires_at <= timezone.now():
            return InvitationState.EXPIRED
        return InvitationState.PENDING


class OAuthClient(models.Model):
    """An MCP client known to Toolkeeper's authorization server (tenancy.oauth): registered by itself (dynamic
    client registration), or named by the URL of its metadata document. Not a tenant's: a client is registered
    before anyone has chosen a tenant for it."""

    REGISTERED, DOCUMENT, EXTERNAL = "registered", "document", "external"  # EXTERNAL: another server's client

    client_id = models.CharField(max_length=255, unique=True)
    kind = models.CharField(max_length=10, default=REGISTERED)
    # the RFC 7591 metadata as registered (client_secret taken out: it is kept encrypted below)
    metadata = models.JSONField(default=dict)
    secret = EncryptedJSONField(null=True, blank=True)  # {"client_secret": …} of a confidential client; None: public
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    last_read_at = models.DateTimeField(null=True, blank=True)  # a metadata document's, when it was fetched

    def __str__(self):
        return self.metadata.get("client_name") or self.client_id

    @property
    def name(self) -> str:
        return str(self.metadata.get("client_name") or "an unnamed client")


class OAuthGrant(TenantOwned):
    """A person's consent that an MCP client acts for them as an agent of a tenant. The client's calls run under
    the grant's own API key (locked to the agent, never shown), so every limit and check of a key applies, and
    revoking the grant revokes the key: its open streams and waits end within seconds (tenancy.grants)."""

    client = models.ForeignKey(OAuthClient, on_delete=models.CASCADE, related_name="grants")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oauth_grants")
    api_key = models.OneToOneField(ApiKey, on_delete=models.CASCADE, related_name="oauth_grant")
    resource = models.CharField(max_length=500)  # the audience of its tokens: the MCP endpoint's URL
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.client} for {self.user} as {self.api_key.agent}"


class OAuthCode(TenantOwned):
    """An authorization code, between the person's consent and the client's token request: single use, a few
    minutes long, stored as a hash."""

    code_hash = models.CharField(max_length=64, unique=True)
    client = models.ForeignKey(OAuthClient, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    agent = models.CharField(max_length=100)
    scopes = models.JSONField(default=list)
    code_challenge = models.CharField(max_length=128)
    redirect_uri = models.TextField()
    redirect_uri_provided_explicitly = models.BooleanField(default=True)
    resource = models.CharField(max_length=500)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    grant = models.ForeignKey(OAuthGrant, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    def __str__(self):
        return f"code for {self.client} as {self.agent}"


class OAuthToken(models.Model):
    """An access or refresh token of a grant, stored as a hash. A refresh token is used once: the next one
    replaces it, and presenting a used one again revokes the grant (someone else has a copy)."""

    ACCESS, REFRESH = "access", "refresh"

    grant = models.ForeignKey(OAuthGrant, on_delete=models.CASCADE, related_name="tokens")
    kind = models.CharField(max_length=8)
    token_hash = models.CharField(max_length=64, unique=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)  # a refresh token that was exchanged
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"{self.kind} token of grant {self.grant_id}"
