"""A cluster view for the pod-trace tests (`trace --pod`): chain_cluster's nodes and pods,
plus a pod bound to the broken gpu-002 and a pending pod with the scheduler's
FailedScheduling Event (core/v1 shape, decoded by aggregator.kube.objects)."""

from __future__ import annotations

import msgspec

from aggregator.cluster import ClusterView, PodRequest, SchedulingEvent
from tests.support.chain_fixtures import RES, chain_cluster

PENDING_MESSAGE = (
    "0/2 nodes are available: 2 Insufficient rdma/ib. preemption: 0/2 nodes are available: "
    "2 No preemption victims found for incoming pod."
)


def pod_cluster() -> ClusterView:
    base = chain_cluster()
    pods = (
        *base.pods,
        PodRequest(namespace="ml", name="t-2", node="gpu-002", phase="Pending", requests={RES: 1}),
        PodRequest(namespace="ml", name="t-9", phase="Pending", requests={RES: 2}),
    )
    event = SchedulingEvent(
        namespace="ml", pod="t-9", message=PENDING_MESSAGE, count=4,
        last_seen="2027-01-15T08:00:00Z",
    )  # fmt: skip
    return msgspec.structs.replace(base, pods=pods, scheduling_events=(event,))
