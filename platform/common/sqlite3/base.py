"""SQLite for the embedded mode: one writer at a time inside the process, queued fairly.

SQLite allows one writer. Left to itself, a thread that finds the database locked sleeps in
SQLite's busy handler with growing back-off, which turns contention into long tail latencies.
Taking a process-wide lock before `BEGIN IMMEDIATE` makes writer threads queue on a lock that
hands over as soon as the previous transaction ends. Other processes still meet the busy handler.
"""
import functools
import threading

from django.db.backends.sqlite3 import base

_write_lock = threading.Lock()


@functools.lru_cache(maxsize=4096)
def _qmark(query: str) -> str:
    return base.FORMAT_QMARK_REGEX.sub("?", query).replace("%%", "%")


class CursorWrapper(base.SQLiteCursorWrapper):
    """Django's cursor, keeping each statement's conversion to SQLite's `?` placeholders: the same statements
    run over and over, and the conversion (a regular-expression pass) cost as much as a short statement."""

    def convert_query(self, query, *, param_names=None):
        if param_names is None:
            return _qmark(query)
        return super().convert_query(query, param_names=param_names)


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_write_lock = False

    def create_cursor(self, name=None):
        return self.connection.cursor(factory=CursorWrapper)

    def _start_transaction_under_autocommit(self):
        _write_lock.acquire()
        self._holds_write_lock = True
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._release_write_lock()
            raise

    def _release_write_lock(self):
        if self._holds_write_lock:
            self._holds_write_lock = False
            _write_lock.release()

    def _commit(self):
        try:
            return super()._commit()
        finally:
            self._release_write_lock()

    def _rollback(self):
        try:
            return super()._rollback()
        finally:
            self._release_write_lock()

    def _close(self):
        try:
            return super()._close()
        finally:
            self._release_write_lock()
