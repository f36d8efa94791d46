"""What may change a session's surface is announced to the tenant's MCP notification streams after commit
(docs/mcp.md, "Notifications"): once for a write of many rows, never before commit, never to another tenant."""
import asyncio

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

from realtime.groups import surface_group
from tools.models import Tool, ToolGroup

pytestmark = pytest.mark.django_db


async def _received(layer, channel, within: float = 0.3) -> list[dict]:
    found = []
    while True:
        try:
            found.append(await asyncio.wait_for(layer.receive(channel), within))
        except TimeoutError:
            return found


def test_a_write_of_many_rows_announces_once_after_commit(world, django_capture_on_commit_callbacks):
    layer = get_channel_layer()
    a, b = world.a.tenant, world.b.tenant
    heard: dict = {}

    def edit():
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            with transaction.atomic():
                for tool in Tool.objects.for_tenant(a).order_by("name")[:3]:
                    tool.description = f"{tool.description} (edited)"
                    tool.save()
                group = ToolGroup.objects.for_tenant(a).get(name="basic")
                group.tools.remove(*group.tools.all()[:1])
            heard["callbacks"] = len(callbacks)

    async def main():
        channel_a, channel_b = await layer.new_channel(), await layer.new_channel()
        await layer.group_add(surface_group(a.pk), channel_a)
        await layer.group_add(surface_group(b.pk), channel_b)
        await sync_to_async(edit, thread_sensitive=True)()
        heard["a"], heard["b"] = await _received(layer, channel_a), await _received(layer, channel_b)

    async_to_sync(main)()
    assert heard["a"] == [{"type": "surface.changed", "session": ""}]
    assert heard["b"] == []


def test_nothing_is_announced_for_a_write_rolled_back(world, django_capture_on_commit_callbacks):
    a = world.a.tenant
    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(RuntimeError), transaction.atomic():
        tool = Tool.objects.for_tenant(a).order_by("name").first()
        tool.enabled = False
        tool.save()
        raise RuntimeError("rolled back")
    assert callbacks == []


def test_a_sessions_own_changes_are_announced_for_that_session(world, django_capture_on_commit_callbacks):
    """reset_tools and a skill loaded (its bound groups) change one session's surface: the announcement names it."""
    from tests.skills.test_loading import load, skill_files, upload
    from tools.calls.submit import calls_submit
    from tools.catalog.services import session_create

    a = world.a
    assert upload(a.client("admin"), skill_files()).status_code == 201
    session = session_create(tenant=a.tenant, agent="announce-bot", api_key=a.key_objects["agent"])
    with django_capture_on_commit_callbacks(execute=False) as switched:
        [call] = calls_submit(session=session, calls=[{"name": "reset_tools", "input": {"ops": True}}])
    with django_capture_on_commit_callbacks(execute=False) as loaded:
        loaded_call = load(session, "launch-check", "SKILL.md")
    assert call.status == "succeeded" and loaded_call.status == "succeeded", (call.error, loaded_call.error)
    for callbacks in (switched, loaded):
        keys = [getattr(callback, "key", None) for callback in callbacks]
        assert (a.tenant.pk, str(session.pk)) in keys
