"""The kubelet's plugin watcher, as both lab kubelets (device plugin, DRA) emulate it.

The real watcher follows `plugins_registry` with inotify, takes only unix sockets, asks each
new (or replaced) socket `GetInfo`, lets the handler of that plugin type decide, and answers
`NotifyRegistrationStatus`. Polling the directory keeps the emulators dependency-free; a
socket counts as replaced when its (device, inode, ctime) changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import grpc

from proto.deviceplugin import pluginregistration_pb2, pluginregistration_pb2_grpc

CALL_TIMEOUT: Final = 5.0
WATCH_INTERVAL: Final = 0.02
# Decides one registration: (registered, error), after whatever connecting it needs.
Decide = Callable[[pluginregistration_pb2.PluginInfo], Awaitable[tuple[bool, str]]]


class SocketScan:
    """The sockets of one registry directory that are new or replaced since the last scan."""

    def __init__(self, registry: Path) -> None:
        self.registry = registry
        self._seen: dict[Path, tuple[int, int, int]] = {}

    def clear(self) -> None:
        self._seen.clear()

    def changed(self) -> list[Path]:
        present: dict[Path, tuple[int, int, int]] = {}
        for entry in sorted(os.listdir(self.registry)):
            path = self.registry / entry
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if stat.S_ISSOCK(st.st_mode):  # as the kubelet's watcher: other files skipped
                    present[path] = (st.st_dev, st.st_ino, st.st_ctime_ns)
        fresh = [p for p, ident in present.items() if self._seen.get(p) != ident]
        self._seen = present
        return fresh


async def poll(
    scan: SocketScan, handle: Callable[[Path], Awaitable[None]], interval: float = WATCH_INTERVAL
) -> None:
    """Hand every new or replaced socket to `handle`, until cancelled."""
    while True:
        for path in scan.changed():
            await handle(path)
        await asyncio.sleep(interval)


async def register(
    path: Path, plugin_type: str, decide: Decide
) -> tuple[pluginregistration_pb2.PluginInfo, bool, str] | None:
    """One registration round trip with the plugin at `path`: GetInfo, `decide`, then
    NotifyRegistrationStatus. (its info, registered, error), or None when the socket does
    not answer GetInfo or is a plugin of another type (another handler's: the kubelet
    dispatches by type, so each emulator leaves the others' sockets alone)."""
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
        try:
            info = await stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError:
            return None
        if info.type != plugin_type:
            return None
        ok, error = await decide(info)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=ok, error=error),
                timeout=CALL_TIMEOUT,
            )
        return info, ok, error
