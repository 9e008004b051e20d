"""Which agent process a node's record follows, and whether a message of it is newer than
the one stored (docs/wire.md, "Ordering").

Pure: no I/O, no clock — callers pass `received_at`. An agent process stamps every message
with its `epoch` (its start, unix ns, by its own clock). A node follows one `Instance` at a
time: a message of another epoch takes over only when that epoch is provably later, or
when the followed one has been silent for `OrderingSettings.takeover_s`; within one
instance, seq decides. No time an agent sends is trusted beyond the moment it arrived.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

import msgspec
from msgspec.structs import replace

_NS: Final = 1e9


@dataclass(frozen=True, slots=True)
class OrderingSettings:
    """`future_tolerance_s`: how far ahead of the aggregator's clock an agent's epoch may be
    and still count as a time. `takeover_s`: how long the followed instance must have been
    silent before a message of an instance that cannot be ordered after it takes over."""

    future_tolerance_s: float = 5.0
    takeover_s: float = 30.0


DEFAULT_ORDERING: Final = OrderingSettings()


class Instance(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The agent process whose messages a node's record follows."""

    epoch: int  # its start, unix ns by its own clock; 0: an agent older than epochs
    # Its start as far as the aggregator can vouch for it: the epoch, but never later than
    # the first message of it received (an epoch from the future is a clock running ahead).
    since: float
    heard_at: float  # when its latest applied message arrived


class Verdict(enum.Enum):
    """How a message's epoch relates to the node's followed instance."""

    SAME = "same"  # the followed process
    LATER = "later"  # a later process (or the followed one went silent): follow it now
    EARLIER = "earlier"  # not provably later, and the followed one is alive: ignore it


def start(epoch: int, received_at: float) -> Instance:
    """The instance of a node's first message of `epoch` (also: a record rebuilt from KV)."""
    since = received_at if epoch == 0 else min(epoch / _NS, received_at)
    return Instance(epoch=epoch, since=since, heard_at=received_at)


def judge(
    current: Instance | None,
    epoch: int,
    received_at: float,
    settings: OrderingSettings,
    *,
    stamped_at: float | None = None,
    offset_s: float | None = None,
) -> Verdict:
    """Whether a message of `epoch` received at `received_at` is of the followed instance,
    of a later one (restart: follow it, whatever its seq), or of an earlier one.

    A message whose clock is not ahead — neither its epoch nor its own time `stamped_at`
    is after its arrival by more than the tolerance — is of a later process when its
    epoch is after the followed instance's `since`. One from a clock ahead is later only
    than a followed instance whose clock ran ahead too (its epoch was from the future, or
    its clock offset `offset_s` — aggregator.fleet.clockoffset — is beyond the tolerance:
    the same clock, restarted) and whose epoch is smaller. An agent older than epochs (0)
    never displaces a newer one, and a newer one always displaces it. Whatever cannot be
    ordered waits for the followed instance to be silent for `takeover_s`, so that no
    verdict locks a live agent out for good.
    """
    if current is None:
        return Verdict.LATER
    if epoch == current.epoch:
        return Verdict.SAME
    tolerance = settings.future_tolerance_s
    if _later(current, epoch, received_at, tolerance, stamped_at, offset_s):
        return Verdict.LATER
    if received_at - current.heard_at >= settings.takeover_s:
        return Verdict.LATER
    return Verdict.EARLIER


def _later(
    current: Instance,
    epoch: int,
    received_at: float,
    tolerance_s: float,
    stamped_at: float | None,
    offset_s: float | None,
) -> bool:
    if epoch == 0:
        return False
    if current.epoch == 0:
        return True
    began = epoch / _NS
    # The stamp matters for a late message: its epoch, taken at its start, may no longer
    # look ahead by the time it arrives, while its stamp, taken at sending, still does.
    stamp_ahead = stamped_at is not None and stamped_at > received_at + tolerance_s
    if began <= received_at + tolerance_s and not stamp_ahead:
        return began > current.since
    ahead = current.epoch / _NS > current.since + tolerance_s
    if offset_s is not None and offset_s > tolerance_s:
        ahead = True
    return ahead and epoch > current.epoch


def heard(current: Instance, received_at: float) -> Instance:
    """`current` after an applied message of it."""
    if received_at <= current.heard_at:
        return current
    return replace(current, heard_at=received_at)


def trusted(stamped_at: float, received_at: float) -> float:
    """An agent's timestamp as far as it can be trusted: never after it was received."""
    return stamped_at if stamped_at <= received_at else received_at


class Order(enum.Enum):
    """One message against the stored one of its kind, both of the followed instance."""

    NEWER = "newer"
    DUPLICATE = "duplicate"  # the stored one again
    OLDER = "older"


def order_seq(
    seq: int,
    at: float,
    received_at: float,
    stored_seq: int,
    stored_at: float,
    stored_received_at: float,
    *,
    legacy: bool,
) -> Order:
    """A snapshot or counter batch against the stored one of the same epoch: seq decides.
    `legacy` (epoch 0, agents older than epochs: no restart can be told from seq alone):
    a higher seq or a later collection, each collection time trusted only up to its
    arrival (`trusted`), so a clock once ahead cannot hold a restarted agent's seq 1 off."""
    if (seq, at) == (stored_seq, stored_at):
        return Order.DUPLICATE
    if seq > stored_seq:
        return Order.NEWER
    if legacy and trusted(at, received_at) > trusted(stored_at, stored_received_at):
        return Order.NEWER
    return Order.OLDER


def order_observed(
    observed_at: float, received_at: float, stored_at: float, stored_received_at: float
) -> Order:
    """A device-plugin status (no seq) against the stored one of the same epoch: the later
    observation, each trusted only up to its arrival."""
    if observed_at == stored_at:
        return Order.DUPLICATE
    now = (trusted(observed_at, received_at), observed_at)
    if now > (trusted(stored_at, stored_received_at), stored_at):
        return Order.NEWER
    return Order.OLDER
