"""One pod's own chain (`nicfleetctl trace --pod NS/NAME`): the node it is on or why the
scheduler left it pending, the resources it requests and, on its node, each resource's
whole chain with the pod's own `scheduling` link and, in `attachment`, `ip-pool` and
`pod-interface`, the pod's own networks and `network-status` (`ChainContext.pod`); and
one DRA chain per spec.resourceClaims entry that asks for an rdma.nicfleet.io device
(`aggregator.trace.dra`), pending or not.

Pure: a function of the fleet records, the cluster view, the policies, the newest
validations (a lookup passed in) and `now`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Final

from aggregator.cluster import ClusterView, PodRequest
from aggregator.errors import AggregatorError
from aggregator.fleet.state import NodeRecord
from aggregator.trace.chain import (
    MAX_SUGGESTIONS,
    NAD_RESOURCE_ANNOTATION,
    UnknownNode,
    UnknownResource,
    trace,
)
from aggregator.trace.dra import trace_claims, untraced_claims
from aggregator.trace.host import link_broken
from aggregator.trace.scheduling import pod_scheduling_link
from proto.dpconfig import resource_full_name
from proto.http import PodTrace, Trace, ValidationRecord
from proto.policy import Policy

__all__ = ["UnknownPod", "pod_node", "rdma_resources", "trace_pod"]

# nicfleet's own resource namespace: a pod asking for one is on an RDMA chain even where no
# node serves it any more (its chain then breaks at the device plugin).
RDMA_PREFIX: Final = "rdma/"


class UnknownPod(AggregatorError, LookupError):
    def __init__(self, pod: str, suggestions: tuple[str, ...], *, cluster: bool) -> None:
        why = (
            "no pod of that name attaches a network (k8s.v1.cni.cncf.io/networks) or requests "
            "a device-plugin resource; a pod doing neither has no RDMA chain to trace"
            if cluster
            else "the aggregator has no Kubernetes API (it runs with --policy FILE)"
        )
        super().__init__(f"pod {pod!r} not found: {why}")
        self.pod, self.suggestions = pod, suggestions


def pod_node(cluster: ClusterView, namespace: str, name: str) -> str | None:
    """The node the pod is bound to; None when unscheduled or not in the view."""
    return next((p.node for p in cluster.pods if p.namespace == namespace and p.name == name), None)


def trace_pod(
    namespace: str,
    name: str,
    *,
    fleet: Mapping[str, NodeRecord],
    cluster: ClusterView,
    policies: tuple[Policy, ...],
    now: float,
    stale_after: float,
    validation: Callable[[str, str], ValidationRecord | None] | None = None,
) -> PodTrace:
    """The pod's chain; raises UnknownPod (with close names) when the view lacks it."""
    ref = f"{namespace}/{name}"
    pods = {f"{p.namespace}/{p.name}": p for p in cluster.pods}
    pod = pods.get(ref)
    if pod is None:
        close = difflib.get_close_matches(ref, sorted(pods), n=MAX_SUGGESTIONS)
        raise UnknownPod(ref, tuple(close), cluster=cluster.present)
    scheduling = pod_scheduling_link(pod, cluster.scheduling_events)
    traces: list[Trace] = []
    untraced: dict[str, str] = {}
    if pod.node is not None:
        rdma = rdma_resources(fleet, policies)
        for resource in sorted(pod.requests):
            if resource not in rdma and not resource.startswith(RDMA_PREFIX):
                untraced[resource] = _not_rdma(resource, pod, cluster)
                continue
            try:
                traces.append(
                    trace(
                        pod.node,
                        resource,
                        fleet=fleet,
                        cluster=cluster,
                        policies=policies,
                        now=now,
                        stale_after=stale_after,
                        validation=validation(pod.node, resource) if validation else None,
                        pod=pod,
                    )
                )
            except (UnknownNode, UnknownResource) as exc:
                # Bound to a node that no longer offers the resource at all: one link says so.
                link = link_broken(
                    "device-plugin",
                    str(exc),
                    "the pod was admitted before the resource went away: restore the "
                    "node's policy/plugin for it, or delete the pod so it is scheduled again",
                )
                traces.append(
                    Trace(
                        node=pod.node, resource=resource, checked_at=now, ok=False,
                        verdict="broken", verdict_reason=f"link 0 (device-plugin): {exc}",
                        first_broken=0, links=(link,),
                    )
                )  # fmt: skip
    # A claim's chain needs no node: a pending pod's says why its claim is not allocated.
    claims = trace_claims(pod, fleet=fleet, cluster=cluster, now=now, stale_after=stale_after)
    untraced_claim = untraced_claims(pod, cluster)
    chains = (*traces, *claims)
    return PodTrace(
        namespace=namespace,
        name=name,
        node=pod.node,
        phase=pod.phase,
        requests=dict(pod.requests),
        checked_at=now,
        ok=scheduling.status != "broken" and all(t.verdict != "broken" for t in chains),
        scheduling=scheduling,
        traces=tuple(traces),
        untraced=untraced | untraced_claim,
        no_chain=(
            _no_chain(pod, untraced, untraced_claim)
            if pod.node is not None and not chains
            else None
        ),
        claims=claims,
    )


def rdma_resources(fleet: Mapping[str, NodeRecord], policies: tuple[Policy, ...]) -> set[str]:
    """The resources nicfleet's chain covers: configured by a policy or served by an agent's
    device plugin on some node (a pod's node may have lost one: that is a broken link)."""
    found = {
        resource_full_name(c)
        for p in policies
        if p.spec.rdma_shared_device_plugin is not None
        for c in p.spec.rdma_shared_device_plugin.config_list
    }
    found |= {
        r.name
        for record in fleet.values()
        if record.device_plugin is not None
        for r in record.device_plugin.resources
    }
    return found


def _not_rdma(resource: str, pod: PodRequest, cluster: ClusterView) -> str:
    by_key = {f"{a.namespace}/{a.name}": a for a in cluster.attachments}
    naming = [k for k in pod.networks if k in by_key and by_key[k].resource_name == resource]
    why = (
        "no policy configures it and no agent's device plugin serves it: another device "
        "plugin's resource, whose chain nicfleet does not trace"
    )
    if naming:
        why += (
            f" (the device of {', '.join(naming)}, by its {NAD_RESOURCE_ANNOTATION}; "
            "nicfleet-verify in the pod checks the interface it got)"
        )
    return why


def _no_chain(
    pod: PodRequest, untraced: Mapping[str, str], untraced_claims: Mapping[str, str]
) -> str:
    """Why a scheduled pod has no RDMA chain: what it asks for, and what it would need."""
    asks = (
        f"requests only {', '.join(sorted(untraced))} (no resource nicfleet serves)"
        if untraced
        else "requests no device-plugin resource"
    )
    if untraced_claims:
        entries = ", ".join(sorted(k.removeprefix("claim/") for k in untraced_claims))
        asks += f" and its claims ({entries}) ask for no rdma.nicfleet.io device"
    networks = (
        f"; it attaches {', '.join(pod.networks)}, but no RDMA adapter is allocated to it"
        if pod.networks
        else ""
    )
    return (
        f"{pod.namespace}/{pod.name} {asks}{networks}: there is no RDMA chain to trace; "
        "request an RDMA resource (nicfleetctl resources lists them) to get one"
    )
