"""The lab kubelet's DRA side (tests, the demo): real gRPC over unix sockets.

Like the kubelet's plugin watcher it polls plugins_registry, asks each new socket GetInfo,
takes DRAPlugin ones (v1.DRAPlugin), dials the endpoint and answers
NotifyRegistrationStatus; then it calls NodePrepareResources / NodeUnprepareResources and
follows the plugin's NodeWatchResources stream. `write_claim` plays the API server's part:
an allocated ResourceClaim object where the plugin's claim source reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import grpc

from agent.lab import pluginwatch
from agent.lab.pluginwatch import CALL_TIMEOUT
from proto.deviceplugin import pluginregistration_pb2
from proto.dra import api_pb2, api_pb2_grpc, health_pb2, health_pb2_grpc

DRA_TYPE: Final = "DRAPlugin"
DRA_VERSION: Final = "v1.DRAPlugin"
Claim = tuple[str, str, str]  # (namespace, uid, name), as the kubelet sends it


class DraPluginConnection:
    """The kubelet's side of one registered DRA driver."""

    def __init__(
        self, driver: str, endpoint: Path, on_update: Callable[[], None] | None = None
    ) -> None:
        self.driver = driver
        self._on_update = on_update
        self.endpoint = endpoint
        self.channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
        self.stub = api_pb2_grpc.DRAPluginStub(self.channel)
        self._health = health_pb2_grpc.DRAResourceHealthStub(self.channel)
        self.health_updates: asyncio.Queue[health_pb2.NodeWatchResourcesResponse] = asyncio.Queue()
        self.latest_health: health_pb2.NodeWatchResourcesResponse | None = None
        self.health_ended = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    def watch_health(self) -> None:
        self._reader = asyncio.create_task(self._read_health())

    async def _read_health(self) -> None:
        try:
            request = health_pb2.NodeWatchResourcesRequest()
            async for response in self._health.NodeWatchResources(request):
                self.latest_health = response
                await self.health_updates.put(response)
                self._updated()
        except grpc.aio.AioRpcError:
            pass  # the plugin went away (or serves no health): the kubelet carries on
        finally:
            self.health_ended.set()
            self._updated()

    def _updated(self) -> None:
        if self._on_update is not None:
            self._on_update()

    def unhealthy(self) -> tuple[str, ...]:
        """Devices the latest health message calls anything but HEALTHY."""
        latest = self.latest_health
        if latest is None:
            return ()
        return tuple(d.device.device_name for d in latest.devices if d.health != health_pb2.HEALTHY)

    async def wait_health(
        self,
        predicate: Callable[[health_pb2.NodeWatchResourcesResponse], bool],
        timeout: float = 5.0,
    ) -> health_pb2.NodeWatchResourcesResponse:
        """Read health messages until one satisfies `predicate`."""

        async def scan() -> health_pb2.NodeWatchResourcesResponse:
            while True:
                response = await self.health_updates.get()
                if predicate(response):
                    return response

        return await asyncio.wait_for(scan(), timeout)

    async def prepare(self, *claims: Claim) -> api_pb2.NodePrepareResourcesResponse:
        request = api_pb2.NodePrepareResourcesRequest(claims=_claims(claims))
        response: api_pb2.NodePrepareResourcesResponse = await self.stub.NodePrepareResources(
            request, timeout=CALL_TIMEOUT
        )
        return response

    async def unprepare(self, *claims: Claim) -> api_pb2.NodeUnprepareResourcesResponse:
        request = api_pb2.NodeUnprepareResourcesRequest(claims=_claims(claims))
        response: api_pb2.NodeUnprepareResourcesResponse = await self.stub.NodeUnprepareResources(
            request, timeout=CALL_TIMEOUT
        )
        return response

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self.channel.close()


def _claims(claims: Iterable[Claim]) -> list[api_pb2.Claim]:
    return [api_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]


class DraKubeletEmulator:
    """`async with DraKubeletEmulator(registry) as kubelet:`; see the module docstring.

    Sockets of other plugin types are left alone (not answered), so a device-plugin
    emulator may watch the same directory only if it, too, skips what is not its own.
    """

    def __init__(self, plugins_registry: Path, *, reject: int = 0) -> None:
        self.registry = plugins_registry
        self.reject = reject  # refuse this many registrations first
        self.infos: list[pluginregistration_pb2.PluginInfo] = []
        self.notifications: list[tuple[str, bool, str]] = []
        self.plugins: dict[str, DraPluginConnection] = {}
        self._scan = pluginwatch.SocketScan(self.registry)
        self._watcher: asyncio.Task[None] | None = None
        self._connected = asyncio.Condition()
        self.changed = asyncio.Event()  # set on every registration and health message

    async def __aenter__(self) -> DraKubeletEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self.registry.mkdir(parents=True, exist_ok=True)
        self._scan.clear()
        self._watcher = asyncio.create_task(pluginwatch.poll(self._scan, self._register))

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        for plugin in self.plugins.values():
            await plugin.close()
        self.plugins.clear()

    async def restart(self, *, wipe: Sequence[Path] = ()) -> None:
        """A kubelet restart: connections dropped, the sockets under `wipe` deleted."""
        await self.stop()
        for path in wipe:
            path.unlink(missing_ok=True)
        await self.start()

    async def plugin(
        self, driver: str, *, after: DraPluginConnection | None = None, timeout: float = 5.0
    ) -> DraPluginConnection:
        """The connection to `driver` once registered (a newer one than `after`)."""

        def ready() -> bool:
            return self.plugins.get(driver) not in (None, after)

        async def wait() -> DraPluginConnection:
            async with self._connected:
                await self._connected.wait_for(ready)
            return self.plugins[driver]

        return await asyncio.wait_for(wait(), timeout)

    async def _register(self, path: Path) -> bool:
        done = await pluginwatch.register(path, DRA_TYPE, self._decide)
        if isinstance(done, pluginwatch.Unanswered):
            return False
        if done is not None:
            info, ok, error = done
            self.notifications.append((info.name, ok, error))
        return True

    async def _decide(self, info: pluginregistration_pb2.PluginInfo) -> tuple[bool, str]:
        self.infos.append(info)
        if DRA_VERSION not in info.supported_versions:
            return False, f"no supported version in {list(info.supported_versions)}"
        if self.reject > 0:
            self.reject -= 1
            return False, "emulated registration failure"
        await self._connect(info.name, Path(info.endpoint))
        return True, ""

    async def _connect(self, driver: str, endpoint: Path) -> None:
        old = self.plugins.pop(driver, None)
        if old is not None:
            await old.close()
        plugin = DraPluginConnection(driver, endpoint, self.changed.set)
        plugin.watch_health()
        self.plugins[driver] = plugin
        self.changed.set()
        async with self._connected:
            self._connected.notify_all()


def claim_object(claim: Claim, results: Sequence[tuple[str, str, str, str]]) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaim allocated to `results`:
    (request, driver, pool, device) each."""
    namespace, uid, name = claim
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": d, "pool": p, "device": dev}
                        for r, d, p, dev in results
                    ]
                }
            }
        },
    }


def write_claim(claims_dir: Path, obj: dict[str, Any]) -> Path:
    """Put claim `obj` where a ClaimDirectory reads it (`<uid>.json`, atomically)."""
    claims_dir.mkdir(parents=True, exist_ok=True)
    path = claims_dir / f"{obj['metadata']['uid']}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path
