"""The built-in lab nodes through every rule: exactly the findings docs/rules.md lists for
each (rendered tree -> agent snapshot -> fleet -> evaluate), and lab faults that add one."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab import faults
from agent.lab.render import render
from agent.lab.spec import load_builtin
from aggregator.fleet.state import Fleet
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.finding import Finding
from proto.inventory import NodeSnapshot

T0 = 1_800_000_000.0
Row = tuple[str, str, str | None, str]  # severity, rule, node, subject


def _snapshot(root: Path, name: str, now: float = T0) -> NodeSnapshot:
    return collect_snapshot(Sysfs(root), node=name, seq=1, now=now, agent_version="t")


def _rendered(tmp: Path, spec: str) -> Path:
    root = tmp / spec
    render(load_builtin(spec), root)
    return root


def _evaluate(*snaps: NodeSnapshot) -> list[Finding]:
    fleet = Fleet()
    for snap in snaps:
        fleet.apply_snapshot(snap, received_at=snap.collected_at)
    return evaluate(fleet.view(), (), now=max(s.collected_at for s in snaps))


def _rows(findings: list[Finding]) -> list[Row]:
    return [(f.severity, f.rule, f.node, f.subject) for f in findings]


EXPECTED: dict[str, list[Row]] = {
    # The two ConnectX-6 Dx Ethernet ports on socket 0 are down, as captured.
    "h100-ib-12nic": [
        ("critical", "port-down", "h100-ib-12nic", "mlx5_1/1"),
        ("critical", "port-down", "h100-ib-12nic", "mlx5_2/1"),
    ],
    # GPU1 (socket 1) reaches its NICs only through the host bridge.
    "roce-cx6dx": [
        ("warning", "gpu-nic-affinity", "roce-cx6dx", "0000:cb:00.0"),
    ],
    # ACS redirect on socket 0's switch downstream ports, IOMMU on with GPUs + RDMA.
    "h100-iommu-acs": [
        ("warning", "acs-enabled", "h100-iommu-acs", "0000:17:00.0"),
        ("warning", "acs-enabled", "h100-iommu-acs", "0000:17:01.0"),
        ("warning", "iommu-translated", "h100-iommu-acs", "iommu"),
    ],
    # Both GPUs on socket 0, the only NIC on socket 1; no peer memory; 9000 vs 1500 MTU.
    "roce-cx6dx-2": [
        ("warning", "gpu-nic-affinity", "roce-cx6dx-2", "0000:3b:00.0"),
        ("warning", "gpu-nic-affinity", "roce-cx6dx-2", "0000:3c:00.0"),
        ("warning", "mtu-mismatch", "roce-cx6dx-2", "mlx5_0/1"),
        ("warning", "mtu-mismatch", "roce-cx6dx-2", "mlx5_1/1"),
        ("warning", "peermem-missing", "roce-cx6dx-2", "nvidia_peermem"),
    ],
    "a100-ib-4nic": [],
}


@pytest.mark.parametrize("spec", sorted(EXPECTED))
def test_lab_node_has_exactly_the_documented_findings(tmp_path: Path, spec: str) -> None:
    snap = _snapshot(_rendered(tmp_path, spec), spec)
    assert _rows(_evaluate(snap)) == EXPECTED[spec]


def test_two_roce_nodes_together(tmp_path: Path) -> None:
    one = _snapshot(_rendered(tmp_path, "roce-cx6dx"), "roce-cx6dx")
    two = _snapshot(_rendered(tmp_path, "roce-cx6dx-2"), "roce-cx6dx-2")
    assert _rows(_evaluate(one, two)) == [
        # 22.39.1002 on 4 of the 6 ConnectX-6 Dx: one fleet-wide story, two odd adapters.
        ("warning", "fw-skew", None, "ConnectX-6 Dx/MT_0000000359"),
        ("warning", "gpu-nic-affinity", "roce-cx6dx", "0000:cb:00.0"),
        ("warning", "fw-skew", "roce-cx6dx-2", "mlx5_0"),
        ("warning", "fw-skew", "roce-cx6dx-2", "mlx5_1"),
        ("warning", "gpu-nic-affinity", "roce-cx6dx-2", "0000:3b:00.0"),
        ("warning", "gpu-nic-affinity", "roce-cx6dx-2", "0000:3c:00.0"),
        # The fleet's RoCE fabric runs 9000 (5 of 6 ports): only the 1500 one is wrong now.
        ("warning", "mtu-mismatch", "roce-cx6dx-2", "mlx5_1/1"),
        ("warning", "peermem-missing", "roce-cx6dx-2", "nvidia_peermem"),
    ]


def test_faults_add_their_findings_and_bringing_the_port_up_resolves(tmp_path: Path) -> None:
    root = _rendered(tmp_path, "h100-ib-12nic")
    faults.port_down(root, "mlx5_3")
    faults.pcie_width_drop(root, "0000:4c:00.0", 8)
    rows = _rows(_evaluate(_snapshot(root, "gpu-01")))
    assert ("critical", "port-down", "gpu-01", "mlx5_3/1") in rows
    assert ("warning", "pcie-degraded", "gpu-01", "mlx5_4") in rows
    faults.port_up(root, "mlx5_3")
    rows = _rows(_evaluate(_snapshot(root, "gpu-01", now=T0 + 1)))
    assert ("critical", "port-down", "gpu-01", "mlx5_3/1") not in rows
