"""The device plugin's unix sockets: their names, their identity, and serving gRPC on one.

The kubelet finds plugins by socket file and deletes them when it restarts; a recreated
file is told from the old one by `socket_id`. Nothing here knows the gRPC services served.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import grpc

from agent.errors import AgentError

# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH: Final = 107
# (st_dev, st_ino, st_ctime_ns): inode numbers are reused at once, creation times are not.
SocketId = tuple[int, int, int]


class ServeError(AgentError, retryable=True):
    """A plugin or registration socket could not be served (retryable)."""


def socket_name(resource: str) -> str:
    return f"nicfleet-{resource.replace('/', '_')}.sock"


def socket_id(path: Path) -> SocketId | None:
    """Identity of the file at `path` (None when absent): a recreated socket differs."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


async def start_unix_server(path: Path, add_services: Callable[[Any], None]) -> Any:
    """A started grpc.aio server on unix socket `path` (a stale file there is replaced)."""
    _prepare_socket_path(path)
    server = grpc.aio.server()
    add_services(server)
    try:
        server.add_insecure_port(f"unix://{path}")
        await server.start()
    except Exception as exc:  # grpc raises RuntimeError for bind failures
        await server.stop(None)
        raise ServeError(f"{path}: cannot serve: {exc}") from exc
    return server


def _prepare_socket_path(path: Path) -> None:
    # Quick local metadata calls: not worth a thread hop.
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ServeError(f"{path}: socket path longer than {MAX_SOCKET_PATH} bytes")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise ServeError(f"{path}: {exc.strerror}") from exc
