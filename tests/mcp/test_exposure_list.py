"""`tools/list` over /mcp/ lists what the session's policy lets it call: nothing is cached between listings, so
the listing after a rule change is already right."""
import asyncio
from types import SimpleNamespace

import pytest

from approvals.services import rule_create, rule_update
from tools.catalog.services import group_update, session_create, tool_external_create
from tools.gateway.protocol import CALLER_SCOPE, McpCaller, _list_tools

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls", "fresh_rule_index")]


def tools_list(caller: McpCaller) -> set[str]:
    """The tools/list handler of the endpoint, run for this caller as a request would run it."""
    ctx = SimpleNamespace(request=SimpleNamespace(scope={CALLER_SCOPE: caller}))
    return {tool.name for tool in asyncio.run(_list_tools(ctx, None)).tools}


def test_tools_list_leaves_out_a_tool_a_deny_rule_always_refuses_and_takes_it_back_when_the_rule_goes(world):
    tenant = world.a.tenant
    wipe = tool_external_create(tenant=tenant, name="disk_wipe", description="Wipe.",
                                input_schema={"properties": {}})
    basic = world.a.groups["basic"]
    group_update(group=basic, tools=[*basic.tools.all(), wipe])
    api_key = world.a.key_objects["agent"]
    caller = McpCaller(api_key, session_create(tenant=tenant, agent="mcp-bot", api_key=api_key), opened=False)

    assert "disk_wipe" in tools_list(caller)
    rule = rule_create(tenant=tenant, behavior="deny", tool_pattern="disk_wipe")
    listed = tools_list(caller)
    assert "disk_wipe" not in listed and "current_time" in listed
    rule_update(rule=rule, enabled=False)
    assert "disk_wipe" in tools_list(caller)
