"""One peer rule's running tally over the fleet: every node's votes, the counts per group,
which nodes voted in each group, and the settled facts — updated per changed node.

Pure. `settle` reports the groups whose fact changed: their members must be re-judged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from typing import Final

from aggregator.rules.peers import PeerRule, Vote

MISSING: Final = object()  # the fact of a group nobody votes in (or that failed to settle)


class PeerTally:
    def __init__(self, rule: PeerRule) -> None:
        self.rule = rule
        self.votes: dict[str, list[Vote]] = {}  # node -> its votes, in tally order
        self.counts: dict[Hashable, Counter[Hashable]] = {}
        self.members: dict[Hashable, set[str]] = {}
        self.facts: dict[Hashable, Hashable] = {}

    def retract(self, name: str) -> set[Hashable]:
        """Withdraw a node's votes; the groups touched."""
        touched: set[Hashable] = set()
        for (group, value), n in Counter(self.votes.pop(name, ())).items():
            counts = self.counts[group]
            counts[value] -= n
            if counts[value] <= 0:
                del counts[value]
            self.members[group].discard(name)
            touched.add(group)
        return touched

    def cast(self, name: str, votes: Iterable[Vote]) -> set[Hashable]:
        """Record a node's votes (after `retract`); the groups touched."""
        mine = self.votes[name] = list(votes)
        for (group, value), n in Counter(mine).items():
            counts = self.counts.get(group)
            if counts is None:
                counts = self.counts[group] = Counter()
                self.members[group] = set()
            counts[value] += n
            self.members[group].add(name)
        return {group for group, _ in mine}

    def settle(self, touched: set[Hashable], broken: set[Hashable]) -> set[Hashable]:
        """Re-settle the touched groups (marking `("group", g)` broken when settle raises);
        the groups whose fact changed."""
        moved: set[Hashable] = set()
        for group in touched:
            broken.discard(("group", group))
            counts = self.counts.get(group)
            old = self.facts.pop(group, MISSING)
            new: Hashable = MISSING
            if not counts:
                self.counts.pop(group, None)
                self.members.pop(group, None)
            else:
                try:
                    new = self.rule.settle(counts)
                except Exception:
                    broken.add(("group", group))
                else:
                    self.facts[group] = new
            if new != old:
                moved.add(group)
        return moved
