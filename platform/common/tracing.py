"""Traces (docs/observability.md, "Traces"): the OpenTelemetry SDK, exporting OTLP over HTTP, off unless configured.

`tracing_setup()` reads the standard environment once per process: tracing is on when
`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set; `OTEL_TRACES_SAMPLER` and
`OTEL_TRACES_SAMPLER_ARG` choose the sampler (by default parent-based, always on); `OTEL_SERVICE_NAME` names the
service (default `toolkeeper`); `OTEL_BSP_*` tune the batch processor. When it is off, `ENABLED` is False and every
function here returns at its first line: tracing off costs a module attribute read per hook.

The provider is made lazily in each process that records a span (a server process, a Celery worker's child, the
MCP host process), after any fork, so each has its own batch thread and a resource naming its own pid. It is
flushed when the process ends (`atexit`, or `tracing_flush()` where a process ends without it: Celery's children,
the MCP host).

A governed call's root span covers received → settled, which may cross processes and hours. Its ids are chosen
when the call is submitted (`trace_start`) and stored with the call; every later span, in whatever process, is a
child of that stored root (`child_span`, `span_record`); the root itself is recorded once, when the call settles
(`root_span_record`), with its start time and the span id chosen at submission (`_Ids`, the id generator, hands
out an id preset for the span being started). The ids come from this process's random generator only: a
`traceparent` from an app gives the trace id and the root's parent, never a span id of ours, and nothing an
upstream answers is read.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace

ENABLED = False  # read by every hook first; set by tracing_setup()

TRACEPARENT = "traceparent"
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
NO_SPAN = contextlib.nullcontext()

_config: dict = {}
_lock = threading.Lock()
_provider = None
_provider_pid = 0
_preset: ContextVar[tuple[int, int] | None] = ContextVar("tracing_preset_ids", default=None)


@dataclass(frozen=True, slots=True)
class CallTrace:
    """A traced call's ids: its trace, its root span, and the span the root continues (an app's; 0: none)."""

    trace_id: int
    span_id: int
    parent_id: int = 0

    @property
    def trace_hex(self) -> str:
        return f"{self.trace_id:032x}"

    @classmethod
    def of(cls, trace_id: str, span_id: str, parent_id: str = "") -> CallTrace | None:
        """From the stored hex ids; None when they are absent or not ids."""
        try:
            trace = cls(int(trace_id, 16), int(span_id, 16), int(parent_id, 16) if parent_id else 0)
        except (TypeError, ValueError):
            return None
        return trace if trace.trace_id and trace.span_id else None


def now_ns() -> int:
    return time.time_ns()


def traceparent_parse(value) -> tuple[int, int, bool] | None:
    """A W3C `traceparent` as (trace id, parent span id, sampled); None when it is not a valid one (then it is
    ignored, never an error). Version ff is invalid; a version 00 header has nothing after its flags; a later
    version may have more, after a dash."""
    if not isinstance(value, str) or len(value) > 512:
        return None
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace, span = int(trace_id, 16), int(span_id, 16)
    if not trace or not span:
        return None
    return trace, span, bool(int(flags, 16) & 1)


def traceparent_format(trace_id: int, span_id: int, sampled: bool = True) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def tracing_setup(*, environ: Mapping[str, str] | None = None, exporter=None, role: str = "") -> bool:
    """Turn tracing on for this process when the environment configures an OTLP endpoint (or a test passes an
    `exporter`); returns whether it is on. `role` names the kind of process in its resource."""
    global ENABLED, _provider, _provider_pid
    environ = os.environ if environ is None else environ
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    with _lock:
        if _provider is not None and _provider_pid == os.getpid():
            _provider.shutdown()
        _provider, _provider_pid = None, 0
        if not endpoint and exporter is None:
            ENABLED = False
            _config.clear()
            return False
        _config.clear()
        _config.update(exporter=exporter, role=role, service=environ.get("OTEL_SERVICE_NAME") or "toolkeeper",
                       environ=dict(environ))
        ENABLED = True
    return True


def tracing_off() -> None:
    """Flush and turn tracing off in this process (tests)."""
    global ENABLED, _provider, _provider_pid
    with _lock:
        ENABLED = False
        if _provider is not None and _provider_pid == os.getpid():
            _provider.shutdown()
        _provider, _provider_pid = None, 0
        _config.clear()


def tracing_flush(timeout_ms: int = 5000) -> None:
    """Export what this process's batch holds (a process that ends without `atexit`)."""
    provider = _provider
    if provider is not None and _provider_pid == os.getpid():
        provider.force_flush(timeout_ms)


@cache
def _sdk() -> SimpleNamespace:
    """The OpenTelemetry SDK, imported by the first process that traces: about 0.2 s of imports that a process
    with tracing off (a tool process above all, which must start fast) never pays."""
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider, sampling
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class Ids(RandomIdGenerator):
        """Random ids, except for a span started under `_preset`: a call's root, whose ids were chosen at
        submission."""

        def generate_span_id(self) -> int:
            preset = _preset.get()
            return preset[1] if preset is not None else super().generate_span_id()

        def generate_trace_id(self) -> int:
            preset = _preset.get()
            return preset[0] if preset is not None else super().generate_trace_id()

    return SimpleNamespace(trace=trace, Context=Context, OTLPSpanExporter=OTLPSpanExporter, Resource=Resource,
                           TracerProvider=TracerProvider, BatchSpanProcessor=BatchSpanProcessor, Ids=Ids,
                           RandomIdGenerator=RandomIdGenerator, sampling=sampling)


def _make_provider():
    sdk = _sdk()
    environ = _config["environ"]
    sampler = _sampler(sdk.sampling, environ)
    attributes = {"service.name": _config["service"], "process.pid": os.getpid()}
    if _config["role"]:
        attributes["toolkeeper.process"] = _config["role"]
    provider = sdk.TracerProvider(sampler=sampler, resource=sdk.Resource.create(attributes), id_generator=sdk.Ids(),
                                  shutdown_on_exit=False)
    exporter = _config["exporter"]
    if exporter is None:
        exporter = sdk.OTLPSpanExporter(**_exporter_options(environ))
    provider.add_span_processor(sdk.BatchSpanProcessor(exporter))
    atexit.register(provider.shutdown)
    return provider


def _sampler(sampling, environ: Mapping[str, str]):
    """The sampler the standard variables name (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`: a ratio for the
    ratio samplers, 1.0 when absent or not a number in [0, 1]); an unknown name: the default,
    parent-based always on."""
    try:
        ratio = float(environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))
    except ValueError:
        ratio = 1.0
    if not 0.0 <= ratio <= 1.0:
        ratio = 1.0
    choices = {
        "always_on": lambda: sampling.ALWAYS_ON,
        "always_off": lambda: sampling.ALWAYS_OFF,
        "traceidratio": lambda: sampling.TraceIdRatioBased(ratio),
        "parentbased_always_on": lambda: sampling.ParentBased(sampling.ALWAYS_ON),
        "parentbased_always_off": lambda: sampling.ParentBased(sampling.ALWAYS_OFF),
        "parentbased_traceidratio": lambda: sampling.ParentBased(sampling.TraceIdRatioBased(ratio)),
    }
    name = (environ.get("OTEL_TRACES_SAMPLER") or "").strip().lower()
    return choices.get(name, choices["parentbased_always_on"])()


def _exporter_options(environ: Mapping[str, str]) -> dict:
    """The endpoint as the OTLP/HTTP exporter reads it: the traces endpoint as given, or the general endpoint
    with `/v1/traces` appended."""
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        return {"endpoint": traces}
    return {"endpoint": environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"}


def _tracer():
    global _provider, _provider_pid
    provider = _provider
    if provider is None or _provider_pid != os.getpid():
        with _lock:
            if not ENABLED:
                return None
            if _provider is None or _provider_pid != os.getpid():  # first span here, or in a forked child
                _provider, _provider_pid = _make_provider(), os.getpid()
            provider = _provider
    return provider.get_tracer("toolkeeper")


def _remote(trace_id: int, span_id: int, sampled: bool = True):
    api = _sdk().trace
    flags = api.TraceFlags(api.TraceFlags.SAMPLED if sampled else api.TraceFlags.DEFAULT)
    return api.set_span_in_context(api.NonRecordingSpan(api.SpanContext(trace_id, span_id, is_remote=True,
                                                                        trace_flags=flags)))


def trace_start(traceparent=None, *, name: str = "call") -> CallTrace | None:
    """Ids for a new call's trace, sampled as its root span will be: the app's trace continued when it sent a valid
    `traceparent`, else a new one. None when tracing is off or the sampler drops the call."""
    if not ENABLED:
        return None
    tracer = _tracer()
    if tracer is None:
        return None
    sdk = _sdk()
    parent = traceparent_parse(traceparent)
    ids = sdk.RandomIdGenerator()
    if parent is not None:
        trace_id, parent_id, sampled = parent
        context = _remote(trace_id, parent_id, sampled)
    else:
        trace_id, parent_id, context = ids.generate_trace_id(), 0, sdk.Context()
    if not tracer.sampler.should_sample(context, trace_id, name).decision.is_sampled():
        return None
    return CallTrace(trace_id, ids.generate_span_id(), parent_id)


def _parent_context(trace: CallTrace):
    """The current span when it belongs to this trace (a step inside the execution), else the call's root."""
    current = _sdk().trace.get_current_span().get_span_context()
    if current.is_valid and current.trace_id == trace.trace_id:
        return None  # the SDK takes the current context
    return _remote(trace.trace_id, trace.span_id)


@contextlib.contextmanager
def _started(tracer, name: str, context, attributes: dict | None, kind) -> Iterator:
    api = _sdk().trace
    span = tracer.start_span(name, context=context, kind=kind, attributes=attributes)
    with api.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        yield span


def child_span(trace: CallTrace | None, name: str, attributes: dict | None = None, *, client: bool = False):
    """A context manager: a span of the call's trace (a child of the current span of that trace, or of its root),
    current while it runs; `client` for a request to another service. Off, or an untraced call: a shared no-op
    context (it yields None)."""
    if not ENABLED or trace is None:
        return NO_SPAN
    tracer = _tracer()
    if tracer is None:
        return NO_SPAN
    kind = _sdk().trace.SpanKind
    return _started(tracer, name, _parent_context(trace), attributes, kind.CLIENT if client else kind.INTERNAL)


def remote_span(traceparent: str | None, name: str, attributes: dict | None = None, *, client: bool = True):
    """A span continuing `traceparent` — our own, carried to another process of ours (the MCP host) — current while
    it runs; a no-op without a valid one."""
    if not ENABLED or not traceparent:
        return NO_SPAN
    parent = traceparent_parse(traceparent)
    tracer = _tracer() if parent is not None else None
    if tracer is None:
        return NO_SPAN
    kind = _sdk().trace.SpanKind
    return _started(tracer, name, _remote(*parent), attributes, kind.CLIENT if client else kind.INTERNAL)


def span_error(span, description: str) -> None:
    """Mark a span (from `child_span`/`remote_span`) failed; a no-op for None."""
    if span is None:
        return
    api = _sdk().trace
    span.set_status(api.Status(api.StatusCode.ERROR, description[:200]))


def span_record(trace: CallTrace | None, name: str, *, start_ns: int, end_ns: int,
                attributes: dict | None = None) -> None:
    """A span of the call's trace, child of its root, measured already (a wait: from when it began to now)."""
    if not ENABLED or trace is None:
        return
    tracer = _tracer()
    if tracer is None:
        return
    span = tracer.start_span(name, context=_remote(trace.trace_id, trace.span_id), attributes=attributes,
                             start_time=start_ns)
    span.end(end_time=max(start_ns, end_ns))


def root_span_record(trace: CallTrace | None, name: str, *, start_ns: int, end_ns: int,
                     attributes: dict | None = None, error: str | None = None) -> None:
    """The call's root span, with the ids chosen at submission: recorded once, when the call settles."""
    if not ENABLED or trace is None:
        return
    tracer = _tracer()
    if tracer is None:
        return
    sdk = _sdk()
    context = _remote(trace.trace_id, trace.parent_id) if trace.parent_id else sdk.Context()
    token = _preset.set((trace.trace_id, trace.span_id))
    try:
        span = tracer.start_span(name, context=context, kind=sdk.trace.SpanKind.SERVER, attributes=attributes,
                                 start_time=start_ns)
    finally:
        _preset.reset(token)
    if error is not None:
        span_error(span, error)
    span.end(end_time=max(start_ns, end_ns))


def current_traceparent() -> str | None:
    """The current span as a `traceparent` for a request this process sends; None when there is none."""
    if not ENABLED:
        return None
    context = _sdk().trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return traceparent_format(context.trace_id, context.span_id, context.trace_flags.sampled)
