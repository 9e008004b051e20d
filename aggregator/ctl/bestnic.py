"""Which NIC a GPU should use: the one definition behind `nicfleetctl topology` and the
status page's heatmap (aggregator/api/ui/topology.js `bestNics` is its twin in JavaScript;
tests/unit/aggregator/ctl/test_bestnic.py runs both on the same snapshots).

A GPU's best NIC is, among the RDMA devices related to it with at least one ACTIVE (or
ACTIVE_DEFER) port, the closest by PCIe relation (NV# < X < PIX < PXB < PHB < NODE < SYS <
anything else); ties go to the fastest ACTIVE port, then to the NIC name in code-point
order. A GPU whose related NICs are all down has none. Pure: a snapshot in, no I/O.

The gpu-nic-affinity rule judges placement instead: the nearest NIC whatever its port state
(a down port is port-down's finding), so both can name different NICs while a port is down.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from proto.ibta import ACTIVE_STATES
from proto.inventory import Device, NodeSnapshot

# nvidia-smi's order, closest first (the JS RELATIONS list, with X for the GPU itself).
RELATIONS: Final = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")
_NVLINK: Final = re.compile(r"NV\d+")


@dataclass(frozen=True)
class NicState:
    """What the choice needs of one RDMA device: is a port ACTIVE, and how fast."""

    active: bool
    rate_gbps: float  # the fastest ACTIVE port's rate; 0 when none or unknown


@dataclass(frozen=True)
class Choice:
    nic: str
    relation: str


def relation_rank(relation: str) -> int:
    """Closest first; NVLink (never between a GPU and a NIC) before X, unknown tokens last."""
    if _NVLINK.fullmatch(relation):
        return -1
    return RELATIONS.index(relation) if relation in RELATIONS else len(RELATIONS)


def nic_states(devices: Iterable[Device]) -> dict[str, NicState]:
    states = {}
    for device in devices:
        active = [p for p in device.ports if p.state in ACTIVE_STATES]
        rates = [p.rate_gbps for p in active if p.rate_gbps is not None]
        states[device.name] = NicState(active=bool(active), rate_gbps=max(rates, default=0.0))
    return states


def best_nic(relations: Mapping[str, str], states: Mapping[str, NicState]) -> Choice | None:
    """The best of one GPU's `relations` (NIC name -> relation), or None when no related
    NIC has an ACTIVE port. A NIC missing from `states` counts as down."""
    up = [
        (relation_rank(relation), -states[nic].rate_gbps, nic, relation)
        for nic, relation in relations.items()
        if nic in states and states[nic].active
    ]
    if not up:
        return None
    *_, nic, relation = min(up)
    return Choice(nic, relation)


def best_nics(snapshot: NodeSnapshot) -> dict[str, Choice | None]:
    """GPU PCI address -> its best NIC, for every GPU with at least one relation."""
    by_gpu: dict[str, dict[str, str]] = {}
    for r in snapshot.gpu_nic_topology:
        by_gpu.setdefault(r.gpu, {})[r.nic] = r.relation
    states = nic_states(snapshot.devices)
    return {gpu: best_nic(relations, states) for gpu, relations in by_gpu.items()}
