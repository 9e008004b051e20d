"""Rules that compare a node with its peers, split in three pure steps so they can be
evaluated incrementally: `tally` a node's votes per group (model, fabric, module, rail),
`settle` each group's counts into a fleet fact (majority, mode, versions seen), and
`judge` a node against the facts of its own groups (or, for fleet findings, `conclude`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from aggregator.cluster import ClusterView, policies_by_node
from aggregator.fleet.state import NodeRecord
from aggregator.rules.finding import Finding
from proto.policy import Expect, Policy

Vote = tuple[Hashable, Hashable]  # (group, value)
Facts = Mapping[Hashable, Hashable]  # group -> settled fact


@dataclass(frozen=True, slots=True)
class Peer:
    """One node as the peer rules see it: its record and the policies that apply."""

    name: str
    record: NodeRecord
    selecting: tuple[Policy, ...]  # every policy selecting the node, in policy order
    policies: tuple[Policy, ...]  # all of them (votes per policy name them by index)

    @property
    def expect(self) -> Expect:
        """The `expect` of the first (by name) selecting policy, else the defaults."""
        if not self.selecting:
            return Expect()
        return min(self.selecting, key=lambda p: p.metadata.name).spec.expect


def _no_findings(policies: tuple[Policy, ...], facts: Facts) -> list[Finding]:
    return []


def _no_node_findings(peer: Peer, votes: Sequence[Vote], facts: Facts) -> list[Finding]:
    return []


@dataclass(frozen=True, slots=True)
class PeerRule:
    """A rule whose findings for node N depend on N and on the facts of N's groups only:
    `judge(peer, votes, facts)` gets the node's own votes (`tally(peer)`, in order) and
    reads `facts[g]` only for the groups `g` voted in."""

    rule: str
    tally: Callable[[Peer], Iterable[Vote]]
    settle: Callable[[Mapping[Hashable, int]], Hashable]  # value -> count (never empty)
    judge: Callable[[Peer, Sequence[Vote], Facts], list[Finding]] = _no_node_findings
    conclude: Callable[[tuple[Policy, ...], Facts], list[Finding]] = _no_findings


def peers(
    fleet: Mapping[str, NodeRecord], policies: tuple[Policy, ...], cluster: ClusterView
) -> Iterator[Peer]:
    """Every node of the fleet, sorted by name."""
    by_node = policies_by_node(policies, fleet, cluster)
    for name in sorted(fleet):
        yield Peer(
            name=name, record=fleet[name], selecting=by_node.get(name, ()), policies=policies
        )


def tally_counts(votes: Iterable[Vote]) -> dict[Hashable, Counter[Hashable]]:
    counts: dict[Hashable, Counter[Hashable]] = {}
    for group, value in votes:
        seen = counts.get(group)
        if seen is None:
            seen = counts[group] = Counter()
        seen[value] += 1
    return counts


def run(
    rule: PeerRule,
    fleet: Mapping[str, NodeRecord],
    policies: tuple[Policy, ...],
    cluster: ClusterView,
) -> list[Finding]:
    """The whole fleet at once (what `registry.evaluate` runs)."""
    everyone = [(peer, list(rule.tally(peer))) for peer in peers(fleet, policies, cluster)]
    counts = tally_counts(vote for _, votes in everyone for vote in votes)
    facts = {group: rule.settle(seen) for group, seen in counts.items()}
    found = [f for peer, votes in everyone for f in rule.judge(peer, votes, facts)]
    return [*found, *rule.conclude(policies, facts)]
