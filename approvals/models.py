from django.conf import settings
from django.db import models

from common.secrets import EncryptedJSONField
from tenancy.scoping import TenantOwned


class RuleBehavior(models.TextChoices):
    """What a rule does with the calls it matches: the tenant's default behaviours, and `confirm` (the session's
    own user is asked first, docs/governance.md#permission-rules)."""

    ASK = "ask"
    DENY = "deny"
    ALLOW = "allow"
    CONFIRM = "confirm"


class PermissionRule(TenantOwned):
    """allow / deny / ask / confirm for calls whose tool, scope and effective input match (docs/governance.md)."""

    behavior = models.CharField(max_length=8, choices=RuleBehavior.choices)
    tool_pattern = models.CharField(max_length=200, help_text="exact name, or a glob with *, e.g. mcp__github__*")
    arg_match = models.JSONField(default=dict, blank=True,
                                 help_text='argument → glob (or list of globs), e.g. {"command": "git *"}')
    agents = models.JSONField(default=list, blank=True, help_text="agent names; empty means every agent")
    users = models.JSONField(default=list, blank=True, help_text="session users; empty means every user")
    user_verified = models.BooleanField(
        null=True, blank=True, default=None,
        help_text="true: only calls of a user Toolkeeper verified; false: only calls without one; null: either")
    queue = models.ForeignKey("approvals.Queue", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="rules")
    priority = models.IntegerField(default=0, help_text="higher wins among rules of the same behavior")
    enabled = models.BooleanField(default=True)
    note = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-priority", "id"]
        indexes = [models.Index(fields=["tenant", "enabled"])]

    def __str__(self):
        return f"{self.behavior} {self.tool_pattern}"


class PolicyVersion(TenantOwned):
    """Bumped with every rule change, so each process knows when its compiled rule index is stale."""

    version = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant"], name="one_policy_version_per_tenant")]


class Queue(TenantOwned):
    name = models.SlugField(max_length=64)
    description = models.TextField(blank=True, default="")
    reviewers = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="review_queues",
                                       help_text="empty: every reviewer of the tenant")
    required_approvals = models.PositiveSmallIntegerField(default=1)
    four_eyes = models.BooleanField(default=False, help_text="a reviewer may not approve their own session's call")
    verified_requesters = models.BooleanField(
        default=False, help_text="calls are approved only when their user is verified, not merely named by the app")
    expires_after = models.DurationField(null=True, blank=True)
    escalate_after = models.DurationField(null=True, blank=True)
    escalation_reviewers = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True,
                                                  related_name="escalation_queues")
    is_default = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="queue_name_per_tenant"),
            models.UniqueConstraint(fields=["tenant"], condition=models.Q(is_default=True),
                                    name="one_default_queue_per_tenant"),
        ]

    def __str__(self):
        return self.name


class RequestStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    RESPONDED = "responded"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class RequestKind(models.TextChoices):
    APPROVAL = "approval"
    EXTERNAL = "external"


class ApprovalRequest(TenantOwned):
    call = models.OneToOneField("tools.ToolCall", on_delete=models.CASCADE, related_name="approval_request")
    queue = models.ForeignKey(Queue, null=True, blank=True, on_delete=models.SET_NULL, related_name="requests")
    kind = models.CharField(max_length=10, choices=RequestKind.choices, default=RequestKind.APPROVAL)
    status = models.CharField(max_length=10, choices=RequestStatus.choices, default=RequestStatus.PENDING)
    rule = models.ForeignKey(PermissionRule, null=True, blank=True, on_delete=models.SET_NULL)
    reason = models.TextField(blank=True, default="")
    opened_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    escalate_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    expiry_noticed_at = models.DateTimeField(null=True, blank=True, help_text="listed in an expiry digest")
    # Denormalized from the call so the inbox filters and sorts without joins.
    agent = models.CharField(max_length=100, blank=True, default="")
    tool_name = models.CharField(max_length=128, blank=True, default="")

    class Meta:
        ordering = ["opened_at", "id"]
        indexes = [
            models.Index(fields=["tenant", "status", "opened_at"]),
            models.Index(fields=["status", "expires_at"]),
            models.Index(fields=["status", "escalate_at"]),
        ]

    def __str__(self):
        return f"{self.kind} {self.tool_name} ({self.status})"


class VoteDecision(models.TextChoices):
    APPROVE = "approve"
    EDIT = "edit"
    REJECT = "reject"
    RESPOND = "respond"


class Vote(TenantOwned):
    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="votes")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    reviewer_label = models.CharField(max_length=150)
    decision = models.CharField(max_length=8, choices=VoteDecision.choices)
    input = models.JSONField(null=True, blank=True)
    message = models.TextField(blank=True, default="")
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["request", "reviewer_label"], name="one_vote_per_reviewer"),
        ]
        # A request's votes, read by each decision: with only the single-column indexes, SQLite's planner took
        # the tenant's and read every vote the tenant ever cast (docs/performance.md, "Flat with history").
        indexes = [models.Index(fields=["tenant", "request"])]

    def __str__(self):
        return f"{self.reviewer_label}: {self.decision}"


# --- notifications (approvals.notifications) ---------------------------------------------------

class NotifyEvent(models.TextChoices):
    REQUESTED = "requested", "new request"
    ESCALATED = "escalated", "escalation"
    EXPIRING = "expiring", "expiry soon (digest)"
    DECIDED = "decided", "decided"
    EXTERNAL = "external", "external task waiting"
    DEFINITION = "definition", "a tool's definition changed (for operators)"
    TEST = "test", "test notification"


class NotificationChannel(TenantOwned):
    """Where a queue's events are sent. A webhook's URL and signing secret are credentials (a Slack URL holds its
    token): stored encrypted in `target`, never shown back; `host` is what the console shows of the URL."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="channels")
    name = models.SlugField(max_length=64)
    kind = models.CharField(max_length=32, help_text="a registered channel kind (approvals.channel_kinds)")
    target = EncryptedJSONField(null=True, blank=True)
    host = models.CharField(max_length=255, blank=True, default="")
    events = models.JSONField(default=list, help_text="which of the queue's events this channel is sent")
    quiet_from = models.TimeField(null=True, blank=True, help_text="quiet hours start (server time)")
    quiet_until = models.TimeField(null=True, blank=True, help_text="quiet hours end (server time)")
    action_links = models.BooleanField(default=False, help_text="one-time approve and reject links in messages")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    public_id = models.UUIDField(null=True, blank=True, unique=True, editable=False,
                                 help_text="a Slack channel's interaction URL names it (approvals.slack)")

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["queue", "name"], name="channel_name_per_queue")]

    def __str__(self):
        return self.name


class ReviewerNotifySetting(TenantOwned):
    """A reviewer's own choice: no messages at all, or none from some of their queues' email channels."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notify_settings")
    muted = models.BooleanField(default=False)
    excluded = models.ManyToManyField(NotificationChannel, blank=True, related_name="excluded_by")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "user"], name="one_notify_setting_per_member")]


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    SENDING = "sending"
    SENT = "sent"
    FAILED = "failed"


class Notification(TenantOwned):
    """One message to one channel (and, for email, one address): written with the change it tells of, sent after
    commit, retried with backoff. The queue's delivery log."""

    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="deliveries")
    request = models.ForeignKey(ApprovalRequest, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="notifications")
    event = models.CharField(max_length=10, choices=NotifyEvent.choices)
    key = models.CharField(max_length=200, help_text="what this message tells of: written once per channel")
    recipient = models.CharField(max_length=254, blank=True, default="")
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=8, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    lease_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["channel", "key", "recipient"], name="one_message_per_key")]
        indexes = [models.Index(fields=["status", "next_attempt_at"])]

    def __str__(self):
        return f"{self.event} → {self.channel} ({self.status})"


class DecisionLink(TenantOwned):
    """A one-time approve or reject link sent in a message, as a signed token of its id (approvals.decision_links);
    it acts only for a logged-in reviewer allowed to decide, while the request is pending."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="links")
    decision = models.CharField(max_length=8, choices=[("approve", "approve"), ("reject", "reject")])
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             help_text="the only reviewer it acts for (email); empty: any reviewer (shared channels)")
    created_at = models.DateTimeField(auto_now_add=True)
    used_at = models.DateTimeField(null=True, blank=True)


# --- grants (approvals.grants) -----------------------------------------------------------------

class GrantScope(models.TextChoices):
    SESSION = "session", "this session"
    DURATION = "duration", "for a while"
    PATTERN = "pattern", "inputs like this one"


class Grant(TenantOwned):
    """A reviewer's approval that lets more calls through without asking again (docs/governance.md, Grants): calls
    of one tool by one agent (in one session, for `session` scope) whose effective input matches `arg_match`, while
    the rules would ask the way they asked the call it was given for (`ask_rule`), until it expires or is revoked."""

    agent = models.CharField(max_length=100)
    tool_name = models.CharField(max_length=128)
    scope = models.CharField(max_length=10, choices=GrantScope.choices)
    session = models.ForeignKey("tools.AgentSession", null=True, blank=True, on_delete=models.CASCADE,
                                related_name="grants")
    arg_match = models.JSONField(default=dict, blank=True, help_text="as a rule's arg_match; empty: any input")
    # The ask rule of the request it was given for (null: the tenant's default asked): it stands in for that rule
    # only. A plain id, so a deleted rule's grants stop matching instead of standing in for the default.
    ask_rule = models.IntegerField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="empty only for a session's grant")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_by_label = models.CharField(max_length=150)
    created_from = models.ForeignKey(ApprovalRequest, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="grants")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    revoked_by_label = models.CharField(max_length=150, blank=True, default="")
    uses = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "agent", "tool_name"], condition=models.Q(revoked_at__isnull=True),
                                name="grant_in_force")]
        constraints = [models.CheckConstraint(
            condition=models.Q(expires_at__isnull=False) | models.Q(session__isnull=False),
            name="grant_expires_unless_session")]

    def __str__(self):
        return f"grant #{self.pk} {self.tool_name} for {self.agent} ({self.scope})"


# --- decisions from Slack (approvals.slack) ------------------------------------------------------

class SlackIdentity(TenantOwned):
    """A Slack user (workspace and user id) linked to a member of the tenant, once, through a signed link."""

    team_id = models.CharField(max_length=32)
    slack_user_id = models.CharField(max_length=32)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_identities")
    linked_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["linked_at", "id"]
        constraints = [models.UniqueConstraint(fields=["tenant", "team_id", "slack_user_id"],
                                               name="one_member_per_slack_user")]

    def __str__(self):
        return f"{self.team_id}/{self.slack_user_id}"


class SlackLink(TenantOwned):
    """A single-use link offered to an unlinked Slack user, as a signed token of its id (approvals.slack)."""

    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="slack_links")
    team_id = models.CharField(max_length=32)
    slack_user_id = models.CharField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)
    used_at = models.DateTimeField(null=True, blank=True)


class SlackSeenRequest(TenantOwned):
    """A signed Slack request already acted on: the same signature again within the window is a replay."""

    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="slack_seen")
    signature = models.CharField(max_length=64, help_text="SHA-256 of the request's signature")
    seen_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["channel", "signature"], name="slack_request_seen_once")]
        indexes = [models.Index(fields=["seen_at"])]
