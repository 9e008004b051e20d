"""The DRA rules: an allocated ResourceClaim holding an rdma.nicfleet.io device that is
unhealthy on its node (`dra-claim-unhealthy-device`), and one pairing a NIC of ours with
another driver's device (a GPU) under another PCIe root (`dra-claim-root-mismatch`).

Pure. Reads the cluster view's claims, the kubelet's health of their pods and every
driver's published devices, and the node's snapshot and device-plugin status. A device's
health is aggregator.dra.nodedevices' (the trace's, the publisher's): never judged here
again. Node-local: a finding names the node of our device (its pool), and only a node of
the fleet.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from aggregator.cluster import ClusterView, DraClaim, DraDevice, DraResult, PodRequest
from aggregator.dra.nodedevices import STALE, device_problem, node_devices, node_slice_settings
from aggregator.fleet.state import NodeRecord
from aggregator.rules.descriptor import Rule, RuleInput
from aggregator.rules.finding import Finding
from aggregator.rules.fleetpolicy import agent_stale_from
from aggregator.rules.nodememo import NodeMemo
from proto import dranames, draslices
from proto.draslices import SliceSettings

UNHEALTHY: Final = "dra-claim-unhealthy-device"
ROOT_MISMATCH: Final = "dra-claim-root-mismatch"
DRIVER: Final = dranames.DRIVER
PCIE_ROOT: Final = f"{draslices.STANDARD}/pcieRoot"
KUBELET_UNHEALTHY: Final = "Unhealthy"  # allocatedResourcesStatus[].resources[].health
PAIR_EXAMPLE: Final = "deploy/dra/examples/gpu-and-nic.yaml"
PAIRS_EXAMPLE: Final = "deploy/dra/examples/gpu-nic-pairs.yaml"
PORT_EXAMPLE: Final = "deploy/dra/examples/rdma-nic.yaml"

Entries = Mapping[str, Mapping[str, Any]]  # DRA device name -> its slice entry


def check_claim_unhealthy_device(given: RuleInput) -> list[Finding]:
    pods: dict[str, PodRequest] | None = None
    found: dict[tuple[str, str], Finding] = {}
    for claim in _allocated(given.cluster):
        for result, record, key in _fresh(claim, _ours(claim), given, found):
            entries = _entries(result.pool, record)
            problem = None
            if entries is not None:
                problem = device_problem(entries.get(result.device), stale=_silent(given, record))
            if pods is None:  # only with a claim of ours on the fleet: most clusters have none
                pods = {f"{p.namespace}/{p.name}": p for p in given.cluster.pods if p.claim_health}
            sick = _kubelet_unhealthy(claim, result, pods)
            if problem is None and not sick:
                continue
            found[key] = _unhealthy_finding(claim, result, record, entries, problem, sick)
    return [found[k] for k in sorted(found)]


def _unhealthy_finding(
    claim: DraClaim,
    result: DraResult,
    record: NodeRecord,
    entries: Entries | None,
    problem: str | None,
    sick: list[str],
) -> Finding:
    node, device = result.pool, result.device
    rdma = _rdma_device(device, entries)
    plugin = record.device_plugin.dra if record.device_plugin is not None else None
    said = plugin.unhealthy.get(device) if plugin is not None else None
    kubelet = f"the kubelet reports it Unhealthy ({said or 'allocatedResourcesStatus'})"
    why = problem or kubelet
    if problem is not None and sick:
        why = f"{problem}; {kubelet}"
    held = ", ".join(claim.reserved_for) or "no pod"
    if entries is not None and entries.get(device) is None:
        fix = (
            "it is no longer published, so a new allocation avoids it: delete the pods "
            "reserving the claim so that it is allocated again (a claim made from a "
            "template goes with its pod), and see adapter-lost for the adapter"
        )
    elif problem == STALE:
        fix = (
            "bring the node's nicfleet-agent back first (agent-stale); if the port is down, "
            "delete the pods reserving the claim so that it is allocated again"
        )
    else:
        fix = (
            "delete the pods reserving the claim so that it is allocated again (a claim made "
            "from a template goes with its pod); the scheduler then passes over this device: "
            'nicfleet\'s DeviceClasses select portState == "ACTIVE" (a class of your own '
            f"needs that selector too, as {PORT_EXAMPLE} spells it out)"
        )
    return Finding(
        rule=UNHEALTHY, severity="critical", node=node, subject=_subject(claim, device),
        message=f"ResourceClaim {_key(claim)} holds {device} (RDMA device {rdma}) on {node}, "
        f"which is unhealthy: {why}. Reserved by {held}; {fix}.",
        evidence={
            "claim": _key(claim), "device": device, "rdma_device": rdma, "reason": why,
            "pods": ",".join(claim.reserved_for), "kubelet_unhealthy": ",".join(sick),
            "request": result.request,
        },
    )  # fmt: skip


def _kubelet_unhealthy(
    claim: DraClaim, result: DraResult, pods: Mapping[str, PodRequest]
) -> list[str]:
    """The pods reserving the claim whose kubelet reports this device Unhealthy."""
    resource_id = f"{DRIVER}/{result.pool}/{result.device}"
    sick = []
    for name in claim.reserved_for:
        pod = pods.get(name)
        if pod is None:
            continue
        # The pod's entries that resolved to this claim; none resolved yet: the resource
        # id alone names the device.
        entries = {c.name for c in pod.claims if c.claim == claim.name}
        if any(
            h.resource_id == resource_id
            and h.health == KUBELET_UNHEALTHY
            and (not entries or h.entry in entries)
            for h in pod.claim_health
        ):
            sick.append(name)
    return sick


def check_claim_root_mismatch(given: RuleInput) -> list[Finding]:
    """Our pcieRoot already is the Data Direct function's root where a NIC has one (the
    NIC's own root is `nicPcieRoot` then): that is the root GPU traffic takes, so pcieRoot
    alone is compared, as the scheduler's matchAttribute does."""
    published: dict[tuple[str, str, str], DraDevice] | None = None
    found: dict[tuple[str, str], Finding] = {}
    for claim in _allocated(given.cluster):
        ours = list(_ours(claim))
        others = [r for r in claim.results if r.driver != DRIVER]
        if not ours or not others:
            continue
        if published is None:  # only with a claim of both: most clusters have none
            published = {(d.driver, d.pool, d.name): d for d in given.cluster.dra_devices}
        roots = _other_roots(claim, others, published)
        for result, record, key in _fresh(claim, ours, given, found):
            here = roots.get(result.pool)
            if not here:
                continue
            entries = _entries(result.pool, record)
            root, source = _nic_root(result, published, entries)
            if root is None or root in here.values():
                continue
            found[key] = _root_finding(claim, result, entries, root, source, here)
    return [found[k] for k in sorted(found)]


def _root_finding(
    claim: DraClaim,
    result: DraResult,
    entries: Entries | None,
    root: str,
    source: str,
    others: Mapping[str, str],
) -> Finding:
    node, device = result.pool, result.device
    rdma = _rdma_device(device, entries)
    listed = ", ".join(f"{name} under {r}" for name, r in sorted(others.items()))
    constrained = _has_root_constraint(claim)
    if constrained:
        fix = (
            "its matchAttribute resource.kubernetes.io/pcieRoot constraint does not cover "
            "these requests: name the GPU's and the NIC's request in one constraint per pair "
            f"({PAIRS_EXAMPLE})"
        )
    else:
        fix = (
            "add a constraint matchAttribute: resource.kubernetes.io/pcieRoot over the GPU "
            f"and NIC requests to its ResourceClaimTemplate ({PAIR_EXAMPLE}; one per pair: "
            f"{PAIRS_EXAMPLE})"
        )
    return Finding(
        rule=ROOT_MISMATCH, severity="warning", node=node, subject=_subject(claim, device),
        message=f"ResourceClaim {_key(claim)} pairs {device} (RDMA device {rdma}) under PCIe "
        f"root {root} on {node} with {listed}: no device of the other driver shares the "
        "NIC's root, so GPU-NIC traffic crosses the CPU interconnect (slower GPUDirect "
        f"RDMA); {fix}, then recreate the pod.",
        evidence={
            "claim": _key(claim), "device": device, "rdma_device": rdma, "nic_root": root,
            "root_from": source, "other_devices": ",".join(sorted(others)),
            "other_roots": ",".join(sorted(set(others.values()))),
            "pcie_root_constraint": constrained,
        },
    )  # fmt: skip


def _other_roots(
    claim: DraClaim, others: list[DraResult], published: Mapping[tuple[str, str, str], DraDevice]
) -> dict[str, dict[str, str]]:
    """node -> "<driver>/<device>" -> pcieRoot of the claim's other-driver devices that
    publish one (a device not node-local is on the node the allocation pins)."""
    roots: dict[str, dict[str, str]] = {}
    for r in others:
        d = published.get((r.driver, r.pool, r.device))
        root = d.attributes.get(PCIE_ROOT) if d is not None else None
        node = (d.node if d is not None else "") or claim.node
        if isinstance(root, str) and node:
            roots.setdefault(node, {})[f"{r.driver}/{r.device}"] = root
    return roots


def _nic_root(
    result: DraResult,
    published: Mapping[tuple[str, str, str], DraDevice],
    entries: Entries | None,
) -> tuple[str | None, str]:
    """Our device's pcieRoot and where it came from: the cluster's published slice (what
    the scheduler matched), else the slice the node's snapshot makes."""
    d = published.get((DRIVER, result.pool, result.device))
    root = d.attributes.get(PCIE_ROOT) if d is not None else None
    if isinstance(root, str):
        return root, "slice"
    entry = entries.get(result.device) if entries is not None else None
    value = entry.get("attributes", {}).get(PCIE_ROOT, {}).get("string") if entry else None
    return (value, "snapshot") if isinstance(value, str) else (None, "unknown")


def _has_root_constraint(claim: DraClaim) -> bool:
    devices = claim.spec.get("devices")
    constraints = devices.get("constraints") if isinstance(devices, dict) else None
    return isinstance(constraints, list) and any(
        isinstance(c, dict) and c.get("matchAttribute") == PCIE_ROOT for c in constraints
    )


def _allocated(cluster: ClusterView) -> Iterator[DraClaim]:
    return (c for c in cluster.claims if c.allocated and not c.deleting)


def _ours(claim: DraClaim) -> Iterator[DraResult]:
    return (r for r in claim.results if r.driver == DRIVER)


def _fresh(
    claim: DraClaim,
    results: Iterable[DraResult],
    given: RuleInput,
    found: Mapping[tuple[str, str], Finding],
) -> Iterator[tuple[DraResult, NodeRecord, tuple[str, str]]]:
    """Each of the claim's results of ours on a node of the fleet (its pool) that has no
    finding yet, with the node's record and the finding's key. Read lazily: a finding the
    caller adds for one result holds back a repeat of the same device."""
    for result in results:
        record = given.fleet.get(result.pool)
        key = (result.pool, _subject(claim, result.device))
        if record is not None and key not in found:
            yield result, record, key


_ENTRIES: Final[NodeMemo[Entries]] = NodeMemo()


def _entries(node: str, record: NodeRecord) -> Entries | None:
    """The node's devices as its slices publish them (None: no snapshot yet), remembered
    while the snapshot is the same object: building them is the cost of these rules."""
    snap = record.snapshot
    if snap is None:
        return None
    settings = node_slice_settings(record.device_plugin, SliceSettings())
    variant = (settings.sharing, settings.share, tuple(sorted(settings.rails.items())))
    return _ENTRIES.get(node, snap, variant, lambda: node_devices(snap, settings))


def _silent(given: RuleInput, record: NodeRecord) -> bool:
    """agent-stale's verdict: silent past its staleAfter, counted from when this process
    could first hear the node if that is later (a record loaded from KV)."""
    heard = given.heard_since.get(record.name)
    since = record.last_seen if heard is None else max(record.last_seen, heard)
    return given.now - since > given.thresholds.param("agent-stale", "staleAfter")


def _rdma_device(device: str, entries: Entries | None) -> str:
    entry = entries.get(device) if entries is not None else None
    value = entry.get("attributes", {}).get("rdmaDevice", {}).get("string") if entry else None
    if isinstance(value, str):
        return value
    try:
        return dranames.rdma_device_of(device)[0]
    except dranames.InvalidDeviceName:
        return device


def _key(claim: DraClaim) -> str:
    return f"{claim.namespace}/{claim.name}"


def _subject(claim: DraClaim, device: str) -> str:
    # One finding per (claim, device): two devices of one claim on one node are two subjects.
    return f"claim/{claim.namespace}/{claim.name}/{device}"


RULES: Final[tuple[Rule, ...]] = (
    # Time-dependent only in the node going silent (`agent_stale_from`); it reports a port
    # that is down or a device that is gone before that too.
    Rule(id=UNHEALTHY, family="fleet", severity="critical", check=check_claim_unhealthy_device,
         reads=frozenset({"snapshot", "device_plugin", "last_seen"}), reads_cluster=True,
         due=agent_stale_from, before_due=True),
    Rule(id=ROOT_MISMATCH, family="fleet", severity="warning", check=check_claim_root_mismatch,
         reads=frozenset({"snapshot", "device_plugin"}), reads_cluster=True),
)  # fmt: skip
