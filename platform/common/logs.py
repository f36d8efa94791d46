"""Logs as JSON lines (docs/observability.md, "Logs"): `TOOLKEEPER_LOG_FORMAT=json` puts `JsonFormatter` on the
handlers of settings.LOGGING.

Each record is one JSON object on one line: time, level, logger, message, and the call it was logged for —
`call_id`, `tenant`, `trace_id`, `step` — read from the context a call's work runs in (`log_context`, entered by the
pipeline, the execution and the worker). Every value is JSON-escaped, non-ASCII included, so hostile text (a tool's
name, an upstream's message) cannot break a line or forge a field. Until a `JsonFormatter` is made, `ACTIVE` is False
and the hooks that would enter a call's context skip it.
"""
import contextlib
import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime

ACTIVE = False  # True once a JsonFormatter exists in this process: the call context is then worth keeping
CALL_FIELDS = ("call_id", "tenant", "trace_id", "step")

_call: ContextVar[dict | None] = ContextVar("log_call_context", default=None)


@contextlib.contextmanager
def log_context(**fields):
    """The call (and step) that records logged inside the block are about; fields of an outer block stay unless
    given again."""
    outer = _call.get()
    token = _call.set({**outer, **fields} if outer else fields)
    try:
        yield
    finally:
        _call.reset(token)


def log_fields() -> dict:
    """The call fields of the current context (all of CALL_FIELDS, None where unknown)."""
    found = _call.get() or {}
    return {name: found.get(name) for name in CALL_FIELDS}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, call_id, tenant, trace_id, step, and
    `exception` (its traceback as text) when the record has one."""

    def __init__(self, *args, **kwargs):
        global ACTIVE
        super().__init__(*args, **kwargs)
        ACTIVE = True

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(), **log_fields(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=True, default=str)
