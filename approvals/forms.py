"""Console forms of the inbox, the rules page and the queues page.

Querysets are always the tenant's: a queue or a reviewer from another tenant is not a valid choice.
The services validate again (they are the rule); these forms only turn text into values. The rule and
queue forms are `TenantForm`s, built by the generic views of `tenancy.editing`.
"""
import json
from datetime import timedelta

from django import forms
from django.contrib.auth import get_user_model

from approvals.channel_kinds import channel_kind_choices
from approvals.grants import DURATION_CHOICES, SCOPES
from approvals.models import NotifyEvent, Queue, RuleBehavior, VoteDecision
from approvals.notifications import CHANNEL_EVENTS, MIN_SECRET_CHARS
from common.json_values import json_parse
from common.outbound import OutboundRefused, check_url
from tenancy.editing import SecretInput
from tenancy.models import Membership
from tenancy.web import TenantForm

JSON_ROWS = 10


def parse_json(text: str, *, what: str = "JSON", want_object: bool = True):
    """The value of a JSON text, or a forms.ValidationError that says where it is broken (or why it could
    not be stored)."""
    try:
        value = json_parse(text)
    except ValueError as exc:
        raise forms.ValidationError(str(exc)) from exc
    if want_object and not isinstance(value, dict):
        raise forms.ValidationError(f"{what} must be a JSON object, like {{\"name\": \"value\"}}")
    return value


def _names(text: str) -> list[str]:
    """Names separated by commas or new lines; duplicates dropped, order kept."""
    seen = []
    for part in text.replace("\n", ",").split(","):
        name = part.strip()
        if name and name not in seen:
            seen.append(name)
    return seen


class InboxFilterForm(forms.Form):
    """The filters of the inbox and its history, offering `choices` (approvals.selectors.inbox_filter_choices).
    An agent or tool asked for stays a valid choice while nothing matches it (its last request was just
    decided); a queue must exist."""

    # The filter bar shows no labels: each select is named for screen readers.
    queue = forms.ChoiceField(required=False, widget=forms.Select(attrs={"aria-label": "Queue"}))
    agent = forms.ChoiceField(required=False, widget=forms.Select(attrs={"aria-label": "Agent"}))
    tool = forms.ChoiceField(required=False, widget=forms.Select(attrs={"aria-label": "Tool"}))

    def __init__(self, data=None, *, choices: dict[str, list[str]]):
        super().__init__(data)
        asked = data or {}
        for name in ("queue", "agent", "tool"):
            names = choices[name]
            if name != "queue":
                names = sorted({*names, asked.get(name, "")} - {""})
            self.fields[name].choices = [("", f"any {name}"), *((value, value) for value in names)]

    def filters(self) -> dict[str, str]:
        """The filters chosen, for approvals.selectors.inbox_requests (none when the form is invalid)."""
        if not (self.is_bound and self.is_valid()):
            return {}
        return {name: value for name, value in self.cleaned_data.items() if value}


class BulkDecisionForm(forms.Form):
    """Approve or reject the requests ticked in the inbox list, in one post. The button pressed names the
    decision; `ids` are the ticked rows; `seen` holds `<id>:<digest>` for each row whose whole input the list
    showed (`approvals.selectors.input_digest`): an approval runs only the input the reviewer was shown."""

    decision = forms.ChoiceField(choices=[(VoteDecision.APPROVE, "Approve"), (VoteDecision.REJECT, "Reject")])
    message = forms.CharField(required=False, max_length=10000, label="Message for the model",
                              widget=forms.Textarea(attrs={"rows": 1, "placeholder": "Why (rejecting: the model "
                                                                                     "reads it)"}))

    def clean(self):
        data = super().clean()
        data["ids"] = self.data.getlist("ids") if hasattr(self.data, "getlist") else []
        seen = {}
        for entry in self.data.getlist("seen") if hasattr(self.data, "getlist") else []:
            key, _, digest = str(entry).partition(":")
            if key.isascii() and key.isdigit() and len(key) <= 18:
                seen[int(key)] = digest
        data["seen"] = seen
        data["message"] = data.get("message", "").strip()
        return data


class DecisionForm(forms.Form):
    """One reviewer's decision. The submit button that was pressed names the decision."""

    decision = forms.ChoiceField(choices=VoteDecision.choices)
    input = forms.CharField(required=False, label="Input (JSON)", strip=False,
                            widget=forms.Textarea(attrs={"rows": JSON_ROWS, "spellcheck": "false"}),
                            help_text="Change it and press Approve (or Edit): the call runs with your input, "
                                      "validated against the tool's schema.")
    message = forms.CharField(required=False, max_length=10000, label="Message",
                              widget=forms.Textarea(attrs={"rows": 3}),
                              help_text="Reject: why (the model reads it). Respond: your answer, "
                                        "which becomes the call's result.")
    add_rule = forms.BooleanField(required=False)
    narrow_to_input = forms.BooleanField(required=False)
    # A grant with the approval (approvals.grants): once (none), this session, a while, inputs like this one.
    grant_scope = forms.ChoiceField(choices=[(scope, scope) for scope in SCOPES], required=False, initial="once")
    grant_duration = forms.TypedChoiceField(choices=[(str(s), label) for s, label in DURATION_CHOICES], coerce=int,
                                            required=False, empty_value=None, initial=str(DURATION_CHOICES[1][0]))
    grant_pattern = forms.CharField(required=False, strip=False, label="Inputs like (JSON)",
                                    widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
                                    help_text='argument → glob (or list of globs), as a rule\'s conditions: '
                                              '{"command": "git push *"}')

    def __init__(self, *args, original_input=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.original_input = original_input

    def grant(self) -> dict | None:
        """The grant asked for, as `services.request_decide` takes it (None: approve once)."""
        data = self.cleaned_data
        scope = data.get("grant_scope") or "once"
        if scope == "once" or data.get("decision") not in (VoteDecision.APPROVE, VoteDecision.EDIT):
            return None
        spec = {"scope": scope}
        if scope == "duration" or (scope == "pattern" and data.get("grant_duration")):
            spec["duration_s"] = data.get("grant_duration")
        if scope == "pattern":
            spec["arg_match"] = data.get("grant_arg_match") or {}
        return spec

    def clean_grant_pattern(self):
        text = self.cleaned_data["grant_pattern"]
        if self.data.get("grant_scope") != "pattern":
            return text
        if not text.strip():
            raise forms.ValidationError("write the pattern inputs must match")
        return text

    def clean(self):
        data = super().clean()
        decision = data.get("decision")
        text = data.get("input", "")
        data["new_input"] = None
        if decision in (VoteDecision.APPROVE, VoteDecision.EDIT) and text.strip():
            try:
                new_input = parse_json(text, what="the input")
            except forms.ValidationError as exc:
                self.add_error("input", exc)
                return data
            if decision == VoteDecision.EDIT or new_input != self.original_input:
                # Approving an input the reviewer changed is an edit: what runs is what they saw.
                data["decision"] = VoteDecision.EDIT
                data["new_input"] = new_input
        elif decision == VoteDecision.EDIT:
            self.add_error("input", "an edit needs the new input")
        if decision == VoteDecision.RESPOND and not data.get("message", "").strip():
            self.add_error("message", "write the answer the model should get")
        if data.get("grant_scope") == "pattern" and data.get("grant_pattern", "").strip():
            try:
                data["grant_arg_match"] = parse_json(data["grant_pattern"], what="the pattern")
            except forms.ValidationError as exc:
                self.add_error("grant_pattern", exc)
        return data


class ExternalResultForm(forms.Form):
    text = forms.CharField(required=False, max_length=100000, label="Result text",
                           widget=forms.Textarea(attrs={"rows": 3}))
    structured = forms.CharField(required=False, label="Structured result (optional JSON)", strip=False,
                                 widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}))
    state = forms.ChoiceField(choices=[("success", "success"), ("error", "error")], initial="success",
                              widget=forms.RadioSelect)

    def clean_structured(self):
        text = self.cleaned_data["structured"]
        if not text.strip():
            return None
        return parse_json(text, want_object=False)

    def clean(self):
        data = super().clean()
        if not data.get("text", "").strip() and data.get("structured") is None and not self.errors:
            raise forms.ValidationError("give a result text, a structured result, or both")
        return data


class RuleForm(TenantForm):
    behavior = forms.ChoiceField(choices=RuleBehavior.choices)
    tool_pattern = forms.CharField(max_length=200, label="Tool pattern",
                                   help_text="An exact tool name, or a glob with *, e.g. mcp__github__*")
    arg_match = forms.CharField(required=False, label="Argument match (JSON)", strip=False,
                                widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
                                help_text='Argument → glob or list of globs, matched on the effective input, '
                                          'e.g. {"command": "git *"}. Whole words; no * means exact.')
    agents = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                             help_text="Agent names, comma or line separated. Empty: every agent.")
    users = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                            help_text="Session users, comma or line separated. Empty: every user.")
    user_verified = forms.TypedChoiceField(
        label="Verified user", required=False, empty_value=None,
        coerce=lambda value: {"yes": True, "no": False}.get(value),
        choices=[("", "either"), ("yes", "only a verified user"), ("no", "only a user not verified")],
        help_text="A verified user signed in through Toolkeeper (an MCP client with OAuth) or was vouched for by "
                  "an ID token; other users are names an app asserts.")
    queue = forms.ModelChoiceField(queryset=Queue.objects.none(), required=False, empty_label="the default queue",
                                   help_text="Where an ask rule's requests go. A confirm rule with a queue opens a "
                                             "request there once the session's user confirms; without one, the "
                                             "user's confirmation is enough.")
    priority = forms.IntegerField(initial=0, min_value=-1000000, max_value=1000000,
                                  help_text="Higher wins among rules of the same behavior.")
    enabled = forms.BooleanField(required=False, initial=True)
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                           help_text="Shown in the explanation of every decision this rule makes.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["queue"].queryset = Queue.objects.for_tenant(self.tenant).order_by("name")

    def clean_tool_pattern(self):
        return self.cleaned_data["tool_pattern"].strip()

    def clean_arg_match(self):
        text = self.cleaned_data["arg_match"]
        return parse_json(text, what="the argument match") if text.strip() else {}

    def clean_agents(self):
        return _names(self.cleaned_data["agents"])

    def clean_users(self):
        return _names(self.cleaned_data["users"])

    def initial_for(self, rule) -> dict:
        return {
            "behavior": rule.behavior, "tool_pattern": rule.tool_pattern,
            "arg_match": json.dumps(rule.arg_match, indent=2) if rule.arg_match else "",
            "agents": ", ".join(rule.agents or []), "users": ", ".join(rule.users or []),
            "user_verified": {True: "yes", False: "no"}.get(rule.user_verified, ""), "queue": rule.queue_id,
            "priority": rule.priority, "enabled": rule.enabled, "note": rule.note,
        }


class SimulatorForm(forms.Form):
    tool = forms.CharField(max_length=128)
    input = forms.CharField(required=False, label="Input (JSON)", strip=False,
                            widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
                            help_text="As the model would send it; the agent's bound arguments are applied.")
    agent = forms.CharField(max_length=100, required=False)
    user = forms.CharField(max_length=200, required=False, label="Session user")
    session = forms.UUIDField(required=False, label="Session (id)",
                              help_text="Its grants apply too; agent and user default to the session's.")

    def clean_tool(self):
        return self.cleaned_data["tool"].strip()

    def clean_input(self):
        text = self.cleaned_data["input"]
        return parse_json(text, what="the input") if text.strip() else {}

    def clean_agent(self):
        return self.cleaned_data["agent"].strip()

    def clean_user(self):
        return self.cleaned_data["user"].strip()


class _MemberChoices(forms.ModelMultipleChoiceField):
    def label_from_instance(self, user):
        return user.get_username()


class QueueForm(TenantForm):
    name = forms.SlugField(max_length=64, help_text="Letters, digits, - and _. Rules name their queue.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    reviewers = _MemberChoices(queryset=get_user_model().objects.none(), required=False,
                               widget=forms.CheckboxSelectMultiple,
                               help_text="None chosen: every reviewer, operator and admin of the tenant.")
    required_approvals = forms.IntegerField(min_value=1, max_value=20, initial=1,
                                            help_text="Distinct reviewers who must approve.")
    four_eyes = forms.BooleanField(required=False,
                                   help_text="Nobody may decide a call made in a session of their own.")
    verified_requesters = forms.BooleanField(
        required=False, label="Verified requesters only",
        help_text="Approve only calls whose user Toolkeeper verified (an MCP client's signed-in person, an ID "
                  "token), so four-eyes cannot be dodged by an app naming someone else; others can only be denied.")
    expires_after_minutes = forms.IntegerField(required=False, min_value=1, max_value=90 * 24 * 60,
                                               label="Expires after (minutes)",
                                               help_text="Empty: never. Expired requests are rejected for the model.")
    escalate_after_minutes = forms.IntegerField(required=False, min_value=1, max_value=90 * 24 * 60,
                                                label="Escalate after (minutes)",
                                                help_text="Empty: never. Then the escalation reviewers may decide too.")
    escalation_reviewers = _MemberChoices(queryset=get_user_model().objects.none(), required=False,
                                          widget=forms.CheckboxSelectMultiple)
    is_default = forms.BooleanField(required=False, label="Default queue",
                                    help_text="Requests whose rule names no queue go here.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        members = Membership.objects.filter(tenant=self.tenant).values("user_id")
        users = get_user_model().objects.filter(pk__in=members).order_by("username")
        self.fields["reviewers"].queryset = users
        self.fields["escalation_reviewers"].queryset = users

    def service_values(self) -> dict:
        """The cleaned data in the shape approvals.services.queue_save takes."""
        data = dict(self.cleaned_data)
        for name in ("expires_after", "escalate_after"):
            minutes = data.pop(f"{name}_minutes")
            if self.instance is not None and f"{name}_minutes" not in self.changed_data:
                data[name] = getattr(self.instance, name)  # untouched: keep it exactly (it may hold seconds)
            else:
                data[name] = timedelta(minutes=minutes) if minutes else None
        return data

    def initial_for(self, queue) -> dict:
        def minutes(value):
            return max(1, round(value.total_seconds() / 60)) if value else None

        return {
            "name": queue.name, "description": queue.description, "reviewers": list(queue.reviewers.all()),
            "required_approvals": queue.required_approvals, "four_eyes": queue.four_eyes,
            "verified_requesters": queue.verified_requesters,
            "expires_after_minutes": minutes(queue.expires_after),
            "escalate_after_minutes": minutes(queue.escalate_after),
            "escalation_reviewers": list(queue.escalation_reviewers.all()), "is_default": queue.is_default,
        }


class ChannelForm(forms.Form):
    """A queue's notification channel. The URL and the secret are write-only: left empty, they stay as they are."""

    name = forms.SlugField(max_length=64)
    kind = forms.ChoiceField(choices=channel_kind_choices)
    url = forms.CharField(required=False, max_length=2000, label="URL", widget=SecretInput(attrs={"type": "url"}),
                          help_text="Webhooks only: a public https address. Never shown again (a Slack URL holds "
                                    "its token).")
    signing_secret = forms.CharField(required=False, min_length=MIN_SECRET_CHARS, max_length=200,
                                     widget=forms.PasswordInput,
                                     help_text=f"Webhooks sign each body with it (HMAC-SHA256): at least "
                                               f"{MIN_SECRET_CHARS} characters. Never shown again.")
    slack_signing_secret = forms.CharField(
        required=False, min_length=MIN_SECRET_CHARS, max_length=200, widget=forms.PasswordInput,
        label="Slack signing secret",
        help_text="Slack channels only: your Slack app's signing secret makes messages interactive (Approve, Reject, "
                  "View input); point the app's interactivity request URL at the address shown for the channel. "
                  "Never shown again.")
    events = forms.MultipleChoiceField(choices=[(e, NotifyEvent(e).label) for e in CHANNEL_EVENTS],
                                       widget=forms.CheckboxSelectMultiple)
    quiet_from = forms.TimeField(required=False, widget=forms.TimeInput(attrs={"type": "time"}, format="%H:%M"),
                                 help_text="Quiet hours, in UTC: messages wait until they end.")
    quiet_until = forms.TimeField(required=False, widget=forms.TimeInput(attrs={"type": "time"}, format="%H:%M"),
                                  help_text="Both or neither.")
    action_links = forms.BooleanField(required=False, label="one-time approve and reject links in messages")
    enabled = forms.BooleanField(required=False, initial=True)

    def clean_url(self):
        url = self.cleaned_data["url"].strip()
        if url:
            try:
                check_url(url)  # said with the other fields' errors, not after them (the service checks again)
            except OutboundRefused as exc:
                raise forms.ValidationError(str(exc)) from exc
        return url

    def clean(self):
        cleaned = super().clean()
        if (cleaned.get("quiet_from") is None) != (cleaned.get("quiet_until") is None) and \
                "quiet_from" not in self.errors and "quiet_until" not in self.errors:
            self.add_error("quiet_until", "quiet hours need both a start and an end")
        return cleaned


class ReviewerNotifyForm(forms.Form):
    muted = forms.BooleanField(required=False, label="mute every notification to me")
    excluded = forms.ModelMultipleChoiceField(queryset=None, required=False, widget=forms.CheckboxSelectMultiple,
                                              label="no email from these channels")

    def __init__(self, *args, channels, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["excluded"].queryset = channels
