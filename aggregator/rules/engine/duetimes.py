"""Which nodes a time-dependent rule must re-run for at `now`: those whose due time (when
the rule may first report them, aggregator.rules.engine.registry.TIME_RULES) is reached.

Pure. A min-heap of due times with lazy deletion; a clock going back is handled.
"""

from __future__ import annotations

import heapq
import math
from typing import Final

SLACK_S: Final = 1.0  # re-run from this long before the due time (float rounding)


class DueNodes:
    def __init__(self) -> None:
        self._due: dict[str, float] = {}
        # Each waiting node has one live heap entry, at or before its due time (`_queued`);
        # a due time that only moves later (a message: the usual case, 10,000 a second at
        # scale) leaves the entry where it is, and `advance` re-queues it when it comes up.
        self._heap: list[tuple[float, str]] = []  # may hold superseded entries
        self._queued: dict[str, float] = {}  # node -> its live entry's time
        self.active: set[str] = set()  # due at the last `advance`

    def reschedule(self, name: str, due: float | None) -> None:
        """A node's new due time (None: the node is gone)."""
        self.active.discard(name)
        if due is None:
            self._due.pop(name, None)
            return
        self._due[name] = due
        if math.isnan(due):
            self.active.add(name)  # cannot be ordered: always re-run
            return
        if due == math.inf:  # never due (e.g. snapshot-missing of a node with a snapshot)
            self._queued.pop(name, None)  # an entry left in the heap is superseded
            return
        queued = self._queued.get(name)
        if queued is None or due < queued:
            self._queued[name] = due
            heapq.heappush(self._heap, (due, name))

    def advance(self, now: float) -> set[str]:
        """Make every node due by `now` active; return the active ones no longer due
        (the clock went back), which are waiting again."""
        due, heap, queued = self._due, self._heap, self._queued
        if len(heap) > 2 * len(queued) + 64:  # drop superseded entries
            heap[:] = [(at, n) for n, at in queued.items()]
            heapq.heapify(heap)
        while heap and heap[0][0] - SLACK_S <= now:
            at, name = heapq.heappop(heap)
            if queued.get(name) != at:
                continue  # superseded by an earlier entry
            del queued[name]
            when = due.get(name)
            if when is None or name in self.active:
                continue  # gone, or NaN (active anyway)
            if when - SLACK_S <= now:
                self.active.add(name)
            else:  # moved later since it was queued
                queued[name] = when
                heapq.heappush(heap, (when, name))
        waiting = {n for n in self.active if due[n] - SLACK_S > now}
        for name in waiting:
            self.active.discard(name)
            if name not in queued or due[name] < queued[name]:
                queued[name] = due[name]
                heapq.heappush(heap, (due[name], name))
        return waiting
