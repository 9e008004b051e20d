"""What a node's snapshot says about it in `nicfleet.io/*` node labels, and the GPU↔NIC
relation ranking those labels and the TopologyOK condition use.

Pure: no I/O. Written to the cluster by `aggregator.reconcile.apply`.
"""

from __future__ import annotations

from typing import Final

from proto.ibta import ACTIVE_STATES
from proto.inventory import NodeSnapshot

RELATION_ORDER: Final = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")
DEFAULT_MAX_RELATION: Final = "PXB"


def relation_rank(relation: str) -> int:
    return RELATION_ORDER.index(relation) if relation in RELATION_ORDER else len(RELATION_ORDER)


def worst_gpu_relation(snapshot: NodeSnapshot) -> tuple[str, str] | None:
    """(gpu, its best relation to any NIC) for the GPU whose best relation is the worst."""
    best: dict[str, str] = {}
    for link in snapshot.gpu_nic_topology:
        held = best.get(link.gpu)
        if held is None or relation_rank(link.relation) < relation_rank(held):
            best[link.gpu] = link.relation
    if not best:
        return None
    gpu = max(sorted(best), key=lambda g: relation_rank(best[g]))
    return gpu, best[gpu]


def node_labels(snapshot: NodeSnapshot) -> dict[str, str]:
    """The `nicfleet.io/*` labels a node carries so that workloads can select it."""
    ports = [p for d in snapshot.devices for p in d.ports]
    if not ports:
        return {}
    labels = {"nicfleet.io/rdma": "true"}
    active = [p for p in ports if p.state in ACTIVE_STATES] or ports
    layers = sorted({p.link_layer for p in active})
    labels["nicfleet.io/link-layer"] = layers[0] if len(layers) == 1 else "Mixed"
    rates = [p.rate_gbps for p in active if p.rate_gbps is not None]
    if rates:
        labels["nicfleet.io/rdma-rate-gbps"] = str(int(max(rates)))
    worst = worst_gpu_relation(snapshot)
    if worst is not None:
        labels["nicfleet.io/gpu-nic-relation"] = worst[1]
    return labels
