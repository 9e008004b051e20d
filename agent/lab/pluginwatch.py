"""The kubelet's plugin watcher, as both lab kubelets (device plugin, DRA) emulate it.

The real watcher follows `plugins_registry` with inotify, takes only unix sockets, asks each
new (or replaced) socket `GetInfo`, lets the handler of that plugin type decide, and answers
`NotifyRegistrationStatus`. Polling the directory keeps the emulators dependency-free; a
socket counts as replaced when its (device, inode, ctime) changes. A socket that does not
answer `GetInfo` (its server not serving yet, or too slow under load) is asked again with a
growing pause, as the kubelet's reconciler retries a failed registration.
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
RETRY_FIRST: Final = 0.05  # seconds before asking an unanswering socket again; doubles ...
RETRY_MAX: Final = 2.0  # ... up to this
# Decides one registration: (registered, error), after whatever connecting it needs.
Decide = Callable[[pluginregistration_pb2.PluginInfo], Awaitable[tuple[bool, str]]]


class SocketScan:
    """The sockets of one registry directory that are new or replaced since the last scan."""

    def __init__(self, registry: Path) -> None:
        self.registry = registry
        self._seen: dict[Path, tuple[int, int, int]] = {}
        # An unanswered socket: (pause before the next ask, when it is due), by path; a
        # replaced socket starts over.
        self._retry: dict[Path, tuple[float, float]] = {}

    def clear(self) -> None:
        self._seen.clear()
        self._retry.clear()

    def changed(self, now: float = 0.0) -> list[Path]:
        """New or replaced sockets, then unanswered ones whose pause is over at `now`."""
        present: dict[Path, tuple[int, int, int]] = {}
        for entry in sorted(os.listdir(self.registry)):
            path = self.registry / entry
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if stat.S_ISSOCK(st.st_mode):  # as the kubelet's watcher: other files skipped
                    present[path] = (st.st_dev, st.st_ino, st.st_ctime_ns)
        fresh = [p for p, ident in present.items() if self._seen.get(p) != ident]
        for path in fresh:
            self._retry.pop(path, None)
        self._retry = {p: r for p, r in self._retry.items() if p in present}
        due = [p for p, (_, at) in self._retry.items() if at <= now and p not in fresh]
        for path in due:
            pause, _ = self._retry[path]
            self._retry[path] = (pause, float("inf"))  # until `unanswered` sets it again
        self._seen = present
        return fresh + due

    def unanswered(self, path: Path, now: float) -> None:
        """`path` did not answer GetInfo at `now`: offer it again after a growing pause."""
        pause, _ = self._retry.get(path, (RETRY_FIRST / 2, 0.0))
        pause = min(pause * 2, RETRY_MAX)
        self._retry[path] = (pause, now + pause)

    def answered(self, path: Path) -> None:
        self._retry.pop(path, None)


async def poll(
    scan: SocketScan, handle: Callable[[Path], Awaitable[bool]], interval: float = WATCH_INTERVAL
) -> None:
    """Hand every new or replaced socket to `handle` (False: it did not answer, ask again
    later), until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        for path in scan.changed(loop.time()):
            if await handle(path):
                scan.answered(path)
            else:
                scan.unanswered(path, loop.time())
        await asyncio.sleep(interval)


class Unanswered:
    """`register`'s result for a socket that did not answer GetInfo."""


UNANSWERED: Final = Unanswered()


async def register(
    path: Path, plugin_type: str, decide: Decide
) -> tuple[pluginregistration_pb2.PluginInfo, bool, str] | Unanswered | None:
    """One registration round trip with the plugin at `path`: GetInfo, `decide`, then
    NotifyRegistrationStatus. (its info, registered, error); UNANSWERED when the socket
    does not answer GetInfo; None for a plugin of another type (another handler's: the
    kubelet dispatches by type, so each emulator leaves the others' sockets alone)."""
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
        try:
            info = await stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError:
            return UNANSWERED
        if info.type != plugin_type:
            return None
        ok, error = await decide(info)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=ok, error=error),
                timeout=CALL_TIMEOUT,
            )
        return info, ok, error
