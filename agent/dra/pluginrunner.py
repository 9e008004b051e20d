"""The DRA kubelet plugin as the agent runs it: `DraPlugin` serves dra.sock and a
plugin-watcher registration socket, keeps both served, and takes the agent's inventory.

Conventions as upstream's kubeletplugin helper: `<plugins dir>/<driver>/dra.sock`,
`<plugins_registry>/<driver>-reg.sock`, PluginInfo type "DRAPlugin" named after the
driver. A socket that disappears (a kubelet restart wipes them) is served again at once;
serving failures retry with the device plugin's bounded backoff, visible in `state`.
`status()` is what the agent publishes (DevicePluginStatus.dra); `on_change` says when.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from agent.deviceplugin.plan import PortStates
from agent.deviceplugin.registration import Backoff
from agent.deviceplugin.sockets import ServeError, socket_id, start_unix_server
from agent.dra.claimstatus import plugin_status
from agent.dra.health import HealthFeed, device_health
from agent.dra.healthstream import DraHealthServicer
from agent.dra.plugin import ClaimPreparer, DraPluginServicer, add_dra_services
from agent.dra.pluginclaims import ClaimDirectory, ClaimSource
from proto.deviceplugin import pluginregistration_pb2, pluginregistration_pb2_grpc
from proto.dranames import DRIVER
from proto.draslices import SliceSettings
from proto.inventory import Device, NodeSnapshot
from proto.messages.status import DraPluginStatus

log = logging.getLogger(__name__)

PLUGIN_TYPE: Final = "DRAPlugin"
# The services the plugin serves, by gRPC service name: DRA registration uses
# PluginInfo.supported_versions for that (upstream's kubeletplugin helper lists the
# DRAPlugin versions and the health service it implements). Both health packages are
# served: v1 for current kubelets, v1alpha1 for those before the v1 API.
SUPPORTED_VERSIONS: Final = ("v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
DEFAULT_PLUGINS_DIR: Final = Path("/var/lib/kubelet/plugins")
DEFAULT_STATE_DIR: Final = Path("/var/lib/nicfleet/dra")
DraState = Literal["starting", "waiting", "registered", "rejected", "retrying", "stopped"]


@dataclass(frozen=True, kw_only=True)
class DraSettings:
    plugins_dir: Path = DEFAULT_PLUGINS_DIR  # dra.sock goes to <plugins_dir>/<driver>/
    plugins_registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    cdi_dir: Path = Path("/var/run/cdi")
    state_dir: Path = DEFAULT_STATE_DIR  # the checkpoint; survives agent restarts
    claims_dir: Path = DEFAULT_STATE_DIR / "claims"  # ClaimDirectory (docs/dra.md)
    claims_from: Literal["nats", "dir"] = "dir"  # the agent asks the aggregator (claimsnats)
    watch_interval: float = 0.1
    resend_interval: float = 10.0  # health re-sent this often without a change
    health_timeout_seconds: int = 30  # told to the kubelet: Unknown after this silence
    backoff: Backoff = field(default_factory=Backoff)
    # How the node's devices are published (`run --dra-share/--dra-consumable/--dra-rail`):
    # reported in the status for the aggregator's slices; share copies get health too.
    slices: SliceSettings = field(default_factory=SliceSettings)

    @property
    def endpoint(self) -> Path:
        return self.plugins_dir / DRIVER / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.plugins_registry_dir / f"{DRIVER}-reg.sock"

    @property
    def checkpoint(self) -> Path:
        return self.state_dir / "checkpoint.json"


class DraRegistrationServicer:
    """pluginregistration.Registration answering with the DRA plugin's info."""

    def __init__(self, endpoint: Path, on_status: Callable[[bool, str], None]) -> None:
        self._info = pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=DRIVER,
            endpoint=str(endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )
        self._on_status = on_status

    async def GetInfo(
        self, request: pluginregistration_pb2.InfoRequest, context: Any
    ) -> pluginregistration_pb2.PluginInfo:
        return self._info

    async def NotifyRegistrationStatus(
        self, request: pluginregistration_pb2.RegistrationStatus, context: Any
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        self._on_status(request.plugin_registered, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()


class DraPlugin:
    """The node's DRA plugin: `update` with every snapshot and port poll, `run` until stop.
    `on_change` is called when what `status()` reports changes: the state, the prepared
    claims, the failures or the devices' health."""

    def __init__(
        self,
        settings: DraSettings,
        *,
        node: str,
        source: ClaimSource | None = None,
        clock: Callable[[], float] = time.time,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.node = node
        self.state: DraState = "starting"
        self.error: str | None = None
        self._inventory: Mapping[str, Device] = {}
        self.health = HealthFeed(resend_interval=settings.resend_interval)
        self.preparer = ClaimPreparer(
            node=node,
            source=source if source is not None else ClaimDirectory(settings.claims_dir),
            cdi_dir=settings.cdi_dir,
            checkpoint_path=settings.checkpoint,
            devices=lambda: self._inventory,
            clock=clock,
            on_change=on_change,
        )
        self._on_change = on_change
        self._clock = clock
        self._wake = asyncio.Event()

    def update(self, snapshot: NodeSnapshot, port_states: PortStates) -> None:
        """New inventory and/or port states: health reaches open streams at once."""
        self._inventory = {d.name: d for d in snapshot.devices}
        if self.health.publish(device_health(snapshot, port_states, self.settings.slices)):
            self._on_change()

    def status(self) -> DraPluginStatus:
        return plugin_status(
            state=self.state,
            error=self.error,
            endpoint=str(self.settings.endpoint),
            slices=self.settings.slices,
            prepared=self.preparer.prepared,
            failed=self.preparer.failures.newest_first(),
            health=self.health.health,
        )

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        stopper = asyncio.create_task(self._wake_on(stop))
        try:
            while not stop.is_set():
                try:
                    await self._round(stop)
                    failures = 0
                    continue
                except ServeError as exc:
                    failures += 1
                    self._set("retrying", str(exc))
                await self._sleep(self.settings.backoff.delay(failures))
        finally:
            stopper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopper
            self._set("stopped")

    async def _wake_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._wake.set()

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    def _set(self, state: DraState, error: str | None = None) -> None:
        if (state, error) != (self.state, self.error):
            self.state, self.error = state, error
            self._on_change()
            level = logging.WARNING if error else logging.INFO
            log.log(level, "DRA plugin: %s%s", state, f" ({error})" if error else "")

    def _got_status(self, registered: bool, error: str) -> None:
        if registered:
            self._set("registered")
        else:
            self._set("rejected", error or "kubelet refused the plugin")

    async def _round(self, stop: asyncio.Event) -> None:
        """Serve both sockets until one of them is gone or `stop`."""
        s = self.settings
        services = add_dra_services(
            DraPluginServicer(self.preparer),
            DraHealthServicer(
                self.health,
                pool=self.node,
                clock=self._clock,
                timeout_seconds=s.health_timeout_seconds,
            ),
        )
        server = await start_unix_server(s.endpoint, services)
        ours = socket_id(s.endpoint)
        try:
            registration = DraRegistrationServicer(s.endpoint, self._got_status)

            def add(reg_server: Any) -> None:
                pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
                    registration, reg_server
                )

            reg_server = await start_unix_server(s.registration_socket, add)
            reg_ours = socket_id(s.registration_socket)
            self._set("waiting")
            try:
                while not stop.is_set():
                    await self._sleep(s.watch_interval)
                    if (
                        socket_id(s.endpoint) != ours
                        or socket_id(s.registration_socket) != reg_ours
                    ):
                        log.warning("DRA plugin: a socket was removed (kubelet restart?)")
                        return
            finally:
                await reg_server.stop(None)
                if socket_id(s.registration_socket) == reg_ours:
                    s.registration_socket.unlink(missing_ok=True)
        finally:
            await server.stop(None)
            if socket_id(s.endpoint) == ours:
                s.endpoint.unlink(missing_ok=True)
