"""When an agent republishes for the aggregator's resync requests: jitter, dedup, rate limit.

Pure: the caller passes the monotonic `now` and a random `draw` in [0, 1); this module
only decides. Several requests before the answer went out cause one answer; answers are
at least `min_interval_s` apart, so a flood of requests cannot make the agent flood.
"""

from __future__ import annotations

from dataclasses import dataclass

from proto.messages.control import MAX_RESYNC_SPREAD_S


@dataclass(frozen=True, kw_only=True)
class RepublishPolicy:
    # The answer goes out at a random moment within this window, so a whole fleet asked
    # at once does not answer in the same millisecond; a request may widen it (spread_s).
    jitter_s: float = 5.0
    # At most one answer per this many seconds; a request inside it is deferred, not lost.
    min_interval_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.jitter_s <= MAX_RESYNC_SPREAD_S:
            raise ValueError(f"republish jitter_s must be in [0, {MAX_RESYNC_SPREAD_S:g}]")
        if self.min_interval_s < 0.0:
            raise ValueError("republish min_interval_s must not be negative")


class RepublishSchedule:
    """The one pending answer (its due time) and when the last one went out."""

    def __init__(self, policy: RepublishPolicy) -> None:
        self.policy = policy
        self._due: float | None = None
        self._last: float | None = None

    @property
    def due(self) -> float | None:
        return self._due

    def request(self, now: float, draw: float, spread_s: float = 0.0) -> float | None:
        """Note a request; return the new due time, or None when one is already pending."""
        if self._due is not None:
            return None
        window = max(self.policy.jitter_s, min(max(spread_s, 0.0), MAX_RESYNC_SPREAD_S))
        earliest = now if self._last is None else max(now, self._last + self.policy.min_interval_s)
        self._due = earliest + min(max(draw, 0.0), 1.0) * window
        return self._due

    def take(self, now: float) -> bool:
        """True (once) when the pending answer is due; it then counts as sent at `now`."""
        if self._due is None or now < self._due:
            return False
        self._due, self._last = None, now
        return True
