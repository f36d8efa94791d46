"""Built-in tools every tenant has."""
from datetime import datetime
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field

from .decorators import ToolContext, ToolError, tool


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
    from .services import session_todos_replace

    if sum(1 for todo in todos if todo.status == "in_progress") > 1:
        raise ToolError("at most one task may be in_progress", error_type="InvalidInput")
    saved = session_todos_replace(session=ctx.session, todos=[todo.model_dump() for todo in todos])
    counts = {status: sum(1 for t in saved if t["status"] == status)
              for status in ("pending", "in_progress", "completed")}
    return {"todos": saved, "counts": counts}
