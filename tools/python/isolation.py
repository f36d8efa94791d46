"""How Python tools are stopped: in their thread at the next instruction, or by killing their process.

Threads cannot be killed. A thread-run tool is stopped by raising `ThreadStop` inside it
(`PyThreadState_SetAsyncExc`), which takes effect at its next Python instruction. The exception is
only ever injected while the thread runs the tool: not in the platform's context methods
(`ctx.emit`, `ctx.sleep`, …), and not while its innermost frame is in code that juggles locks shared
with other threads (the standard library's threading, queue, logging and asyncio, the broker and
channel clients, the platform's own machinery), where an exception between a lock's acquire and its
`try` would leave the lock held for every thread. Such a frame postpones the stop (retried with back
off); a pending injection is cleared the moment the tool leaves. The stop may land in database code
the tool called: the thread's connections are then closed and replaced, which ends an open
transaction. A tool blocked in one long C call (a GIL-holding computation, `time.sleep`, a read
without timeout) is stopped when that call returns.

A process-run tool (`@tool(isolation="process")`) runs in a child process from a small pool of
pre-started ones; stopping it kills the child, and the pool starts a replacement. The child has no
database; its `ctx.emit` events travel to the parent over the pipe, and the parent writes them. Its
`ctx.ask_user` travels the same way: the parent asks, waits for the answer and sends it back to the child, which
waits meanwhile (a stop kills it there too).
"""
import contextlib
import ctypes
import importlib.util
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connections

from common.children import READY_TIMEOUT_S, ChildGone, ChildProcess, start_child

logger = logging.getLogger("toolkeeper.calls")

STOP_GRACE_S = 1.0  # a cooperative tool (ctx.sleep, ctx.check_cancelled, awaits) leaves by itself within this
STOP_RETRY_MAX_S = 0.5
# Set in the tool processes: they run Python tools only and must start fast, so they leave out the MCP
# client (tools.apps), whose SDK alone takes seconds to import.
TOOL_PROCESS_ENV = "TOOLKEEPER_TOOL_PROCESS"

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


class ThreadStop(BaseException):
    """Raised inside a thread-run tool to stop it. A BaseException, so `except Exception` does not swallow it;
    a tool that swallows it anyway is hit again until it leaves."""


_THREAD_STOP = ctypes.py_object(ThreadStop)


class ToolStopped(Exception):
    """A tool's thread was stopped, or its process killed, after its call was settled."""


class CallStop(threading.Event):
    """A call's cancel signal (timeout or cancel). Setting it also runs the stop hooks of whatever runs the
    tool: stopping a thread, cancelling an asyncio task, killing a child process."""

    def __init__(self):
        super().__init__()
        self._hooks: list[Callable[[], None]] = []
        self._hooks_lock = threading.Lock()

    def on_set(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Run `hook` when the signal is set (at once if it is). Returns a remover: once it has returned, the
        hook neither runs nor is still running."""
        with self._hooks_lock:
            if not self.is_set():
                self._hooks.append(hook)
                return lambda: self._remove(hook)
        _run_hook(hook)
        return _nothing

    def _remove(self, hook) -> None:
        with self._hooks_lock, contextlib.suppress(ValueError):
            self._hooks.remove(hook)

    def set(self) -> None:
        with self._hooks_lock:
            if self.is_set():
                return
            super().set()
            hooks, self._hooks = self._hooks, []
            for hook in hooks:  # under the lock, so that a removed hook can never run late
                _run_hook(hook)


def _nothing() -> None:
    return None


def _run_hook(hook) -> None:
    try:
        hook()
    except Exception:
        logger.exception("a stop hook failed")


# --- threads -----------------------------------------------------------------------------------------

def _module_locations(*names: str) -> list[str]:
    locations = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        if spec.submodule_search_locations:
            locations += [os.path.join(path, "") for path in spec.submodule_search_locations]
        elif spec.origin:
            locations.append(spec.origin)
    return locations


_TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
# Frames where an exception must not land: code that juggles locks shared with other threads, event loops and
# thread hand-offs, and the platform's own call machinery (its SQLite writer lock among them). Database code
# is not here: it only touches the thread's own connections, which are discarded after a stop.
_FRAGILE = tuple(
    _module_locations(
        "threading", "queue", "logging", "asyncio", "concurrent", "multiprocessing", "selectors", "psycopg_pool",
        "redis", "asgiref", "channels", "channels_redis", "kombu", "celery", "billiard",
        "toolkeeper", "tenancy", "audit", "realtime",
    )
    + [os.path.join(_TOOLS_DIR, name) for name in ("decorators.py", "events.py", "call_statements.py", "execution.py",
                                                   "executors.py", "isolation.py", "waiting.py", "worker.py")]
)


def _interruptible(frame) -> bool:
    return frame is not None and not frame.f_code.co_filename.startswith(_FRAGILE)


class ThreadGuard:
    """Runs a tool's code in the current thread so that setting the call's `CallStop` stops it: at once for
    cooperative tools (they see the signal), after STOP_GRACE_S by `ThreadStop` for the others."""

    def __init__(self, stop: threading.Event | None):
        self._stop = stop
        self._lock = threading.Lock()
        self._ident = 0
        self._inside = False  # the thread executes the tool's code (not a shielded platform section)
        self._fired = False
        self._left = threading.Event()
        self._active = False

    def run(self, step: Callable[[], object]):
        """`step()` in this thread; raises ToolStopped when the tool was stopped."""
        on_set = getattr(self._stop, "on_set", None)
        if on_set is None:
            return step()
        self._ident = threading.get_ident()
        self._c_ident = ctypes.c_ulong(self._ident)
        self._active = True
        with self._lock:
            self._inside = True
        remove = on_set(self._request_stop)
        try:
            outcome = (True, step())
        except ThreadStop:
            outcome = None
        except BaseException as exc:
            outcome = (False, exc)
        try:
            self._leave()
        except ThreadStop:  # injected just before the tool returned: it fires here at the latest, and only once
            outcome = None
            self._leave()
        except BaseException as exc:  # raised by a signal handler (Celery's soft time limit): leave all the same
            outcome = (False, exc)
            self._leave()
        remove()
        if self._fired:
            discard_thread_connections()
        if outcome is None:
            raise ToolStopped("the tool was stopped")
        ok, value = outcome
        if ok:
            return value
        raise value

    def _leave(self) -> None:
        with self._lock:
            self._inside = False  # first: from here on nothing is injected
            if self._fired:
                _set_async_exc(self._c_ident, None)  # a C call: clears a pending stop before it can fire
        self._active = False
        self._left.set()

    @contextlib.contextmanager
    def shielded(self):
        """A platform section inside the tool's run (the context's methods): never interrupted."""
        if not self._active or threading.get_ident() != self._ident:
            yield
            return
        with self._lock:
            self._inside = False
            if self._fired:
                _set_async_exc(self._c_ident, None)
        try:
            yield
        finally:
            with self._lock:
                self._inside = self._active

    def _request_stop(self) -> None:
        if not self._left.is_set():
            threading.Thread(target=self._stop_when_possible, name="toolkeeper-stop", daemon=True).start()

    def _stop_when_possible(self) -> None:
        if self._left.wait(STOP_GRACE_S):
            return
        pause = 0.01
        while True:
            with self._lock:
                if self._inside and _interruptible(sys._current_frames().get(self._ident)):
                    _set_async_exc(self._c_ident, _THREAD_STOP)
                    self._fired = True
            if self._left.wait(pause):
                return
            pause = min(pause * 2, STOP_RETRY_MAX_S)


def discard_thread_connections() -> None:
    """After a stop that may have landed anywhere in the tool's own database work: this thread's connections
    are closed (which also ends an open transaction and frees SQLite's writer lock) and replaced on next use."""
    for connection in connections.all(initialized_only=True):
        with contextlib.suppress(Exception):
            connection.close()
        with contextlib.suppress(AttributeError):
            del connections[connection.alias]


# --- processes ---------------------------------------------------------------------------------------

class ProcessPool:
    """`size` children, started ahead of need and reused (the most recently used first, its imports warm).
    More calls at once than children start more on demand; beyond `size`, returned children are closed.
    A killed or crashed child is replaced at once. All children are started by one long-lived thread,
    because a child asks to be killed when the thread that started it ends (PR_SET_PDEATHSIG)."""

    def __init__(self, size: int):
        self.size = max(1, size)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._idle: list[ChildProcess] = []  # the most recently used last
        self._busy = 0
        self._waiting = 0
        self._starting = 0
        self._failures = 0
        threading.Thread(target=self._start_loop, name="toolkeeper-tool-processes", daemon=True).start()

    def warm(self) -> None:
        with self._lock:
            self._request_starts()

    def _request_starts(self) -> None:
        wanted = max(self.size - self._busy - len(self._idle), self._waiting - len(self._idle))
        if wanted > self._starting:
            self._starting = wanted
            self._changed.notify_all()

    def acquire(self) -> ChildProcess:
        while True:
            deadline = time.monotonic() + READY_TIMEOUT_S
            with self._lock:
                self._busy += 1
                self._waiting += 1
                failures = self._failures
                try:
                    while not self._idle:
                        self._request_starts()
                        remaining = deadline - time.monotonic()
                        if self._failures != failures or remaining <= 0:
                            self._busy -= 1
                            raise ChildGone("no tool process could be started")
                        self._changed.wait(remaining)
                    child = self._idle.pop()
                finally:
                    self._waiting -= 1
            try:
                child.wait_ready()
            except ChildGone:
                self.discard(child)
                raise
            if child.alive():
                return child
            self.discard(child)  # it died while idle: take another

    def release(self, child: ChildProcess) -> None:
        with self._lock:
            self._busy -= 1
            if child.alive() and len(self._idle) < self.size:
                self._idle.append(child)
                self._changed.notify_all()
                return
        child.close()

    def discard(self, child: ChildProcess) -> None:
        child.close()
        with self._lock:
            self._busy -= 1
            self._request_starts()

    def _start_loop(self) -> None:
        while True:
            with self._lock:
                while not self._starting:
                    self._changed.wait()
            try:
                child = _start_child()
            except Exception:
                logger.exception("could not start a tool process")
                child = None
            with self._lock:
                self._starting -= 1
                if child is None:
                    self._failures += 1
                else:
                    self._idle.insert(0, child)  # below the warm ones, which are reused first
                self._changed.notify_all()


_CHILD_MAIN = "import sys; from tools.python.isolation_child import main; main(int(sys.argv[1]), int(sys.argv[2]))"


def _start_child() -> ChildProcess:
    return start_child(_CHILD_MAIN, env={TOOL_PROCESS_ENV: "1"})


_pool: ProcessPool | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def process_pool() -> ProcessPool:
    """This process's pool (a forked process, such as a Celery worker child, gets its own)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ProcessPool(settings.TOOLKEEPER_TOOL_PROCESSES)
            _pool_pid = os.getpid()
            _pool.warm()
        return _pool


def child_run(request: dict, *, emit: Callable[[dict], None], stop: threading.Event | None,
              ask: Callable[[dict], dict] | None = None) -> dict:
    """Run one tool call in a child process: `emit` gets the child's events, `ask` its questions for the user
    (`ctx.ask_user`; what it returns goes back to the waiting child), the answer is the child's final
    message ({"result": …} or {"error": …}). Raises ToolStopped when `stop` killed the child, ChildGone when the
    child ended by itself."""
    pool = process_pool()
    child = pool.acquire()
    on_set = getattr(stop, "on_set", None)
    remove = on_set(child.kill) if on_set is not None else _nothing
    try:
        child.send(request)
        while True:
            message = child.recv()
            if "ask" in message:
                child.send(ask(message["ask"]) if ask is not None else {
                    "error": {"type": "NoUserToAsk", "message": "this call cannot ask its user a question"}})
                continue
            if "emit" not in message:
                break
            emit(message["emit"])
    except ChildGone:
        remove()
        pool.discard(child)
        if stop is not None and stop.is_set():
            raise ToolStopped("the tool's process was stopped") from None
        raise
    except BaseException:
        remove()
        pool.discard(child)  # it may still be running the tool
        raise
    remove()
    pool.release(child)
    return message
