"""The kubelet stand-in of the device-plugin tests: agent.lab.kubelet (real gRPC
Registration server, dial-back, ListAndWatch follower, plugin watcher), re-exported,
plus `silent_socket`, a hung kubelet."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any

from agent.lab.kubelet import KubeletEmulator, PluginConnection, ResourceView
from agent.lab.pluginwatch import CALL_TIMEOUT, WATCH_INTERVAL

__all__ = [
    "CALL_TIMEOUT",
    "WATCH_INTERVAL",
    "KubeletEmulator",
    "PluginConnection",
    "ResourceView",
    "silent_socket",
]


@contextlib.contextmanager
def silent_socket(path: Path) -> Any:
    """A unix socket that accepts connections into its backlog and never answers: a hung
    kubelet as a plugin sees it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        sock.listen(16)
        yield sock
    finally:
        sock.close()
        path.unlink(missing_ok=True)
