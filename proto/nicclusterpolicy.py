"""Audit of an NVIDIA network-operator NicClusterPolicy (and NicNodePolicy) against node
snapshots: per node and per RDMA resource, what the upstream plugin would do ("would not
start", "advertises 0 for X: why", "advertises N") and where nicfleet would differ; plus the
operator's other sections (ofedDriver, secondaryNetwork, nvIpam, sriovDevicePlugin, status).

Pure: the object dicts and snapshots in, an AuditReport out. Upstream semantics are
proto.rsdpupstream's; nicfleet's config rules are proto.dpconfig's. Here (not in
aggregator.reconcile) so that nicfleetctl can run it offline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import msgspec

from proto import rsdpupstream as upstream
from proto.dpconfig import (
    CheckedConfig,
    ConfigError,
    InvalidResource,
    normalize_pci_id,
    parse_device_plugin_resources,
)
from proto.inventory import Device, NodeSnapshot
from proto.messages.config import ResourceConfig, Selectors
from proto.nicpolicysections import (
    Note,
    Severity,
    node_policy_notes,
    ofed_notes,
    secondary_network_notes,
    status_notes,
)
from proto.operatorwebhook import node_overlaps, section_conflicts, webhook_notes
from proto.sriovdp import sriov_notes

Verdict = Literal["would-not-start", "advertises", "no-inventory"]
_NICFLEET_REQUIRED: Final = ("uverbs", "umad")  # agent.deviceplugin.selectors._REQUIRED
_ARPHRD_LINK_TYPES: Final = {1: "ether", 32: "infiniband"}
_LAYER_LINK_TYPES: Final = {"Ethernet": "ether", "InfiniBand": "infiniband"}
_PLUGIN_CONFIG: Final = "spec.rdmaSharedDevicePlugin.config"
# The one NicClusterPolicy the operator reconciles (pkg/consts NicClusterPolicyResourceName;
# controllers/nicclusterpolicy_controller.go sets any other to state "ignore").
NIC_CLUSTER_POLICY_NAME: Final = "nic-cluster-policy"


class ResourceVerdict(msgspec.Struct, frozen=True, kw_only=True):
    resource: str  # rdma/rdma_shared_device_a
    advertised: int  # upstream's count on this node
    selected: tuple[str, ...] = ()  # PCI addresses upstream serves
    why: str | None = None  # set when upstream advertises 0
    nicfleet: int | None = None  # nicfleet's count where it differs; None: same
    nicfleet_why: str | None = None


class NodeVerdict(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    verdict: Verdict
    reason: str | None = None  # why it would not start
    resources: tuple[ResourceVerdict, ...] = ()
    # What nicfleet's own plugin does on a node where upstream would not start for the
    # node's RDMA netns mode (exclusive); None elsewhere.
    nicfleet_instead: str | None = None
    # Set when the node's RDMA netns mode is unknown: the verdict holds only if it is shared.
    netns_caveat: str | None = None

    @property
    def sentence(self) -> str:
        if self.verdict == "would-not-start":
            instead = f"; {self.nicfleet_instead}" if self.nicfleet_instead else ""
            return f"upstream would not start: {self.reason}{instead}"
        if self.verdict == "no-inventory":
            return "no inventory for this node"
        parts = []
        for r in self.resources:
            said = f"upstream advertises {r.advertised} for {r.resource}"
            parts.append(f"{said}: {r.why}" if r.advertised == 0 and r.why else said)
        if self.netns_caveat:
            parts.append(self.netns_caveat)
        return "; ".join(parts)


class PolicyAudit(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # NicClusterPolicy or NicNodePolicy
    name: str
    nodes: tuple[NodeVerdict, ...] = ()
    notes: tuple[Note, ...] = ()
    start_failure: upstream.StartFailure | None = None
    # The error nicfleet's agent refuses the whole document for (it then serves nothing);
    # None when it serves the document resource by resource.
    nicfleet_refuses: str | None = None
    nicfleet_invalid: tuple[str, ...] = ()  # each entry it leaves out: "path (resource): why"


class AuditReport(msgspec.Struct, frozen=True, kw_only=True):
    policies: tuple[PolicyAudit, ...]

    @property
    def worst(self) -> Severity | None:
        order: dict[Severity, int] = {"critical": 0, "warning": 1, "info": 2}
        found: list[Severity] = [n.severity for p in self.policies for n in p.notes]
        found += ["critical" for p in self.policies if p.start_failure is not None]
        found += [
            "critical" for p in self.policies for v in p.nodes if v.verdict == "would-not-start"
        ]
        found += [
            "warning"
            for p in self.policies
            for v in p.nodes
            for r in v.resources
            if r.advertised == 0 or r.nicfleet is not None
        ]
        if not found:
            return None
        return min(found, key=lambda s: order[s])


def audit(
    objs: Sequence[Mapping[str, Any]],
    snapshots: Mapping[str, NodeSnapshot],
    *,
    selected: Mapping[str, frozenset[str]] | None = None,
) -> AuditReport:
    """Audit every NicClusterPolicy / NicNodePolicy in `objs` against the snapshots;
    `selected` (NicNodePolicy name -> the nodes its nodeSelector matches, from the live
    fleet's labels) narrows a node policy to its nodes. Snapshots carry no labels."""
    chosen = selected or {}
    found = [audit_policy(obj, snapshots, selected_nodes=chosen.get(_name(obj))) for obj in objs]
    extra = overlap_notes(objs, sorted(snapshots), selected)
    return AuditReport(
        policies=tuple(
            msgspec.structs.replace(p, notes=p.notes + tuple(extra[i])) if extra.get(i) else p
            for i, p in enumerate(found)
        )
    )


def overlap_notes(
    objs: Sequence[Mapping[str, Any]],
    nodes: Sequence[str],
    selected: Mapping[str, frozenset[str]] | None,
) -> dict[int, list[Note]]:
    """The webhook's policy-overlap refusals (pkg/policyoverlap), keyed by the index in
    `objs` of the NicNodePolicy they are reported on: a section it sets that a
    NicClusterPolicy sets too, and nodes it selects that an earlier NicNodePolicy of the
    file selects too (`kubectl apply -f` creates them in file order: the later is refused).
    Which nodes a nodeSelector picks is known only from the live fleet's labels
    (`selected` names every NicNodePolicy); from snapshots only selectors are compared."""
    notes: dict[int, list[Note]] = {}
    clusters = [(_name(o), _map(o.get("spec"))) for o in objs if _kind(o) == "NicClusterPolicy"]
    policies = [(i, o) for i, o in enumerate(objs) if _kind(o) == "NicNodePolicy"]
    known = selected is not None and all(_name(o) in selected for _, o in policies)
    reach = {_name(o): _reach(o, selected if known else None) for _, o in policies}
    for i, obj in policies:
        name, spec = _name(obj), _map(obj.get("spec"))
        for cluster, cluster_spec in clusters:
            for section in section_conflicts(cluster_spec, spec):
                message = (
                    f"NicClusterPolicy {cluster} sets {section} too: the operator's webhook "
                    f"refuses whichever of the two is created or updated second (both would "
                    f"deploy it on {reach[name]})"
                )
                notes.setdefault(i, []).append(_overlap(f"spec.{section}", message))
    for later, (i, obj) in enumerate(policies):
        for _, earlier in policies[:later]:
            note = _node_overlap(earlier, obj, selected if known else None, nodes)
            if note is not None:
                notes.setdefault(i, []).append(note)
    return notes


def _reach(obj: Mapping[str, Any], selected: Mapping[str, frozenset[str]] | None) -> str:
    selector = node_selector_of(obj)
    if selected is not None:
        return _nodes_text(sorted(selected[_name(obj)])) or "no node"
    if not selector:
        return "every node"
    return "every node labelled " + _selector_text(selector)


def _node_overlap(
    earlier: Mapping[str, Any],
    later: Mapping[str, Any],
    selected: Mapping[str, frozenset[str]] | None,
    nodes: Sequence[str],
) -> Note | None:
    a, b = _name(earlier), _name(later)
    refused = (
        f"the operator's webhook refuses NicNodePolicy {b} (created after {a}: the webhook "
        f"refuses whichever of two overlapping NicNodePolicies is created or updated last)"
    )
    if selected is not None:
        both = [n for n, _ in node_overlaps({a: selected[a], b: selected[b]})]
        if not both:
            return None
        message = f"NicNodePolicies {a} and {b} both select {_nodes_text(both)}: {refused}"
        return _overlap("spec.nodeSelector", message)
    sa, sb = node_selector_of(earlier), node_selector_of(later)
    if any(k in sb and sb[k] != v for k, v in sa.items()):
        return None  # no node carries two values of one label
    if not sa and not sb:
        where = _nodes_text(list(nodes)) or "every node"
        message = (
            f"NicNodePolicies {a} and {b} have no nodeSelector, so both select every node "
            f"({where}): {refused}"
        )
        return _overlap("spec.nodeSelector", message)
    message = (
        f"NicNodePolicies {a} and {b} both select any node labelled "
        f"{_selector_text({**sa, **sb})}; snapshots carry no node labels, so whether such a "
        f"node exists (and the webhook refuses {b}) is known only against the live fleet"
    )
    return Note(section="webhook", severity="info", path="spec.nodeSelector", message=message)


def _overlap(path: str, message: str) -> Note:
    return Note(section="webhook", severity="critical", path=path, message=message)


def _nodes_text(nodes: Sequence[str]) -> str:
    shown = ", ".join(nodes[:8])
    return f"{shown} and {len(nodes) - 8} more" if len(nodes) > 8 else shown


def _selector_text(selector: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))


def _kind(obj: Mapping[str, Any]) -> str:
    return str(obj.get("kind") or "NicClusterPolicy")


def node_selector_of(obj: Mapping[str, Any]) -> dict[str, str]:
    """A NicNodePolicy's spec.nodeSelector (a plain label map: every pair must match)."""
    raw = _map(_map(obj.get("spec")).get("nodeSelector"))
    return {str(k): str(v) for k, v in raw.items() if isinstance(v, str)}


def audit_policy(
    obj: Mapping[str, Any],
    snapshots: Mapping[str, NodeSnapshot],
    *,
    selected_nodes: frozenset[str] | None = None,
) -> PolicyAudit:
    kind = str(obj.get("kind") or "NicClusterPolicy")
    name = _name(obj)
    spec = _map(obj.get("spec"))
    notes: list[Note] = []
    if kind == "NicClusterPolicy" and name and name != NIC_CLUSTER_POLICY_NAME:
        notes.append(
            Note(
                section="operator",
                severity="critical",
                path="metadata.name",
                message=f"the operator reconciles only the NicClusterPolicy named "
                f"{NIC_CLUSTER_POLICY_NAME}: it sets {name}'s status to ignore "
                "and deploys nothing from it",
            )
        )
    if kind == "NicNodePolicy":
        selector = node_selector_of(obj)
        narrowed = selected_nodes if selector else None
        notes.extend(node_policy_notes(name, spec, narrowed, sorted(snapshots)))
        if narrowed is not None:
            snapshots = {n: s for n, s in snapshots.items() if n in narrowed}
    notes.extend(webhook_notes(kind, spec))
    notes.extend(ofed_notes(_map(spec.get("ofedDriver")), snapshots))
    notes.extend(secondary_network_notes(spec, snapshots))
    notes.extend(sriov_notes(_map(spec.get("sriovDevicePlugin")), snapshots))
    notes.extend(status_notes(_map(obj.get("status"))))
    plugin = _map(spec.get("rdmaSharedDevicePlugin"))
    raw = plugin.get("config")
    if not plugin or raw is None:
        return PolicyAudit(kind=kind, name=name, notes=tuple(notes))
    if not isinstance(raw, str):
        failure = upstream.StartFailure(stage="decode", path="", reason="config must be a string")
        return PolicyAudit(kind=kind, name=name, notes=tuple(notes), start_failure=failure)
    notes.extend(
        Note(
            section="webhook",
            severity="critical",
            path=_PLUGIN_CONFIG,
            message=f"the operator's webhook refuses the config: {e}",
        )
        for e in upstream.webhook_errors(raw)
    )
    nicfleet, refuses = _nicfleet_config(raw)
    invalid = tuple(e.message for e in nicfleet if isinstance(e, InvalidResource))
    config = upstream.read_config(raw)
    if isinstance(config, upstream.StartFailure):
        reason = _failure_text(config)
        nodes = tuple(
            NodeVerdict(node=n, verdict="would-not-start", reason=reason) for n in sorted(snapshots)
        )
        return PolicyAudit(
            kind=kind,
            name=name,
            nodes=nodes,
            notes=tuple(notes),
            start_failure=config,
            nicfleet_refuses=refuses,
            nicfleet_invalid=invalid,
        )
    nodes = tuple(_node_verdict(config, nicfleet, refuses, snapshots[n]) for n in sorted(snapshots))
    return PolicyAudit(
        kind=kind,
        name=name,
        nodes=nodes,
        notes=tuple(notes),
        nicfleet_refuses=refuses,
        nicfleet_invalid=invalid,
    )


def _node_verdict(
    config: upstream.Config,
    nicfleet: Sequence[ResourceConfig | InvalidResource],
    whole: str | None,
    snap: NodeSnapshot,
) -> NodeVerdict:
    if not snap.devices and snap.errors:
        return NodeVerdict(node=snap.node, verdict="no-inventory")
    netns = upstream.netns_check(snap.platform)
    if netns.outcome == "exits":
        return NodeVerdict(
            node=snap.node,
            verdict="would-not-start",
            reason=netns.reason,
            nicfleet_instead=_nicfleet_in_exclusive(config, nicfleet, whole, snap),
        )
    found = upstream.adapters(snap)
    verdicts = []
    for i, resource in enumerate(config.resources):
        prediction = upstream.predict(resource, found)
        why = None if prediction.advertised else _zero_why(resource, prediction)
        ours, ours_why = _nicfleet_count(nicfleet[i] if i < len(nicfleet) else None, whole, snap)
        differs = ours != prediction.advertised
        verdicts.append(
            ResourceVerdict(
                resource=prediction.resource,
                advertised=prediction.advertised,
                selected=prediction.selected,
                why=why,
                nicfleet=ours if differs else None,
                nicfleet_why=ours_why if differs else None,
            )
        )
    return NodeVerdict(
        node=snap.node,
        verdict="advertises",
        resources=tuple(verdicts),
        netns_caveat=netns.reason if netns.outcome == "unknown" else None,
    )


def _nicfleet_in_exclusive(
    config: upstream.Config,
    nicfleet: Sequence[ResourceConfig | InvalidResource],
    whole: str | None,
    snap: NodeSnapshot,
) -> str:
    """nicfleet's plugin starts in exclusive mode too, but a device stays in the host's
    netns and ib_uverbs_open refuses (EPERM) a process of any other netns: it advertises a
    shared resource with every device Unhealthy (agent.deviceplugin.plan, netns-exclusive)
    and an exclusive one as usual (rdma-cni moves each adapter into its pod's netns)."""
    counts = []
    for i, resource in enumerate(config.resources):
        ours = nicfleet[i] if i < len(nicfleet) else None
        count, _ = _nicfleet_count(ours, whole, snap)
        shared = not (isinstance(ours, ResourceConfig) and ours.exclusive)
        counts.append(f"{resource.full_name} {count}" + (" (all Unhealthy)" if shared else ""))
    return (
        f"nicfleet's device plugin starts and would advertise {', '.join(counts)}: in"
        " exclusive mode a pod in its own network namespace gets EPERM opening a shared"
        " adapter's /dev/infiniband/uverbsN, so it advertises shared devices Unhealthy"
        " (netns-exclusive; the kubelet allocates none, hostNetwork pods included) and"
        " reports it at the char-devices and advertised links of trace. For shared resources:"
        " drop the ib_core netns_mode=0 module option and reboot (rdma system set netns"
        " shared fails with EBUSY while any other netns exists); else use dedicated devices"
        " moved into each pod's netns (exclusive: true, SR-IOV VFs with rdma-cni)"
    )


def _zero_why(resource: upstream.Resource, prediction: upstream.Prediction) -> str:
    if prediction.selected:
        return "rdmaHcaMax is 0 (absent): the plugin creates 0 devices for the selected adapters"
    if not prediction.unmatched:
        return "the node has no RDMA adapter"
    # Group the adapters by reason: a 12-adapter node has two or three distinct ones.
    by_reason: dict[str, list[str]] = {}
    for u in prediction.unmatched:
        by_reason.setdefault(u.reason, []).append(u.adapter)
    reasons = "; ".join(
        f"{a[0]}{f' and {len(a) - 1} more' if len(a) > 1 else ''}: {r}"
        for r, a in by_reason.items()
    )
    return f"no adapter matches ({reasons})"


def _nicfleet_config(raw: str) -> tuple[list[ResourceConfig | InvalidResource], str | None]:
    """Each configList entry as nicfleet's agent takes the document (the same resource-by-
    resource check, proto.dpconfig's): the normalized entry it serves or why it leaves it
    out; or, instead, the error it refuses the whole document for (it then serves nothing)."""
    try:
        checked = parse_device_plugin_resources(raw, source=_PLUGIN_CONFIG)
    except ConfigError as exc:
        return [], _config_error(exc)
    return nicfleet_entries(checked), None


def nicfleet_entries(checked: CheckedConfig) -> list[ResourceConfig | InvalidResource]:
    """Back in document order: each entry served, or the InvalidResource it was left out as."""
    invalid = {bad.index: bad for bad in checked.invalid}
    served = iter(checked.config.config_list)
    return [
        invalid[i] if i in invalid else next(served)
        for i in range(len(invalid) + len(checked.config.config_list))
    ]


def _config_error(exc: ConfigError) -> str:
    entry = "" if exc.resource_name is None else f" (resourceName {exc.resource_name!r})"
    return f"{exc.path}{entry}: {exc.reason}"


def _nicfleet_count(
    ours: ResourceConfig | InvalidResource | None, whole: str | None, snap: NodeSnapshot
) -> tuple[int, str]:
    if whole is not None:  # the agent exits at start on such a file, keeps the last good one live
        return 0, f"nicfleet would advertise 0: it refuses the whole config: {whole}"
    if ours is None:
        return 0, "nicfleet does not read this entry"
    if isinstance(ours, InvalidResource):
        return 0, f"nicfleet would advertise 0: it leaves this resource out: {ours.message}"
    matched = [d for d in snap.devices if nicfleet_selects(ours, d) and _nicfleet_servable(d)]
    count = len(matched) if ours.exclusive else (ours.rdma_hca_max if matched else 0)
    names = ", ".join(d.name for d in matched) or "none"
    return count, f"nicfleet would advertise {count}: its selectors match {names}" + _LOOSER


_LOOSER: Final = (
    " (nicfleet reads IDs with or without 0x in any case, every netdev of an adapter, and"
    " the port's link layer when there is no netdev)"
)


def nicfleet_selects(resource: ResourceConfig, device: Device) -> bool:
    """nicfleet's matching (agent.deviceplugin.selectors, at adapter level): IDs normalized,
    any netdev for ifNames, the port's link layer when no netdev has a type."""
    s = resource.selectors or Selectors()
    if_names = s.if_names or resource.devices
    link_types = {
        _ARPHRD_LINK_TYPES[i.type] for i in device.interfaces if i.type in _ARPHRD_LINK_TYPES
    } or {
        _LAYER_LINK_TYPES[p.link_layer] for p in device.ports if p.link_layer in _LAYER_LINK_TYPES
    }
    checks = (
        (s.vendors, {normalize_pci_id(device.vendor_id or "")}),
        (s.device_ids, {normalize_pci_id(device.device_id or "")}),
        (s.drivers, {device.driver or ""}),
        (if_names, set(device.netdevs)),
        (s.link_types, link_types),
        (s.pci_addresses, {device.pci_address or ""}),
        (s.rdma_devices, {device.name}),
    )
    return all(not wanted or set(wanted) & have for wanted, have in checks)


def _nicfleet_servable(device: Device) -> bool:
    names = [p.rsplit("/", 1)[-1] for p in device.char_devices]
    return all(any(n.startswith(need) for n in names) for need in _NICFLEET_REQUIRED)


def _failure_text(failure: upstream.StartFailure) -> str:
    where = f"{_PLUGIN_CONFIG}.{failure.path}" if failure.path else _PLUGIN_CONFIG
    if failure.stage == "decode":
        return f"{where}: the config is not valid for Go's json.Unmarshal: {failure.reason}"
    return f"{where}: ValidateConfigs: {failure.reason}"


def _name(obj: Mapping[str, Any]) -> str:
    return str(_map(obj.get("metadata")).get("name") or "")


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
