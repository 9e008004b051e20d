"""Fleet-level rules for one replica of a sharded aggregator: node-local rules run over the
replica's own nodes; peer rules settle each group's fact from its own vote counts plus
the other live replicas' per-partition counts (`ShardSummary`), then judge its own nodes.

Pure. With every partition counted once, the union of the replicas' findings equals
`registry.evaluate` over the whole fleet (tests/unit/aggregator/replicas/test_shards.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from typing import Final

import msgspec

from aggregator.cluster import NO_CLUSTER, ClusterView, policies_by_node
from aggregator.fleet.state import NodeRecord
from aggregator.replicas.partitions import partition_of
from aggregator.rules.descriptor import NOT_LOADED
from aggregator.rules.engine.incremental import IncrementalRules
from aggregator.rules.engine.peertally import PeerTally
from aggregator.rules.engine.registry import PEER_RULES, READS, sort_key
from aggregator.rules.finding import Finding
from aggregator.rules.peers import Peer, PeerRule, Vote
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS, Thresholds
from proto import subjects
from proto.messages.shards import ShardSummary, ShardVote
from proto.policy import Policy

Remote = dict[str, dict[Hashable, Counter[Hashable]]]  # rule -> group -> value -> count
VoteKey = tuple[int, str, Hashable, Hashable]  # partition, rule, group, value
_NO_COUNTS: Final[Counter[Hashable]] = Counter()
_ALL_FIELDS: Final = frozenset(NodeRecord.__struct_fields__)


def hashable(value: object) -> Hashable:
    """A decoded vote part with its lists turned back into the sender's tuples."""
    if isinstance(value, list | tuple):
        return tuple(hashable(v) for v in value)
    return value  # str, int, float, bool, None


def merge_remote(summaries: Iterable[ShardSummary], owners: Mapping[int, str], me: str) -> Remote:
    """Counts of every partition from the summary of the replica that owns it now (not
    `me`, whose own nodes are counted locally); other partitions' votes are dropped."""
    merged: Remote = {}
    for summary in summaries:
        if summary.replica == me:
            continue
        for vote in summary.votes:
            if owners.get(vote.partition) != summary.replica or vote.count <= 0:
                continue
            groups = merged.setdefault(vote.rule, {})
            counts = groups.setdefault(hashable(vote.group), Counter())
            counts[hashable(vote.value)] += vote.count
    return merged


def _without_peer_rules(thresholds: Thresholds) -> Thresholds:
    for rule in PEER_RULES:
        thresholds = thresholds.with_rule(rule, enabled=False)
    return thresholds


class ShardRules:
    """`IncrementalRules` for a replica's own nodes, peer rules against merged facts."""

    def __init__(self, partitions: int) -> None:
        self._node_rules = IncrementalRules()
        self.partitions = partitions
        self.remote: Remote = {}  # set from the other replicas' summaries (merge_remote)
        self.votes: Counter[VoteKey] = Counter()  # this replica's summary
        self._context: tuple[object, ...] | None = None
        self._local_thresholds: tuple[Thresholds, Thresholds] | None = None
        self._start_peers()

    def _start_peers(self) -> None:
        self._tallies = {name: PeerTally(rule) for name, rule in PEER_RULES.items()}
        self._seen: dict[str, NodeRecord] = {}
        self._selecting: dict[str, tuple[Policy, ...]] = {}
        self._facts: dict[str, dict[Hashable, Hashable]] = {}
        self._found: dict[tuple[str, str | None], list[Finding]] = {}
        self.votes = Counter()

    def summary(self, replica: str, held: Iterable[int], now: float) -> ShardSummary:
        votes = tuple(
            ShardVote(partition, rule, group, value, n)
            for (partition, rule, group, value), n in sorted(
                self.votes.items(), key=lambda kv: repr(kv[0])
            )
            if n > 0
        )
        return ShardSummary(
            replica=replica,
            partitions=tuple(sorted(held)),
            nodes=len(self._seen),
            votes=votes,
            sent_at=now,
        )

    def evaluate(
        self,
        fleet: Mapping[str, NodeRecord],
        policies: tuple[Policy, ...] = (),
        cluster: ClusterView = NO_CLUSTER,
        now: float = 0.0,
        *,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
        heard_since: Mapping[str, float] = NOT_LOADED,
    ) -> list[Finding]:
        local = self._node_rules.evaluate(
            fleet, policies, cluster, now, thresholds=self._local(thresholds),
            heard_since=heard_since,
        )  # fmt: skip
        context = (policies, cluster, thresholds)
        if self._context is None or any(
            a is not b and a != b for a, b in zip(self._context, context, strict=True)
        ):
            self._start_peers()
        self._context = context
        changed = [n for n, r in fleet.items() if self._seen.get(n) is not r]
        changed += [n for n in self._seen if n not in fleet]
        moved: dict[str, frozenset[str]] = {}  # node -> record fields that changed
        for name in changed:
            old, record = self._seen.get(name), fleet.get(name)
            if old is None or record is None:
                moved[name] = _ALL_FIELDS
            else:
                moved[name] = frozenset(
                    f for f in _ALL_FIELDS if getattr(old, f) is not getattr(record, f)
                )
            if record is None:
                self._seen.pop(name, None)
                self._selecting.pop(name, None)
            else:
                self._seen[name] = record
        peer: list[Finding] = []
        for name, rule in PEER_RULES.items():
            if thresholds.enabled(name):
                reads = READS[name]  # counters arriving every second touch no peer rule
                touched = [n for n, fields in moved.items() if fields & reads]
                self._run_peer(rule, touched, fleet, policies, cluster)
            else:
                self._clear_rule(name)
        for found in self._found.values():
            peer.extend(found)
        unique = {f.fingerprint: f for f in [*local, *peer]}
        return sorted(unique.values(), key=sort_key)

    def _local(self, thresholds: Thresholds) -> Thresholds:
        cached = self._local_thresholds
        if cached is None or cached[0] != thresholds:
            cached = self._local_thresholds = (thresholds, _without_peer_rules(thresholds))
        return cached[1]

    def _clear_rule(self, rule: str) -> None:
        for key in [k for k in self._found if k[0] == rule]:
            del self._found[key]

    def _peer(self, name: str, fleet: Mapping[str, NodeRecord], policies: tuple[Policy, ...],
              cluster: ClusterView) -> Peer:  # fmt: skip
        selecting = self._selecting.get(name)
        if selecting is None:
            nodes = {n: c for n, c in cluster.nodes.items() if n == name}
            # The whole view but the other nodes (DRA claims and devices included).
            view = msgspec.structs.replace(cluster, nodes=nodes)
            one = {name: fleet[name]}
            selecting = self._selecting[name] = policies_by_node(policies, one, view).get(name, ())
        return Peer(name=name, record=fleet[name], selecting=selecting, policies=policies)

    def _count(self, name: str, rule: str, votes: Iterable[Vote], sign: int) -> None:
        partition = partition_of(subjects.node_token(name), self.partitions)
        for group, value in votes:
            key = (partition, rule, group, value)
            self.votes[key] += sign
            if self.votes[key] <= 0:
                del self.votes[key]

    def _run_peer(
        self,
        rule: PeerRule,
        changed: list[str],
        fleet: Mapping[str, NodeRecord],
        policies: tuple[Policy, ...],
        cluster: ClusterView,
    ) -> None:
        tally = self._tallies[rule.rule]
        for name in changed:
            self._count(name, rule.rule, tally.votes.get(name, ()), -1)
            tally.retract(name)
            self._found.pop((rule.rule, name), None)
            if name not in fleet:
                continue
            try:  # a rule that raises on a node: the node casts no vote (docs/scaling.md)
                votes = list(rule.tally(self._peer(name, fleet, policies, cluster)))
            except Exception:
                continue
            tally.cast(name, votes)
            self._count(name, rule.rule, votes, +1)
        remote = self.remote.get(rule.rule, {})
        old = self._facts.get(rule.rule, {})
        facts: dict[Hashable, Hashable] = {}
        for group in tally.counts.keys() | remote.keys():
            counts = tally.counts.get(group, _NO_COUNTS) + remote.get(group, _NO_COUNTS)
            if counts:
                try:
                    facts[group] = rule.settle(counts)
                except Exception:
                    continue
        self._facts[rule.rule] = facts
        judge = {name for name in changed if name in tally.votes}
        for group in old.keys() | facts.keys():
            if old.get(group, _NO_COUNTS) != facts.get(group, _NO_COUNTS):
                judge |= tally.members.get(group, set())
        for name in judge:
            try:
                found = rule.judge(self._peer(name, fleet, policies, cluster),
                                   tally.votes[name], facts)  # fmt: skip
            except Exception:
                found = []
            self._set(rule.rule, name, found)
        try:
            self._set(rule.rule, None, rule.conclude(policies, facts))
        except Exception:
            self._set(rule.rule, None, [])

    def _set(self, rule: str, node: str | None, found: list[Finding]) -> None:
        if found:
            self._found[(rule, node)] = found
        else:
            self._found.pop((rule, node), None)
