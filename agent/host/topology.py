"""GPU<->NIC placement: the PCIe relation `nvidia-smi topo -m` prints, and a parser for it.

Pure: classifies PCI address chains and parses text; no I/O, no sysfs. A chain is the
device's position from the root complex down: `(host bridge, bridges..., device)`, e.g.
`("pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:01.0", "0000:19:00.0")` — the
sysfs directory names between /sys/devices and the device (PciFunction.path + address,
with the host bridge first).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum


class Relation(StrEnum):
    """Closest first. Values are nvidia-smi's legend tokens."""

    X = "X"  # the device itself
    PIX = "PIX"  # at most one PCIe bridge (one switch) between them
    PXB = "PXB"  # several bridges, without the host bridge
    PHB = "PHB"  # through the host bridge (same root complex, different root ports)
    NODE = "NODE"  # between host bridges of one NUMA node
    SYS = "SYS"  # across the inter-socket link (or NUMA unknown)


_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}\Z")
_LABEL = re.compile(r"^(GPU\d+|NIC\d+|[A-Za-z][A-Za-z0-9]*_\d+)$")  # old nvidia-smi: mlx5_0
_CELL = re.compile(r"^(X|PIX|PXB|PHB|NODE|SYS|SOC|NV\d+)$")  # SOC: pre-2017 name of SYS
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")


def classify_relation(
    a_path: Sequence[str], b_path: Sequence[str], a_numa: int | None, b_numa: int | None
) -> Relation:
    """How the PCIe path between two devices runs. NUMA (None or -1 = unknown) only
    matters across host bridges; unknown there is SYS, since locality cannot be shown."""
    for path in (a_path, b_path):
        if len(path) < 2 or not _HOST_BRIDGE.match(path[0]):
            raise ValueError(f"not a PCI chain (host bridge, bridges..., device): {path!r}")
    if tuple(a_path) == tuple(b_path):
        return Relation.X
    if a_path[0] != b_path[0]:
        known = a_numa is not None and a_numa >= 0
        return Relation.NODE if known and a_numa == b_numa else Relation.SYS
    a_bridges, b_bridges = a_path[1:-1], b_path[1:-1]
    common = 0
    for a, b in zip(a_bridges, b_bridges, strict=False):
        if a != b:
            break
        common += 1
    if common == 0:  # they part right at the root complex: different root ports
        return Relation.PHB
    # Bridges on the way: the deepest shared one and everything below it on both sides.
    switches = {_switch_of(a_bridges, i) for i in range(common - 1, len(a_bridges))}
    switches |= {_switch_of(b_bridges, i) for i in range(common - 1, len(b_bridges))}
    return Relation.PIX if len(switches) <= 1 else Relation.PXB


def path_bridges(a_path: Sequence[str], b_path: Sequence[str]) -> tuple[str, ...]:
    """The bridges peer-to-peer traffic between two devices crosses below the root
    complex: the deepest bridge they share, then every bridge down to each of them.

    Empty when they meet only at the root complex or beyond (PHB, NODE, SYS): that
    traffic goes through the root complex anyway, so ACS redirect cannot reroute it.
    """
    if len(a_path) < 2 or len(b_path) < 2 or a_path[0] != b_path[0]:
        return ()
    a_bridges, b_bridges = a_path[1:-1], b_path[1:-1]
    common = 0
    for a, b in zip(a_bridges, b_bridges, strict=False):
        if a != b:
            break
        common += 1
    if common == 0:
        return ()
    return tuple(dict.fromkeys([*a_bridges[common - 1 :], *b_bridges[common:]]))


def _switch_of(bridges: Sequence[str], i: int) -> str:
    # Below a root port (index 0) every PCIe link joins a downstream port to an upstream
    # port, so the chain alternates switch upstream (odd index) / downstream (even index).
    # nvidia-smi counts a whole switch as one bridge: name it by its upstream port.
    return bridges[i if i == 0 or i % 2 == 1 else i - 1]


def parse_nic_legend(text: str) -> dict[str, str]:
    """The `NIC Legend:` block of `nvidia-smi topo -m`: {"NIC0": "mlx5_0", ...}."""
    return {m[1]: m[2] for line in text.splitlines() if (m := _NIC_LEGEND.match(line))}


def parse_topo_matrix(text: str) -> dict[tuple[str, str], str]:
    """`nvidia-smi topo -m` output -> {(row, column): cell} for the device columns.

    NICk labels are replaced by their legend names (mlx5_k) when a legend is present, so
    keys match RDMA device names; GPUs stay GPUk. Cells are kept as printed (X, NV18,
    PIX, ...). Comment lines (#), the affinity columns and the legend are skipped. A
    matrix row that is short of cells or holds an unknown token raises ValueError.
    """
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    header = next(
        (i for i, line in enumerate(lines) if line[:1].isspace() and _first_label(line)), None
    )
    if header is None:
        raise ValueError("no nvidia-smi topo header line (GPU0 GPU1 ... NIC0 ...) found")
    columns: list[str] = []
    for token in lines[header].split():
        if not _LABEL.match(token):
            break  # "CPU Affinity", "NUMA Affinity", ...
        columns.append(token)
    legend = parse_nic_legend(text)
    matrix: dict[tuple[str, str], str] = {}
    for line in lines[header + 1 :]:
        tokens = line.split()
        if not tokens or tokens[0] == "Legend:":
            break
        row, cells = tokens[0], tokens[1 : 1 + len(columns)]
        if row not in columns:
            raise ValueError(f"row {row!r} is not one of the columns {columns}")
        if len(cells) < len(columns):
            raise ValueError(f"row {row}: {len(cells)} cells for {len(columns)} columns")
        for column, cell in zip(columns, cells, strict=True):
            if not _CELL.match(cell):
                raise ValueError(f"row {row}, column {column}: unknown relation {cell!r}")
            matrix[legend.get(row, row), legend.get(column, column)] = cell
    return matrix


def _first_label(line: str) -> bool:
    tokens = line.split()
    return bool(tokens) and bool(_LABEL.match(tokens[0]))
