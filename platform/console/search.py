"""The header's search box: what a text names among a tenant's calls, sessions, tools and approval requests.

An id finds its object (a call's id or the id its app gave it, a session's id, a request's number); a name
finds tools by part of their name and the sessions of an agent or a user of that name. Each kind gives at
most `FOUND_MAX` answers, one query each, however large the tenant.
"""
import uuid
from dataclasses import dataclass
from urllib.parse import urlencode

from django.db.models import Q
from django.urls import reverse

from approvals.models import ApprovalRequest
from tools.models import AgentSession, Tool, ToolCall

FOUND_MAX = 20
SEARCH_MAX = 200  # characters of the text looked for


@dataclass(frozen=True)
class Found:
    kind: str  # "call", "session", "sessions", "tool", "request"
    label: str
    detail: str
    url: str


def uuid_or_none(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _calls(tenant, text: str, pk) -> list[Found]:
    calls = ToolCall.objects.for_tenant(tenant).select_related("session").only(
        "pk", "call_id", "tool_name", "status", "session__agent")
    matched = calls.filter(Q(call_id=text) | Q(pk=pk)) if pk else calls.filter(call_id=text)
    return [Found("call", call.call_id, f"{call.tool_name} · {call.status} · {call.session.agent}",
                  reverse("console:call_detail", kwargs={"tenant": tenant.slug, "call_id": call.pk}))
            for call in matched.order_by("-created_at")[:FOUND_MAX]]


def _session(tenant, pk) -> list[Found]:
    return [Found("session", session.agent, session.user or "no user",
                  reverse("console:session_detail", kwargs={"tenant": tenant.slug, "session_id": session.pk}))
            for session in AgentSession.objects.for_tenant(tenant).filter(pk=pk).only("pk", "agent", "user")]


def _sessions_of(tenant, text: str) -> list[Found]:
    """The sessions of an agent or a user named exactly so, as links to the filtered session list."""
    sessions = AgentSession.objects.for_tenant(tenant)
    found = []
    for field in ("agent", "user"):
        if sessions.filter(**{field: text}).exists():
            url = reverse("console:session_list", kwargs={"tenant": tenant.slug}) + "?" + urlencode({field: text})
            found.append(Found("sessions", text, f"the sessions of the {field} {text}", url))
    return found


def _tools(tenant, text: str) -> list[Found]:
    tools = Tool.objects.for_tenant(tenant).filter(name__icontains=text).only("pk", "name", "source", "enabled")
    exact_first = sorted(tools.order_by("name")[:FOUND_MAX], key=lambda tool: tool.name != text)
    return [Found("tool", tool.name, tool.source + ("" if tool.enabled else " · disabled"),
                  reverse("console:tool_detail", kwargs={"tenant": tenant.slug, "tool_id": tool.pk}))
            for tool in exact_first]


def _request(tenant, text: str) -> list[Found]:
    number = int(text) if text.isascii() and text.isdigit() and len(text) < 19 else None
    if number is None:
        return []
    requests = ApprovalRequest.objects.for_tenant(tenant).filter(pk=number).select_related("call")
    return [Found("request", f"request {request.pk}", f"{request.call.tool_name} · {request.status}",
                  reverse("inbox:inbox_request", kwargs={"tenant": tenant.slug, "request_id": request.pk}))
            for request in requests]


def find(tenant, text: str) -> list[Found]:
    """What `text` names in the tenant, calls first."""
    text = text.strip()[:SEARCH_MAX]
    if not text:
        return []
    pk = uuid_or_none(text)
    found = _calls(tenant, text, pk)
    if pk:
        return found + _session(tenant, pk)
    return found + _request(tenant, text) + _tools(tenant, text) + _sessions_of(tenant, text)
