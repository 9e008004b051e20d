"""`nicfleet.v1.control.resync`: the aggregator asks agents to re-publish their state."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from proto.inventory import Base
from proto.messages import MESSAGES_VERSION

ResyncReason = Literal["start", "reconnect", "slow-consumer", "shard-takeover"]


# The longest window an agent accepts for spreading its answer (docs/wire.md, "Resync").
MAX_RESYNC_SPREAD_S = 300.0


class ResyncRequest(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.ResyncRequest"
):
    """The aggregator may have missed messages: every agent re-publishes its state once.

    Broadcast on `nicfleet.v1.control.resync`. `spread_s` widens the agents' random delay
    for large fleets (the agent's own `resync_jitter_s` is the minimum).
    """

    version: int = MESSAGES_VERSION
    reason: str = "reconnect"  # ResyncReason; a plain string so new reasons still decode
    spread_s: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_RESYNC_SPREAD_S)] = 0.0
    requested_at: float
    # Scoped (sharded takeover, docs/scaling.md): only agents whose node is in one of
    # `partitions` of `partition_count` (proto.subjects.partition_of) answer; 0: every agent.
    # Agents that predate these fields ignore them and answer, as for a broadcast.
    partition_count: Annotated[int, msgspec.Meta(ge=0)] = 0
    partitions: tuple[int, ...] = ()
