"""Which aggregator replica holds which partition of the node subjects (docs/scaling.md).

Pure. nats-server maps `nicfleet.v1.node.<token>.<kind>` to partition
FNV-1a-32(token) mod P; replicas that are alive (fresh heartbeat) split the P partitions
by rendezvous hashing, so a replica joining or dying moves only its own share.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from proto.subjects import partition_of

__all__ = ["ShardSettings", "live_replicas", "owner", "partition_of", "plan"]


@dataclass(frozen=True, kw_only=True)
class ShardSettings:
    partitions: int = 0  # 0: not sharded (one aggregator takes every node subject)
    heartbeat_s: float = 1.0  # a replica re-announces itself (and its summary) this often
    ttl_s: float = 6.0  # a replica not heard from for this long is dead
    replicas: int = 1  # copies of the `nicfleet-shards` bucket (`--kv-replicas`)
    # The API URL peers forward node requests to; None: the bound address (with a wildcard
    # listen address, this host's address instead).
    advertise_url: str | None = None

    def __post_init__(self) -> None:
        if self.partitions < 0:
            raise ValueError(f"partitions must be >= 0, got {self.partitions}")
        if self.heartbeat_s <= 0 or self.ttl_s <= self.heartbeat_s:
            raise ValueError("shard ttl_s must be longer than heartbeat_s (both > 0)")


def _weight(replica: str, partition: int) -> bytes:
    return hashlib.blake2b(f"{replica}/{partition}".encode(), digest_size=8).digest()


def owner(partition: int, replicas: Iterable[str]) -> str | None:
    """The live replica with the highest rendezvous weight for `partition`."""
    best: tuple[bytes, str] | None = None
    for replica in replicas:
        candidate = (_weight(replica, partition), replica)
        if best is None or candidate > best:
            best = candidate
    return best[1] if best is not None else None


def plan(partitions: int, replicas: Iterable[str]) -> dict[str, frozenset[int]]:
    """Replica -> the partitions it should hold (every live replica listed, maybe empty)."""
    live = sorted(set(replicas))
    held: dict[str, set[int]] = {replica: set() for replica in live}
    for partition in range(partitions):
        chosen = owner(partition, live)
        if chosen is not None:
            held[chosen].add(partition)
    return {replica: frozenset(parts) for replica, parts in held.items()}


def live_replicas(heartbeats: Mapping[str, float], now: float, ttl_s: float) -> frozenset[str]:
    """Replicas whose last heartbeat (replica -> sent at) is younger than `ttl_s`."""
    return frozenset(r for r, at in heartbeats.items() if now - at < ttl_s)
