"""Module-level functions that tests register as process-isolated tools (a child process imports them).

Plain functions, not registered here: each test registers the ones it needs under a unique name.
"""
import asyncio
import os

from tools.models import Tool
from tools.python.decorators import ToolContext, ToolError


def huge_power(exponent: int, ctx: ToolContext) -> str:
    """Compute 10 ** exponent: one C call that holds the GIL throughout (minutes for 10**8).

    Args:
        exponent: The power of ten.
    """
    ctx.emit(str(os.getpid()))
    return str(len(str(10**exponent)))


def process_id(ctx: ToolContext) -> dict:
    """Where the tool runs, and what the context offers there."""
    return {"pid": os.getpid(), "call_id": ctx.call_id, "agent": ctx.agent, "tenant": ctx.tenant,
            "cancelled": ctx.cancelled}


def squares(count: int, ctx: ToolContext):
    """Stream the squares of 1..count after a progress report.

    Args:
        count: How many squares.
    """
    ctx.emit("starting", progress=0.0)
    for n in range(1, count + 1):
        yield {"n": n, "square": n * n}


async def async_greeting(name: str, ctx: ToolContext) -> str:
    """Greet after an await.

    Args:
        name: Who to greet.
    """
    await asyncio.sleep(0)
    ctx.emit(f"greeting {name}")
    return f"hello {name} from {os.getpid()}"


def refuses(reason: str) -> None:
    """Fail with a tool error.

    Args:
        reason: The message.
    """
    raise ToolError(reason, error_type="Refused")


def crashes() -> None:
    """End the process without answering."""
    os._exit(3)


def reads_the_database() -> int:
    """Try to use the database, which a tool process does not have."""
    return Tool.all_tenants.count()


def counted(ctx: ToolContext) -> str:
    """Report progress as counts and log, from a process of its own."""
    ctx.progress(1, 2, "half")
    ctx.log("from the child", level="warning")
    return "counted"


def ask_for_name(greeting: str, ctx: ToolContext, wait_s: float = 60.0) -> dict:
    """Ask the session's user for their name and say what they answered.

    Args:
        greeting: Said before the question.
        wait_s: How long to wait for the answer.
    """
    answer = ctx.ask_user(f"{greeting}: what is your name?", {
        "type": "object", "properties": {"name": {"type": "string", "description": "Your name"}},
        "required": ["name"]}, timeout_s=wait_s)
    if answer["action"] != "accept":
        return {"heard": answer["action"], "content": answer["content"]}
    return {"heard": "accept", "greeting": f"{greeting}, {answer['content']['name']}!"}
