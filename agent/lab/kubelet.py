"""A lab kubelet for device plugins (tests, the demo): real gRPC over unix sockets in a dir.

Serves v1beta1.Registration on <dir>/kubelet.sock and, like the kubelet's device manager,
dials a registering plugin back and follows its ListAndWatch stream (`view()`: devices and
health per resource). Can play the plugins_registry watcher and restart like a kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agent.lab import pluginwatch
from agent.lab.pluginwatch import CALL_TIMEOUT
from proto.deviceplugin import api_pb2, api_pb2_grpc, pluginregistration_pb2

HEALTHY = "Healthy"


@dataclass(frozen=True, slots=True)
class ResourceView:
    """What this kubelet knows of one resource from the plugin's latest ListAndWatch list.

    A real kubelet reports capacity = every device and allocatable = the healthy ones in
    the Node's status; this is that count as the kubelet got it, not what an API server holds.
    """

    resource: str
    endpoint: str
    devices: tuple[str, ...]
    unhealthy: tuple[str, ...]
    stream_open: bool

    @property
    def capacity(self) -> int:
        return len(self.devices)

    @property
    def allocatable(self) -> int:
        return len(self.devices) - len(self.unhealthy)


class PluginConnection:
    """The kubelet's side of one registered plugin: its options and its device lists."""

    def __init__(
        self, resource: str, endpoint: Path, on_update: Callable[[], None] | None = None
    ) -> None:
        self.resource = resource
        self._on_update = on_update
        self.endpoint = endpoint
        self.channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
        self.stub = api_pb2_grpc.DevicePluginStub(self.channel)
        self.options: api_pb2.DevicePluginOptions | None = None
        self.lists: asyncio.Queue[api_pb2.ListAndWatchResponse] = asyncio.Queue()
        self.stream_ended = asyncio.Event()
        self.latest: api_pb2.ListAndWatchResponse | None = None
        self._reader: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        self.options = await self.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=CALL_TIMEOUT)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self.stub.ListAndWatch(api_pb2.Empty()):
                self.latest = response
                await self.lists.put(response)
                self._updated()
        except grpc.aio.AioRpcError:
            pass  # the plugin went away, as a kubelet would notice
        finally:
            self.stream_ended.set()
            self._updated()

    def _updated(self) -> None:
        if self._on_update is not None:
            self._on_update()

    def view(self) -> ResourceView:
        devices = self.latest.devices if self.latest is not None else ()
        return ResourceView(
            resource=self.resource,
            endpoint=str(self.endpoint),
            devices=tuple(d.ID for d in devices),
            unhealthy=tuple(d.ID for d in devices if d.health != HEALTHY),
            stream_open=not self.stream_ended.is_set(),
        )

    async def next_list(self, timeout: float = 5.0) -> api_pb2.ListAndWatchResponse:
        return await asyncio.wait_for(self.lists.get(), timeout)

    async def wait_list(
        self,
        predicate: Callable[[api_pb2.ListAndWatchResponse], bool],
        timeout: float = 5.0,
    ) -> api_pb2.ListAndWatchResponse:
        """Read lists until one satisfies `predicate` (fails the wait after `timeout`)."""

        async def scan() -> api_pb2.ListAndWatchResponse:
            while True:
                response = await self.lists.get()
                if predicate(response):
                    return response

        return await asyncio.wait_for(scan(), timeout)

    async def allocate(self, *containers: Sequence[str]) -> api_pb2.AllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=c) for c in containers]
        )
        response: api_pb2.AllocateResponse = await self.stub.Allocate(request, timeout=CALL_TIMEOUT)
        return response

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> tuple[str, ...]:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must_include,
                    allocation_size=size,
                )
            ]
        )
        response = await self.stub.GetPreferredAllocation(request, timeout=CALL_TIMEOUT)
        return tuple(response.container_responses[0].deviceIDs)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self.channel.close()


class _RegistrationService:
    def __init__(self, kubelet: KubeletEmulator) -> None:
        self._kubelet = kubelet

    async def Register(self, request: api_pb2.RegisterRequest, context: Any) -> api_pb2.Empty:
        kubelet = self._kubelet
        kubelet.registrations.append(request)
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad version {request.version}")
        # Like the kubelet: connect back before answering, follow the stream afterwards.
        await kubelet.connect(request.resource_name, kubelet.dir / request.endpoint)
        return api_pb2.Empty()


class KubeletEmulator:
    """`async with KubeletEmulator(dir) as kubelet:`; see the module docstring."""

    def __init__(
        self,
        device_plugin_dir: Path,
        *,
        plugins_registry: Path | None = None,
        reject_watcher: int = 0,
    ) -> None:
        self.dir = device_plugin_dir
        self.registry = plugins_registry
        self.reject_watcher = reject_watcher  # refuse this many watcher registrations first
        self.registrations: list[api_pb2.RegisterRequest] = []
        self.watcher_infos: list[pluginregistration_pb2.PluginInfo] = []
        self.notifications: list[tuple[str, bool, str]] = []
        self.plugins: dict[str, PluginConnection] = {}
        self._server: Any = None
        self._watcher: asyncio.Task[None] | None = None
        self._scan: pluginwatch.SocketScan | None = None
        self._connected = asyncio.Condition()
        self.changed = asyncio.Event()  # set on every registration and device list

    def view(self) -> dict[str, ResourceView]:
        """Every registered resource as this kubelet sees it now."""
        return {name: plugin.view() for name, plugin in sorted(self.plugins.items())}

    @property
    def socket(self) -> Path:
        return self.dir / "kubelet.sock"

    async def __aenter__(self) -> KubeletEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_RegistrationService(self), self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()
        if self.registry is not None:
            self.registry.mkdir(parents=True, exist_ok=True)
            self._scan = pluginwatch.SocketScan(self.registry)
            self._watcher = asyncio.create_task(
                pluginwatch.poll(self._scan, self._register_watched)
            )

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        for plugin in self.plugins.values():
            await plugin.close()
        self.plugins.clear()
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def restart(self) -> None:
        """What a kubelet restart looks like to plugins: every socket in the dir deleted,
        then a new kubelet.sock."""
        await self.stop()
        for entry in os.listdir(self.dir):
            (self.dir / entry).unlink(missing_ok=True)
        await self.start()

    async def connect(self, resource: str, endpoint: Path) -> PluginConnection:
        old = self.plugins.pop(resource, None)
        if old is not None:
            await old.close()
        plugin = PluginConnection(resource, endpoint, self.changed.set)
        try:
            await plugin.connect()
        except BaseException:
            await plugin.close()
            raise
        self.plugins[resource] = plugin
        self.changed.set()
        async with self._connected:
            self._connected.notify_all()
        return plugin

    async def plugin(self, resource: str, timeout: float = 5.0) -> PluginConnection:
        """The connection to `resource` once it has registered (waits for it)."""

        async def wait() -> PluginConnection:
            async with self._connected:
                await self._connected.wait_for(lambda: resource in self.plugins)
            return self.plugins[resource]

        return await asyncio.wait_for(wait(), timeout)

    async def reconnected(
        self, resource: str, previous: PluginConnection, timeout: float = 5.0
    ) -> PluginConnection:
        """The next connection to `resource` after `previous` (a re-registration)."""

        def fresh() -> bool:
            return self.plugins.get(resource) not in (None, previous)

        async def wait() -> PluginConnection:
            async with self._connected:
                await self._connected.wait_for(fresh)
            return self.plugins[resource]

        return await asyncio.wait_for(wait(), timeout)

    async def _register_watched(self, path: Path) -> bool:
        done = await pluginwatch.register(path, "DevicePlugin", self._decide_watched)
        if isinstance(done, pluginwatch.Unanswered):
            return False
        if done is not None:
            info, ok, error = done
            self.notifications.append((info.name, ok, error))
        return True

    async def _decide_watched(self, info: pluginregistration_pb2.PluginInfo) -> tuple[bool, str]:
        self.watcher_infos.append(info)
        if "v1beta1" not in info.supported_versions:
            return False, f"unsupported plugin {info.type} {list(info.supported_versions)}"
        if self.reject_watcher > 0:
            self.reject_watcher -= 1
            return False, "emulated registration failure"
        try:
            await self.connect(info.name, Path(info.endpoint))
        except grpc.aio.AioRpcError as exc:
            return False, f"cannot connect to {info.endpoint}: {exc.code().name}"
        return True, ""
