"""Topology rules: GPU<->NIC placement, PCIe link training, ACS, peer memory, IOMMU, NUMA.

Pure functions of the fleet view (no I/O, no clock); each returns the findings of one
rule id. Evidence carries the values read from the snapshot.
"""

from __future__ import annotations

from typing import Final

from aggregator.rules.descriptor import SNAPSHOT, Rule, RuleInput
from aggregator.rules.finding import Finding
from aggregator.rules.fleetfacts import (
    DEFAULT_MAX_RELATION,
    RELATION_ORDER,
    expectations,
    is_vf,
    snapshots,
)
from proto.inventory import GpuNicRelation, NodeSnapshot
from proto.policy import Expect


def check_gpu_nic_affinity(given: RuleInput) -> list[Finding]:
    expect = expectations(given.fleet, given.policies, given.cluster)
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        limit = expect[node].max_gpu_nic_relation or DEFAULT_MAX_RELATION
        if not snap.devices:
            continue
        by_gpu: dict[str, list[GpuNicRelation]] = {}
        for row in snap.gpu_nic_topology:
            by_gpu.setdefault(row.gpu, []).append(row)
        for gpu in snap.gpus:
            rows = by_gpu.get(gpu.pci_address, [])
            if not rows:
                continue  # no topology for this GPU: reported by data-quality
            best = min(rows, key=lambda r: (RELATION_ORDER[r.relation], r.nic))
            if RELATION_ORDER[best.relation] <= RELATION_ORDER[limit]:
                continue
            found.append(
                Finding(
                    rule="gpu-nic-affinity",
                    severity="warning",
                    node=node,
                    subject=gpu.pci_address,
                    message=f"GPU {gpu.pci_address}'s nearest RDMA adapter {best.nic} is "
                    f"{best.relation}, worse than {limit}: GPUDirect RDMA will not be used "
                    "for it; move the NIC or GPU under a common PCIe switch or relax "
                    "maxGpuNicRelation.",
                    evidence={
                        "best_nic": best.nic,
                        "relation": best.relation,
                        "max_relation": limit,
                        "gpu_numa_node": gpu.numa_node,
                    },
                )
            )
    return found


def check_pcie_degraded(given: RuleInput) -> list[Finding]:
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        for device in snap.devices:
            pcie = device.pcie
            if pcie is None:
                continue
            slow = _below(pcie.current_speed_gts, pcie.max_speed_gts)
            narrow = _below(pcie.current_width, pcie.max_width)
            if not (pcie.degraded or slow or narrow):
                continue
            found.append(
                Finding(
                    rule="pcie-degraded",
                    severity="warning",
                    node=node,
                    subject=device.name,
                    message=f"{device.name} trained its PCIe link at {pcie.current_speed_gts} "
                    f"GT/s x{pcie.current_width}, below the possible {pcie.max_speed_gts} GT/s "
                    f"x{pcie.max_width}; reseat the card or check the slot/riser and BIOS "
                    "PCIe settings.",
                    evidence={
                        "current_speed_gts": pcie.current_speed_gts,
                        "current_width": pcie.current_width,
                        "max_speed_gts": pcie.max_speed_gts,
                        "max_width": pcie.max_width,
                        "pci_address": device.pci_address,
                    },
                )
            )
    return found


def _below(current: float | None, maximum: float | None) -> bool:
    return current is not None and maximum is not None and current < maximum


def check_acs_enabled(given: RuleInput) -> list[Finding]:
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        for bridge in sorted(set(snap.platform.acs_enabled_bridges)):
            found.append(
                Finding(
                    rule="acs-enabled",
                    severity="warning",
                    node=node,
                    subject=bridge,
                    message=f"Bridge {bridge} on a GPU<->NIC path has ACS redirect enabled, so "
                    "GPUDirect peer-to-peer traffic detours through the root complex; clear it "
                    f"(setpci -s {bridge} ECAP_ACS+6.w=0, or boot with iommu=pt / the BIOS ACS "
                    "option off).",
                    evidence={"bridge": bridge, "iommu": snap.platform.iommu},
                )
            )
    return found


def _gpudirect_expected(snap: NodeSnapshot, expect: Expect) -> bool:
    if expect.gpu_direct is not None:
        return expect.gpu_direct
    nvidia = any(g.driver in (None, "nvidia") for g in snap.gpus)
    return bool(snap.gpus) and nvidia and bool(snap.devices)


def check_peermem_missing(given: RuleInput) -> list[Finding]:
    expect = expectations(given.fleet, given.policies, given.cluster)
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        if snap.platform.peermem or not _gpudirect_expected(snap, expect[node]):
            continue
        required = expect[node].gpu_direct is True
        found.append(
            Finding(
                rule="peermem-missing",
                severity="critical" if required else "warning",
                node=node,
                subject="nvidia_peermem",
                message="GPUs and RDMA adapters are present but nvidia_peermem is not loaded, "
                "so GPUDirect RDMA silently falls back to host memory; load it "
                "(modprobe nvidia_peermem) and make it persistent.",
                evidence={
                    "gpus": len(snap.gpus),
                    "rdma_devices": len(snap.devices),
                    "gpu_direct_required": required,
                },
            )
        )
    return found


def check_iommu_translated(given: RuleInput) -> list[Finding]:
    expect = expectations(given.fleet, given.policies, given.cluster)
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        if snap.platform.iommu is not True or not _gpudirect_expected(snap, expect[node]):
            continue
        found.append(
            Finding(
                rule="iommu-translated",
                severity="warning",
                node=node,
                subject="iommu",
                message="The IOMMU is enabled on a GPUDirect RDMA node: unless it runs in "
                "pass-through mode, peer-to-peer DMA is translated or blocked; boot with "
                "iommu=pt (e.g. intel_iommu=on iommu=pt) or disable the IOMMU.",
                evidence={"iommu": True, "gpus": len(snap.gpus), "rdma_devices": len(snap.devices)},
            )
        )
    return found


def check_numa_unknown(given: RuleInput) -> list[Finding]:
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        known = {d.numa_node for d in snap.devices if d.numa_node is not None}
        known |= {g.numa_node for g in snap.gpus if g.numa_node is not None}
        # Multi-socket when two NUMA nodes are seen, or any id above 0 is.
        if len(known) < 2 and not any(n > 0 for n in known):
            continue
        for device in snap.devices:
            if device.numa_node is not None or is_vf(device):
                continue
            found.append(
                Finding(
                    rule="numa-unknown",
                    severity="warning",
                    node=node,
                    subject=device.name,
                    message=f"{device.name} reports no NUMA node on a multi-socket host, so "
                    "the device plugin and NCCL cannot place work next to it; enable "
                    "ACPI SRAT/NUMA in the BIOS or fix the platform firmware.",
                    evidence={"numa_node": None, "numa_nodes_seen": len(known)},
                )
            )
    return found


RULES: Final[tuple[Rule, ...]] = (
    Rule(id="gpu-nic-affinity", family="topology", severity="warning",
         check=check_gpu_nic_affinity, reads=SNAPSHOT),
    Rule(id="pcie-degraded", family="topology", severity="warning",
         check=check_pcie_degraded, reads=SNAPSHOT, for_s=30.0),
    Rule(id="acs-enabled", family="topology", severity="warning",
         check=check_acs_enabled, reads=SNAPSHOT),
    # Escalates to critical when the policy requires GPUDirect.
    Rule(id="peermem-missing", family="topology", severity="warning",
         check=check_peermem_missing, reads=SNAPSHOT),
    Rule(id="iommu-translated", family="topology", severity="warning",
         check=check_iommu_translated, reads=SNAPSHOT),
    Rule(id="numa-unknown", family="topology", severity="warning",
         check=check_numa_unknown, reads=SNAPSHOT),
)  # fmt: skip
