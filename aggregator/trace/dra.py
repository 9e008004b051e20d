"""A pod's DRA chains (`nicfleetctl trace --pod` for pods with spec.resourceClaims): one
Trace per claim entry that asks for (or was allocated) an rdma.nicfleet.io device, its
links "slice published -> device healthy -> claim allocated -> prepared -> pod" after the
`claim` itself (draclaim: claim, prepared, pod; draalloc: the middle three).

Pure: a function of the pod, the fleet records, the cluster view and `now`. Entries whose
claim asks only for other drivers' devices (a GPU claim) are not traced: `untraced_claims`
says why, under "claim/<entry>".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from aggregator.cluster import ClusterView, DraClaim, PodClaim, PodRequest
from aggregator.dra import builtin
from aggregator.fleet.state import NodeRecord
from aggregator.trace.draalloc import (
    ALLOCATED_LINK,
    HEALTHY_LINK,
    SLICE_LINK,
    claim_allocated_link,
    device_healthy_link,
    slice_published_link,
)
from aggregator.trace.draclaim import (
    CLAIM_LINK,
    POD_LINK,
    PREPARED_LINK,
    ClaimContext,
    claim_link,
    pod_link,
    prepared_link,
)
from aggregator.trace.verdict import verdict_of
from proto.dranames import DRIVER
from proto.http import Link, Trace

__all__ = ["CLAIM_LINK_NAMES", "claim_resource", "trace_claims", "untraced_claims"]

CLAIM_LINK_NAMES: Final = (
    CLAIM_LINK, SLICE_LINK, HEALTHY_LINK, ALLOCATED_LINK, PREPARED_LINK, POD_LINK,
)  # fmt: skip
_LINKS: Final[tuple[Callable[[ClaimContext], Link], ...]] = (
    claim_link, slice_published_link, device_healthy_link, claim_allocated_link,
    prepared_link, pod_link,
)  # fmt: skip


def claim_resource(entry: str) -> str:
    """The `resource` of an entry's chain (and its key in PodTrace.untraced)."""
    return f"claim/{entry}"


def trace_claims(
    pod: PodRequest,
    *,
    fleet: Mapping[str, NodeRecord],
    cluster: ClusterView,
    now: float,
    stale_after: float,
) -> tuple[Trace, ...]:
    """One chain per entry of `pod.claims`, in the pod's order, but those `untraced_claims`
    names."""
    traces = []
    for entry in pod.claims:
        claim = claim_of(pod, entry, cluster)
        if claim is not None and _other_drivers(claim, cluster) is not None:
            continue
        ctx = ClaimContext(
            pod=pod, entry=entry, claim=claim, cluster=cluster, fleet=fleet, now=now,
            stale_after=stale_after,
        )  # fmt: skip
        links = tuple(check(ctx) for check in _LINKS)
        verdict, reason = verdict_of(links, None)
        broken = next((i for i, link in enumerate(links) if link.status == "broken"), None)
        traces.append(
            Trace(
                node=pod.node or "", resource=claim_resource(entry.name), checked_at=now,
                verdict=verdict, verdict_reason=reason, ok=verdict == "ok",
                first_broken=broken, links=links,
            )
        )  # fmt: skip
    return tuple(traces)


def untraced_claims(pod: PodRequest, cluster: ClusterView) -> dict[str, str]:
    """Why each entry whose claim asks for no rdma.nicfleet.io device is not traced, by
    "claim/<entry>"."""
    found = {}
    for entry in pod.claims:
        claim = claim_of(pod, entry, cluster)
        classes = _other_drivers(claim, cluster) if claim is not None else None
        if claim is not None and classes is not None:
            found[claim_resource(entry.name)] = (
                f"ResourceClaim {claim.namespace}/{claim.name} asks for no {DRIVER} device "
                f"(DeviceClass {', '.join(classes) or 'none'}): another driver's, whose chain "
                "nicfleet does not trace"
            )
    return found


def claim_of(pod: PodRequest, entry: PodClaim, cluster: ClusterView) -> DraClaim | None:
    """The ResourceClaim an entry resolved to, when the cluster view has it."""
    if not cluster.dra_present or entry.claim is None:
        return None
    return next(
        (c for c in cluster.claims if (c.namespace, c.name) == (pod.namespace, entry.claim)),
        None,
    )


def _other_drivers(claim: DraClaim, cluster: ClusterView) -> list[str] | None:
    """The claim's DeviceClasses when none of its requests nor results is ours; None when
    it is ours — or when its spec cannot be read, so the chain shows why."""
    if any(r.driver == DRIVER for r in claim.results):
        return None
    asked = _requested(claim.spec)
    if asked is None:
        return None
    classes, expressions = asked
    ours = {c.name for c in builtin.CLASSES} | {
        c.name for c in cluster.device_classes if any(DRIVER in s for s in c.selectors)
    }
    if any(c in ours for c in classes) or any(DRIVER in e for e in expressions):
        return None
    return sorted(set(classes))


def _requested(spec: Mapping[str, Any]) -> tuple[list[str], list[str]] | None:
    """The deviceClassNames and selector expressions of every request and subrequest, read
    leniently (parse_claim judges the shape in `claim-allocated`); None: none found."""
    devices = spec.get("devices")
    requests = devices.get("requests") if isinstance(devices, dict) else None
    classes: list[str] = []
    expressions: list[str] = []
    for request in requests if isinstance(requests, list) else ():
        if not isinstance(request, dict):
            continue
        first = request.get("firstAvailable")
        choices = [request.get("exactly"), *(first if isinstance(first, list) else ())]
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            name = choice.get("deviceClassName")
            if isinstance(name, str):
                classes.append(name)
            selectors = choice.get("selectors")
            for selector in selectors if isinstance(selectors, list) else ():
                cel = selector.get("cel") if isinstance(selector, dict) else None
                expression = cel.get("expression") if isinstance(cel, dict) else None
                if isinstance(expression, str):
                    expressions.append(expression)
    return (classes, expressions) if classes else None
