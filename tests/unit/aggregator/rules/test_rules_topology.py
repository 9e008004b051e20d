"""Table tests of the topology rules: each fires on its cause, stays quiet without it, and
resolves when the cause goes (the same node re-evaluated after the fix)."""

from __future__ import annotations

import pytest

from proto.inventory import IommuGroup, Pcie, Platform
from tests.support.rules_cases import Scenario, adapter, fleet_of, gpu, hits, node, policy_doc

G0 = "0000:18:00.0"
BRIDGE = "0000:17:00.0"
PEER = Platform(peermem=True)


def _iommu(kind: str) -> Platform:
    groups = tuple(
        IommuGroup(pci_address=address, group=str(n), type=kind)
        for n, address in enumerate(("0000:19:00.0", G0))
    )
    return Platform(peermem=True, iommu=True, iommu_groups=groups)


def _affinity(relation: str) -> Scenario:
    return fleet_of(node("n1", adapter(), gpus=(gpu(G0),), topo=((G0, "mlx5_0", relation),)))  # type: ignore[arg-type]


FIRES_AND_RESOLVES = [
    pytest.param("gpu-nic-affinity", _affinity("PHB"), _affinity("PIX"), {("n1", G0)},
                 id="gpu-nic-affinity-phb"),
    pytest.param("gpu-nic-affinity", _affinity("SYS"), _affinity("PXB"), {("n1", G0)},
                 id="gpu-nic-affinity-sys"),
    pytest.param(
        "pcie-degraded",
        fleet_of(node("n1", adapter(pcie=Pcie(current_speed_gts=16.0, current_width=16,
                                              max_speed_gts=32.0, max_width=16)))),
        fleet_of(node("n1", adapter(pcie=Pcie(current_speed_gts=32.0, current_width=16,
                                              max_speed_gts=32.0, max_width=16)))),
        {("n1", "mlx5_0")}, id="pcie-degraded-speed"),
    pytest.param(
        "pcie-degraded",
        fleet_of(node("n1", adapter(pcie=Pcie(current_speed_gts=32.0, current_width=8,
                                              max_speed_gts=32.0, max_width=16, degraded=True)))),
        fleet_of(node("n1", adapter(pcie=Pcie(current_speed_gts=32.0, current_width=16,
                                              max_speed_gts=32.0, max_width=16)))),
        {("n1", "mlx5_0")}, id="pcie-degraded-width"),
    pytest.param(
        "acs-enabled",
        fleet_of(node("n1", platform=Platform(peermem=True, acs_enabled_bridges=(BRIDGE,)))),
        fleet_of(node("n1", platform=PEER)),
        {("n1", BRIDGE)}, id="acs-enabled"),
    pytest.param(
        "peermem-missing",
        fleet_of(node("n1", gpus=(gpu(G0),), platform=Platform(peermem=False))),
        fleet_of(node("n1", gpus=(gpu(G0),), platform=PEER)),
        {("n1", "nvidia_peermem")}, id="peermem-missing-gpus-and-rdma"),
    pytest.param(
        "iommu-translated",
        fleet_of(node("n1", gpus=(gpu(G0),), platform=_iommu("DMA-FQ"))),
        fleet_of(node("n1", gpus=(gpu(G0),), platform=_iommu("identity"))),
        {("n1", "iommu")}, id="iommu-translated-then-iommu-pt"),
    pytest.param(
        "iommu-translated",
        fleet_of(node("n1", gpus=(gpu(G0),), platform=_iommu("DMA"))),
        fleet_of(node("n1", gpus=(gpu(G0),), platform=Platform(peermem=True, iommu=False))),
        {("n1", "iommu")}, id="iommu-translated-then-off"),
    pytest.param(
        "numa-unknown",
        fleet_of(node("n1", adapter(numa=None), gpus=(gpu(G0, numa=1),))),
        fleet_of(node("n1", adapter(numa=0), gpus=(gpu(G0, numa=1),))),
        {("n1", "mlx5_0")}, id="numa-unknown-multi-socket"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "bad", "fixed", "expected"), FIRES_AND_RESOLVES)
def test_fires_then_resolves(
    rule: str, bad: Scenario, fixed: Scenario, expected: set[tuple[str, str]]
) -> None:
    assert hits(rule, bad) == expected
    assert hits(rule, fixed) == set()


DOES_NOT_FIRE = [
    pytest.param("gpu-nic-affinity", fleet_of(
        node("n1", gpus=(gpu(G0),), topo=((G0, "mlx5_0", "PHB"),)),
        policies=policy_doc(expect={"maxGpuNicRelation": "PHB"})), id="affinity-policy-allows-phb"),
    pytest.param("gpu-nic-affinity", fleet_of(node("n1", gpus=(gpu(G0),))),
                 id="affinity-no-topology-rows"),
    pytest.param("pcie-degraded", fleet_of(node("n1", adapter(pcie=None))), id="pcie-unknown"),
    pytest.param("peermem-missing", fleet_of(node("n1", platform=Platform(peermem=False))),
                 id="peermem-no-gpus"),
    pytest.param("peermem-missing", fleet_of(
        node("n1", gpus=(gpu(G0),), platform=Platform(peermem=False)),
        policies=policy_doc(expect={"gpuDirect": False})), id="peermem-gpudirect-off"),
    pytest.param("iommu-translated", fleet_of(node("n1", platform=_iommu("DMA-FQ"))),
                 id="iommu-no-gpus"),
    pytest.param("iommu-translated", fleet_of(node("n1", gpus=(gpu(G0),),
                 platform=Platform(peermem=True, iommu=True))), id="iommu-mode-unknown"),
    pytest.param("numa-unknown", fleet_of(node("n1", adapter(numa=None), gpus=(gpu(G0, None),))),
                 id="numa-single-socket"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "scenario"), DOES_NOT_FIRE)
def test_does_not_fire(rule: str, scenario: Scenario) -> None:
    assert hits(rule, scenario) == set()


def test_affinity_with_policy_limit_node_fires_on_sys() -> None:
    scenario = fleet_of(
        node("n1", gpus=(gpu(G0),), topo=((G0, "mlx5_0", "SYS"),)),
        policies=policy_doc(expect={"maxGpuNicRelation": "NODE"}),
    )
    (finding,) = [f for f in scenario.findings() if f.rule == "gpu-nic-affinity"]
    assert finding.evidence == {
        "best_nic": "mlx5_0", "relation": "SYS", "max_relation": "NODE", "gpu_numa_node": 0,
    }  # fmt: skip


def test_peermem_is_critical_when_policy_requires_gpudirect() -> None:
    scenario = fleet_of(
        node("n1", gpus=(gpu(G0),), platform=Platform(peermem=False)),
        policies=policy_doc(expect={"gpuDirect": True}),
    )
    (finding,) = [f for f in scenario.findings() if f.rule == "peermem-missing"]
    assert finding.severity == "critical"
