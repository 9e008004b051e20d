"""The middle of a pod claim's DRA chain (`aggregator.trace.dra`): `slice-published` (the
devices are in ResourceSlices), `device-healthy` (by the shared rule of
aggregator.dra.nodedevices and the kubelet's own view) and `claim-allocated` (what the
scheduler gave, or the real explanation of why it cannot: aggregator.dra.explain).

Pure: functions of the `ClaimContext`. The CEL work of a pending claim's explanation is
bounded by the cluster view: its DeviceClasses' and the claim's selectors over the
devices of the ResourceSlices listed, nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from aggregator.cluster import DraClaim, DraDevice, DraResult
from aggregator.dra import builtin
from aggregator.dra.celenv import CelCompileError
from aggregator.dra.explain import Explanation, NodeResult, explain
from aggregator.dra.nodedevices import device_problem, status_devices
from aggregator.dra.objects import Claim, Device, DeviceClass, InvalidObject, Selector, parse_claim
from aggregator.fleet.state import NodeRecord
from aggregator.fleet.views import node_state
from aggregator.trace.draclaim import ClaimContext, rdma_name
from aggregator.trace.host import link_broken, link_degraded, link_ok, link_unknown
from proto.dranames import DRIVER
from proto.draslices import SliceSettings
from proto.http import Link

SLICE_LINK: Final = "slice-published"
HEALTHY_LINK: Final = "device-healthy"
ALLOCATED_LINK: Final = "claim-allocated"
MAX_NODES: Final = 20  # nodes named in evidence (the count has them all)
NOT_ALLOCATED: Final = "the claim is not allocated"

_Key = tuple[str, str, str]  # driver, pool, device


def _key(result: DraResult) -> _Key:
    return result.driver, result.pool, result.device


def slice_published_link(ctx: ClaimContext) -> Link:
    """Allocated: each of our devices is in a ResourceSlice of its pool. Pending: some node
    publishes rdma.nicfleet.io slices at all."""
    claim = ctx.claim
    if claim is None:
        return link_unknown(SLICE_LINK, reason="no ResourceClaim")
    published = ctx.published
    if not claim.allocated:
        nodes = sorted({d.node or d.pool for d in ctx.cluster.dra_devices if d.driver == DRIVER})
        if not nodes:
            return link_broken(
                SLICE_LINK,
                f"no ResourceSlice of {DRIVER} in the cluster: run the aggregator with "
                "--dra-publish",
                "run the aggregator with --dra-publish (deploy/overlays/dra): its leader "
                "publishes one pool per node whose agent reports",
                nodes_count=0,
            )
        return link_ok(SLICE_LINK, nodes_count=len(nodes), nodes=nodes[:MAX_NODES])
    ours = ctx.ours
    if not ours:
        return link_ok(SLICE_LINK, note=f"no {DRIVER} device allocated (another subrequest)")
    slices = {r.device: (published[_key(r)].slice if _key(r) in published else None) for r in ours}
    missing: dict[str, list[str]] = {}
    for r in ours:
        if _key(r) not in published:
            missing.setdefault(r.pool, []).append(r.device)
    if missing:
        said = "; ".join(
            f"{', '.join(devs)} {'is' if len(devs) == 1 else 'are'} not in any ResourceSlice "
            f"of pool {pool}"
            for pool, devs in sorted(missing.items())
        )
        return link_broken(
            SLICE_LINK,
            f"{said}: the publisher (aggregator --dra-publish) withdrew it or the device is "
            "gone from the node",
            "check the node's agent still reports the device (nicfleetctl node NODE) and that "
            "the aggregator runs with --dra-publish; the pod keeps what it was prepared with "
            "until it is recreated",
            slices=slices,
        )
    return link_ok(SLICE_LINK, slices=slices)


def device_healthy_link(ctx: ClaimContext) -> Link:
    """Each allocated device of ours by the shared rule (port ACTIVE, node reporting, device
    present) and by the kubelet (allocatedResourcesStatus Unhealthy)."""
    claim = ctx.claim
    if claim is None:
        return link_unknown(HEALTHY_LINK, reason="no ResourceClaim")
    if not claim.allocated:
        return link_unknown(HEALTHY_LINK, reason=NOT_ALLOCATED)
    ours = ctx.ours
    if not ours:
        return link_unknown(HEALTHY_LINK, reason=f"no {DRIVER} device allocated")
    published = ctx.published
    entries: dict[str, Mapping[str, Mapping[str, Any]] | None] = {}
    problems: dict[str, list[str]] = {}
    devices: dict[str, dict[str, Any]] = {}
    plugin_says: dict[str, str] = {}
    for r in ours:
        node = _device_node(r, published)
        if node not in entries:
            entries[node] = _node_entries(ctx, node)
        found = entries[node]
        record = ctx.fleet.get(node)
        if found is None or record is None:
            agent: str | None = f"no inventory from an agent on {node}"
        else:
            stale = node_state(record, ctx.now, ctx.stale_after) == "stale"
            agent = device_problem(found.get(r.device), stale=stale)
            said_by_plugin = _plugin_unhealthy(record).get(r.device)
            if said_by_plugin is not None:
                plugin_says[r.device] = said_by_plugin
        kubelet = ctx.unhealthy_by_kubelet(r)
        said = [agent] if agent is not None else []
        if kubelet:
            said.append(f"the kubelet reports it Unhealthy ({', '.join(kubelet)})")
        devices[r.device] = {"node": node, "problem": agent, "kubelet_unhealthy": kubelet}
        if said:
            problems[r.device] = said
    evidence: dict[str, Any] = {"devices": devices, "agent_unhealthy": plugin_says}
    if not problems:
        return link_ok(HEALTHY_LINK, **evidence)
    named = "; ".join(f"{d}: {', '.join(why)}" for d, why in sorted(problems.items()))
    fix = _health_fix(problems)
    if len(problems) == len(devices):
        return link_broken(
            HEALTHY_LINK, f"the claim's devices are unhealthy ({named})", fix, **evidence
        )
    cause = f"{len(problems)} of {len(devices)} of the claim's devices unhealthy ({named})"
    return link_degraded(
        HEALTHY_LINK, cause, fix, sorted(rdma_name(d) for d in problems), **evidence
    )


def _node_entries(ctx: ClaimContext, node: str) -> Mapping[str, Mapping[str, Any]] | None:
    record = ctx.fleet.get(node)
    if record is None or record.snapshot is None:
        return None
    return status_devices(record.snapshot, record.device_plugin, SliceSettings())


def _device_node(result: DraResult, published: Mapping[_Key, DraDevice]) -> str:
    """The node a device of ours is on: its slice's nodeName, else its pool's name (ours
    are named after their node; another publisher's pool need not be)."""
    device = published.get(_key(result))
    return (device.node if device is not None else None) or result.pool


def _plugin_unhealthy(record: NodeRecord) -> Mapping[str, str]:
    """What the node's own DRA plugin reports unhealthy; the trace quotes only the claim's
    devices from it (an agent's list is as long as it makes it)."""
    plugin = record.device_plugin
    return plugin.dra.unhealthy if plugin is not None and plugin.dra is not None else {}


def _health_fix(problems: Mapping[str, list[str]]) -> str:
    said = " ".join(w for why in problems.values() for w in why)
    if "port " in said:
        fix = "bring the port up (ibstat, mlxlink -d <pci>; cable, transceiver, switch port)"
    elif "silent" in said or "no inventory" in said:
        fix = "check the node's nicfleet-agent pod and its NATS connection"
    elif "not on the node" in said:
        fix = "check the adapter did not fall off the bus (dmesg, lspci)"
    else:
        fix = "check the device's health in the kubelet's log and on the node (ibstat)"
    return f"{fix}; or delete the pod so its claim is allocated from healthy devices"


def claim_allocated_link(ctx: ClaimContext) -> Link:
    """Allocated: the devices by request and whether matchAttribute still holds. Pending:
    why no node can allocate it, by the published slices (aggregator.dra.explain)."""
    claim = ctx.claim
    if claim is None:
        return link_unknown(ALLOCATED_LINK, reason="no ResourceClaim")
    if claim.allocated:
        return _allocated(ctx, claim)
    try:
        parsed = parse_claim({"metadata": {"name": claim.name}, "spec": claim.spec})
    except InvalidObject as exc:
        return _invalid(f"{exc.where}: {exc.reason}")
    classes = _classes(ctx)
    for request in parsed.requests:
        for choice in request.choices:
            if choice.device_class not in classes:
                return link_broken(
                    ALLOCATED_LINK,
                    f"request {choice.name} names DeviceClass {choice.device_class}, which the "
                    "cluster does not have: the claim cannot be allocated",
                    "create the DeviceClass (deploy/dra has nicfleet's) or correct the "
                    "request's deviceClassName",
                )
    devices = [_device(d) for d in ctx.cluster.dra_devices]
    try:
        explanation = explain(parsed, classes, devices)
    except (InvalidObject, CelCompileError) as exc:
        return _invalid(str(exc))
    return _pending(ctx, explanation)


def _invalid(why: str) -> Link:
    return link_broken(
        ALLOCATED_LINK,
        f"the claim's spec is invalid: {why}",
        "correct the claim (or its template) where named; nicfleetctl claim explain -f FILE "
        "checks one offline",
    )


def _classes(ctx: ClaimContext) -> dict[str, DeviceClass]:
    """nicfleet's classes, then the cluster's (the cluster's own version wins)."""
    found = {c.name: c for c in builtin.CLASSES}
    for c in ctx.cluster.device_classes:
        selectors = tuple(
            Selector(s, f"class {c.name} selector #{i}") for i, s in enumerate(c.selectors)
        )
        found[c.name] = DeviceClass(c.name, selectors)
    return found


def _device(d: DraDevice) -> Device:
    return Device(
        driver=d.driver, pool=d.pool, node=d.node, name=d.name,
        attributes=dict(d.attributes), capacity=dict(d.capacity),
    )  # fmt: skip


def _pending(ctx: ClaimContext, explanation: Explanation) -> Link:
    nodes = {n.node: {r.request: r.why for r in n.requests if not r.ok} for n in explanation.nodes}
    evidence: dict[str, Any] = {
        "nodes_count": len(explanation.nodes),
        "nodes": dict(list(nodes.items())[:MAX_NODES]),
        "notes": list(explanation.notes),
    }
    fits = [n.node for n in explanation.nodes if n.ok]
    if fits:
        return link_broken(
            ALLOCATED_LINK,
            f"the claim is not allocated, though by the published slices it fits on "
            f"{', '.join(fits[:5])}: the scheduler allocates it when it places the pod",
            "see the pod's scheduling link: its other needs (resources, affinity, taints) or "
            "devices already allocated to other claims (not known here) keep it pending",
            fits=fits[:MAX_NODES],
            **evidence,
        )
    if not explanation.nodes:
        return link_broken(
            ALLOCATED_LINK,
            "no ResourceSlice bound to a node lists any device: nothing to allocate from",
            f"run the aggregator with --dra-publish for {DRIVER} devices (and the other "
            "drivers' DRA plugins for theirs)",
            **evidence,
        )
    best = _closest(explanation.nodes)
    failing = "; ".join(f"request {r.request}: {r.why}" for r in best.requests if not r.ok)
    return link_broken(
        ALLOCATED_LINK,
        f"no node can allocate the claim; closest, {best.node}: {failing}",
        "fix what the reason names on a node meant for the pod, or change the claim's "
        "requests (nicfleetctl claim explain shows every node)",
        closest=best.node,
        **evidence,
    )


def _closest(nodes: tuple[NodeResult, ...]) -> NodeResult:
    """The node with the most requests satisfiable; explain() sorts nodes by name and max
    keeps the first of equals, so a tie goes to the first by name."""
    return max(nodes, key=lambda n: sum(r.ok for r in n.requests))


def _allocated(ctx: ClaimContext, claim: DraClaim) -> Link:
    by_request: dict[str, list[str]] = {}
    for r in claim.results:
        shared = f" (share {r.share_id})" if r.share_id else ""
        by_request.setdefault(r.request, []).append(f"{r.driver}/{r.pool}/{r.device}{shared}")
    evidence: dict[str, Any] = {"node": claim.node, "devices": by_request}
    try:
        parsed: Claim | None = parse_claim({"metadata": {"name": claim.name}, "spec": claim.spec})
    except InvalidObject as exc:
        parsed = None
        evidence["constraints"] = f"not read: {exc}"
    if parsed is None or not parsed.constraints:
        return link_ok(ALLOCATED_LINK, **evidence)
    published = ctx.published
    checks: dict[str, Any] = {}
    broken: list[tuple[str, dict[str, Any]]] = []
    for c in parsed.constraints:
        covered = [
            r for r in claim.results
            if not c.requests or r.request in c.requests or r.request.split("/")[0] in c.requests
        ]  # fmt: skip
        values = {
            r.device: (published[_key(r)].attributes.get(c.attribute) if _key(r) in published
                       else None)
            for r in covered
        }  # fmt: skip
        known = {v for v in values.values() if v is not None}
        holds = "unknown" if None in values.values() else len(known) <= 1
        checks[c.attribute] = {"holds": holds, "values": values}
        if len(known) > 1:
            broken.append((c.attribute, values))
    evidence["constraints"] = checks
    if not broken:
        return link_ok(ALLOCATED_LINK, **evidence)
    attribute, values = broken[0]
    said = ", ".join(f"{d} has {v}" for d, v in sorted(values.items()))
    ours = sorted(rdma_name(r.device) for r in ctx.ours)
    return link_degraded(
        ALLOCATED_LINK,
        f"matchAttribute {attribute} no longer holds ({said}): a device was republished with "
        "another value after the allocation",
        "delete the pod so its claim is allocated again from devices that match",
        ours,
        **evidence,
    )
