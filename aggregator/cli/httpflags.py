"""The `--http-*` flags of `nicfleet-aggregator run`: the HTTP API's bounds against hostile
clients (header timeout, open connections, requests in flight, SSE subscribers).

One decorator adds them and hands the command `http_limits` (`HttpLimitSettings`). The
connection bound's default is read from this process's RLIMIT_NOFILE, here at the edge.
"""

from __future__ import annotations

import functools
import resource
from collections.abc import Callable
from typing import Any, Final

import click

from aggregator.api.limits import HttpLimitSettings

_DEFAULTS: Final = HttpLimitSettings()
# Half the fd limit for API connections, less room for NATS, Kubernetes and files; the
# other half takes an accept burst (up to 128 sockets accepted before any is counted).
FD_RESERVE: Final = 32
MIN_CONNECTIONS, MAX_DEFAULT_CONNECTIONS = 16, 1024

_OPTIONS = (
    click.option("--http-header-timeout", type=click.FloatRange(min=0.5),
                 default=_DEFAULTS.header_timeout, show_default=True, metavar="SECONDS",
                 help="Close an API connection that sends no complete request head within "
                 "this time of connecting or of its last response (slowloris)."),
    click.option("--http-max-connections", type=click.IntRange(min=MIN_CONNECTIONS),
                 metavar="N", help="Open API connections; a new one over the bound closes the "
                 "oldest idle one (or is answered 503 when none is idle). Default: half the "
                 f"open-files limit (RLIMIT_NOFILE) less {FD_RESERVE}, "
                 f"{MIN_CONNECTIONS} to {MAX_DEFAULT_CONNECTIONS}."),
    click.option("--http-max-in-flight", type=click.IntRange(min=1),
                 default=_DEFAULTS.max_in_flight, show_default=True, metavar="N",
                 help="API requests handled at once (SSE streams included; /healthz and "
                 "/readyz exempt); over it: 503 with Retry-After."),
    click.option("--http-max-stream-clients", type=click.IntRange(min=1),
                 default=_DEFAULTS.max_stream_clients, show_default=True, metavar="N",
                 help="Subscribers of /api/v1/alerts/stream; over it: 503 with Retry-After."),
)  # fmt: skip


def default_max_connections(open_files: int) -> int:
    """The connection bound for a soft RLIMIT_NOFILE of `open_files` (-1: unlimited)."""
    if open_files < 0:
        return MAX_DEFAULT_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_DEFAULT_CONNECTIONS, open_files // 2 - FD_RESERVE))


def http_limit_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the flags; the command receives `http_limits` instead of them."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        http_header_timeout: float,
        http_max_connections: int | None,
        http_max_in_flight: int,
        http_max_stream_clients: int,
        **kwargs: Any,
    ) -> None:
        if http_max_connections is None:
            soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            http_max_connections = default_max_connections(soft)
        settings = HttpLimitSettings(
            header_timeout=http_header_timeout,
            max_connections=http_max_connections,
            max_in_flight=http_max_in_flight,
            max_stream_clients=http_max_stream_clients,
        )
        command(*args, http_limits=settings, **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper
