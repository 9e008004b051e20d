"""The DRA plugin's health stream: `v1.DRAResourceHealth` (and its `v1alpha1` twin) over
the `HealthFeed`: every published device's health in each message, on every change and
at least every resend interval. `health_response` builds one message (pure).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from agent.dra.health import DeviceHealth, HealthFeed
from proto.dra import health_pb2, healthv1alpha1_pb2


class DraHealthServicer:
    """v1.DRAResourceHealth: every device's health, on every change of any of them."""

    def __init__(
        self,
        feed: HealthFeed,
        *,
        pool: str,
        clock: Callable[[], float],
        timeout_seconds: int,
    ) -> None:
        self._feed = feed
        self._pool = pool
        self._clock = clock
        self._timeout = timeout_seconds

    async def NodeWatchResources(
        self, request: health_pb2.NodeWatchResourcesRequest, context: Any
    ) -> AsyncIterator[health_pb2.NodeWatchResourcesResponse]:
        async for health in self._feed.watch():
            yield health_response(
                health, pool=self._pool, now=int(self._clock()), timeout_seconds=self._timeout
            )


def health_response(
    health: tuple[DeviceHealth, ...], *, pool: str, now: int, timeout_seconds: int
) -> health_pb2.NodeWatchResourcesResponse:
    return health_pb2.NodeWatchResourcesResponse(
        devices=[
            health_pb2.DeviceHealth(
                device=health_pb2.DeviceIdentifier(pool_name=pool, device_name=h.device),
                health=health_pb2.HEALTHY if h.healthy else health_pb2.UNHEALTHY,
                last_updated_time=now,
                health_check_timeout_seconds=timeout_seconds,
                message=h.reason or "",
            )
            for h in health
        ]
    )


class DraHealthV1alpha1Servicer:
    """`v1alpha1.DRAResourceHealth`: the same stream under the older package, for kubelets
    that predate the v1 API. The messages are identical field for field, so each v1 message
    is re-read as its v1alpha1 twin from its own bytes."""

    def __init__(self, v1: DraHealthServicer) -> None:
        self._v1 = v1

    async def NodeWatchResources(
        self, request: healthv1alpha1_pb2.NodeWatchResourcesRequest, context: Any
    ) -> AsyncIterator[healthv1alpha1_pb2.NodeWatchResourcesResponse]:
        async for message in self._v1.NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest(), context
        ):
            yield healthv1alpha1_pb2.NodeWatchResourcesResponse.FromString(
                message.SerializeToString()
            )
