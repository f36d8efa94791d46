"""Bench only (bench/embedded_cores.py): the embedded SQLite backend with its writer queue shared by every server
process of one data dir. The product's backend queues a process's writer threads on a thread lock and leaves other
processes to SQLite's busy handler, which sleeps and polls; here the lock also takes an exclusive `flock` on a file
beside the database, so writers of all processes wait in the kernel and the next one wakes when the lock is let go.
"""
import fcntl
import os
import threading

from django.conf import settings

from common.sqlite3 import base as product_base


class ProcessesWriterLock:
    """The process's writer lock (one thread at a time), then the data dir's file lock (one process at a time)."""

    def __init__(self):
        self.threads = threading.Lock()
        self.fd: int | None = None

    def acquire(self) -> None:
        self.threads.acquire()
        try:
            if self.fd is None:
                path = settings.DATABASES["default"]["NAME"]
                self.fd = os.open(f"{path}.writer-lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            self.threads.release()
            raise

    def release(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self.threads.release()


product_base._write_lock = ProcessesWriterLock()
DatabaseWrapper = product_base.DatabaseWrapper
