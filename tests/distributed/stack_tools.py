"""Test-only tools of the distributed stack (see stack_settings): each shape of Python tool and each
isolation, in the `hardening` group."""
import asyncio
import os

from tools.python.decorators import ToolContext, tool

GROUP = "hardening"


@tool(timeout=2, groups=(GROUP,))
def stack_spin(ctx: ToolContext) -> str:
    """Spin forever in Python code, ignoring the context."""
    ctx.emit("spinning")
    while True:
        pass


@tool(timeout=5, isolation="process", groups=(GROUP,))
def stack_power(exponent: int, ctx: ToolContext) -> str:
    """Compute 10 ** exponent in one GIL-holding C call, in a process of its own.

    Args:
        exponent: The power of ten.
    """
    ctx.emit(str(os.getpid()))
    return str(len(str(10**exponent)))


@tool(groups=(GROUP,))
async def stack_greeting(name: str, ctx: ToolContext) -> str:
    """Greet after an await.

    Args:
        name: Who to greet.
    """
    await asyncio.sleep(0)
    ctx.emit(f"greeting {name}")
    return f"hello {name}"


@tool(isolation="process", groups=(GROUP,))
def stack_squares(count: int):
    """Stream squares from a process of its own.

    Args:
        count: How many.
    """
    for n in range(1, count + 1):
        yield n * n
