"""The chain trace: why a node does (or does not) offer an RDMA resource, link by link.

Pure: a function of the fleet records, the cluster view, the policies and `now`. Each link
is `ok`, `degraded` (it holds on fewer adapters, named), `broken` or `unknown` with its
evidence; a broken or degraded one carries a one-sentence likely cause and fix, and the
trace a verdict over them all (`verdict`). Host links live in `tracehost`; the
device-plugin and Kubernetes links here; the last two, `pod-interface` (`podinterface`)
and `tested-data-path` (`tested`), read the newest pair validation, passed in.
`scheduling` (why a pod is not on a node) is in `scheduling`; what the cluster must run on
the node, `components`, is a section of the trace beside the links (in `components`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any, Final

from aggregator.cluster import ClusterView, PodRequest, policies_by_node
from aggregator.errors import AggregatorError
from aggregator.fleet.adapterhistory import ResourcePeak
from aggregator.fleet.state import NodeRecord
from aggregator.trace.attachment import ATTACHMENT_LINK, attachment_link
from aggregator.trace.components import components_link
from aggregator.trace.host import (
    ChainContext,
    check_adapter,
    check_agent,
    check_char_devices,
    check_driver,
    check_rdma_device,
    compact,
    link_broken,
    link_degraded,
    link_ok,
    link_unknown,
)
from aggregator.trace.ippool import IP_POOL_LINK, ip_pool_link
from aggregator.trace.podinterface import POD_INTERFACE_LINK, pod_interface_link
from aggregator.trace.resources import allocatable_count
from aggregator.trace.scheduling import SCHEDULING_LINK, scheduling_link
from aggregator.trace.tested import TESTED_LINK, data_path_link
from aggregator.trace.verdict import verdict_of
from proto.dpconfig import resource_full_name
from proto.http import Link, Trace, ValidationRecord
from proto.messages.config import ResourceConfig
from proto.messages.status import ResourceStatus
from proto.policy import Policy

__all__ = ["LINK_NAMES", "UnknownNode", "UnknownResource", "trace"]

LINK_NAMES: Final = (
    "agent", "adapter", "driver", "rdma-device", "char-devices",
    "device-plugin", "advertised", "allocatable", "pods", SCHEDULING_LINK,
    ATTACHMENT_LINK, IP_POOL_LINK, POD_INTERFACE_LINK, TESTED_LINK,
)  # fmt: skip
MAX_SUGGESTIONS: Final = 3
CONFIG_INVALID: Final = "config-invalid"  # ResourceStatus.registration of a left-out entry
NAD_RESOURCE_ANNOTATION: Final = "k8s.v1.cni.cncf.io/resourceName"


class UnknownNode(AggregatorError, LookupError):
    def __init__(self, node: str, suggestions: tuple[str, ...]) -> None:
        super().__init__(f"node {node!r} not found")
        self.node, self.suggestions = node, suggestions


class UnknownResource(AggregatorError, LookupError):
    def __init__(self, node: str, resource: str, suggestions: tuple[str, ...]) -> None:
        known = (
            f"; known here: {', '.join(suggestions)}"
            if suggestions
            else "; no policy configures a resource for this node and its agent serves none "
            "(run the agent with --device-plugin-config FILE or --device-plugin)"
        )
        super().__init__(
            f"resource {resource!r} is neither configured nor served on {node!r}{known}"
        )
        self.node, self.resource, self.suggestions = node, resource, suggestions


def trace(
    node: str,
    resource: str,
    *,
    fleet: Mapping[str, NodeRecord],
    cluster: ClusterView,
    policies: tuple[Policy, ...],
    now: float,
    stale_after: float,
    validation: ValidationRecord | None = None,  # the newest finished one of node+resource
    pod: PodRequest | None = None,  # a pod's own chain (aggregator.trace.pod)
) -> Trace:
    """Every link of the chain for `resource` on `node`; raises UnknownNode/UnknownResource."""
    record = fleet.get(node)
    if record is None and node not in cluster.nodes:
        names = sorted({*fleet, *cluster.nodes})
        raise UnknownNode(node, tuple(difflib.get_close_matches(node, names, n=MAX_SUGGESTIONS)))
    selecting = policies_by_node(policies, fleet.keys(), cluster).get(node, ())
    configs = {resource_full_name(c): c for p in selecting for c in _config_list(p)}
    plugin = record.device_plugin if record is not None else None
    served = {r.name: r for r in plugin.resources} if plugin is not None else {}
    if resource not in configs and resource not in served:
        known = sorted({*configs, *served})
        close = difflib.get_close_matches(resource, known, n=MAX_SUGGESTIONS, cutoff=0.0)
        raise UnknownResource(node, resource, tuple(close))
    ctx = ChainContext(
        node=node, resource=resource, record=record, cluster=cluster, policies=selecting,
        config=configs.get(resource), status=served.get(resource), now=now,
        stale_after=stale_after, pod=pod,
    )  # fmt: skip
    links = (
        *(check(ctx) for check in _CHECKS),
        pod_interface_link(ctx, validation),
        data_path_link(validation, node, resource, now),
    )
    broken = next((i for i, link in enumerate(links) if link.status == "broken"), None)
    components = components_link(ctx)  # a section of its own: link indices stay stable
    verdict, reason = verdict_of(links, components)
    return Trace(
        node=node, resource=resource, checked_at=now, verdict=verdict, verdict_reason=reason,
        ok=verdict == "ok", first_broken=broken, links=links, components=components,
    )  # fmt: skip


def _config_list(policy: Policy) -> tuple[ResourceConfig, ...]:
    config = policy.spec.rdma_shared_device_plugin
    return config.config_list if config is not None else ()


def _device_plugin(ctx: ChainContext) -> Link:
    name = "device-plugin"
    plugin = ctx.record.device_plugin if ctx.record is not None else None
    evidence: dict[str, Any] = {"policies": [p.metadata.name for p in ctx.policies]}
    if ctx.config is not None:
        evidence["config"] = compact(ctx.config)
    if len(ctx.policies) > 1:
        return link_broken(
            name,
            f"{ctx.node} is selected by {len(ctx.policies)} policies (conflict, never merged)",
            "narrow the nodeSelectors so exactly one policy selects the node",
            **evidence,
        )
    if plugin is None:
        return link_broken(
            name,
            "the agent's device plugin has never reported status",
            "run the agent with the device plugin on (--device-plugin-config) and check its log",
            **evidence,
        )
    evidence["config_generation"] = plugin.config_generation
    status = ctx.status
    if status is None:
        return link_broken(
            name,
            f"{ctx.resource} is configured but the agent does not serve it "
            f"(applied config generation {plugin.config_generation})",
            "check the agent received the config (nicfleet-config KV) and its log for a "
            "rejected config",
            **evidence,
        )
    evidence |= {
        "registration": status.registration,
        "mode": status.registration_mode,
        "error": status.registration_error,
        "attempts": status.registration_attempts,
        "endpoint": status.endpoint,
    }
    if status.registration == CONFIG_INVALID:
        evidence |= {"config_path": status.config_path, "config_error": status.config_error}
    if status.registration != "registered":
        cause, fix = _registration_cause(status)
        return link_broken(name, cause, fix, **evidence)
    return link_ok(name, **evidence)


def _registration_cause(status: ResourceStatus) -> tuple[str, str]:
    if status.registration == CONFIG_INVALID:
        return _config_invalid_cause(status, "the agent does not serve it")
    error = f": {status.registration_error}" if status.registration_error else ""
    if status.registration == "rejected":
        return (
            f"the kubelet rejected the registration{error}",
            "check the resource name and the kubelet's log; the kubelet must support v1beta1",
        )
    if status.registration == "waiting":
        return (
            "the kubelet's socket is not there: the plugin is waiting for it",
            "mount the kubelet's device-plugins directory into the agent (--device-plugin-dir)",
        )
    return (
        f"the device plugin is not registered with the kubelet "
        f"({status.registration}{error}, {status.registration_attempts} failed attempts)",
        "check the kubelet is running and the agent's --device-plugin-dir matches its root dir",
    )


def _config_invalid_cause(status: ResourceStatus, effect: str) -> tuple[str, str]:
    """A configList entry the agent leaves out (it serves the config's valid ones)."""
    path = status.config_path or "the entry"
    return (
        f"the device-plugin config's entry for {status.name} is invalid, {effect}: "
        f"{path}: {status.config_error or 'no reason given'}",
        f"correct {path} in the device-plugin config",
    )


def _advertised(ctx: ChainContext) -> Link:
    name = "advertised"
    status = ctx.status
    if status is None:
        return link_unknown(name, reason="resource not served by the agent")
    evidence: dict[str, Any] = {
        "advertised": status.advertised,
        "healthy": status.healthy,
        "unhealthy": status.unhealthy,
    }
    if status.registration == CONFIG_INVALID:
        cause, fix = _config_invalid_cause(status, "nothing is advertised for it")
        return link_broken(name, cause, fix, **evidence)
    if status.advertised == 0:
        hca_max = ctx.config.rdma_hca_max if ctx.config is not None else None
        cause = "the plugin advertises 0 devices" + (
            " (rdmaHcaMax is 0)" if hca_max == 0 and status.devices else ""
        )
        return link_broken(
            name, cause, "fix the first broken link above; set rdmaHcaMax > 0", **evidence
        )
    why = status.unhealthy_reason or (
        "; ".join(f"{a}: {r}" for a, r in sorted(status.unhealthy.items())) or "unknown"
    )
    if status.healthy == 0:
        return link_broken(
            name,
            f"all {status.advertised} devices are unhealthy ({why})",
            "remove what makes the adapters unhealthy (the links above show which)",
            **evidence,
        )
    fix = "remove what makes those adapters unhealthy (the links above show which)"
    if status.healthy < status.advertised:
        cause = f"{status.healthy} of {status.advertised} devices healthy ({why})"
        return link_degraded(name, cause, fix, sorted(status.unhealthy), **evidence)
    if status.unhealthy:  # shared: every device ID stays healthy while one adapter is
        cause = (
            f"{len(status.unhealthy)} of {len(status.devices)} selected adapters unhealthy "
            f"({why}); the {status.advertised} shared devices run on the others"
        )
        return link_degraded(name, cause, fix, sorted(status.unhealthy), **evidence)
    lost = _lost_since_peak(ctx, status)
    if lost is not None:
        peak, dropped = lost
        evidence |= {"highest": peak.advertised, "most_adapters": len(peak.devices)}
        return link_degraded(
            name,
            f"{status.advertised} advertised over {_adapters(len(status.devices))}, down "
            f"from {peak.advertised} over {_adapters(len(peak.devices))} since the agent "
            f"started (same config): {', '.join(dropped) or 'an adapter'} no longer served",
            "see the adapter-lost finding: bring the adapter back (dmesg, lspci, driver "
            "reload, reset), or restart the agent to accept the node as it is",
            dropped,
            **evidence,
        )
    return link_ok(name, **evidence)


def _adapters(count: int) -> str:
    return f"{count} adapter{'' if count == 1 else 's'}"


def _lost_since_peak(
    ctx: ChainContext, status: ResourceStatus
) -> tuple[ResourcePeak, list[str]] | None:
    """The resource's peak under this config generation and the adapters served then but
    not now, when it offers less (aggregator.fleet.adapterhistory)."""
    record = ctx.record
    history = record.adapters if record is not None else None
    plugin = record.device_plugin if record is not None else None
    peak = history.peaks.get(status.name) if history is not None else None
    if peak is None or plugin is None or peak.config_generation != plugin.config_generation:
        return None
    if status.advertised >= peak.advertised and len(status.devices) >= len(peak.devices):
        return None
    return peak, sorted(set(peak.devices) - set(status.devices))


def _allocatable(ctx: ChainContext) -> Link:
    name = "allocatable"
    if not ctx.cluster.present:
        return link_unknown(name, cluster="no cluster")
    node = ctx.cluster.nodes.get(ctx.node)
    if node is None:
        return link_broken(
            name,
            f"{ctx.node} is not a node of the Kubernetes cluster",
            "check the node is registered (kubectl get node) under the same name as the agent",
        )
    raw = node.allocatable.get(ctx.resource)
    evidence: dict[str, Any] = {"allocatable": raw, "capacity": node.capacity.get(ctx.resource)}
    count = allocatable_count(raw) or 0
    capacity = allocatable_count(node.capacity.get(ctx.resource))
    if count > 0 and capacity is not None and count < capacity:
        # The kubelet subtracts the plugin's unhealthy devices from capacity.
        unhealthy = sorted(ctx.status.unhealthy) if ctx.status is not None else []
        return link_degraded(
            name,
            f"the kubelet offers {count} of {capacity} {ctx.resource}: it counts only the "
            "plugin's healthy devices"
            + (f" ({', '.join(unhealthy)} unhealthy)" if unhealthy else ""),
            "fix the degraded links above; the kubelet follows the plugin",
            unhealthy,
            **evidence,
        )
    if count > 0:
        return link_ok(name, **evidence)
    # The kubelet's allocatable counts the plugin's *healthy* devices only.
    healthy = ctx.status.healthy if ctx.status is not None else 0
    if healthy > 0:
        cause = (
            f"the plugin has {healthy} healthy devices but the kubelet lists "
            f"{raw or 'nothing'}: it registered with another kubelet or the kubelet restarted"
        )
        fix = "check the agent's --device-plugin-dir is the kubelet's and restart the agent pod"
    else:
        cause = (
            f"node allocatable {ctx.resource} is {raw or 'absent'}: "
            "the kubelet counts only healthy devices and the plugin has none"
        )
        fix = "fix the first broken link above; the kubelet follows the plugin"
    return link_broken(name, cause, fix, **evidence)


def _pods(ctx: ChainContext) -> Link:
    name = "pods"
    if not ctx.cluster.present:
        return link_unknown(name, cluster="no cluster")
    requesting = [p for p in ctx.cluster.pods if p.requests.get(ctx.resource, 0) > 0]
    here = [p for p in requesting if p.node == ctx.node]
    nads = [a for a in ctx.cluster.attachments if a.resource_name == ctx.resource]
    netdevs = sorted({n for d in ctx.selected for n in d.netdevs})
    evidence: dict[str, Any] = {
        "running": sum(p.phase == "Running" for p in here),
        "pending": sum(p.phase == "Pending" for p in here),
        "pending_unscheduled": sum(p.node is None for p in requesting),
        "pods": [f"{p.namespace}/{p.name}" for p in here],
        "attachments": [
            {
                "name": f"{a.namespace}/{a.name}",
                NAD_RESOURCE_ANNOTATION: a.resource_name,
                "master": a.master,
            }
            for a in nads
        ],
        "netdevs": netdevs,
    }
    # Whether those NADs attach the right adapters is the `attachment` link's to say.
    return link_ok(name, **evidence)


_CHECKS: Final[tuple[Callable[[ChainContext], Link], ...]] = (
    check_agent, check_adapter, check_driver, check_rdma_device, check_char_devices,
    _device_plugin, _advertised, _allocatable, _pods, scheduling_link,
    attachment_link, ip_pool_link,
)  # fmt: skip
