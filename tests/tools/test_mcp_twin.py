"""A retry over MCP attaches to the session's call that still waits for a reviewer with the same arguments:
`pending_approval_twin` finds it by one plain statement, on either database, and finds nothing else."""
from tools.gateway.protocol import pending_approval_twin
from tools.models import CallStatus, ToolCall


def waiting_call(world, call_id: str, arguments: dict, *, status=CallStatus.AWAITING_APPROVAL, session=None):
    return ToolCall.objects.create(tenant=world.a.tenant, session=session or world.a.session, call_id=call_id,
                                   tool_name="current_time", input=arguments, status=status)


def test_the_twin_is_the_waiting_call_with_equal_arguments(world):
    nested = {"timezone": "UTC", "options": {"format": ["iso", 24]}, "note": "naïve ✓"}
    waiting_call(world, "call_90", {"timezone": "UTC"})
    twin = waiting_call(world, "call_91", nested)
    found = pending_approval_twin(world.a.session, "current_time", dict(nested))
    assert found is not None and found.pk == twin.pk and found.input == nested


def test_no_twin_for_other_arguments_statuses_tools_or_sessions(world):
    arguments = {"timezone": "Europe/Paris"}
    waiting_call(world, "call_92", arguments, status=CallStatus.QUEUED)
    waiting_call(world, "call_93", {"timezone": "Europe/Paris", "extra": 1})
    assert pending_approval_twin(world.a.session, "current_time", arguments) is None
    assert pending_approval_twin(world.a.session, "todo_write", {"timezone": "Europe/Paris", "extra": 1}) is None
    assert pending_approval_twin(world.b.session, "current_time", {"timezone": "Europe/Paris", "extra": 1}) is None
