"""Which nodes a time-dependent rule must re-run for at `now`: those whose due time (when
the rule may first report them, aggregator.rules.registry.TIME_RULES) is reached.

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
        self._heap: list[tuple[float, str]] = []  # may hold superseded entries
        self.active: set[str] = set()  # due at the last `advance`

    def reschedule(self, name: str, due: float | None) -> None:
        """A node's new due time (None: the node is gone)."""
        self.active.discard(name)
        self._due.pop(name, None)
        if due is None:
            return
        self._due[name] = due
        if math.isnan(due):
            self.active.add(name)  # cannot be ordered: always re-run
        else:
            heapq.heappush(self._heap, (due, name))

    def advance(self, now: float) -> set[str]:
        """Make every node due by `now` active; return the active ones no longer due
        (the clock went back), which are waiting again."""
        due, heap = self._due, self._heap
        if len(heap) > 2 * len(due) + 64:  # drop entries superseded by later messages
            heap[:] = [(at, n) for n, at in due.items() if n not in self.active]
            heapq.heapify(heap)
        while heap and heap[0][0] - SLACK_S <= now:
            at, name = heapq.heappop(heap)
            if due.get(name) == at:
                self.active.add(name)
        waiting = {n for n in self.active if due[n] - SLACK_S > now}
        for name in waiting:
            self.active.discard(name)
            heapq.heappush(heap, (due[name], name))
        return waiting
