"""The HTTP API's bounds against hostile or runaway clients: settings and their state.

`HttpLimitSettings` (the --http-* flags) and `HttpLimits`, one per server: the connection
guard (aggregator.api.connections), the in-flight middleware (503 + Retry-After over the
bound; the probes are exempt, so a saturated API is not restarted by its kubelet) and
the SSE subscriber count. Metrics are `aggregator.metrics.HttpMetrics`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry

from aggregator.api.connections import ConnectionGuard
from aggregator.api.errors import error_response
from aggregator.metrics import HttpMetrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Probes never wait behind the in-flight bound (aggregator.api.auth.OPEN_PATHS).
PROBE_PATHS: Final = frozenset({"/healthz", "/readyz"})


@dataclass(frozen=True, kw_only=True)
class HttpLimitSettings:
    # Seconds a connection may take to send a complete request head, counted from the
    # accept or from the end of its last response (so also the keep-alive idle time).
    header_timeout: float = 10.0
    # Open connections; over it the oldest idle one is closed for the new one. The CLI
    # derives the default from RLIMIT_NOFILE (aggregator.cli.httpflags).
    max_connections: int = 512
    max_in_flight: int = 256  # requests being handled, SSE streams included
    max_stream_clients: int = 64  # SSE subscribers of /api/v1/alerts/stream
    retry_after_s: int = 1  # the Retry-After of a 503 from a bound
    accept_log_interval: float = 10.0  # at most one accept-error log line per interval


class HttpLimits:
    """One server's bounds and what they count (`create` registers the metrics)."""

    def __init__(self, settings: HttpLimitSettings, metrics: HttpMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.connections = ConnectionGuard(
            max_connections=settings.max_connections,
            header_timeout=settings.header_timeout,
            retry_after_s=settings.retry_after_s,
            metrics=metrics,
        )
        self.in_flight = 0
        self.stream_clients = 0

    @classmethod
    def create(cls, settings: HttpLimitSettings, registry: CollectorRegistry) -> HttpLimits:
        return cls(settings, HttpMetrics.create(registry))

    @property
    def keepalive_timeout(self) -> float:
        """For aiohttp's own idle close: a backstop behind the guard's header timeout."""
        return 2 * self.settings.header_timeout

    def middleware(self) -> Middleware:
        """Outermost: marks the connection busy, answers 503 over `max_in_flight`."""
        bound = self.settings.max_in_flight

        @web.middleware
        async def in_flight(request: web.Request, handler: Handler) -> web.StreamResponse:
            protocol = request.protocol
            self.connections.request_started(protocol)
            try:
                if request.path in PROBE_PATHS:
                    return await handler(request)
                if self.in_flight >= bound:
                    self.metrics.refused.labels("in-flight").inc()
                    return self.overloaded(f"{bound} requests in flight (--http-max-in-flight)")
                self.in_flight += 1
                self.metrics.in_flight.inc()
                try:
                    return await handler(request)
                finally:
                    self.in_flight -= 1
                    self.metrics.in_flight.dec()
            finally:
                self.connections.request_finished(protocol)

        return in_flight

    def open_stream(self) -> web.Response | None:
        """Take an SSE subscriber slot (None), or the 503 to answer over the bound."""
        bound = self.settings.max_stream_clients
        if self.stream_clients >= bound:
            self.metrics.refused.labels("stream-clients").inc()
            return self.overloaded(f"{bound} alert stream clients (--http-max-stream-clients)")
        self.stream_clients += 1
        return None

    def close_stream(self) -> None:
        self.stream_clients -= 1

    def overloaded(self, what: str) -> web.Response:
        retry = self.settings.retry_after_s
        return error_response(
            503,
            "overloaded",
            f"the API is at its bound of {what}; retry after {retry} s",
            headers={"Retry-After": str(retry)},
        )
