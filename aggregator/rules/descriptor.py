"""What a rule is: its descriptor (`Rule`: id, family, usual severity, the record fields it
reads, fleet-level peer steps or due time, default settings, and its check) and what its
check reads (`RuleInput`). Each family module lists its rules' descriptors in one explicit
tuple; aggregator.rules.catalog concatenates them and the engine derives its tables.

Pure data. A descriptor that contradicts itself is refused when it is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

from aggregator.cluster import ClusterView
from aggregator.fleet.state import NodeRecord
from aggregator.rules.finding import Finding, Severity
from aggregator.rules.peers import PeerRule, run
from aggregator.rules.settings import NO_PARAMS, RuleSettings, Thresholds
from proto.policy import Policy

Family = Literal["topology", "links", "counters", "versions", "fleet", "data"]
Kind = Literal["node", "fleet"]
# The NodeRecord fields most rules read of a node.
SNAPSHOT: Final = frozenset({"snapshot"})
COUNTERS: Final = frozenset({"counters_held"})
_FIELDS: Final = frozenset(NodeRecord.__struct_fields__)
NOT_LOADED: Final[Mapping[str, float]] = MappingProxyType({})  # no record came from KV


@dataclass(frozen=True, slots=True)
class RuleInput:
    """Everything a check may read: the fleet view (node -> record), the policies, the
    cluster's labels, the evaluation time and every rule's settings.

    `heard_since`: node -> the moment this process could first have heard it (its node
    subscription up, or the partition taken), for the records it installed from KV: their
    receive times are an earlier process's. Absent: every receive time is this process's."""

    fleet: Mapping[str, NodeRecord]
    policies: tuple[Policy, ...]
    cluster: ClusterView
    now: float
    thresholds: Thresholds
    heard_since: Mapping[str, float] = field(default_factory=lambda: NOT_LOADED)


Check = Callable[[RuleInput], list[Finding]]
Due = Callable[[NodeRecord, Thresholds], float]  # when a record may first be reported


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule. Node-local (no `peer`): its findings for node N depend only on N's record
    (and the policies, cluster, settings, `now`) and each names N; re-run for a node only
    when a field in `reads` changed — and, with `counter_keys`, only when a counter delta
    touched one of those counter/rate keys. `due`: it reads `now`, and reports no record
    before that time (`before_due`: `now` moves its findings only then). Fleet-level
    (`peer`): tally / settle / judge (aggregator.rules.peers)."""

    id: str  # stable API: alert fingerprints, policy `alerts` keys, API filters
    family: Family
    severity: Severity  # the usual severity; a few rules escalate (see docs/rules.md)
    check: Check
    reads: frozenset[str]  # the NodeRecord fields it reads of a node (empty: only presence)
    peer: PeerRule | None = None
    due: Due | None = None
    counter_keys: frozenset[str] | None = None
    for_s: float = 0.0  # default `for`: how long a finding must hold before it alerts
    resolve_s: float = 0.0  # default hysteresis: how long it must be gone before resolving
    # Numeric parameters a policy may override under alerts.<rule>.thresholds.
    params: Mapping[str, float] = field(default_factory=lambda: NO_PARAMS)
    # It reads the cluster's pods, NADs, IP pools, DRA claims or slices (not only node
    # labels): re-run for every node when those change (aggregator.rules.engine.incremental).
    reads_cluster: bool = False
    # With `due`: it also reports records before their due time, and `now` changes what it
    # reports only at that time (dra-claim-unhealthy-device: a silent node). Re-run when a
    # field in `reads` changed, as a rule without `due` is, and from the due time on.
    before_due: bool = False

    def __post_init__(self) -> None:
        if not self.reads <= _FIELDS:
            raise ValueError(f"{self.id}: reads unknown fields {sorted(self.reads - _FIELDS)}")
        if self.peer is not None and (self.peer.rule != self.id or self.due is not None):
            raise ValueError(f"{self.id}: a peer rule of its own id, without a due time")
        if self.before_due and self.due is None:
            raise ValueError(f"{self.id}: reports before its due time, but has none")
        if self.counter_keys is not None and self.reads != COUNTERS:
            raise ValueError(f"{self.id}: counter keys for a rule reading more than counters")

    @classmethod
    def of_peers(
        cls,
        peer: PeerRule,
        *,
        family: Family,
        severity: Severity,
        reads: frozenset[str],
        for_s: float = 0.0,
    ) -> Rule:
        """A fleet-level rule: its check runs the peer steps over the whole fleet."""

        def check(given: RuleInput) -> list[Finding]:
            return run(peer, given.fleet, given.policies, given.cluster)

        return cls(
            id=peer.rule, family=family, severity=severity, check=check, reads=reads,
            peer=peer, for_s=for_s,
        )  # fmt: skip

    @property
    def kind(self) -> Kind:
        return "node" if self.peer is None else "fleet"

    @property
    def defaults(self) -> RuleSettings:
        return RuleSettings(for_s=self.for_s, resolve_s=self.resolve_s, params=self.params)
