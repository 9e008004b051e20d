"""Findings kept in `registry.sort_key` order under small changes: remove and insert by
bisection instead of sorting the whole list again on every evaluation.

Pure. Keys are unique for unique fingerprints (severity, node, rule, subject).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from aggregator.rules.engine.registry import sort_key
from aggregator.rules.finding import Finding

Key = tuple[int, str, str, str]


class SortedFindings:
    def __init__(self) -> None:
        self._keys: list[Key] = []
        self._items: list[Finding] = []

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[Finding]:
        """A copy, safe to hand out."""
        return list(self._items)

    def reset(self, findings: Iterable[Finding]) -> None:
        self._items = sorted(findings, key=sort_key)
        self._keys = [sort_key(f) for f in self._items]

    def remove(self, finding: Finding) -> None:
        key = sort_key(finding)
        i = bisect_left(self._keys, key)
        while self._items[i] is not finding:  # equal keys: find this very object
            i += 1
        del self._keys[i]
        del self._items[i]

    def add(self, finding: Finding) -> None:
        key = sort_key(finding)
        i = bisect_left(self._keys, key)
        self._keys.insert(i, key)
        self._items.insert(i, finding)
