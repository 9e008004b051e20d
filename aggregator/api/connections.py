"""The API listener's connection bound and header timeout, and rate-limited accept errors.

`ConnectionGuard` makes the protocol of every accepted connection: over the bound it closes
the oldest idle connection (no request in progress) for the new one, or answers 503 and
closes when none is idle; a connection without a complete request head within the header
timeout (of connecting, or of its last response) is closed. `AcceptErrorLog` is the loop's
exception handler for accept() failures (EMFILE): counted always, logged once per interval.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from aggregator.metrics import HttpMetrics

log = logging.getLogger(__name__)

# asyncio's BaseSelectorEventLoop._accept_connection reports EMFILE/ENFILE/ENOBUFS/ENOMEM
# with this message, once per accept attempt: up to `backlog` (128) reports per loop tick,
# and as many re-arms of the listener a second later (CPython 3.11 does not stop the loop).
ACCEPT_FAILED: Final = "socket.accept() out of system resource"
BACKLOG: Final = 128  # aiohttp's TCPSite default: listen() backlog and accepts per tick
ExceptionHandler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]


@dataclass
class _Conn:
    busy: int  # requests in progress on the connection (the middleware counts them)
    idle_since: float  # loop time of the accept or of the end of the last request
    timer: asyncio.TimerHandle | None


class ConnectionGuard:
    """Counts the server's open connections, evicts or refuses over `max_connections`,
    closes connections idle (no complete request head) for `header_timeout` seconds."""

    def __init__(
        self,
        *,
        max_connections: int,
        header_timeout: float,
        retry_after_s: int,
        metrics: HttpMetrics,
    ) -> None:
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.retry_after_s = retry_after_s
        self.metrics = metrics
        self._conns: dict[RequestHandler, _Conn] = {}
        self._server: web.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def protocol_factory(self, server: web.Server) -> Callable[[], asyncio.BaseProtocol]:
        """What `loop.create_server` calls per accepted connection (instead of `server`)."""
        self._server = server
        self._loop = asyncio.get_running_loop()
        self.metrics.connections.set_function(lambda: len(self._open()))
        return self._accepted

    def request_started(self, protocol: RequestHandler) -> None:
        conn = self._conns.get(protocol)
        if conn is not None:
            conn.busy += 1

    def request_finished(self, protocol: RequestHandler) -> None:
        conn = self._conns.get(protocol)
        if conn is None or self._loop is None:
            return
        conn.busy -= 1
        conn.idle_since = self._loop.time()
        if conn.timer is None:
            conn.timer = self._loop.call_at(
                conn.idle_since + self.header_timeout, self._check, protocol
            )

    def open_connections(self) -> int:
        return len(self._open())

    def _open(self) -> list[RequestHandler]:
        # `Server.connections` keeps a connection until its handler task ends; one we
        # closed already has no transport. Oldest first (connection_made order).
        server = self._server
        return [] if server is None else [h for h in server.connections if h.transport]

    def _accepted(self) -> asyncio.BaseProtocol:
        assert self._server is not None and self._loop is not None
        open_now = self._open()
        if len(open_now) >= self.max_connections:
            idle = next((h for h in open_now if not self._is_busy(h)), None)
            if idle is None:
                self.metrics.connections_closed.labels("refused").inc()
                return _Refused(self.max_connections, self.retry_after_s)
            self._close(idle, "evicted")
        handler = self._server()
        now = self._loop.time()
        timer = self._loop.call_at(now + self.header_timeout, self._check, handler)
        self._conns[handler] = _Conn(busy=0, idle_since=now, timer=timer)
        return handler

    def _is_busy(self, handler: RequestHandler) -> bool:
        conn = self._conns.get(handler)
        return conn is not None and conn.busy > 0

    def _check(self, handler: RequestHandler) -> None:
        conn = self._conns.get(handler)
        if conn is None or self._loop is None:
            return
        conn.timer = None
        if handler.transport is None:  # closed by the client (connection_made ran long ago)
            del self._conns[handler]
            return
        if conn.busy:
            return  # request_finished re-arms
        due = conn.idle_since + self.header_timeout
        if self._loop.time() < due:
            conn.timer = self._loop.call_at(due, self._check, handler)
            return
        self._close(handler, "header-timeout")

    def _close(self, handler: RequestHandler, reason: str) -> None:
        conn = self._conns.pop(handler, None)
        if conn is not None and conn.timer is not None:
            conn.timer.cancel()
        handler.force_close()
        self.metrics.connections_closed.labels(reason).inc()


class _Refused(asyncio.Protocol):
    """Over the bound with every connection busy: a fixed 503, then close."""

    def __init__(self, bound: int, retry_after_s: int) -> None:
        body = (
            b'{"error":{"code":"overloaded","message":"%d connections open'
            b' (--http-max-connections), none idle; retry later"}}' % bound
        )
        self._response = (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: %d\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (retry_after_s, len(body), body)
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(self._response)
        transport.close()


class GuardedSite(web.BaseSite):
    """A TCP listener whose connections go through `guard` (aiohttp's TCPSite, guarded)."""

    __slots__ = ("_guard", "_host", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard):
        super().__init__(runner, backlog=BACKLOG)
        self._host, self._port, self._guard = host, port, guard

    @property
    def name(self) -> str:
        host, port = self.bound() if self._server is not None else (self._host, self._port)
        return f"http://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None  # BaseSite.__init__ checked setup() ran
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.protocol_factory(server),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=True,
        )

    def bound(self) -> tuple[str, int]:
        """The listening address (the OS's port when started on port 0)."""
        sockets = getattr(self._server, "sockets", None) or ()
        for sock in sockets:
            host, port = sock.getsockname()[:2]
            return str(host), int(port)
        raise RuntimeError("the API site is not listening")


class ReportLimit:
    """Pure: at most one report per `interval` seconds; counts what it held back."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last: float | None = None
        self._held = 0

    def event(self, now: float) -> int | None:
        """None: stay quiet; else report now, covering this many events (this one included)."""
        self._held += 1
        if self._last is not None and now - self._last < self.interval:
            return None
        self._last, covered, self._held = now, self._held, 0
        return covered


class AcceptErrorLog:
    """Loop exception handler: accept() out of resources is counted and logged at most
    once per `interval`; every other context goes to the handler it replaced."""

    def __init__(
        self,
        *,
        interval: float,
        metrics: HttpMetrics,
        guard: ConnectionGuard,
        previous: ExceptionHandler | None,
    ) -> None:
        self._limit = ReportLimit(interval)
        self._metrics, self._guard, self._previous = metrics, guard, previous

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if context.get("message") != ACCEPT_FAILED or not isinstance(exc, OSError):
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        code = exc.errno or 0
        self._metrics.accept_errors.labels(errno.errorcode.get(code, str(code))).inc()
        covered = self._limit.event(loop.time())
        if covered is not None:
            log.error(
                "API listener cannot accept connections: %s (%d accept failures since the"
                " last report, at most one report per %gs; %d connections open, bound %d)",
                exc.strerror or exc, covered, self._limit.interval,
                self._guard.open_connections(), self._guard.max_connections,
            )  # fmt: skip


def log_accept_errors(
    loop: asyncio.AbstractEventLoop,
    *,
    interval: float,
    metrics: HttpMetrics,
    guard: ConnectionGuard,
) -> Callable[[], None]:
    """Install `AcceptErrorLog` on `loop`; the callable puts the previous handler back."""
    previous = loop.get_exception_handler()
    loop.set_exception_handler(
        AcceptErrorLog(interval=interval, metrics=metrics, guard=guard, previous=previous)
    )
    return lambda: loop.set_exception_handler(previous)
