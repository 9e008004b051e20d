"""`nicfleetctl topology NODE`: the node's GPU × NIC matrix, as `nvidia-smi topo -m` draws it.

`build_matrix` (pure) turns a snapshot's `gpu_nic_topology` into rows with each GPU's best
NIC — the same choice the gpu-nic-affinity rule makes; `render_matrix` draws it with
relations coloured (PIX/PXB green, PHB/NODE yellow, SYS red), plain when piped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final

import click
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from aggregator.ctl.client import parse_detail
from aggregator.rules.fleetfacts import DEFAULT_MAX_RELATION, RELATION_ORDER
from proto.inventory import NodeSnapshot

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
    nics = tuple(
        NicColumn(
            name=d.name,
            pci_address=d.pci_address,
            numa_node=d.numa_node,
            link_layer=d.ports[0].link_layer if d.ports else None,
        )
        for d in snapshot.devices
        if d.name in related
    )
    known = {n.name for n in nics}
    nics += tuple(NicColumn(n, None, None, None) for n in sorted(related - known))
    by_gpu: dict[str, dict[str, str]] = {}
    for r in snapshot.gpu_nic_topology:
        by_gpu.setdefault(r.gpu, {})[r.nic] = r.relation
    rows = []
    for index, gpu in enumerate(sorted(snapshot.gpus, key=lambda g: g.pci_address)):
        relations = by_gpu.get(gpu.pci_address, {})
        best = min(relations.items(), key=lambda kv: (RELATION_ORDER[kv[1]], kv[0]), default=None)
        rows.append(
            GpuRow(
                label=f"GPU{index}",
                pci_address=gpu.pci_address,
                numa_node=gpu.numa_node,
                relations=relations,
                best_nic=best[0] if best else None,
                best_relation=best[1] if best else None,
            )
        )
    return Matrix(node=snapshot.node, nics=nics, gpus=tuple(rows))


def render_matrix(console: Console, matrix: Matrix, *, wide: bool = False) -> None:
    """The matrix, one row per GPU; `*` marks each GPU's best NIC, then a legend."""
    if not matrix.gpus or not matrix.nics:
        what = "no GPUs" if not matrix.gpus else "no GPU-NIC relations (no RDMA device)"
        console.print(Text(f"{matrix.node}: {what} in the latest snapshot."))
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("")
    if wide:
        table.add_column("PCI")
    for nic in matrix.nics:
        table.add_column(nic.name, justify="left", no_wrap=True)
    table.add_column("NUMA")
    table.add_column("BEST-NIC")
    if wide:
        for label, values in (
            ("PCI", [n.pci_address or NONE for n in matrix.nics]),
            ("NUMA", [_opt(n.numa_node) for n in matrix.nics]),
            ("LINK", [n.link_layer or NONE for n in matrix.nics]),
        ):
            table.add_row(
                Text(label, style="dim"), Text(""), *map(Text, values), Text(""), Text("")
            )
    limit = RELATION_ORDER[matrix.max_relation]
    for row in matrix.gpus:
        cells: list[Text] = [Text(row.label, style="bold")]
        if wide:
            cells.append(Text(row.pci_address))
        for nic in matrix.nics:
            relation = row.relations.get(nic.name)
            if relation is None:
                cells.append(Text(NONE))
                continue
            best = nic.name == row.best_nic
            cells.append(
                Text(
                    relation + (BEST_MARK if best else ""),
                    style=RELATION_STYLE.get(relation, "") + (" bold underline" if best else ""),
                )
            )
        cells.append(Text(_opt(row.numa_node)))
        if row.best_nic is None or row.best_relation is None:
            cells.append(Text(NONE, style="red"))
        else:
            ok = RELATION_ORDER[row.best_relation] <= limit
            cells.append(Text(f"{row.best_nic} ({row.best_relation})", style="" if ok else "red"))
        table.add_row(*cells)
    console.print(table)
    console.print()
    console.print(_legend(matrix))


def _legend(matrix: Matrix) -> Group:
    lines = [
        Text(
            f"{BEST_MARK} the GPU's best NIC (nearest relation, then name; what the "
            f"gpu-nic-affinity rule uses; worse than {matrix.max_relation} is flagged)"
        )
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
