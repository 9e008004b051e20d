"""Pure GetPreferredAllocation: which adapters of an exclusive resource belong together.

Adapters are ranked by their PCIe relation (nvidia-smi's X < PIX < PXB < PHB < NODE < SYS,
from agent.host.topology): adapters on one PCIe switch first, then one NUMA node. Shared
resources have interchangeable IDs, so any valid choice is as good as another. No I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Final

from agent.deviceplugin.plan import Adapter, InvalidRequest, ResourcePlan, validate_ids
from agent.host.topology import Relation, classify_relation

_RANK: Final = {r: i for i, r in enumerate(Relation)}
_UNKNOWN: Final = _RANK[Relation.SYS]


def relation_rank(a: Adapter, b: Adapter) -> int:
    """0 for the adapter itself up to SYS; NUMA alone decides when a chain is unknown."""
    return _rank(a.name, a.chain, a.numa_node, b.name, b.chain, b.numa_node)


@functools.lru_cache(maxsize=4096)
def _rank(
    a: str, a_chain: tuple[str, ...], a_numa: int | None,
    b: str, b_chain: tuple[str, ...], b_numa: int | None,
) -> int:  # fmt: skip
    # Cached: a node's adapters are few and fixed, and kubelet asks on every pod admission.
    if a == b:
        return _RANK[Relation.X]
    if a_chain and b_chain:
        try:
            return _RANK[classify_relation(a_chain, b_chain, a_numa, b_numa)]
        except ValueError:
            pass
    same_numa = a_numa is not None and a_numa >= 0 and a_numa == b_numa
    return _RANK[Relation.NODE] if same_numa else _UNKNOWN


def preferred_allocation(
    plan: ResourcePlan, available: Sequence[str], must_include: Sequence[str], size: int
) -> tuple[str, ...]:
    """`size` IDs from `available` that include `must_include`, packed by topology."""
    if size < 1:
        raise InvalidRequest(f"GetPreferredAllocation: allocation_size {size} must be >= 1")
    validate_ids(plan, available, what="GetPreferredAllocation available_deviceIDs")
    if must_include:
        validate_ids(plan, must_include, what="GetPreferredAllocation must_include_deviceIDs")
    if len(must_include) > size:
        raise InvalidRequest(
            f"GetPreferredAllocation: {len(must_include)} must-include devices for "
            f"allocation_size {size}"
        )
    chosen = list(must_include)
    pool = [i for i in available if i not in chosen]
    if size > len(chosen) + len(pool):
        raise InvalidRequest(
            f"GetPreferredAllocation: allocation_size {size} exceeds the "
            f"{len(chosen) + len(pool)} available devices"
        )
    if not plan.exclusive:
        return (*chosen, *sorted(pool, key=_slot_key)[: size - len(chosen)])
    rank = _rank_matrix(plan, [*chosen, *pool])
    if not chosen:
        chosen = [_best_seed(pool, size, rank)]
    return tuple(_grow(chosen, pool, size, rank))


Ranks = dict[tuple[str, str], int]


def _slot_key(device_id: str) -> tuple[int, str]:
    return (int(device_id), "") if device_id.isdigit() else (1 << 62, device_id)


def _rank_matrix(plan: ResourcePlan, ids: Sequence[str]) -> Ranks:
    adapter_of = {a.name: a for a in plan.adapters}
    adapters = {i: adapter_of[plan.by_id[i].adapters[0]] for i in ids}
    return {(a, b): relation_rank(adapters[a], adapters[b]) for a in ids for b in ids}


def _grow(chosen: list[str], pool: Sequence[str], size: int, rank: Ranks) -> list[str]:
    """Greedy: repeatedly add the pool member closest to anything already chosen."""
    group = list(chosen)
    closeness = {c: min(rank[c, x] for x in group) for c in pool if c not in group}
    order = {c: i for i, c in enumerate(pool)}
    while len(group) < size and closeness:
        best = min(closeness, key=lambda c: (closeness[c], order[c]))
        group.append(best)
        del closeness[best]
        for c in closeness:
            closeness[c] = min(closeness[c], rank[c, best])
    return group


def _best_seed(pool: Sequence[str], size: int, rank: Ranks) -> str:
    """The start that grows into the tightest group. Seeds whose relations to the pool are
    the same multiset (symmetric positions: two NICs of one switch) are tried once."""
    best: tuple[tuple[int, int], int, str] | None = None
    tried: set[tuple[int, ...]] = set()
    for index, seed in enumerate(pool):
        profile = tuple(sorted(rank[seed, other] for other in pool))
        if profile in tried:
            continue
        tried.add(profile)
        candidate = (_cost(_grow([seed], pool, size, rank), rank), index, seed)
        if best is None or candidate < best:
            best = candidate
    assert best is not None  # pool is never empty here
    return best[2]


def _cost(group: Sequence[str], rank: Ranks) -> tuple[int, int]:
    """Worst relation inside the group first, then the sum of all pairs."""
    ranks = [rank[a, b] for i, a in enumerate(group) for b in group[i + 1 :]]
    return (max(ranks, default=0), sum(ranks))
