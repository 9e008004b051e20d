"""Pure result math of the pair test: bandwidth from bytes and seconds, latency
percentiles from samples, and the PairTestResult they make up.

No I/O, no clock: the QP layer or perftest measures, this computes (docs/verify.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from proto.messages.validation import LatencySummary


def bytes_per_second(transferred: int, seconds: float) -> float:
    """Bytes over elapsed seconds; refuses what is not a measurement."""
    if transferred < 0:
        raise ValueError(f"transferred bytes must not be negative, got {transferred}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"elapsed seconds must be a positive number, got {seconds}")
    return transferred / seconds


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of sorted samples (p in 0..100): always a real sample."""
    if not ordered:
        raise ValueError("no samples")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_summary(samples_us: Sequence[float]) -> LatencySummary:
    """p50/p99/min/max of one-way latencies in µs (ping-pong round trip / 2)."""
    if any(not math.isfinite(s) or s < 0 for s in samples_us):
        raise ValueError("latency samples must be finite and not negative")
    ordered = sorted(samples_us)
    return LatencySummary(
        samples=len(ordered),
        p50_us=percentile(ordered, 50),
        p99_us=percentile(ordered, 99),
        min_us=ordered[0],
        max_us=ordered[-1],
    )


def one_way_us(round_trips_s: Sequence[float]) -> list[float]:
    """Round-trip times in seconds as one-way µs, as ib_send_lat reports them."""
    return [rtt * 1e6 / 2 for rtt in round_trips_s]
