"""Every rule, in one explicit tuple, classified node-local / fleet-level / time-dependent
(for aggregator.rules.engine.incremental), and `evaluate`: all enabled rules over the fleet view,
findings sorted deterministically (severity, node, rule, subject).

Pure. A rule that raises on input it did not foresee becomes a `data-quality` finding
naming it, so one bad node can neither crash evaluation nor silence the other rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Final

from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.fleet.state import Fleet, NodeRecord
from aggregator.rules import counters, dataquality, fleetpolicy, links, topology, versions
from aggregator.rules.catalog import RULE_IDS, SEVERITY_ORDER
from aggregator.rules.finding import Finding
from aggregator.rules.peers import PeerRule
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS, Thresholds
from proto.inventory import NodeSnapshot
from proto.policy import Policy

Check = Callable[
    [Mapping[str, NodeRecord], tuple[Policy, ...], ClusterView, float, Thresholds], list[Finding]
]

ALL_RULES: Final[tuple[tuple[str, Check], ...]] = (
    ("gpu-nic-affinity", topology.check_gpu_nic_affinity),
    ("pcie-degraded", topology.check_pcie_degraded),
    ("acs-enabled", topology.check_acs_enabled),
    ("peermem-missing", topology.check_peermem_missing),
    ("iommu-translated", topology.check_iommu_translated),
    ("numa-unknown", topology.check_numa_unknown),
    ("port-down", links.check_port_down),
    ("rate-mismatch", links.check_rate_mismatch),
    ("link-layer-mismatch", links.check_link_layer_mismatch),
    ("mtu-mismatch", links.check_mtu_mismatch),
    ("link-flap", links.check_link_flap),
    ("counter-errors", counters.check_counter_errors),
    ("retries-exceeded", counters.check_retries_exceeded),
    ("cc-misconfigured", counters.check_cc_misconfigured),
    ("fw-skew", versions.check_fw_skew),
    ("fw-below-minimum", versions.check_fw_below_minimum),
    ("driver-skew", versions.check_driver_skew),
    ("agent-stale", fleetpolicy.check_agent_stale),
    ("resource-zero", fleetpolicy.check_resource_zero),
    ("selector-matches-nothing", fleetpolicy.check_selector_matches_nothing),
    ("policy-conflict", fleetpolicy.check_policy_conflict),
    ("rail-mismatch", fleetpolicy.check_rail_mismatch),
    ("data-quality", dataquality.check_data_quality),
)
assert tuple(rule for rule, _ in ALL_RULES) == RULE_IDS, "ALL_RULES and the catalogue differ"

# Node-local: the findings for node N depend only on N's record (and policies, cluster,
# thresholds, now); each is named after N. aggregator.rules.engine.incremental re-runs them for
# changed nodes only.
NODE_RULES: Final[tuple[str, ...]] = (
    "gpu-nic-affinity", "pcie-degraded", "acs-enabled", "peermem-missing",
    "iommu-translated", "numa-unknown", "port-down", "link-flap", "counter-errors",
    "retries-exceeded", "cc-misconfigured", "fw-below-minimum", "agent-stale",
    "resource-zero", "policy-conflict", "data-quality",
)  # fmt: skip
# Fleet-level: compare a node with its peers (majorities, modes, versions seen, rails) or
# judge a policy over all its nodes; each is a PeerRule (tally / settle / judge).
_PEERS: Final = (
    links.RATE_MISMATCH, links.LINK_LAYER_MISMATCH, links.MTU_MISMATCH, versions.FW_SKEW,
    versions.DRIVER_SKEW, fleetpolicy.SELECTOR_MATCHES_NOTHING, fleetpolicy.RAIL_MISMATCH,
)  # fmt: skip
PEER_RULES: Final[Mapping[str, PeerRule]] = MappingProxyType({r.rule: r for r in _PEERS})
FLEET_RULES: Final[tuple[str, ...]] = tuple(PEER_RULES)
# Node-local rules that read `now`: when each may first report a record (not before).
TIME_RULES: Final[Mapping[str, Callable[[NodeRecord, Thresholds], float]]] = MappingProxyType(
    {"agent-stale": fleetpolicy.agent_stale_from}
)
_SNAPSHOT: Final = frozenset({"snapshot"})
_COUNTERS: Final = frozenset({"counters_held"})
# The NodeRecord fields each rule reads of a node: a node's findings of a rule are
# recomputed only when one of them changed (or the node came or went).
READS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        **dict.fromkeys(("gpu-nic-affinity", "pcie-degraded", "acs-enabled", "peermem-missing",
                         "iommu-translated", "numa-unknown", "port-down", "fw-below-minimum",
                         *FLEET_RULES), _SNAPSHOT),
        **dict.fromkeys(("link-flap", "counter-errors", "retries-exceeded",
                         "cc-misconfigured"), _COUNTERS),
        "data-quality": _SNAPSHOT | _COUNTERS,
        "resource-zero": frozenset({"device_plugin"}),
        "selector-matches-nothing": frozenset({"snapshot", "device_plugin"}),
        "policy-conflict": frozenset(),  # only whether the node is in the fleet
        "agent-stale": frozenset({"last_seen"}),
    }
)  # fmt: skip
assert sorted((*NODE_RULES, *FLEET_RULES)) == sorted(RULE_IDS), "unclassified rule"
assert READS.keys() == set(RULE_IDS), "a rule without READS"
assert all(READS[r] <= set(NodeRecord.__struct_fields__) for r in RULE_IDS), "unknown field"
assert set(TIME_RULES) <= set(NODE_RULES), "a time rule must be node-local"
# Rules reading only these counter/rate keys of a node's counter batch (rate-key spelling,
# declared next to each rule): a delta that changed none of them leaves their findings.
COUNTER_KEYS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "counter-errors": counters.COUNTER_ERRORS_KEYS,
        "retries-exceeded": counters.RETRIES_EXCEEDED_KEYS,
        "cc-misconfigured": counters.CC_MISCONFIGURED_KEYS,
        "link-flap": links.LINK_FLAP_KEYS,
    }
)
assert all(READS[r] == _COUNTERS for r in COUNTER_KEYS), "a counter rule reading more"
CHECKS: Final[Mapping[str, Check]] = MappingProxyType(dict(ALL_RULES))


def sort_key(finding: Finding) -> tuple[int, str, str, str]:
    return (SEVERITY_ORDER[finding.severity], finding.node or "", finding.rule, finding.subject)


def run_rule(
    rule: str,
    fleet: Mapping[str, NodeRecord],
    policies: tuple[Policy, ...],
    cluster: ClusterView,
    now: float,
    thresholds: Thresholds,
) -> list[Finding]:
    """One rule's findings; if it raises, one `data-quality` finding naming it instead."""
    try:
        return CHECKS[rule](fleet, policies, cluster, now, thresholds)
    except Exception as exc:  # a rule bug must not hide every other finding
        return [
            Finding(
                rule="data-quality",
                severity="warning",
                node=None,
                subject=f"rule/{rule}",
                message=f"Rule {rule} could not evaluate this fleet ({type(exc).__name__}: "
                f"{exc}); its findings are missing — report this input as a bug.",
                evidence={"rule": rule, "error": f"{type(exc).__name__}: {exc}"},
            )
        ]


def evaluate(
    fleet: Mapping[str, NodeRecord],
    policies: tuple[Policy, ...] = (),
    cluster: ClusterView = NO_CLUSTER,
    now: float = 0.0,
    *,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> list[Finding]:
    """All findings of every enabled rule; one per (rule, node, subject)."""
    found: dict[tuple[str, str | None, str], Finding] = {}
    for rule, _ in ALL_RULES:
        if not thresholds.enabled(rule):
            continue
        for finding in run_rule(rule, fleet, policies, cluster, now, thresholds):
            found.setdefault(finding.fingerprint, finding)
    return sorted(found.values(), key=sort_key)


def evaluate_snapshots(
    snapshots: Iterable[NodeSnapshot],
    policies: tuple[Policy, ...] = (),
    *,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> list[Finding]:
    """Every enabled rule over a fleet of `snapshots` alone, as of the newest one (offline
    `nicfleetctl check`: each snapshot counts as received when it was collected)."""
    fleet = Fleet()
    collected = []
    for snap in snapshots:
        fleet.apply_snapshot(snap, received_at=snap.collected_at)
        collected.append(snap.collected_at)
    return evaluate(fleet.view(), policies, now=max(collected, default=0.0), thresholds=thresholds)
