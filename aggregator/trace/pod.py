"""One pod's own chain (`nicfleetctl trace --pod NS/NAME`): the node it is on or why the
scheduler left it pending, the resources it requests and, on its node, each resource's
whole chain with the pod's own `scheduling` link and, in `attachment`, `ip-pool` and
`pod-interface`, the pod's own networks and `network-status` (`ChainContext.pod`).

Pure: a function of the fleet records, the cluster view, the policies, the newest
validations (a lookup passed in) and `now`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping

from aggregator.cluster import ClusterView
from aggregator.errors import AggregatorError
from aggregator.fleet.state import NodeRecord
from aggregator.trace.chain import MAX_SUGGESTIONS, UnknownNode, UnknownResource, trace
from aggregator.trace.host import link_broken
from aggregator.trace.scheduling import pod_scheduling_link
from proto.http import PodTrace, Trace, ValidationRecord
from proto.policy import Policy

__all__ = ["UnknownPod", "trace_pod"]


class UnknownPod(AggregatorError, LookupError):
    def __init__(self, pod: str, suggestions: tuple[str, ...], *, cluster: bool) -> None:
        why = (
            "no pod of that name requests an RDMA resource (only pods requesting one are traced)"
            if cluster
            else "the aggregator has no Kubernetes API (it runs with --policy FILE)"
        )
        super().__init__(f"pod {pod!r} not found: {why}")
        self.pod, self.suggestions = pod, suggestions


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
    if pod.node is not None:
        for resource in sorted(pod.requests):
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
                        first_broken=0, links=(link,),
                    )
                )  # fmt: skip
    return PodTrace(
        namespace=namespace,
        name=name,
        node=pod.node,
        phase=pod.phase,
        requests=dict(pod.requests),
        checked_at=now,
        ok=scheduling.status != "broken" and all(t.ok for t in traces),
        scheduling=scheduling,
        traces=tuple(traces),
    )
