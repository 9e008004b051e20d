"""The scheduling link (pure): the scheduler's FailedScheduling messages, parsed, and a pod's
link from its Events or its PodScheduled condition. The messages are shaped as
kubernetes/kubernetes pkg/scheduler writes them (framework.FitError.Error():
"0/N nodes are available: <count> <reason>, ... ." then " preemption: ..." since 1.24)."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.cluster import ClusterView, PodRequest, SchedulingEvent
from aggregator.trace.host import ChainContext
from aggregator.trace.scheduling import (
    MAX_LISTED,
    Reason,
    failure_fix,
    parse_failed_scheduling,
    pod_scheduling_link,
    scheduling_link,
)

CONTROL_PLANE = "{node-role.kubernetes.io/control-plane: }"
INSUFFICIENT_AND_TAINT = (
    "0/5 nodes are available: 2 Insufficient rdma/ib, 3 node(s) had untolerated taint "
    "{node-role.kubernetes.io/control-plane: }. preemption: 0/5 nodes are available: 2 No "
    "preemption victims found for incoming pod, 3 Preemption is not helpful for scheduling."
)
AFFINITY = (
    "0/4 nodes are available: 1 node(s) were unschedulable, 3 node(s) didn't match Pod's node "
    "affinity/selector. preemption: 0/4 nodes are available: 4 Preemption is not helpful for "
    "scheduling."
)
OLD_STYLE = "0/3 nodes are available: 1 Insufficient cpu, 2 Insufficient rdma/hca_shared."
TOO_MANY = "0/2 nodes are available: 2 Too many pods."


@pytest.mark.parametrize(
    ("message", "available", "total", "reasons", "preemption"),
    [
        pytest.param(
            INSUFFICIENT_AND_TAINT, 0, 5,
            (
                Reason(count=2, text="Insufficient rdma/ib", kind="insufficient",
                       resource="rdma/ib"),
                Reason(count=3, kind="taint",
                       text="node(s) had untolerated taint " + CONTROL_PLANE,
                       taint=CONTROL_PLANE),
            ),
            "0/5 nodes are available: 2 No preemption victims found for incoming pod, 3 "
            "Preemption is not helpful for scheduling",
            id="insufficient-and-taint",
        ),
        pytest.param(
            AFFINITY, 0, 4,
            (
                Reason(count=1, text="node(s) were unschedulable", kind="unschedulable"),
                Reason(count=3, text="node(s) didn't match Pod's node affinity/selector",
                       kind="affinity"),
            ),
            "0/4 nodes are available: 4 Preemption is not helpful for scheduling",
            id="cordoned-and-affinity",
        ),
        pytest.param(
            OLD_STYLE, 0, 3,
            (
                Reason(count=1, text="Insufficient cpu", kind="insufficient", resource="cpu"),
                Reason(count=2, text="Insufficient rdma/hca_shared", kind="insufficient",
                       resource="rdma/hca_shared"),
            ),
            None,
            id="before-preemption-suffix",
        ),
        pytest.param(
            TOO_MANY, 0, 2,
            (Reason(count=2, text="Too many pods", kind="insufficient", resource="pods"),),
            None,
            id="too-many-pods",
        ),
        pytest.param(
            "0/3 nodes are available: 3 pod has unbound immediate PersistentVolumeClaims.", 0, 3,
            (Reason(count=3, text="pod has unbound immediate PersistentVolumeClaims",
                    kind="volume"),),
            None,
            id="volume",
        ),
        pytest.param(
            "0/1 nodes are available: 1 something new in a later release.", 0, 1,
            (Reason(count=1, text="something new in a later release", kind="other"),),
            None,
            id="unknown-reason-kept",
        ),
    ],
)  # fmt: skip
def test_messages_parse(
    message: str,
    available: int,
    total: int,
    reasons: tuple[Reason, ...],
    preemption: str | None,
) -> None:
    failure = parse_failed_scheduling(message)
    assert (failure.available, failure.total) == (available, total)
    assert failure.reasons == reasons
    assert failure.preemption == preemption
    assert failure.message == message


@pytest.mark.parametrize(
    "message",
    [
        pytest.param("no nodes available to schedule pods", id="no-nodes"),
        pytest.param('running PreFilter plugin "VolumeBinding": error', id="plugin-error"),
        pytest.param("", id="empty"),
    ],
)
def test_an_unknown_shape_keeps_the_raw_message(message: str) -> None:
    failure = parse_failed_scheduling(message)
    assert (failure.message, failure.reasons, failure.total) == (message, (), None)


PENDING = PodRequest(namespace="ml", name="train-1", phase="Pending", requests={"rdma/ib": 1})


def event(message: str, last_seen: str, count: int = 1, pod: str = "train-1") -> SchedulingEvent:
    return SchedulingEvent(
        namespace="ml", pod=pod, message=message, count=count, last_seen=last_seen
    )


def test_a_pending_pods_newest_event_is_the_cause() -> None:
    events = (
        event(TOO_MANY, "2026-01-01T10:00:00Z"),
        event(INSUFFICIENT_AND_TAINT, "2026-01-01T10:05:00Z", count=7),
        event(AFFINITY, "2026-01-01T11:00:00Z", pod="other"),
    )
    link = pod_scheduling_link(PENDING, events)
    assert link.status == "broken"
    assert link.cause == (
        "ml/train-1 is not scheduled: 0/5 nodes are available: 2 Insufficient rdma/ib, "
        "3 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }"
    )
    assert link.fix is not None and "toleration" in link.fix  # 3 nodes say taint, 2 rdma/ib
    assert (link.evidence["count"], link.evidence["last_seen"]) == (7, "2026-01-01T10:05:00Z")
    assert [r["kind"] for r in link.evidence["reasons"]] == ["insufficient", "taint"]


def test_without_events_the_podscheduled_condition_is_the_cause() -> None:
    pod = PodRequest(
        namespace="ml", name="train-1", phase="Pending", unschedulable=OLD_STYLE,
        requests={"rdma/hca_shared": 1},
    )  # fmt: skip
    link = pod_scheduling_link(pod, ())
    assert link.status == "broken"
    assert link.fix is not None and "nicfleetctl resources --name rdma/hca_shared" in link.fix


def test_an_unknown_message_is_the_cause_as_written() -> None:
    link = pod_scheduling_link(PENDING, (event("no nodes available to schedule pods", "t"),))
    assert link.status == "broken"
    assert link.cause == "ml/train-1 is not scheduled: no nodes available to schedule pods"
    assert link.fix == "read the scheduler's message in full (kubectl describe pod -n ml train-1)"


def test_a_scheduled_pod_is_ok_and_a_fresh_one_unknown() -> None:
    bound = PodRequest(namespace="ml", name="train-0", node="gpu-001", phase="Running")
    assert pod_scheduling_link(bound, ()).status == "ok"
    assert pod_scheduling_link(bound, ()).evidence["node"] == "gpu-001"
    assert pod_scheduling_link(PENDING, ()).status == "unknown"


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        pytest.param(AFFINITY, "nodeSelector/affinity", id="affinity"),
        pytest.param(TOO_MANY, "free pods", id="too-many-pods"),
        pytest.param(
            "0/2 nodes are available: 2 node(s) were unschedulable.", "uncordon", id="cordoned"
        ),
    ],
)
def test_the_fix_follows_the_reason_most_nodes_gave(message: str, needle: str) -> None:
    assert needle in failure_fix(parse_failed_scheduling(message), "ml/train-1")


def test_a_nodes_chain_lists_the_unscheduled_pods_and_stays_ok() -> None:
    pods = tuple(
        PodRequest(namespace="ml", name=f"p-{i}", phase="Pending", requests={"rdma/ib": 1})
        for i in range(25)
    )
    events = (event(TOO_MANY, "2026-01-01T10:00:00Z", pod="p-3"),)
    cluster = ClusterView(present=True, pods=pods, scheduling_events=events)
    ctx = ChainContext(
        node="gpu-001", resource="rdma/ib", record=None, cluster=cluster, policies=(),
        config=None, status=None, now=0.0, stale_after=30.0,
    )  # fmt: skip
    link = scheduling_link(ctx)
    assert (link.status, link.evidence["unscheduled_count"]) == ("ok", 25)
    assert len(link.evidence["unscheduled"]) == MAX_LISTED
    assert link.evidence["unscheduled"][3] == {"pod": "ml/p-3", "message": TOO_MANY}
    assert scheduling_link(msgspec.structs.replace(ctx, cluster=ClusterView())).status == "unknown"
