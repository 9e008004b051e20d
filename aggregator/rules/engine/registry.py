"""The engine's view of the rule catalogue, derived from the rule descriptors
(aggregator.rules.catalog): which rules are node-local, fleet-level (peer rules) and
time-dependent, what each reads; and `evaluate`: all enabled rules over the fleet view,
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
from aggregator.rules import fleetpolicy, links
from aggregator.rules.catalog import ALL_RULES, RULES, SEVERITY_ORDER
from aggregator.rules.descriptor import NOT_LOADED, Check, RuleInput
from aggregator.rules.finding import Finding
from aggregator.rules.peers import PeerRule
from aggregator.rules.settings import Thresholds
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS
from proto.inventory import NodeSnapshot
from proto.policy import Policy

# Node-local rules, in evaluation order: aggregator.rules.engine.incremental re-runs them
# for changed nodes only (a node's findings depend on its own record).
NODE_RULES: Final[tuple[str, ...]] = tuple(r.id for r in ALL_RULES if r.kind == "node")
# Fleet-level rules: their peer steps (tally / settle / judge).
PEER_RULES: Final[Mapping[str, PeerRule]] = MappingProxyType(
    {r.id: r.peer for r in ALL_RULES if r.peer is not None}
)
FLEET_RULES: Final[tuple[str, ...]] = tuple(PEER_RULES)
# Node-local rules that read `now`: when each may first report a record (not before).
TIME_RULES: Final[Mapping[str, Callable[[NodeRecord, Thresholds], float]]] = MappingProxyType(
    {r.id: r.due for r in ALL_RULES if r.due is not None}
)
# Time rules that also report before the due time (`Rule.before_due`): re-run for changed
# nodes as well as for due ones.
BEFORE_DUE: Final[frozenset[str]] = frozenset(r.id for r in ALL_RULES if r.before_due)
# The NodeRecord fields each rule reads of a node: a node's findings of a rule are
# recomputed only when one of them changed (or the node came or went).
READS: Final[Mapping[str, frozenset[str]]] = MappingProxyType({r.id: r.reads for r in ALL_RULES})
# Rules reading only these counter/rate keys of a node's counter batch (rate-key spelling):
# a delta that changed none of them leaves their findings.
COUNTER_KEYS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {r.id: r.counter_keys for r in ALL_RULES if r.counter_keys is not None}
)
CHECKS: Final[Mapping[str, Check]] = MappingProxyType({r.id: r.check for r in ALL_RULES})
# Node-local rules reading the cluster's pods, NADs, IP pools, DRA claims or slices: re-run
# for every node when those change.
CLUSTER_RULES: Final[frozenset[str]] = frozenset(r.id for r in ALL_RULES if r.reads_cluster)


# Rules that can tell, for an open alert whose finding is gone, that they can no longer
# judge its subject (their input went away): rule -> (the node's record, the alert's
# subject and evidence) -> the reason, or None. The alert is then unknown, not resolved
# (aggregator.alerts.lifecycle). Rules without an entry: every absence is a verdict.
Unjudged = Callable[[NodeRecord | None, str, Mapping[str, str]], str | None]
UNJUDGED: Final[Mapping[str, Unjudged]] = MappingProxyType(
    {
        "rail-mismatch": fleetpolicy.rail_unjudged,
        "rate-mismatch": links.rate_unjudged,
        "mtu-mismatch": links.mtu_unjudged,
    }
)


def cannot_judge(
    fleet: Mapping[str, NodeRecord], rule: str, node: str, subject: str, evidence: Mapping[str, str]
) -> str | None:
    """Why `rule` cannot judge `subject` on `node` (a fleet view's node name, or any other
    string for fleet-wide alerts) now, or None (`UNJUDGED`)."""
    check = UNJUDGED.get(rule)
    return None if check is None else check(fleet.get(node), subject, evidence)


def sort_key(finding: Finding) -> tuple[int, str, str, str]:
    return (SEVERITY_ORDER[finding.severity], finding.node or "", finding.rule, finding.subject)


def run_rule(rule: str, given: RuleInput) -> list[Finding]:
    """One rule's findings; if it raises, one `data-quality` finding naming it instead."""
    try:
        return CHECKS[rule](given)
    except Exception as exc:  # a rule bug must not hide every other finding
        return [
            Finding(
                rule="data-quality",
                severity=RULES["data-quality"].severity,
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
    heard_since: Mapping[str, float] = NOT_LOADED,
) -> list[Finding]:
    """All findings of every enabled rule; one per (rule, node, subject)."""
    given = RuleInput(fleet, policies, cluster, now, thresholds, heard_since)
    found: dict[tuple[str, str | None, str], Finding] = {}
    for rule in ALL_RULES:
        if not thresholds.enabled(rule.id):
            continue
        for finding in run_rule(rule.id, given):
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
