"""One advertised resource: its gRPC server, its registration and its restarts.

`ResourceRunner.serve()` keeps the resource served and registered until stopped: it polls
its own socket and kubelet.sock (stat every `watch_interval`; the stdlib has no inotify)
and re-creates the server and re-registers when the kubelet restarts (it recreates
kubelet.sock and deletes plugin sockets). Failures are retried with a bounded backoff and
always visible in the runner's state — it never stops silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from agent.deviceplugin.plan import ResourcePlan
from agent.deviceplugin.registration import (
    KUBELET_SOCKET,
    Backoff,
    EffectiveMode,
    RegistrationFailed,
    WatcherRegistrationServicer,
    add_watcher_registration,
    register_legacy,
)
from agent.deviceplugin.server import (
    DevicePluginServicer,
    ResourceFeed,
    add_device_plugin,
    plugin_options,
)
from agent.deviceplugin.sockets import (
    ServeError,
    SocketId,
    socket_id,
    socket_name,
    start_unix_server,
)

log = logging.getLogger(__name__)

RegistrationState = Literal[
    "starting", "waiting", "registering", "registered", "retrying", "rejected", "stopped"
]
DEREGISTER_WAIT: Final = 0.5  # seconds to let open streams send the empty list


@dataclass(frozen=True, kw_only=True)
class RunnerSettings:
    device_plugin_dir: Path
    plugins_registry_dir: Path
    watch_interval: float = 0.1
    call_timeout: float = 3.0
    backoff: Backoff = field(default_factory=Backoff)
    watcher_grace: float | None = 10.0  # auto mode: fall back to legacy after this long


class ResourceRunner:
    """Serves and registers one resource; AdvertisedResources owns the task running `serve()`."""

    def __init__(
        self,
        feed: ResourceFeed,
        settings: RunnerSettings,
        *,
        mode: EffectiveMode,
        cdi: Callable[[], bool],
        on_change: Callable[[], None],
    ) -> None:
        self.feed = feed
        self.settings = settings
        self.mode: EffectiveMode = mode
        self.state: RegistrationState = "starting"
        self.error: str | None = None
        self.attempts = 0
        self._cdi = cdi
        self._on_change = on_change
        self._wake = asyncio.Event()
        self._stopping = False
        self._deregister = False
        self._restart = False
        self._notified: tuple[bool, str] | None = None
        self._info_seen = False

    @property
    def resource(self) -> str:
        return self.feed.plan.resource

    @property
    def endpoint(self) -> Path:
        return self.settings.device_plugin_dir / socket_name(self.resource)

    @property
    def registration_socket(self) -> Path:
        return self.settings.plugins_registry_dir / socket_name(self.resource)

    def stop(self, *, deregister: bool) -> None:
        """End serving; with `deregister`, first send the kubelet an empty device list."""
        self._stopping, self._deregister = True, deregister
        self._wake.set()

    def restart(self) -> None:
        """Re-create the server and register again (e.g. the plugin options changed)."""
        self._restart = True
        self._wake.set()

    def _set(self, state: RegistrationState, error: str | None = None) -> None:
        if (state, error) != (self.state, self.error):
            self.state, self.error = state, error
            level = logging.WARNING if error else logging.INFO
            log.log(level, "%s: %s%s", self.resource, state, f" ({error})" if error else "")
            self._on_change()

    async def serve(self, previous: asyncio.Task[None] | None = None) -> None:
        if previous is not None:
            await previous  # a removed resource of the same name is still shutting down
        failures = 0
        while not self._stopping:
            self._restart = False
            try:
                await self._round()
                failures = 0
                continue
            except ServeError as exc:
                error = str(exc)
            except Exception as exc:  # keep serving the other resources; retry this one
                log.exception("%s: serving failed", self.resource)
                error = f"{type(exc).__name__}: {exc}"
            failures += 1
            self.attempts += 1
            self._set("retrying", error)
            await self._sleep(self.settings.backoff.delay(failures))
        self._set("stopped")

    async def _sleep(self, seconds: float) -> None:
        """Wait `seconds` or until woken (stop, restart, a kubelet notification)."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    async def _round(self) -> None:
        """Serve until a restart is due or the runner is stopped."""
        self._set("starting", self.error)
        servicer = DevicePluginServicer(self.feed, cdi=self._cdi)
        server = await start_unix_server(self.endpoint, add_device_plugin(servicer))
        ours = socket_id(self.endpoint)
        try:
            if self.mode == "watcher":
                await self._watcher_round(ours)
            else:
                await self._legacy_round(ours)
        finally:
            if self._deregister:
                self.feed.publish(
                    ResourcePlan(resource=self.resource, exclusive=False, devices=(), adapters=())
                )
                await self.feed.wait_delivered(DEREGISTER_WAIT)
            await server.stop(None)
            if socket_id(self.endpoint) == ours:
                self.endpoint.unlink(missing_ok=True)

    def _socket_lost(self, ours: SocketId | None) -> bool:
        if socket_id(self.endpoint) != ours:
            log.warning("%s: %s was removed (kubelet restart?)", self.resource, self.endpoint)
            return True
        return False

    async def _legacy_round(self, ours: SocketId | None) -> None:
        kubelet = self.settings.device_plugin_dir / KUBELET_SOCKET
        seen = socket_id(kubelet)
        registered, next_try, failures = False, 0.0, 0
        while not self._stopping and not self._restart:
            if not registered and time.monotonic() >= next_try:
                if seen is None:
                    self._set("waiting", f"{kubelet} does not exist")
                else:
                    self._set("registering", self.error)
                    try:
                        await register_legacy(
                            kubelet,
                            endpoint=self.endpoint.name,
                            resource=self.resource,
                            options=plugin_options(self.feed.plan),
                            timeout=self.settings.call_timeout,
                        )
                        registered, failures, self.attempts = True, 0, 0
                        self._set("registered")
                    except RegistrationFailed as exc:
                        failures += 1
                        self.attempts += 1
                        next_try = time.monotonic() + self.settings.backoff.delay(failures)
                        self._set("retrying", str(exc))
            await self._sleep(self.settings.watch_interval)
            if self._socket_lost(ours):
                return
            current = socket_id(kubelet)
            if current != seen:
                if registered:
                    log.warning("%s: kubelet.sock was recreated: re-registering", self.resource)
                    return
                seen, next_try, failures = current, 0.0, 0

    async def _watcher_round(self, ours: SocketId | None) -> None:
        self._notified, self._info_seen = None, False
        servicer = WatcherRegistrationServicer(
            resource=self.resource,
            endpoint=self.endpoint,
            on_info=self._got_info,
            on_status=self._got_status,
        )
        registry = self.registration_socket
        reg_server = await start_unix_server(registry, add_watcher_registration(servicer))
        reg_ours = socket_id(registry)
        kubelet = self.settings.device_plugin_dir / KUBELET_SOCKET
        seen = socket_id(kubelet)
        started, retry_at = time.monotonic(), None
        self._set("waiting", None if self.state != "rejected" else self.error)
        try:
            while not self._stopping and not self._restart:
                await self._sleep(self.settings.watch_interval)
                if self._notified is not None:
                    ok, error = self._notified
                    self._notified = None
                    if ok:
                        self.attempts = 0
                        self._set("registered")
                    else:
                        self.attempts += 1
                        retry_at = time.monotonic() + self.settings.backoff.delay(self.attempts)
                        self._set("rejected", error or "kubelet refused the plugin")
                if retry_at is not None and time.monotonic() >= retry_at:
                    return  # a fresh registration socket makes the watcher try again
                if self._socket_lost(ours) or socket_id(registry) != reg_ours:
                    return
                current = socket_id(kubelet)
                if current != seen and current is not None and seen is not None:
                    log.warning("%s: kubelet.sock was recreated: re-registering", self.resource)
                    return
                seen = current
                grace = self.settings.watcher_grace
                if (
                    grace is not None
                    and not self._info_seen
                    and current is not None
                    and time.monotonic() - started > grace
                ):
                    log.warning(
                        "%s: no plugin watcher called %s in %.0f s; registering via %s",
                        self.resource,
                        registry,
                        grace,
                        kubelet,
                    )
                    self.mode = "legacy"
                    return
        finally:
            await reg_server.stop(None)
            if socket_id(registry) == reg_ours:
                registry.unlink(missing_ok=True)

    def _got_info(self) -> None:
        self._info_seen = True
        if self.state in ("waiting", "starting"):
            self._set("registering", None)

    def _got_status(self, registered: bool, error: str) -> None:
        self._notified = (registered, error)
        self._wake.set()
