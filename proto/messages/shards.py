"""What one sharded aggregator replica tells the others: its votes and its summary."""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from proto.inventory import Base
from proto.messages import MESSAGES_VERSION


class ShardVote(Base, frozen=True, array_like=True):
    """Nodes of one partition casting `value` in a fleet-level rule's group (rules/peers)."""

    partition: int
    rule: str
    group: object  # str, int, None or a list of them (a tuple on the sender's side)
    value: object
    count: int


MAX_STALE_NAMES: Final = 20_000  # ~300 KB of names: well inside NATS's 1 MB max payload


class ShardSummary(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.ShardSummary"
):
    """A sharded aggregator replica's vote counts per partition it holds, on
    `nicfleet.v1.shard.<replica>.summary` (docs/scaling.md)."""

    version: int = MESSAGES_VERSION
    replica: str
    partitions: tuple[int, ...] = ()
    nodes: int = 0
    votes: tuple[ShardVote, ...] = ()
    sent_at: float
    api_url: str = ""  # the replica's HTTP API, for forwarding node requests to their holder
    # Its nodes it has heard nothing from within stale_after (sorted, at most
    # MAX_STALE_NAMES): the leader's policy status counts them as Stale.
    stale: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_STALE_NAMES)] = ()
