"""Calls and approval requests made at chosen times, for the activity page's tests: rows written directly
(the page reads what the pipeline wrote; how it got there is the pipeline's tests' concern)."""
import uuid
from datetime import timedelta

from django.db.models import F

from approvals.models import ApprovalRequest, Queue, RequestStatus
from tools.catalog.services import session_create
from tools.models import CallStatus, McpServer, Tool, ToolCall

RAN = frozenset({CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.TIMED_OUT, CallStatus.INTERRUPTED,
                 CallStatus.RUNNING})


def calls_make(tenant, specs, *, session=None) -> list[ToolCall]:
    """One call per spec {"at", "tool" or "name", "status", "took" (seconds, received → finished), "ran"}, in one
    INSERT and one UPDATE (created_at is set on insert: it goes through dispatched_at)."""
    session = session or session_create(tenant=tenant, agent="activity-bot")
    rows = []
    for spec in specs:
        status = spec.get("status", CallStatus.SUCCEEDED)
        at, took = spec["at"], spec.get("took")
        ran = spec.get("ran", status in RAN)
        tool = spec.get("tool")
        rows.append(ToolCall(
            tenant=tenant, session=session, call_id=f"c_{uuid.uuid4().hex}", tool=tool,
            tool_name=spec.get("name") or tool.name, status=status, dispatched_at=at,
            started_at=at if ran else None, finished_at=at + timedelta(seconds=took) if took is not None else None))
    made = ToolCall.objects.bulk_create(rows)
    ToolCall.objects.for_tenant(tenant).filter(pk__in=[c.pk for c in made]).update(created_at=F("dispatched_at"))
    return made


def request_make(tenant, call, *, queue, opened, waited=None, status=None) -> ApprovalRequest:
    """An approval request of `call` opened at `opened`, decided `waited` seconds later (pending without)."""
    status = status or (RequestStatus.PENDING if waited is None else RequestStatus.APPROVED)
    request = ApprovalRequest.objects.create(tenant=tenant, call=call, queue=queue, status=status,
                                             tool_name=call.tool_name)
    ApprovalRequest.objects.for_tenant(tenant).filter(pk=request.pk).update(
        opened_at=opened, decided_at=opened + timedelta(seconds=waited) if waited is not None else None)
    return request


def queue_make(tenant, name: str) -> Queue:
    return Queue.objects.create(tenant=tenant, name=name)


def mcp_tool(tenant, server_name: str, tool: str) -> Tool:
    server, _ = McpServer.objects.get_or_create(tenant=tenant, name=server_name, defaults={
        "transport": "streamable_http", "url": f"https://{server_name}.example.com/mcp"})
    return Tool.objects.create(tenant=tenant, name=f"mcp__{server_name}__{tool}", source="mcp", mcp_server=server,
                               input_schema={"type": "object", "properties": {}})


def http_tool(tenant, name: str) -> Tool:
    return Tool.objects.create(tenant=tenant, name=name, source="http", input_schema={"type": "object",
                                                                                      "properties": {}})
