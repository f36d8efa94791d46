"""Traces (docs/observability.md, "Traces"): one trace per governed call, received to settled, exported over OTLP/HTTP
to a real receiver (tests/otlp_receiver.py); an app's `traceparent` continued, a malformed one ignored; the trace id
on the call in the API and the console; tracing off records nothing. The trace across a Celery worker and an MCP
upstream: tests/distributed/test_traces.py."""
import json
import logging
import os
import subprocess
import sys

import pytest
from django.urls import reverse

from approvals.models import ApprovalRequest
from approvals.services import request_decide, rule_create
from common import logs, tracing
from common.logs import JsonFormatter
from common.tracing import traceparent_parse, tracing_off, tracing_setup
from tests.otlp_receiver import serve, tree
from tests.tools.http_endpoint import serve as serve_endpoint
from tests.tools.support import wait_terminal
from tools.api.serializers import call_data
from tools.calls.submit import calls_submit
from tools.calls.traces import call_span
from tools.catalog.services import session_create
from tools.http_tools.services import http_tool_create
from tools.models import CallStatus, ToolCall, ToolGroup

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]

APP_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
APP_SPAN = "00f067aa0ba902b7"
APP = f"00-{APP_TRACE}-{APP_SPAN}-01"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = ["bind", "dispatch", "external", "normalize", "permission", "result_rules", "validate"]


@pytest.fixture
def receiver(monkeypatch):
    """Tracing on in this process, exporting to a test receiver (the batch sent every 50 ms)."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    for found in serve():
        tracing_setup(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": found.endpoint})
        try:
            yield found
        finally:
            tracing_off()


@pytest.fixture
def shout(make_tool):
    logger = logging.getLogger("toolkeeper.test.shout")

    def shout(word: str) -> str:
        """Say it louder.

        Args:
            word: A word.
        """
        logger.warning("shouting %s", word)
        return word.upper()

    return make_tool(shout)


def _ran(world, tool, *, traceparent=None) -> ToolCall:
    session = session_create(tenant=world.a.tenant, agent="planner")
    [call] = calls_submit(session=session, calls=[{"name": tool.name, "input": {"word": "hi"}}],
                          traceparent=traceparent)
    return wait_terminal(call.pk, tenant=world.a.tenant)


@pytest.mark.parametrize("value, parsed", [
    (APP, (int(APP_TRACE, 16), int(APP_SPAN, 16), True)),
    (f"00-{APP_TRACE}-{APP_SPAN}-00", (int(APP_TRACE, 16), int(APP_SPAN, 16), False)),
    (f"01-{APP_TRACE}-{APP_SPAN}-01-later", (int(APP_TRACE, 16), int(APP_SPAN, 16), True)),  # a later version's more
])
def test_a_valid_traceparent_is_read(value, parsed):
    assert traceparent_parse(value) == parsed


@pytest.mark.parametrize("value", [
    None, "", 42, ["00"], "garbage", APP.upper(), f"00-{APP_TRACE}-{APP_SPAN}", f"00-{APP_TRACE}-{APP_SPAN}-01-x",
    f"ff-{APP_TRACE}-{APP_SPAN}-01", f"00-{'0' * 32}-{APP_SPAN}-01", f"00-{APP_TRACE}-{'0' * 16}-01",
    f"00-{APP_TRACE[:-1]}g-{APP_SPAN}-01", f"00-{APP_TRACE}-{APP_SPAN}-01\n", APP + "x" * 600,
])
def test_a_malformed_traceparent_is_none(value):
    assert traceparent_parse(value) is None


def test_a_call_is_one_trace_continuing_the_apps(world, shout, receiver):
    call = _ran(world, shout, traceparent=APP)
    assert call.status == CallStatus.SUCCEEDED
    assert call.trace_id == APP_TRACE and call.trace_parent_id == APP_SPAN and len(call.trace_span_id) == 16
    spans = receiver.spans_of(APP_TRACE, 3 + len(STEPS) + 1)
    by_name = {span.name: span for span in spans}
    root = by_name[f"execute_tool {shout.name}"]
    assert (root.span_id, root.parent_id) == (call.trace_span_id, APP_SPAN)  # the ids stored at submission
    assert root.attributes["toolkeeper.call.id"] == str(call.pk)
    assert root.attributes["toolkeeper.call.status"] == "succeeded"
    assert tree(spans) == {
        root.name: ["execution", "policy"], "policy": STEPS, "execution": ["after_steps"], "after_steps": [],
        **{step: [] for step in STEPS}}
    # received → settled: the root covers every other span
    assert all(root.start_ns <= span.start_ns <= span.end_ns <= root.end_ns for span in spans)
    assert by_name["policy"].end_ns <= by_name["execution"].start_ns
    assert call_data(call)["trace_id"] == APP_TRACE


def test_a_call_without_a_traceparent_starts_its_own_trace(world, shout, receiver):
    call = _ran(world, shout)
    assert len(call.trace_id) == 32 and call.trace_id != APP_TRACE and call.trace_parent_id == ""
    spans = receiver.spans_of(call.trace_id, 3 + len(STEPS) + 1)
    [root] = [span for span in spans if span.parent_id == ""]
    assert root.span_id == call.trace_span_id
    assert {span.trace_id for span in spans} == {call.trace_id}


def test_calls_of_one_batch_are_a_trace_each(world, shout, receiver):
    session = session_create(tenant=world.a.tenant, agent="planner")
    calls = calls_submit(session=session, calls=[{"name": shout.name, "input": {"word": w}} for w in "ab"])
    done = [wait_terminal(call.pk, tenant=world.a.tenant) for call in calls]
    assert len({call.trace_id for call in done}) == 2
    for call in done:
        [root] = [span for span in receiver.spans_of(call.trace_id, 11) if span.parent_id == ""]
        assert root.span_id == call.trace_span_id


def test_a_malformed_traceparent_on_the_api_is_ignored(world, shout, receiver):
    session = session_create(tenant=world.a.tenant, agent="planner", api_key=world.a.key_objects["agent"])
    client = world.a.client("agent")
    for malformed in ("00-zz-zz-01", f"ff-{APP_TRACE}-{APP_SPAN}-01", f"00-{'0' * 32}-{APP_SPAN}-01", "x" * 5000):
        response = client.post(f"/api/v1/sessions/{session.pk}/calls", {"name": shout.name, "input": {"word": "a"}},
                               format="json", HTTP_TRACEPARENT=malformed)
        assert response.status_code == 200, response.content
        [answer] = response.json()["calls"]
        assert len(answer["trace_id"]) == 32 and answer["trace_id"] != APP_TRACE  # a trace of its own
        call = ToolCall.objects.for_tenant(world.a.tenant).get(pk=answer["id"])
        assert call.trace_parent_id == ""
    response = client.post(f"/api/v1/sessions/{session.pk}/calls", {"name": shout.name, "input": {"word": "a"}},
                           format="json", HTTP_TRACEPARENT=APP)
    [answer] = response.json()["calls"]
    assert answer["trace_id"] == APP_TRACE
    assert client.get(f"/api/v1/calls/{answer['id']}").json()["trace_id"] == APP_TRACE


def test_the_reviewers_wait_is_a_span_of_the_calls_trace(world, shout, receiver):
    rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern=shout.name, note="a person looks")
    session = session_create(tenant=world.a.tenant, agent="planner")
    [call] = calls_submit(session=session, calls=[{"name": shout.name, "input": {"word": "hi"}}], traceparent=APP)
    assert call.status == CallStatus.AWAITING_APPROVAL
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    request_decide(request=request, reviewer=world.a.users["reviewer"], decision="approve")
    call = wait_terminal(call.pk, tenant=world.a.tenant)
    # the root, two passes of the chain (up to the permission step, then after it), the wait, the execution's two
    spans = receiver.spans_of(APP_TRACE, 1 + 2 + 4 + 3 + 1 + 2)
    by_name = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    [root] = by_name[f"execute_tool {shout.name}"]
    [wait] = by_name["approval_wait"]
    assert wait.parent_id == root.span_id and wait.attributes["toolkeeper.wait.outcome"] != "awaiting_approval"
    first, second = sorted(by_name["policy"], key=lambda span: span.start_ns)
    [execution] = by_name["execution"]
    # the wait began inside the first pass (its move to awaiting_approval), ended with the decision's move
    assert first.start_ns <= wait.start_ns <= first.end_ns <= wait.end_ns <= second.end_ns <= execution.start_ns
    assert all(span.parent_id == root.span_id for span in (first, second, execution))


def test_a_denied_call_is_a_trace_that_ends_at_submission(world, shout, receiver):
    rule_create(tenant=world.a.tenant, behavior="deny", tool_pattern=shout.name, note="never")
    session = session_create(tenant=world.a.tenant, agent="planner")
    [call] = calls_submit(session=session, calls=[{"name": shout.name, "input": {"word": "hi"}}])
    assert call.status == CallStatus.DENIED
    spans = receiver.spans_of(call.trace_id, 1 + 1 + 4)  # the root, the chain, the steps up to the denial
    [root] = [span for span in spans if span.parent_id == ""]
    assert root.attributes["toolkeeper.call.status"] == "denied"
    assert sorted(tree(spans)["policy"]) == ["bind", "normalize", "permission", "validate"]


def test_the_sampler_and_an_unsampled_parent_decide(world, shout, receiver, monkeypatch):
    call = _ran(world, shout, traceparent=f"00-{APP_TRACE}-{APP_SPAN}-00")  # the app did not sample it
    assert call.trace_id == "" and call_data(call)["trace_id"] is None
    tracing_setup(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_TRACES_SAMPLER": "always_off"})
    assert _ran(world, shout).trace_id == ""
    tracing_setup(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                           "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.0"})
    assert _ran(world, shout).trace_id != ""
    tracing_setup(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                           "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"})
    assert _ran(world, shout).trace_id == ""  # a ratio of nothing
    tracing_setup(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                           "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "lots"})
    assert _ran(world, shout).trace_id != ""  # not a ratio: all of them
    tracing.tracing_flush()
    assert receiver.trace(APP_TRACE) == []


def test_tracing_off_records_nothing_and_costs_a_shared_no_op(world, shout, monkeypatch):
    monkeypatch.setattr(logs, "ACTIVE", False)  # as in a process with plain logs (a JsonFormatter turns it on)
    assert not tracing.ENABLED
    call = _ran(world, shout, traceparent=APP)
    assert (call.trace_id, call.trace_span_id, call.trace_parent_id) == ("", "", "")
    assert call_data(call)["trace_id"] is None
    assert call_span(call, "execution") is tracing.NO_SPAN  # no log context either: JSON logs are off here
    assert tracing.current_traceparent() is None


def test_http_tools_hear_our_span_and_never_a_configured_traceparent(world, receiver, settings):
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    forged = f"00-{'a' * 32}-{'b' * 16}-01"
    for endpoint in serve_endpoint():
        tool = http_tool_create(tenant=world.a.tenant, name="traced_lookup", method="POST",
                                url=endpoint.url + "/echo/x",
                                input_schema={"type": "object", "properties": {}},
                                headers={"TraceParent": forged, "X-Team": "core"}, secrets={})
        ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").tools.add(tool)
        session = session_create(tenant=world.a.tenant, agent="planner")
        [call] = calls_submit(session=session, calls=[{"name": "traced_lookup", "input": {}}], traceparent=APP)
        call = wait_terminal(call.pk, tenant=world.a.tenant)
        assert call.status == CallStatus.SUCCEEDED, call.error
        [sent] = endpoint.received
        [(name, value)] = [(name, value) for name, value in sent.headers.items() if name.lower() == "traceparent"]
        assert sent.headers["X-Team"] == "core"
        spans = receiver.spans_of(APP_TRACE, 1 + 1 + len(STEPS) + 3)
        [post] = [span for span in spans if span.name == "POST"]
        assert value == f"00-{APP_TRACE}-{post.span_id}-01"  # our client span, not the configured value
        assert tree(spans)["execution"] == ["POST", "after_steps"]


def test_a_calls_log_lines_carry_its_ids(world, shout, receiver, monkeypatch):
    monkeypatch.setattr(logs, "ACTIVE", logs.ACTIVE)  # as it was, after the test
    formatter = JsonFormatter()  # what TOOLKEEPER_LOG_FORMAT=json installs
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(formatter.format(record))

    keep = Keep()
    logging.getLogger("toolkeeper.test.shout").addHandler(keep)
    try:
        call = _ran(world, shout, traceparent=APP)
    finally:
        logging.getLogger("toolkeeper.test.shout").removeHandler(keep)
    [line] = lines
    assert "\n" not in line
    assert json.loads(line) | {"time": None} == {
        "time": None, "level": "WARNING", "logger": "toolkeeper.test.shout", "message": "shouting hi",
        "call_id": str(call.pk), "tenant": world.a.tenant.slug, "trace_id": APP_TRACE, "step": "execution"}


def test_a_tool_process_never_loads_the_tracing_sdk(tmp_path):
    probe = ("import os, sys; sys.path[:0] = ['platform', '.'];"
             "os.environ['DJANGO_SETTINGS_MODULE'] = 'toolkeeper.settings';"
             "import django; django.setup(); from common import tracing;"
             "print(tracing.ENABLED, any(m.startswith(('opentelemetry.sdk.trace', 'opentelemetry.exporter')) "
             "for m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"}}
    env.update(TOOLKEEPER_DATA_DIR=str(tmp_path / "data"), OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    seen = {}
    for flag in ("1", ""):
        result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, "TOOLKEEPER_TOOL_PROCESS": flag},
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        seen[flag] = result.stdout.split()
    # a server process is on, and loads the SDK at its first span only
    assert seen == {"1": ["False", "False"], "": ["True", "False"]}


def test_the_call_page_shows_the_trace_id_as_text(world):
    call = world.a.calls[0]
    page = reverse("console:call_detail", args=[world.a.tenant.slug, call.pk])
    assert 'id="call-trace"' not in world.a.console("viewer").get(page).content.decode()  # untraced: no line
    ToolCall.objects.for_tenant(world.a.tenant).filter(pk=call.pk).update(trace_id=APP_TRACE)
    assert f'<code id="call-trace">{APP_TRACE}</code>' in world.a.console("viewer").get(page).content.decode()
    hostile = '<i>"x"</i>&'  # never stored by the platform (it writes hex ids only); escaped all the same
    ToolCall.objects.for_tenant(world.a.tenant).filter(pk=call.pk).update(trace_id=hostile)
    html = world.a.console("viewer").get(page).content.decode()
    assert hostile not in html and '<code id="call-trace">&lt;i&gt;&quot;x&quot;&lt;/i&gt;&amp;</code>' in html


def test_json_logs_are_configured_by_the_setting_and_escape_hostile_text(tmp_path):
    probe = ("import logging, os, sys; sys.path[:0] = ['platform', '.'];"
             "os.environ['DJANGO_SETTINGS_MODULE'] = 'toolkeeper.settings';"
             "import django; django.setup(); from common.logs import log_context;"
             "log = logging.getLogger('toolkeeper.calls');"
             "log.warning('plain');"
             "ctx = log_context(call_id='c-1', tenant='acme', trace_id='" + APP_TRACE + "', step='execution');"
             "ctx.__enter__(); log.warning('a %s', 'line\\nbreak \"quoted\" \\u2028 é');"
             "ctx.__exit__(None, None, None)")
    env = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"}}
    env.update(TOOLKEEPER_DATA_DIR=str(tmp_path / "data"))
    lines = {}
    for form in ("json", ""):
        result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, "TOOLKEEPER_LOG_FORMAT": form},
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        lines[form] = [line for line in result.stderr.split("\n") if line and "TOOLKEEPER_SECRETS_KEY" not in line]
    assert lines[""] == ["plain", "a line", 'break "quoted" \u2028 é']  # Python's plain lines
    first, second = (json.loads(line) for line in lines["json"])  # two records, two lines, whatever they hold
    assert all(line.isascii() for line in lines["json"])
    assert first | {"time": None} == {"time": None, "level": "WARNING", "logger": "toolkeeper.calls",
                                      "message": "plain", "call_id": None, "tenant": None, "trace_id": None,
                                      "step": None}
    assert second["message"] == 'a line\nbreak "quoted" \u2028 é'
    assert (second["call_id"], second["tenant"], second["trace_id"], second["step"]) == (
        "c-1", "acme", APP_TRACE, "execution")
