"""Tools are what they claim: coroutines are awaited, generators stream, meta tool names are reserved.
Calls really run through the local executor, so most tests are transactional."""
import asyncio
import threading

import pytest
from pydantic import BaseModel

from tests.tools import isolated_tools
from tests.tools.support import events_of, poll, registered_tool, submit, unique_name, wait_terminal
from tools.catalog.services import session_create
from tools.models import CallStatus
from tools.python.decorators import ToolContext, build_python_tool, tool


@pytest.fixture
def session(world):
    return session_create(tenant=world.a.tenant, agent="shapes")


def outputs(events):
    return [e["data"]["text"] for e in events if e["kind"] == "output"]


@pytest.mark.parametrize("shape", ["coroutine", "generator", "async_generator"])
def test_schemas_come_from_the_signature_whatever_the_shape(shape):
    async def coroutine(query: str, ctx: ToolContext, limit: int = 3) -> str:
        """Look something up.

        Args:
            query: What to look for.
            limit: How many.
        """
        return query

    def generator(query: str, ctx: ToolContext, limit: int = 3):
        """Look something up.

        Args:
            query: What to look for.
            limit: How many.
        """
        yield query

    async def async_generator(query: str, ctx: ToolContext, limit: int = 3):
        """Look something up.

        Args:
            query: What to look for.
            limit: How many.
        """
        yield query

    fn = {"coroutine": coroutine, "generator": generator, "async_generator": async_generator}[shape]
    spec = build_python_tool(fn, name=shape)
    assert spec.description == "Look something up."
    assert spec.context_param == "ctx"
    assert spec.input_schema == {
        "type": "object", "additionalProperties": False, "required": ["query"],
        "properties": {"query": {"type": "string", "description": "What to look for."},
                       "limit": {"type": "integer", "default": 3, "description": "How many."}},
    }


@pytest.mark.parametrize("name", ["reset_tools", "load_skill_through_path", "Reset_Tools", "LOAD_SKILL_THROUGH_PATH"])
def test_meta_tool_names_are_refused_at_registration(name):
    def impostor() -> str:
        """Pretend to be a meta tool."""
        return "gotcha"

    with pytest.raises(ValueError, match="reserved"):
        tool(name=name)(impostor)
    with pytest.raises(ValueError, match="reserved"):
        build_python_tool(impostor, name=name)


def test_a_function_named_like_a_meta_tool_is_refused_by_the_bare_decorator():
    def reset_tools() -> str:
        """Pretend to be the meta tool."""
        return "gotcha"

    with pytest.raises(ValueError, match="reserved"):
        tool(reset_tools)


def test_a_process_tool_must_be_importable():
    def local(x: int) -> int:
        """Defined inside a function: a child process cannot import it."""
        return x

    with pytest.raises(ValueError, match="module level"):
        build_python_tool(local, name="local", isolation="process")
    with pytest.raises(ValueError, match="isolation"):
        build_python_tool(isolated_tools.process_id, name="where", isolation="container")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
class TestCoroutines:
    def test_a_coroutine_is_awaited_and_its_emits_are_written(self, world, make_tool, session):
        async def fetch(city: str, ctx: ToolContext) -> dict:
            """Fetch the weather.

            Args:
                city: A city.
            """
            ctx.emit("asking", progress=0.5)
            await asyncio.sleep(0.01)
            ctx.emit("answered")
            return {"city": city, "sky": "clear", "agent": ctx.agent}

        fetch_tool = make_tool(fetch)
        client = world.a.client()
        [call] = submit(client, session, {"name": fetch_tool.name, "input": {"city": "Oslo"}, "wait": 10})
        assert call["status"] == "succeeded", call
        assert call["result"]["structured"] == {"city": "Oslo", "sky": "clear", "agent": "shapes"}
        events = events_of(client, call["id"])
        assert [e["data"] for e in events if e["kind"] == "progress"] == [{"text": "asking", "progress": 0.5}]
        assert outputs(events) == ["answered"]

    def test_a_coroutine_that_raises_fails_with_its_error(self, world, make_tool, session):
        async def broken() -> str:
            """Fail after an await."""
            await asyncio.sleep(0)
            raise RuntimeError("boom")

        [call] = submit(world.a.client(), session, {"name": make_tool(broken).name, "wait": 10})
        assert call["status"] == "failed"
        assert call["error"]["errorType"] == "ToolFailed"
        assert "boom" not in call["error"]["error"]  # never a trace or an internal message

    def test_a_tool_that_answers_with_an_error_result_fails(self, world, make_tool, session):
        def refusing() -> dict:
            """Answer with a result in the error state."""
            return {"state": "error", "content": [{"type": "text", "text": "the ledger is closed"}],
                    "structured": None}

        [call] = submit(world.a.client(), session, {"name": make_tool(refusing).name, "wait": 10})
        assert call["status"] == "failed"
        assert call["error"]["errorType"] == "ToolError"
        assert call["error"]["error"] == "the ledger is closed"

    def test_a_coroutine_times_out_and_is_cancelled_at_its_await(self, world, make_tool, session):
        cancelled = threading.Event()

        async def slow() -> str:
            """Wait far longer than the timeout."""
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return "overslept"

        [call] = submit(world.a.client(), session, {"name": make_tool(slow, timeout=0.5).name})
        final = wait_terminal(call["id"], tenant=world.a.tenant)
        assert final.status == CallStatus.TIMED_OUT
        assert final.error["errorType"] == "TimedOut"
        poll(cancelled.is_set, message="the coroutine to be cancelled")

    def test_cancelling_a_running_coroutine_interrupts_it(self, world, make_tool, session):
        started = threading.Event()
        cancelled = threading.Event()

        async def waits() -> str:
            """Wait until cancelled."""
            started.set()
            try:
                await asyncio.sleep(30)
            finally:
                cancelled.set()
            return "not cancelled"

        client = world.a.client()
        [call] = submit(client, session, {"name": make_tool(waits).name})
        poll(started.is_set, message="the coroutine to start")
        response = client.post(f"/api/v1/calls/{call['id']}/cancel")
        assert response.json()["status"] == "interrupted"
        poll(cancelled.is_set, message="the coroutine to be cancelled")
        assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.INTERRUPTED

    @pytest.mark.stops_threads
    def test_a_coroutine_that_never_awaits_is_stopped(self, world, make_tool, session):
        left = threading.Event()

        async def spins() -> str:
            """Spin without ever awaiting."""
            try:
                while True:
                    pass
            finally:
                left.set()

        [call] = submit(world.a.client(), session, {"name": make_tool(spins, timeout=0.5).name})
        assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.TIMED_OUT
        poll(left.is_set, message="the spinning coroutine to be stopped")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
class TestGenerators:
    def test_each_item_is_an_output_event_and_the_return_value_is_the_result(self, world, make_tool, session):
        def lines(count: int, ctx: ToolContext):
            """Stream lines.

            Args:
                count: How many.
            """
            ctx.emit("begin", progress=0.0)
            for n in range(count):
                yield f"line {n}"
            yield {"done": count}
            return f"{count} lines"

        client = world.a.client()
        [call] = submit(client, session, {"name": make_tool(lines).name, "input": {"count": 3}, "wait": 10})
        assert call["status"] == "succeeded", call
        assert call["result"]["content"] == [{"type": "text", "text": "3 lines"}]
        events = events_of(client, call["id"])
        assert outputs(events) == ["line 0", "line 1", "line 2", '{"done": 3}']
        kinds = [e["kind"] for e in events]
        assert kinds.index("progress") < kinds.index("output")  # in the order the tool produced them

    def test_a_generator_returning_nothing_has_its_items_as_the_result(self, world, make_tool, session):
        def numbers():
            """Stream numbers."""
            yield 1
            yield {"two": 2}

        [call] = submit(world.a.client(), session, {"name": make_tool(numbers).name, "wait": 10})
        assert call["status"] == "succeeded", call
        assert call["result"]["structured"] == [1, {"two": 2}]

    def test_an_async_generator_streams_its_items(self, world, make_tool, session):
        async def ticks(count: int):
            """Stream ticks.

            Args:
                count: How many.
            """
            for n in range(count):
                await asyncio.sleep(0)
                yield f"tick {n}"

        client = world.a.client()
        [call] = submit(client, session, {"name": make_tool(ticks).name, "input": {"count": 3}, "wait": 10})
        assert call["status"] == "succeeded", call
        assert call["result"]["structured"] == ["tick 0", "tick 1", "tick 2"]
        assert outputs(events_of(client, call["id"])) == ["tick 0", "tick 1", "tick 2"]

    def test_cancelling_a_stream_closes_the_generator(self, world, make_tool, session):
        closed = threading.Event()

        def endless(ctx: ToolContext):
            """Stream until cancelled."""
            try:
                n = 0
                while True:
                    yield n
                    n += 1
                    ctx.sleep(0.05)
            finally:
                closed.set()

        client = world.a.client()
        [call] = submit(client, session, {"name": make_tool(endless).name})
        poll(lambda: len(outputs(events_of(client, call["id"]))) >= 2, message="two items")
        assert client.post(f"/api/v1/calls/{call['id']}/cancel").json()["status"] == "interrupted"
        poll(closed.is_set, message="the generator to be closed")
        final = wait_terminal(call["id"], tenant=world.a.tenant)
        assert final.status == CallStatus.INTERRUPTED
        statuses = [e["data"]["status"] for e in events_of(client, call["id"]) if e["kind"] == "status"]
        assert statuses == ["queued", "running", "interrupted"]
        assert events_of(client, call["id"])[-1]["kind"] == "status"  # nothing streamed after the cancel


def test_a_direct_call_awaits_a_coroutine_and_drains_a_generator():
    async def answer() -> str:
        """Answer after an await."""
        await asyncio.sleep(0)
        return "ok"

    def items():
        """Two items."""
        yield "a"
        yield "b"

    with registered_tool(answer, name=unique_name("answer")) as coroutine_spec:
        assert coroutine_spec({}) == "ok"
    with registered_tool(items, name=unique_name("items")) as generator_spec:
        assert generator_spec({}) == ["a", "b"]


class Weather(BaseModel):
    city: str
    degrees: int


def test_a_pydantic_return_annotation_is_the_tools_output_schema():
    def forecast(city: str) -> Weather:
        """Forecast."""
        return Weather(city=city, degrees=20)

    def plain(city: str) -> dict:
        """No declared shape."""
        return {"city": city}

    declared = build_python_tool(forecast, name="forecast").definition()
    assert declared.output_schema == {"type": "object", "required": ["city", "degrees"], "properties": {
        "city": {"type": "string"}, "degrees": {"type": "integer"}}}
    assert build_python_tool(plain, name="plain").definition().output_schema is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
class TestProgressCountsAndLogs:
    def test_counts_and_totals_are_kept_beside_the_share_done_and_logs_have_their_level(
            self, world, make_tool, session):
        def steps(ctx: ToolContext) -> Weather:
            """Counts its steps."""
            ctx.progress(1, 4, "one")
            ctx.progress(3)  # no total known
            ctx.progress(2, float("nan"))  # a total that is no number is no total
            ctx.log("careful", level="warning")
            ctx.log("x" * 5000, level="shout")  # no such level: info; bounded
            return Weather(city="Oslo", degrees=3)

        tool_row = make_tool(steps)
        assert tool_row.output_schema["properties"]["degrees"] == {"type": "integer"}
        client = world.a.client()
        [call] = submit(client, session, {"name": tool_row.name, "wait": 10})
        assert call["status"] == "succeeded", call
        assert call["result"]["structured"] == {"city": "Oslo", "degrees": 3}
        events = events_of(client, call["id"])
        assert [e["data"] for e in events if e["kind"] == "progress"] == [
            {"text": "one", "progress": 0.25, "completed": 1, "total": 4},
            {"text": "3", "completed": 3}, {"text": "2", "completed": 2}]
        logs = [e["data"] for e in events if e["kind"] == "log"]
        assert logs[0] == {"text": "careful", "level": "warning"}
        assert logs[1]["level"] == "info" and len(logs[1]["text"]) == 2000

    def test_a_process_run_tool_reports_counts_and_logs_too(self, world, make_tool, session):
        counted = make_tool(isolated_tools.counted, isolation="process")
        client = world.a.client()
        [call] = submit(client, session, {"name": counted.name, "wait": 30})
        assert call["status"] == "succeeded", call
        events = events_of(client, call["id"])
        assert [e["data"] for e in events if e["kind"] in ("progress", "log")] == [
            {"text": "half", "progress": 0.5, "completed": 1, "total": 2},
            {"text": "from the child", "level": "warning"}]
