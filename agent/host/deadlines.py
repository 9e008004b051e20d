"""A time bound for collections whose reads can block in the kernel.

A sysfs read can wait on firmware (an mlx5 hw_counters or port query) and cannot be
interrupted. `ReadGuard` tracks which file each thread is reading; `run` gives a
collection up after a timeout, leaves the stuck thread behind and runs it again with
that file answering ETIMEDOUT, so one hung file costs one error, not the collection.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final, Generic, TypeVar

from agent.errors import CollectionTimeout, ReadFailed

T = TypeVar("T")
TIMED_OUT: Final = "ETIMEDOUT"
THREAD_NAME: Final = "nicfleet-sysfs"


class ReadAbandoned(BaseException):
    """Ends a worker whose collection was given up while it was blocked in a read.

    A BaseException so that no `except ReadFailed`/`except Exception` on the way stops it.
    """


class ReadGuard:
    """Which path each thread is reading, which paths a given-up thread is still stuck
    in, and those given-up threads. Readers wrap every read in `enter`/`leave`."""

    def __init__(self) -> None:
        self._reading: dict[int, str] = {}
        self._hung: set[str] = set()
        self._abandoned: set[int] = set()
        self._lock = threading.Lock()

    def enter(self, path: str) -> int:
        """Before a read of `path`: ETIMEDOUT at once while a given-up read of it is stuck."""
        if path in self._hung:
            raise ReadFailed(path, TIMED_OUT)
        me = threading.get_ident()
        self._reading[me] = path
        return me

    def leave(self, me: int, path: str) -> None:
        """After the read (also when it failed). A thread given up on stops here."""
        self._reading.pop(me, None)
        if me in self._abandoned:
            with self._lock:
                self._hung.discard(path)
                self._abandoned.discard(me)
            raise ReadAbandoned

    def run(self, work: Callable[[], T], *, timeout: float | None, retries: int) -> T:
        """`work()` in a daemon thread, given up after `timeout` seconds, at most
        `retries` times; then CollectionTimeout. `timeout=None` runs it inline."""
        if timeout is None:
            return work()
        stuck = "/"
        for _ in range(retries + 1):
            attempt = _Attempt(self, work)
            attempt.done.wait(timeout)
            with self._lock:
                if not attempt.done.is_set():
                    ident = attempt.thread.ident or 0
                    self._abandoned.add(ident)
                    path = self._reading.get(ident)
                    if path is not None:
                        self._hung.add(path)
                        stuck = path
                    continue
            return attempt.result()
        raise CollectionTimeout(stuck, TIMED_OUT)

    def finished(self) -> None:
        """Called by a worker thread as it ends, under the lock `run` decides with."""
        self._abandoned.discard(threading.get_ident())


class _Attempt(Generic[T]):
    """One run of a collection in its own daemon thread."""

    def __init__(self, guard: ReadGuard, work: Callable[[], T]) -> None:
        self._guard = guard
        self._work = work
        self._outcome: list[T] = []
        self._failure: list[BaseException] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._outcome.append(self._work())
        except ReadAbandoned:
            pass  # given up on: nobody waits for this result any more
        except BaseException as exc:
            self._failure.append(exc)
        finally:
            with self._guard._lock:
                self._guard.finished()
                self.done.set()

    def result(self) -> T:
        if self._failure:
            raise self._failure[0]
        return self._outcome[0]
