"""The main loop of a tool process (`@tool(isolation="process")`, see tools.python.isolation).

Started by the server's pool with one end of a socket pair; answers one request at a time: the tool's
events as they come ({"emit": …}), its questions for the user ({"ask": …}, each waiting for the server's
{"answer": …} or {"error": …}), then {"result": …} or {"error": …}. Dies with the process that
started it, and has no database.
"""
import contextlib
import ctypes
import importlib
import logging
import os
import signal
import threading
from functools import cache

import django
from django.db.backends.base.base import BaseDatabaseWrapper

from common.children import ChildSide
from tools.python.decorators import EMIT_EXTRAS, PythonTool, ToolContext, ToolError, build_python_tool
from tools.python.results import tool_result

logger = logging.getLogger("toolkeeper.calls")

PR_SET_PDEATHSIG = 1


class DetachedContext(ToolContext):
    """The context of a tool in a child process: the call's identity, and events relayed to the server."""

    def __init__(self, info: dict, emit, ask=None):
        super().__init__(tenant=None, session=None, call=None, emit=emit, cancelled=threading.Event(), ask=ask)
        self._info = info

    @property
    def call_id(self) -> str:
        return self._info.get("call_id")

    @property
    def agent(self) -> str:
        return self._info.get("agent")

    @property
    def user(self) -> str:
        return self._info.get("user")


def _no_database(self, *args, **kwargs):
    raise ToolError("a tool that runs in its own process has no database access", error_type="ToolFailed")


def _die_with_parent(parent_pid: int) -> None:
    # Not on Linux: the child still ends when its socket closes, between two calls.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(0)  # the parent is already gone


@cache
def _spec(module: str, qualname: str, name: str) -> PythonTool:
    target = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return build_python_tool(target, name=name)


def _answer(request: dict, send, recv) -> dict:
    def emit(text="", *, progress=None, kind=None, **extra) -> None:
        send({"emit": {"text": str(text), "progress": None if progress is None else float(progress), "kind": kind,
                       **{name: extra[name] for name in EMIT_EXTRAS if extra.get(name) is not None}}})

    def ask(message: str, requested_schema: dict | None, timeout_s: float | None) -> dict:
        """The server asks the session's user and sends the answer back; this process waits for it."""
        send({"ask": {"message": str(message), "requested_schema": requested_schema, "timeout_s": timeout_s}})
        reply = recv() or {}
        if "answer" in reply:
            return reply["answer"]
        error = reply.get("error") or {"type": "ToolFailed", "message": "the server did not answer the question"}
        if error.get("type") == "InvalidQuestion":
            raise ValueError(error.get("message"))
        raise ToolError(error.get("message") or "", error_type=error.get("type") or "ToolFailed")

    try:
        spec = _spec(request["module"], request["qualname"], request["name"])
        value = spec.run_here(request["arguments"], DetachedContext(request.get("context") or {}, emit, ask))
        return {"result": tool_result(value)}
    except ToolError as exc:
        return {"error": {"type": exc.error_type, "message": str(exc)}}
    except Exception:
        logger.exception("tool %s raised in its process", request.get("name"))
        return {"error": {"type": "ToolFailed", "message": "the tool failed with an unexpected error"}}


def main(fd: int, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the server; the child dies with it
    _die_with_parent(parent_pid)
    parent = ChildSide(fd)
    send = parent.send
    django.setup()
    BaseDatabaseWrapper.ensure_connection = _no_database
    send({"ready": True})
    while (request := parent.recv()) is not None:
        answer = _answer(request, send, parent.recv)
        try:
            send(answer)
        except (TypeError, ValueError):
            send({"error": {"type": "ToolFailed", "message": "the tool's result is not JSON"}})
