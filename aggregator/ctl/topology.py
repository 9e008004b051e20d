"""`nicfleetctl topology NODE`: the node's GPU × NIC matrix, as `nvidia-smi topo -m` draws it.

`build_matrix` (pure) turns a snapshot's `gpu_nic_topology` into rows with each GPU's best
NIC — `bestnic`'s choice, the one the status page marks; `render_matrix` draws it with
relations coloured (PIX/PXB green, PHB/NODE yellow, SYS red), NICs without an ACTIVE port
marked DOWN, plain when piped. GPUs are GPU0… (nvidia-smi's numbering) with their PCI
address, the name findings use.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final

import click
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from aggregator.ctl.bestnic import best_nics, nic_states, relation_rank
from aggregator.ctl.client import parse_detail
from aggregator.rules.fleetfacts import DEFAULT_MAX_RELATION
from proto.ibta import ACTIVE_STATES
from proto.inventory import Device, NodeSnapshot

NONE: Final = "-"
BEST_MARK: Final = "*"
RELATION_STYLE: Final = {
    "X": "bold green",
    "PIX": "green",
    "PXB": "green",
    "PHB": "yellow",
    "NODE": "yellow",
    "SYS": "red",
}
LEGEND: Final = (
    ("PIX", "at most a single PCIe bridge (same PCIe switch: GPUDirect RDMA)"),
    ("PXB", "multiple PCIe bridges, no host bridge (GPUDirect RDMA)"),
    ("PHB", "through a PCIe host bridge (the CPU)"),
    ("NODE", "between PCIe host bridges within a NUMA node"),
    ("SYS", "across the NUMA interconnect (QPI/UPI): the slowest path"),
)


@dataclass(frozen=True)
class NicColumn:
    name: str
    pci_address: str | None
    numa_node: int | None
    link_layer: str | None
    port_state: str  # ACTIVE when a port is; else the first port's state (DOWN, INIT, ...)
    active: bool  # a port is ACTIVE: only such a NIC can be a GPU's best


@dataclass(frozen=True)
class GpuRow:
    label: str  # GPU0, GPU1, … in PCI address order, as nvidia-smi numbers them
    pci_address: str
    numa_node: int | None
    relations: dict[str, str]  # NIC name -> relation
    best_nic: str | None
    best_relation: str | None


@dataclass(frozen=True)
class Matrix:
    node: str
    nics: tuple[NicColumn, ...]
    gpus: tuple[GpuRow, ...]
    max_relation: str = DEFAULT_MAX_RELATION

    def to_builtins(self) -> dict[str, Any]:
        return asdict(self)


def build_matrix(snapshot: NodeSnapshot) -> Matrix:
    """Rows per GPU (PCI order), columns per RDMA device that has a relation to any GPU."""
    related = {r.nic for r in snapshot.gpu_nic_topology}
    states = nic_states(snapshot.devices)
    nics = tuple(
        NicColumn(
            name=d.name,
            pci_address=d.pci_address,
            numa_node=d.numa_node,
            link_layer=d.ports[0].link_layer if d.ports else None,
            port_state=_port_state(d),
            active=states[d.name].active,
        )
        for d in snapshot.devices
        if d.name in related
    )
    known = {n.name for n in nics}
    nics += tuple(
        NicColumn(n, None, None, None, port_state="unknown", active=False)
        for n in sorted(related - known)
    )
    by_gpu: dict[str, dict[str, str]] = {}
    for r in snapshot.gpu_nic_topology:
        by_gpu.setdefault(r.gpu, {})[r.nic] = r.relation
    best = best_nics(snapshot)
    rows = []
    for index, gpu in enumerate(sorted(snapshot.gpus, key=lambda g: g.pci_address)):
        choice = best.get(gpu.pci_address)
        rows.append(
            GpuRow(
                label=f"GPU{index}",
                pci_address=gpu.pci_address,
                numa_node=gpu.numa_node,
                relations=by_gpu.get(gpu.pci_address, {}),
                best_nic=choice.nic if choice else None,
                best_relation=choice.relation if choice else None,
            )
        )
    return Matrix(node=snapshot.node, nics=nics, gpus=tuple(rows))


def _port_state(device: Device) -> str:
    states = [p.state for p in device.ports]
    active = next((s for s in states if s in ACTIVE_STATES), None)
    return active or (states[0] if states else "no port")


def render_matrix(console: Console, matrix: Matrix, *, wide: bool = False) -> None:
    """The matrix, one row per GPU; a PORT row marks NICs that are down, `*` each GPU's
    best NIC, then a legend."""
    if not matrix.gpus or not matrix.nics:
        what = "no GPUs" if not matrix.gpus else "no GPU-NIC relations (no RDMA device)"
        console.print(Text(f"{matrix.node}: {what} in the latest snapshot."))
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("")
    table.add_column("PCI", no_wrap=True)
    for nic in matrix.nics:
        table.add_column(nic.name, justify="left", no_wrap=True)
    table.add_column("NUMA")
    table.add_column("BEST-NIC", no_wrap=True)
    info = [("PORT", [n.port_state for n in matrix.nics])]
    if wide:
        info += [
            ("PCI", [n.pci_address or NONE for n in matrix.nics]),
            ("NUMA", [_opt(n.numa_node) for n in matrix.nics]),
            ("LINK", [n.link_layer or NONE for n in matrix.nics]),
        ]
    for label, values in info:
        cells = [
            Text(v, style="dim" if n.active or label != "PORT" else "bold red")
            for n, v in zip(matrix.nics, values, strict=True)
        ]
        table.add_row(Text(label, style="dim"), Text(""), *cells, Text(""), Text(""))
    limit = relation_rank(matrix.max_relation)
    for row in matrix.gpus:
        cells = [Text(row.label, style="bold"), Text(row.pci_address)]
        for nic in matrix.nics:
            relation = row.relations.get(nic.name)
            if relation is None:
                cells.append(Text(NONE))
                continue
            best = nic.name == row.best_nic
            style = RELATION_STYLE.get(relation, "") if nic.active else "dim"
            cells.append(
                Text(relation + (BEST_MARK if best else ""),
                     style=style + (" bold underline" if best else ""))
            )  # fmt: skip
        cells.append(Text(_opt(row.numa_node)))
        if row.best_nic is None or row.best_relation is None:
            none = "none up" if row.relations else NONE
            cells.append(Text(none, style="red"))
        else:
            ok = relation_rank(row.best_relation) <= limit
            cells.append(Text(f"{row.best_nic} ({row.best_relation})", style="" if ok else "red"))
        table.add_row(*cells)
    console.print(table)
    console.print()
    console.print(_legend(matrix))


def _legend(matrix: Matrix) -> Group:
    lines = [
        Text(
            f"{BEST_MARK} the GPU's best NIC: the closest with an ACTIVE port, then the "
            "fastest port, then the name (the status page marks the same); BEST-NIC in red "
            f"when worse than {matrix.max_relation}, `none up` when every related NIC is down"
        ),
        Text("PORT: ACTIVE, or the state of a NIC that is down (never a best NIC)"),
    ]
    for relation, meaning in LEGEND:
        lines.append(Text.assemble("  ", (f"{relation:<5}", RELATION_STYLE[relation]), meaning))
    return Group(*lines)


def _opt(value: int | None) -> str:
    return NONE if value is None else str(value)


def snapshot_of(body: dict[str, Any], node: str) -> NodeSnapshot:
    """The snapshot in a /api/v1/nodes/{node} answer, or a readable error without one."""
    detail = parse_detail(body)
    if detail.snapshot is None:
        raise click.ClickException(
            f"node {node!r} has sent no snapshot yet (state {detail.summary.state}); "
            "is its agent running? See `nicfleetctl node " + node + "`"
        )
    return detail.snapshot
