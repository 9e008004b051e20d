"""The chain's `scheduling` link: why a pod requesting an RDMA resource is not on a node,
read from the scheduler's `FailedScheduling` message ("0/5 nodes are available: 2
Insufficient rdma/ib, 3 node(s) had untolerated taint {...}. preemption: ...").

Pure: a function of the pod, its Events and `now`-free data; no I/O, no clock. A message
this parser does not know is kept whole as the cause, never dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final, Literal

import msgspec

from aggregator.cluster import ClusterView, PodRequest, SchedulingEvent
from aggregator.trace.host import ChainContext, link_broken, link_ok, link_unknown
from proto.http import Link

SCHEDULING_LINK: Final = "scheduling"
MAX_LISTED: Final = 20  # pending pods named in a node's evidence (the count has them all)

ReasonKind = Literal[
    "insufficient", "taint", "affinity", "unschedulable", "volume", "ports", "other"
]  # fmt: skip

# pkg/scheduler: "%d/%d nodes are available: %s." then, since 1.24, " preemption: ...".
_HEAD: Final = re.compile(
    r"(?P<avail>\d+)/(?P<total>\d+) nodes are available(?::\s*(?P<body>.*))?", re.S
)
_PREEMPTION: Final = re.compile(r"\.?\s*preemption:\s*", re.S)
_SPLIT: Final = re.compile(r",\s+(?=\d+\s)")  # "2 A, 3 B": a comma before the next count
_REASON: Final = re.compile(r"(?P<count>\d+)\s+(?P<text>.+)", re.S)
_INSUFFICIENT: Final = re.compile(r"Insufficient (?P<resource>\S+)")
_TAINT: Final = re.compile(r"untolerated taint(?:\(s\))?\s*(?P<taint>\{.*\})?")


class Reason(msgspec.Struct, frozen=True, kw_only=True):
    count: int  # how many nodes gave this reason
    text: str  # as the scheduler wrote it
    kind: ReasonKind
    resource: str | None = None  # Insufficient <resource>
    taint: str | None = None  # {key: value}


class SchedulingFailure(msgspec.Struct, frozen=True, kw_only=True):
    """One FailedScheduling message, parsed; `reasons` is () when its shape is unknown."""

    message: str
    available: int | None = None
    total: int | None = None
    reasons: tuple[Reason, ...] = ()
    preemption: str | None = None


def parse_failed_scheduling(message: str) -> SchedulingFailure:
    """The node counts, per-node reasons and preemption verdict of a FailedScheduling
    message; only `message` for a shape the scheduler's format does not explain."""
    text = message.strip()
    head = _HEAD.match(text)
    if head is None:
        return SchedulingFailure(message=text)
    body = head["body"] or ""
    preemption: str | None = None
    split = _PREEMPTION.split(body, maxsplit=1)
    if len(split) == 2:
        body, preemption = split[0], split[1].strip().rstrip(".") or None
    reasons = []
    for part in _SPLIT.split(body.strip().rstrip(".")):
        found = _REASON.fullmatch(part.strip())
        if found is not None:
            reasons.append(_reason(int(found["count"]), found["text"].strip()))
    return SchedulingFailure(
        message=text,
        available=int(head["avail"]),
        total=int(head["total"]),
        reasons=tuple(reasons),
        preemption=preemption,
    )


def _reason(count: int, text: str) -> Reason:
    if (found := _INSUFFICIENT.match(text)) is not None:
        return Reason(count=count, text=text, kind="insufficient", resource=found["resource"])
    if text.startswith("Too many pods"):
        return Reason(count=count, text=text, kind="insufficient", resource="pods")
    if (found := _TAINT.search(text)) is not None:
        return Reason(count=count, text=text, kind="taint", taint=found["taint"])
    if "affinity" in text or "selector" in text:
        return Reason(count=count, text=text, kind="affinity")
    if "were unschedulable" in text:
        return Reason(count=count, text=text, kind="unschedulable")
    if "PersistentVolumeClaim" in text or "volume" in text:
        return Reason(count=count, text=text, kind="volume")
    if "free ports" in text:
        return Reason(count=count, text=text, kind="ports")
    return Reason(count=count, text=text, kind="other")


def failure_fix(failure: SchedulingFailure, pod: str) -> str:
    """What to do about the reason most nodes gave (the first named on a tie)."""
    describe = f"kubectl describe pod -n {pod.replace('/', ' ', 1)}"
    if not failure.reasons:
        return f"read the scheduler's message in full ({describe})"
    top = max(failure.reasons, key=lambda r: r.count)
    if top.kind == "insufficient" and top.resource is not None and "/" in top.resource:
        return (
            f"no node has {top.resource} free: check its nodes' chains "
            f"(nicfleetctl resources --name {top.resource}) or lower the pod's request"
        )
    if top.kind == "insufficient":
        return f"free {top.resource} on the nodes offering the RDMA resource, or lower the request"
    if top.kind == "taint":
        return (
            f"add a toleration for {top.taint or 'the taint'} to the pod, or untaint the nodes "
            "meant for it (kubectl taint node NODE KEY-)"
        )
    if top.kind == "affinity":
        return (
            "the pod's nodeSelector/affinity matches no node with room: compare it with "
            "kubectl get nodes --show-labels (nicfleet.io/* labels come from the policies)"
        )
    if top.kind == "unschedulable":
        return "the nodes are cordoned: kubectl uncordon NODE once it is fit"
    return f"act on the scheduler's reasons ({describe})"


def newest_failure(
    pod: PodRequest, events: Iterable[SchedulingEvent]
) -> tuple[SchedulingEvent | None, str | None]:
    """The pod's newest FailedScheduling Event and its message, else the message of its
    PodScheduled=False condition (Events expire after an hour, the condition stays)."""
    mine = [e for e in events if (e.namespace, e.pod) == (pod.namespace, pod.name)]
    # RFC 3339 UTC timestamps sort as text; an Event without one is the oldest.
    event = max(mine, key=lambda e: e.last_seen or "", default=None)
    if event is not None and event.message:
        return event, event.message
    return None, pod.unschedulable


def pod_scheduling_link(pod: PodRequest, events: Iterable[SchedulingEvent]) -> Link:
    """`scheduling` for one pod: ok once bound to a node, broken with the scheduler's
    reason while it is not, unknown before the scheduler has said anything."""
    ref = f"{pod.namespace}/{pod.name}"
    if pod.node is not None:
        return link_ok(SCHEDULING_LINK, pod=ref, node=pod.node, phase=pod.phase)
    event, message = newest_failure(pod, events)
    if message is None:
        return link_unknown(
            SCHEDULING_LINK, pod=ref, phase=pod.phase, reason="no FailedScheduling event yet"
        )
    failure = parse_failed_scheduling(message)
    evidence: dict[str, Any] = {
        "pod": ref,
        "phase": pod.phase,
        "message": failure.message,
        "reasons": [msgspec.to_builtins(r) for r in failure.reasons],
        "preemption": failure.preemption,
    }
    if event is not None:
        evidence |= {"count": event.count, "last_seen": event.last_seen}
    head = _HEAD.match(failure.message)
    summary = _PREEMPTION.split(failure.message, maxsplit=1)[0] if head else failure.message
    return link_broken(
        SCHEDULING_LINK,
        f"{ref} is not scheduled: {summary.rstrip('.')}",
        failure_fix(failure, ref),
        **evidence,
    )


def scheduling_link(ctx: ChainContext) -> Link:
    """`scheduling` in a node's chain: the pod's link in a pod trace; otherwise ok, with
    the pods requesting the resource that no node takes and why (a full cluster is not a
    broken node: the links above say whether this node offers what it should)."""
    if ctx.pod is not None:
        return pod_scheduling_link(ctx.pod, ctx.cluster.scheduling_events)
    if not ctx.cluster.present:
        return link_unknown(SCHEDULING_LINK, cluster="no cluster")
    pending = unscheduled(ctx.cluster, ctx.resource)
    return link_ok(
        SCHEDULING_LINK, unscheduled_count=len(pending), unscheduled=pending[:MAX_LISTED]
    )


def unscheduled(cluster: ClusterView, resource: str) -> list[dict[str, Any]]:
    """The pending pods requesting `resource` that are not on a node, with the scheduler's
    newest reason."""
    found = []
    for pod in cluster.pods:
        if pod.node is not None or pod.requests.get(resource, 0) <= 0:
            continue
        _, message = newest_failure(pod, cluster.scheduling_events)
        found.append({"pod": f"{pod.namespace}/{pod.name}", "message": message})
    return found
