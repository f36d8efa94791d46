"""A test OTLP receiver: a real HTTP server on 127.0.0.1 that takes traces as OTLP/HTTP defines them.

`POST /v1/traces` with a binary protobuf `ExportTraceServiceRequest` (`Content-Type: application/x-protobuf`,
optionally `Content-Encoding: gzip`) is decoded with opentelemetry-proto and answered 200 with an
`ExportTraceServiceResponse` of the same encoding; another path is 404, another method 405, another content type
415, a body that does not decode 400. Each span is kept as a `Span` (ids in hex, its resource's attributes beside
its own). `spans_of(trace_id, count)` waits, bounded, until a trace has that many spans.
"""
import gzip
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

PROTOBUF = "application/x-protobuf"
WAIT_LIMIT_S = 20.0


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in any_value.array_value.values]
    if kind == "kvlist_value":
        return {item.key: _value(item.value) for item in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def _attributes(items) -> dict:
    return {item.key: _value(item.value) for item in items}


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict
    resource: dict
    status_code: int  # 0 unset, 1 ok, 2 error


@dataclass
class Receiver:
    url: str = ""
    spans: list[Span] = field(default_factory=list)
    requests: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def endpoint(self) -> str:
        """The value of OTEL_EXPORTER_OTLP_ENDPOINT (the exporter appends /v1/traces)."""
        return self.url

    def take(self, payload: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(payload)
        taken = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    taken.append(Span(
                        trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), parent_id=span.parent_span_id.hex(),
                        name=span.name, kind=span.kind, start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano, attributes=_attributes(span.attributes), resource=resource,
                        status_code=span.status.code))
        with self.changed:
            self.spans.extend(taken)
            self.requests += 1
            self.changed.notify_all()

    def trace(self, trace_id: str) -> list[Span]:
        with self.changed:
            return [span for span in self.spans if span.trace_id == trace_id]

    def spans_of(self, trace_id: str, count: int, *, timeout: float = WAIT_LIMIT_S) -> list[Span]:
        """The trace's spans once at least `count` arrived (a bound keeps a broken run from hanging; never a timed
        assertion)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = [span for span in self.spans if span.trace_id == trace_id]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted(span.name for span in found)
                    raise AssertionError(f"trace {trace_id}: {len(found)} spans of {count} arrived: {names}")
                self.changed.wait(left)


def _handler(receiver: Receiver):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, status: int, body: bytes = b"", content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # noqa: N802 (the handler's own naming)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.path != "/v1/traces":
                return self._answer(404)
            if (self.headers.get("Content-Type") or "").split(";")[0].strip() != PROTOBUF:
                return self._answer(415)
            try:
                if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                    body = gzip.decompress(body)
                receiver.take(body)
            except (DecodeError, OSError, EOFError):
                return self._answer(400)
            return self._answer(200, ExportTraceServiceResponse().SerializeToString(), PROTOBUF)

        def do_GET(self):  # noqa: N802
            self._answer(405)

    return Handler


def serve() -> Iterator[Receiver]:
    """A running receiver for the duration of a fixture."""
    receiver = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


def tree(spans: list[Span]) -> dict[str, list[str]]:
    """Each span's name → the names of its children (by parent id), sorted: the shape of a trace."""
    by_id = {span.span_id: span for span in spans}
    shape: dict[str, list[str]] = {span.name: [] for span in spans}
    for span in spans:
        parent = by_id.get(span.parent_id)
        if parent is not None:
            shape[parent.name].append(span.name)
    return {name: sorted(children) for name, children in shape.items()}
