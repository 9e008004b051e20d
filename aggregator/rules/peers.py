"""Rules that compare a node with its peers, split in three pure steps so they can be
evaluated incrementally: `tally` a node's votes per group (model, fabric, module, rail),
`settle` each group's counts into a fleet fact (majority, mode, versions seen), and
`judge` a node against the facts of its own groups (or, for fleet findings, `conclude`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from aggregator.cluster import ClusterView, policies_by_node
from aggregator.fleet import NodeRecord
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


def _no_node_findings(peer: Peer, facts: Facts) -> list[Finding]:
    return []


@dataclass(frozen=True, slots=True)
class PeerRule:
    """A rule whose findings for node N depend on N and on the facts of N's groups only:
    `judge(peer, facts)` reads `facts[g]` for the groups `g` that `tally(peer)` voted in."""

    rule: str
    tally: Callable[[Peer], Iterable[Vote]]
    settle: Callable[[Mapping[Hashable, int]], Hashable]  # value -> count (never empty)
    judge: Callable[[Peer, Facts], list[Finding]] = _no_node_findings
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
        counts.setdefault(group, Counter())[value] += 1
    return counts


def run(
    rule: PeerRule,
    fleet: Mapping[str, NodeRecord],
    policies: tuple[Policy, ...],
    cluster: ClusterView,
) -> list[Finding]:
    """The whole fleet at once (what `registry.evaluate` runs)."""
    everyone = list(peers(fleet, policies, cluster))
    counts = tally_counts(vote for peer in everyone for vote in rule.tally(peer))
    facts = {group: rule.settle(seen) for group, seen in counts.items()}
    found = [finding for peer in everyone for finding in rule.judge(peer, facts)]
    return [*found, *rule.conclude(policies, facts)]
