"""Built-in tools every tenant has. Loaded by the app's `ready`; they use the services like any other code."""
from datetime import datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.utils import timezone as django_timezone
from pydantic import BaseModel, Field

from tools.catalog.selectors import call_history_day
from tools.catalog.services import session_todos_replace
from tools.python.decorators import ToolContext, ToolError, tool


@tool(kind="builtin", read_only=True, idempotent=True, timeout=5, groups=("basic",))
def current_time(timezone: str = "UTC") -> dict:
    """The current date and time in a time zone.

    Args:
        timezone: An IANA time zone name such as "Europe/Berlin" or "America/New_York".
    """
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ToolError(
            f"unknown time zone {timezone!r}: use an IANA name such as 'Europe/Berlin'",
            error_type="InvalidTimezone",
        ) from exc
    now = datetime.now(zone)
    return {
        "timezone": timezone,
        "iso": now.isoformat(timespec="seconds"),
        "date": now.date().isoformat(),
        "time": now.strftime("%H:%M:%S"),
        "weekday": now.strftime("%A"),
        "utc_offset": now.strftime("%z"),
    }


class Todo(BaseModel):
    content: str = Field(min_length=1, max_length=500, description="What to do, in the imperative.")
    status: Literal["pending", "in_progress", "completed"] = Field(description="Where the task stands.")


@tool(kind="builtin", concurrency_safe=False, timeout=5, groups=("basic",))
def todo_write(todos: list[Todo], ctx: ToolContext) -> dict:
    """Replace the session's task list with this one. Send the whole list every time: tasks left out are dropped.

    Keep at most one task in_progress, and mark tasks completed as soon as they are done.

    Args:
        todos: The complete, updated task list.
    """
    if sum(1 for todo in todos if todo.status == "in_progress") > 1:
        raise ToolError("at most one task may be in_progress", error_type="InvalidInput")
    saved = session_todos_replace(session=ctx.session, todos=[todo.model_dump() for todo in todos])
    counts = {status: sum(1 for t in saved if t["status"] == status)
              for status in ("pending", "in_progress", "completed")}
    return {"todos": saved, "counts": counts}


@tool(kind="builtin", read_only=True, idempotent=True, timeout=600, groups=("reports",))
def call_history_report(days: int = 7, ctx: ToolContext = None) -> dict:
    """Summarise this tenant's tool calls over the last days (UTC): volume, outcomes and durations per tool.

    Works through the history day by day and reports progress as it goes.

    Args:
        days: How many days back to cover, 1 to 90.
    """
    if not 1 <= days <= 90:
        raise ToolError("days must be between 1 and 90", error_type="InvalidInput")
    today = django_timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    per_tool: dict[str, dict] = {}
    per_day = []
    for index in range(days):
        ctx.check_cancelled()
        day_start = today - timedelta(days=index)
        rows = call_history_day(tenant=ctx.tenant, start=day_start, end=day_start + timedelta(days=1))
        for row in rows:
            stats = per_tool.setdefault(row["tool_name"], {"calls": 0, "succeeded": 0, "failed": 0, "other": 0,
                                                           "total_ms": 0.0, "timed": 0})
            stats["calls"] += row["n"]
            bucket = row["status"] if row["status"] in ("succeeded", "failed") else "other"
            stats[bucket] += row["n"]
            if row["total_ms"] is not None:
                stats["total_ms"] += row["total_ms"]
                stats["timed"] += row["timed"]
        day_calls = sum(row["n"] for row in rows)
        per_day.append({"day": day_start.date().isoformat(), "calls": day_calls})
        ctx.emit(f"{per_day[-1]['day']}: {day_calls} calls", progress=(index + 1) / days)
    tools_summary = {
        name: {"calls": s["calls"], "succeeded": s["succeeded"], "failed": s["failed"], "other": s["other"],
               "success_rate": round(s["succeeded"] / s["calls"], 3) if s["calls"] else None,
               "avg_ms": round(s["total_ms"] / s["timed"], 1) if s["timed"] else None}
        for name, s in sorted(per_tool.items(), key=lambda item: -item[1]["calls"])
    }
    return {"days": days, "total_calls": sum(d["calls"] for d in per_day), "per_tool": tools_summary,
            "per_day": list(reversed(per_day))}
