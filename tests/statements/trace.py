"""Every SQL statement any thread runs while a trace is on, with the thread that ran it, and the
transactions committed: what one governed call costs the database, counted where it cannot be missed."""
import re
import threading
from dataclasses import dataclass, field

from django.db.backends import utils
from django.db.backends.base.base import BaseDatabaseWrapper


def shape(sql: str) -> str:
    """A statement's kind and table: `SELECT tools_toolcall`, `WITH UPDATE tools_toolcall INSERT …`."""
    text = sql.strip()
    verb = text.split(None, 1)[0].upper()
    if verb == "WITH":
        return "WITH " + " ".join(f"{m.group(1).upper()} {m.group(2)}" for m in re.finditer(
            r'\b(UPDATE|INSERT INTO)\s+"?([A-Za-z_]+)"?', text))
    while True:  # subqueries and value lists out: the statement's own table is left
        flat = re.sub(r"\([^()]*\)", "", text)
        if flat == text:
            break
        text = flat
    table = re.search(r'\b(?:FROM|INTO|UPDATE)\s+"?([A-Za-z_]+)"?', text)
    return f"{verb} {table.group(1) if table else ''}".strip()


@dataclass
class Trace:
    statements: list[tuple[str, str]] = field(default_factory=list)  # (thread name, statement shape)
    commits: list[str] = field(default_factory=list)  # thread names
    texts: list[tuple[str, object]] = field(default_factory=list)  # (SQL, parameters), for asking for plans
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        with self._lock:
            self.statements.clear()
            self.commits.clear()
            self.texts.clear()

    def of(self, thread_prefix: str) -> list[str]:
        return [statement for thread, statement in self.statements if thread.startswith(thread_prefix)]

    def commits_of(self, thread_prefix: str) -> int:
        return sum(1 for thread in self.commits if thread.startswith(thread_prefix))


def trace_on(monkeypatch) -> Trace:
    """Record every statement and commit of every connection, in every thread, until the test ends."""
    trace = Trace()
    execute, executemany = utils.CursorWrapper.execute, utils.CursorWrapper.executemany
    commit = BaseDatabaseWrapper.commit

    def traced_execute(self, sql, params=None):
        with trace._lock:
            trace.statements.append((threading.current_thread().name, shape(sql)))
            trace.texts.append((sql, params))
        return execute(self, sql, params)

    def traced_executemany(self, sql, param_list):
        """One statement with many sets of values: one entry, as it is one round trip (psycopg's pipeline)."""
        param_list = list(param_list)
        with trace._lock:
            trace.statements.append((threading.current_thread().name, shape(sql) + " (many)"))
            trace.texts.extend((sql, params) for params in param_list[:1])
        return executemany(self, sql, param_list)

    def traced_commit(self):
        with trace._lock:
            trace.commits.append(threading.current_thread().name)
        return commit(self)

    monkeypatch.setattr(utils.CursorWrapper, "execute", traced_execute)
    monkeypatch.setattr(utils.CursorWrapper, "executemany", traced_executemany)
    monkeypatch.setattr(BaseDatabaseWrapper, "commit", traced_commit)
    return trace
