"""Counter deltas: publish only what changed since the last full batch the agent sent.

Pure: no I/O, no clock, no logging. `delta_against(base, current)` is `current` as a delta
on the full batch `base`; `DeltaEncoder` decides per round between a delta and a full batch
(first round, periodic, after a rebase — reconnect or republish — or a failed send, when the
port set changed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, TypeVar

import msgspec

from proto.messages.counters import CounterBatch, PortCounters

# Keys of `PortCounters.removed` are "<group>/<name>" for these, "rates/<key>" for rates.
VALUE_GROUPS: Final = ("counters", "counters_ext", "hw_counters")
RATES: Final = "rates"
BYTES_FIELDS: Final = ("rx_bytes", "tx_bytes")
DEFAULT_FULL_EVERY: Final = 30

V = TypeVar("V", int, float)


def changed(base: Mapping[str, V], current: Mapping[str, V]) -> dict[str, V]:
    """Entries of `current` that `base` lacks or holds with another value."""
    return {k: v for k, v in current.items() if k not in base or base[k] != v}


def removed(prefix: str, base: Mapping[str, object], current: Mapping[str, object]) -> list[str]:
    """`PortCounters.removed` keys for the entries of `base` that `current` lacks."""
    return [f"{prefix}/{k}" for k in base if k not in current]


def port_delta(base: PortCounters, current: PortCounters) -> PortCounters | None:
    """`current` as a change of `base` (same device and port), or None when equal."""
    groups: dict[str, dict[str, int]] = {}
    gone: list[str] = []
    for group in VALUE_GROUPS:
        old, new = getattr(base, group), getattr(current, group)
        groups[group] = changed(old, new)
        gone += removed(group, old, new)
    rates = changed(base.rates, current.rates)
    gone += removed(RATES, base.rates, current.rates)
    moved: dict[str, int | None] = {}
    for field in BYTES_FIELDS:
        old_bytes, new_bytes = getattr(base, field), getattr(current, field)
        if new_bytes is None and old_bytes is not None:
            gone.append(field)
        moved[field] = new_bytes if new_bytes != old_bytes else None
    if (
        not any(groups.values())
        and not rates
        and not gone
        and moved == dict.fromkeys(BYTES_FIELDS)
        and (current.saturated, current.resets) == (base.saturated, base.resets)
    ):
        return None
    return PortCounters(
        device=current.device,
        port=current.port,
        counters=groups["counters"],
        counters_ext=groups["counters_ext"],
        hw_counters=groups["hw_counters"],
        rx_bytes=moved["rx_bytes"],
        tx_bytes=moved["tx_bytes"],
        rates=rates,
        saturated=current.saturated,
        resets=current.resets,
        removed=tuple(gone),
    )


def port_keys(batch: CounterBatch) -> list[tuple[str, int]]:
    return [(p.device, p.port) for p in batch.ports]


def delta_against(base: CounterBatch, current: CounterBatch) -> CounterBatch | None:
    """`current` (a full batch) as a delta on the full batch `base`, or None when a delta
    cannot say it: the port set or order changed (a full batch is needed then)."""
    if base.base_seq is not None or current.base_seq is not None:
        raise ValueError("deltas are taken between full batches")
    if port_keys(base) != port_keys(current):
        return None
    ports = tuple(
        delta
        for old, new in zip(base.ports, current.ports, strict=True)
        if (delta := port_delta(old, new)) is not None
    )
    return msgspec.structs.replace(current, ports=ports, base_seq=base.seq)


class DeltaEncoder:
    """Per round: a delta on the last full batch that was sent, or a full batch.

    A full batch goes out on the first round, every `full_every` rounds (1: never a
    delta), after `rebase()` (a reconnect or a republish), when the previous full batch
    could not be sent, when the port set changed, and on the first round with rates after a
    base without.
    With `size` (bytes a message takes on the wire), a delta that would not be smaller
    than the full batch is replaced by the full batch (busy ports change every value, and
    full batches are packed while deltas are maps). Call `sent(message, ok)` after every
    publish.
    """

    def __init__(
        self,
        *,
        full_every: int = DEFAULT_FULL_EVERY,
        size: Callable[[CounterBatch], int] | None = None,
    ) -> None:
        if full_every < 1:
            raise ValueError(f"full_every must be at least 1, not {full_every}")
        self.full_every = full_every
        self._size = size
        self._base: CounterBatch | None = None
        self._deltas = 0  # deltas encoded since the base
        self._rebase = True

    def rebase(self) -> None:
        """Make the next message a full batch, the base later deltas name (a new receiver
        has no base): the counter side of a reconnect or a republish."""
        self._rebase = True

    def encode(self, current: CounterBatch) -> CounterBatch:
        base = self._base
        if (
            base is not None
            and not self._rebase
            and self._deltas + 1 < self.full_every
            # A base without rates (the first sample) would put every rate in every delta.
            and (base.interval_s is not None or current.interval_s is None)
        ):
            delta = delta_against(base, current)
            if delta is not None and (
                self._size is None or self._size(delta) < self._size(current)
            ):
                self._deltas += 1
                return delta
        self._rebase = False
        return current

    def sent(self, message: CounterBatch, ok: bool) -> None:
        """Record a publish: a full batch that went out becomes the base of what follows."""
        if message.base_seq is not None:
            return
        self._base = message if ok else None
        self._deltas = 0
