"""The `ip-pool` link: the IPAM of every NetworkAttachmentDefinition the chain uses still has
an address for a pod on the node — NV-IPAM IPPool/CIDRPool per-node blocks (of the pools
whose nodeSelector selects the node), whereabouts ranges and Fast-IPAM node slices — before
pods fail with "no free IP"; host-local is reported as not observable.

Pure: the counting is `aggregator.podnetworks` (shared with the `ip-pool-*` rules). NV-IPAM
keeps a node's reservations on the node: "used" is a lower bound, the block's addresses in
the network-status of every unfinished pod on the node (evidence `counted`).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from aggregator import podnetworks
from aggregator.trace.attachment import chain_pods
from aggregator.trace.host import ChainContext, link_broken, link_ok, link_unknown
from proto.http import Link

IP_POOL_LINK: Final = "ip-pool"


def ip_pool_link(ctx: ChainContext) -> Link:
    name = IP_POOL_LINK
    if not ctx.cluster.present:
        return link_unknown(name, cluster="no cluster")
    uses = podnetworks.nad_uses(ctx.resource, chain_pods(ctx), ctx.cluster)
    nads = [u.attachment for u in uses if u.attachment is not None]
    if not nads:
        return link_unknown(name, reason="no NetworkAttachmentDefinition in the chain")
    pools = [p for nad in nads for p in podnetworks.pool_uses(nad, ctx.node, ctx.cluster)]
    evidence: dict[str, Any] = {
        "pools": [
            {k: v for k, v in msgspec.structs.asdict(p).items() if v not in (None, "")}
            for p in pools
        ]
    }
    for pool in pools:
        if pool.state == "missing":
            return link_broken(
                name,
                f"NetworkAttachmentDefinition {pool.nad}: {pool.detail}; its pods cannot "
                "get an address",
                "create the pool (NV-IPAM IPPool/CIDRPool in the NV-IPAM namespace) or fix "
                "the NAD's ipam section",
                **evidence,
            )
        if pool.state in podnetworks.NO_ADDRESS_STATES:
            return link_broken(
                name,
                f"{pool.detail}: the next pod of {pool.nad} here gets no address",
                _REMEDY[pool.state],
                **evidence,
            )
        if pool.state == "exhausted":
            where = f"block {pool.block} of {ctx.node}" if pool.block else "the range"
            return link_broken(
                name,
                f"{pool.pool or pool.nad}: {where} has 0 of {pool.capacity} addresses free: "
                f'the next pod of {pool.nad} here fails with "no free IP"',
                _REMEDY["exhausted"],
                **evidence,
            )
    if all(p.state == "not-observable" for p in pools):
        return link_unknown(name, reason="; ".join(sorted({p.detail for p in pools})), **evidence)
    return link_ok(name, **evidence)


_REMEDY: Final = {
    "exhausted": "enlarge the pool (perNodeBlockSize / perNodeNetworkPrefix / range / "
    "node_slice_size), free addresses (delete pods that no longer need them) or add a pool",
    "no-block": "enlarge the pool (more blocks or slices) or free a block held by a node that left",
    "not-selected": "select the node in the pool's spec.nodeSelector, or give the NAD a "
    "pool that selects it",
    "invalid": "fix the pool's configuration (or the NAD's ipam section) as the cause says",
}
