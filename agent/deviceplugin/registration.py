"""How a resource server announces itself to the kubelet, in either registration mode.

legacy: call v1beta1 `Registration.Register` on <device-plugins dir>/kubelet.sock with the
endpoint relative to that dir. watcher: serve `pluginregistration.Registration` on a socket
in plugins_registry and let the kubelet's plugin watcher call GetInfo, then report back with
NotifyRegistrationStatus. Every kubelet call here has a timeout; retry policy is the caller's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import grpc

from agent.errors import AgentError
from proto.deviceplugin import (
    api_pb2,
    api_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

log = logging.getLogger(__name__)

RegistrationMode = Literal["legacy", "watcher", "auto"]
EffectiveMode = Literal["legacy", "watcher"]
REGISTRATION_MODES: Final[tuple[RegistrationMode, ...]] = ("legacy", "watcher", "auto")
API_VERSION: Final = "v1beta1"
KUBELET_SOCKET: Final = "kubelet.sock"
PLUGIN_TYPE: Final = "DevicePlugin"


class RegistrationFailed(AgentError, retryable=True):
    """The kubelet did not accept (or did not answer) a registration; retry later."""


def resolve_mode(mode: RegistrationMode, *, registry_exists: bool) -> EffectiveMode:
    """auto picks the watcher when the plugins_registry dir is there (as the upstream plugin
    does); the runner still falls back to legacy if no kubelet ever calls GetInfo."""
    if mode == "auto":
        return "watcher" if registry_exists else "legacy"
    return mode


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Bounded exponential backoff: initial, doubling per failed attempt, capped."""

    initial: float = 0.2
    maximum: float = 10.0

    def delay(self, attempt: int) -> float:
        return float(min(self.initial * 2 ** max(attempt - 1, 0), self.maximum))


async def register_legacy(
    kubelet_socket: Path,
    *,
    endpoint: str,
    resource: str,
    options: api_pb2.DevicePluginOptions,
    timeout: float,
) -> None:
    """One Register call; raises RegistrationFailed on refusal, timeout or no socket."""
    request = api_pb2.RegisterRequest(
        version=API_VERSION, endpoint=endpoint, resource_name=resource, options=options
    )
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        try:
            await stub.Register(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationFailed(
                f"Register {resource} on {kubelet_socket}: {exc.code().name}: {exc.details()}"
            ) from exc


class WatcherRegistrationServicer:
    """pluginregistration.Registration for one resource, served in plugins_registry."""

    def __init__(
        self,
        *,
        resource: str,
        endpoint: Path,
        on_info: Callable[[], None],
        on_status: Callable[[bool, str], None],
    ) -> None:
        self._info = pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=resource,
            endpoint=str(endpoint),
            supported_versions=[API_VERSION],
        )
        self._on_info = on_info
        self._on_status = on_status

    async def GetInfo(
        self, request: pluginregistration_pb2.InfoRequest, context: Any
    ) -> pluginregistration_pb2.PluginInfo:
        self._on_info()
        return self._info

    async def NotifyRegistrationStatus(
        self, request: pluginregistration_pb2.RegistrationStatus, context: Any
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        self._on_status(request.plugin_registered, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()


def add_watcher_registration(servicer: WatcherRegistrationServicer) -> Callable[[Any], None]:
    def add(server: Any) -> None:
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)

    return add
