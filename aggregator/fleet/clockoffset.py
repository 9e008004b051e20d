"""How far a node's agent clock runs from the aggregator's: an estimate from the messages'
own times against their arrival (the `clock-skew` rule reports it; docs/rules.md).

Pure: callers pass `received_at`. Transit only ever delays a message, so of several samples
`stamped_at - received_at` the largest is the least delayed: the estimate is the largest
sample of the current and the previous `WINDOW_S` (a corrected clock shows within two).
"""

from __future__ import annotations

import math
from typing import Final

import msgspec
from msgspec.structs import replace

WINDOW_S: Final = 30.0


class ClockOffset(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Samples of one agent process (a restart starts afresh: another clock, maybe fixed)."""

    window_start: float  # aggregator time the current window began
    best: float  # the largest sample in it
    previous: float | None = None  # the largest of the window before, if adjacent

    @property
    def offset_s(self) -> float:
        """Seconds the agent's clock is ahead of the aggregator's (negative: behind)."""
        return self.best if self.previous is None else max(self.best, self.previous)


def observe(clock: ClockOffset | None, stamped_at: float, received_at: float) -> ClockOffset | None:
    """`clock` after a message stamped `stamped_at` by the agent arrived at `received_at`;
    the same object when the estimate did not move (rules reading it are not re-run)."""
    if not math.isfinite(stamped_at):
        return clock  # data-quality reports it
    sample = stamped_at - received_at
    if clock is None or received_at >= clock.window_start + 2 * WINDOW_S:
        return ClockOffset(window_start=received_at, best=sample)
    if received_at >= clock.window_start + WINDOW_S:
        return ClockOffset(window_start=received_at, best=sample, previous=clock.best)
    if sample > clock.best:
        return replace(clock, best=sample)
    return clock
