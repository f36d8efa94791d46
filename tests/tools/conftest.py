import pytest

from tests.tools.support import install_tool, registered_tool, unique_name
from tools.python.decorators import ToolContext


@pytest.fixture
def echo_tool(world):
    """A test-only tool in tenant A's `basic` group that returns the arguments it received."""

    def echo(city: str, scope: str, ctx: ToolContext, limit: int = 3) -> dict:
        """Echo the arguments back.

        Args:
            city: A city.
            scope: The data the call may see.
            limit: How many results.
        """
        return {"city": city, "scope": scope, "limit": limit, "agent": ctx.agent}

    name = unique_name("echo")
    with registered_tool(echo, name=name):
        tool = install_tool(world.a.tenant, name)
        yield tool


@pytest.fixture
def make_tool(world):
    """Register test-only tools (unique names) and put them in tenant A's `basic` group."""
    stack = []

    def make(fn, prefix: str | None = None, **options):
        name = unique_name(prefix or fn.__name__)
        manager = registered_tool(fn, name=name, **options)
        manager.__enter__()
        stack.append(manager)
        return install_tool(world.a.tenant, name)

    yield make
    for manager in reversed(stack):
        manager.__exit__(None, None, None)
