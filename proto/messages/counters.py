"""Counter samples: one port's cumulative counters and rates, and the batch a node sends."""

from __future__ import annotations

import msgspec

from proto.inventory import Base, ReadError
from proto.messages import MESSAGES_VERSION


class PortCounters(Base, frozen=True, kw_only=True):
    """One port's cumulative counters (raw kernel values) and their rates."""

    device: str
    port: int
    counters: dict[str, int] = msgspec.field(default_factory=dict)
    counters_ext: dict[str, int] = msgspec.field(default_factory=dict)
    hw_counters: dict[str, int] = msgspec.field(default_factory=dict)
    rx_bytes: int | None = None
    tx_bytes: int | None = None
    # Per second since the previous sample, keyed "<group>/<name>" (group: counters,
    # counters_ext, hw_counters) plus "rx_bytes" and "tx_bytes". A counter that is
    # saturated or was reset has no rate this round; it is named below instead.
    rates: dict[str, float] = msgspec.field(default_factory=dict)
    saturated: tuple[str, ...] = ()
    resets: tuple[str, ...] = ()
    # Only in a delta batch (see CounterBatch.base_seq): keys that the base batch had and
    # this round has not — "<group>/<name>", "rates/<rate key>", "rx_bytes", "tx_bytes".
    removed: tuple[str, ...] = ()


class CounterBatch(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.CounterBatch"
):
    """One sampling round of every port's counters (core NATS, newest wins).

    A full batch (`base_seq` None) lists every port. A delta batch names the seq of the
    last full batch it is relative to and lists only the ports that differ from it, each
    with only the values that differ (plus its whole `saturated`/`resets` and `removed`);
    see docs/wire.md, "Counter deltas".
    """

    version: int = MESSAGES_VERSION
    node: str
    seq: int
    collected_at: float
    interval_s: float | None = None  # seconds since the previous sample (None: first)
    ports: tuple[PortCounters, ...] = ()
    errors: tuple[ReadError, ...] = ()  # counter files that could not be read
    base_seq: int | None = None  # delta against this full batch; None: a full batch
    # The agent process that sent it (docs/wire.md, "Ordering"): its start in unix ns by
    # its own clock, the same in every message of one process; 0: an agent older than epochs.
    epoch: int = 0
