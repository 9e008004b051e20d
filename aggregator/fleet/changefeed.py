"""Fan-out of "this node changed" to the aggregator's loops (rules, reconcile, ...).

Each subscriber gets its own coalescing set of changed node names and an event; a slow
subscriber never blocks ingest or the others. No I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Container

_NONE: frozenset[str] = frozenset()


class Subscription:
    def __init__(self) -> None:
        self._nodes: set[str] = set()
        self._kinds: set[str] = set()
        self._event = asyncio.Event()
        self._quiet: Container[str] = _NONE
        self._quiet_nodes: Container[str] = _NONE

    def ignore(self, kinds: Container[str], of_nodes: Container[str]) -> None:
        """Skip messages of `kinds` about a node in `of_nodes` (kept by reference, so the
        subscriber may grow it): they neither wake the subscriber nor show in `wait`. The
        reconciler skips counter batches of nodes it knows — 10,000 a second at scale."""
        self._quiet, self._quiet_nodes = kinds, of_nodes

    def _add(self, node: str, kind: str) -> None:
        if kind in self._quiet and node in self._quiet_nodes:
            return
        self._nodes.add(node)
        self._kinds.add(kind)
        self._event.set()

    async def wait(self, timeout: float | None = None) -> tuple[set[str], set[str]]:
        """Changed (nodes, message kinds) since the last call; empty after a timeout."""
        if not self._event.is_set():
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                return set(), set()
        self._event.clear()
        nodes, self._nodes = self._nodes, set()
        kinds, self._kinds = self._kinds, set()
        return nodes, kinds


class ChangeFeed:
    def __init__(self) -> None:
        self._subscriptions: list[Subscription] = []

    def subscribe(self) -> Subscription:
        sub = Subscription()
        self._subscriptions.append(sub)
        return sub

    def publish(self, node: str, kind: str) -> None:
        for sub in self._subscriptions:
            sub._add(node, kind)
