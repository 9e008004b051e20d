"""The DevicePlugin gRPC service of one resource, on a grpc.aio server on a unix socket.

`ResourceFeed` holds the resource's current plan and wakes every open ListAndWatch stream
the moment it changes (health is pushed by events; the periodic re-send is only for a
kubelet that lost the list). The servicer validates every request against the plan and
answers bad input with INVALID_ARGUMENT; it never decides anything itself (see plan.py).
The socket it is served on: sockets.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc

from agent.deviceplugin.placement import preferred_allocation
from agent.deviceplugin.plan import (
    MAX_CONTAINERS,
    InvalidRequest,
    ResourcePlan,
    plan_allocation,
    validate_ids,
)
from proto.deviceplugin import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)


class ResourceFeed:
    """The current plan of one resource and the ListAndWatch streams that follow it."""

    def __init__(self, plan: ResourcePlan, *, resend_interval: float) -> None:
        self._plan = plan
        self._version = 0
        self._resend = resend_interval
        self._streams: dict[int, tuple[asyncio.Event, list[int]]] = {}
        self._next_stream = 0
        self._sent = asyncio.Event()  # set whenever a stream finished sending a list

    @property
    def plan(self) -> ResourcePlan:
        return self._plan

    @property
    def streams(self) -> int:
        return len(self._streams)

    def publish(self, plan: ResourcePlan) -> bool:
        """Replace the plan; wake the streams when what the kubelet sees changed."""
        changed = plan.devices != self._plan.devices
        self._plan = plan
        if changed:
            self._version += 1
            for wake, _ in self._streams.values():
                wake.set()
        return changed

    def delivered(self) -> bool:
        """Every open stream has sent the latest list."""
        return all(sent[0] >= self._version for _, sent in self._streams.values())

    async def wait_delivered(self, timeout: float) -> bool:
        """Wait (bounded) until every open stream has sent the latest list."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.delivered():
            self._sent.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sent.wait(), timeout=remaining)
        return True

    async def watch(self) -> AsyncIterator[ResourcePlan]:
        """The plan now, then after every change, and at least every resend interval."""
        key = self._next_stream
        self._next_stream += 1
        wake, sent = asyncio.Event(), [-1]
        self._streams[key] = (wake, sent)
        try:
            while True:
                wake.clear()
                version = self._version
                yield self._plan
                sent[0] = version
                self._sent.set()
                if self._version != version:
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=self._resend)
        finally:
            del self._streams[key]


def list_response(plan: ResourcePlan) -> api_pb2.ListAndWatchResponse:
    return api_pb2.ListAndWatchResponse(
        devices=[
            api_pb2.Device(
                ID=d.id,
                health=d.health,
                topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in d.numa_nodes])
                if d.numa_nodes
                else None,
            )
            for d in plan.devices
        ]
    )


class DevicePluginServicer:
    """v1beta1.DevicePlugin for one resource; reads the feed, never blocks on I/O."""

    def __init__(self, feed: ResourceFeed, *, cdi: Callable[[], bool]) -> None:
        self._feed = feed
        self._cdi = cdi

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Any
    ) -> api_pb2.DevicePluginOptions:
        return plugin_options(self._feed.plan)

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Any
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        async for plan in self._feed.watch():
            log.debug("%s: sending %d devices", plan.resource, len(plan.devices))
            yield list_response(plan)

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Any
    ) -> api_pb2.PreferredAllocationResponse:
        plan = self._feed.plan
        try:
            _check_containers(len(request.container_requests), "GetPreferredAllocation")
            answers = [
                api_pb2.ContainerPreferredAllocationResponse(
                    deviceIDs=preferred_allocation(
                        plan, r.available_deviceIDs, r.must_include_deviceIDs, r.allocation_size
                    )
                )
                for r in request.container_requests
            ]
        except InvalidRequest as exc:
            await _refuse(context, plan, exc)
        return api_pb2.PreferredAllocationResponse(container_responses=answers)

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: Any
    ) -> api_pb2.AllocateResponse:
        plan, cdi = self._feed.plan, self._cdi()
        try:
            _check_containers(len(request.container_requests), "Allocate")
            allocations = [
                plan_allocation(plan, r.devices_ids, cdi=cdi) for r in request.container_requests
            ]
        except InvalidRequest as exc:
            await _refuse(context, plan, exc)
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(
                    envs=dict(a.envs),
                    devices=[
                        api_pb2.DeviceSpec(
                            container_path=n.container_path,
                            host_path=n.host_path,
                            permissions=n.permissions,
                        )
                        for n in a.device_nodes
                    ],
                    cdi_devices=[api_pb2.CDIDevice(name=name) for name in a.cdi_devices],
                )
                for a in allocations
            ]
        )

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Any
    ) -> api_pb2.PreStartContainerResponse:
        plan = self._feed.plan
        try:
            validate_ids(plan, request.devices_ids, what="PreStartContainer")
        except InvalidRequest as exc:
            await _refuse(context, plan, exc)
        return api_pb2.PreStartContainerResponse()


def plugin_options(plan: ResourcePlan) -> api_pb2.DevicePluginOptions:
    # Shared slots are interchangeable: a preferred allocation only means something when
    # each ID is one adapter.
    return api_pb2.DevicePluginOptions(
        pre_start_required=False, get_preferred_allocation_available=plan.exclusive
    )


def _check_containers(count: int, what: str) -> None:
    if count == 0:
        raise InvalidRequest(f"{what}: no container requests")
    if count > MAX_CONTAINERS:
        raise InvalidRequest(f"{what}: {count} container requests (at most {MAX_CONTAINERS})")


async def _refuse(context: Any, plan: ResourcePlan, exc: InvalidRequest) -> NoReturn:
    log.warning("%s: refused request: %s", plan.resource, exc)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    raise AssertionError("context.abort returned")  # it raises to end the call


def add_device_plugin(servicer: DevicePluginServicer) -> Callable[[Any], None]:
    def add(server: Any) -> None:
        api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)

    return add
