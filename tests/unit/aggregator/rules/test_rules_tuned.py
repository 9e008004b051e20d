"""Hosts tuned the recommended way raise no alarm: `iommu-translated` judges the real DMA
mode (IOMMU group types, then the kernel command line) and names the translated adapters
and GPUs; `peermem-missing` fires only when neither GPUDirect path (nvidia_peermem,
dma-buf) is available. Pure table tests, then the lab nodes end to end."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from agent.host.inventory import collect_snapshot
from agent.host.procfs import Procfs
from agent.host.sysfs import Sysfs
from agent.lab.render import render
from agent.lab.spec import load_builtin
from aggregator.rules import topology
from aggregator.rules.finding import Finding
from proto.inventory import IommuGroup, NodeSnapshot, Platform
from tests.support.paths import FIXTURES
from tests.support.rules_cases import Scenario, adapter, fleet_of, gpu, node, policy_doc

G0 = "0000:18:00.0"
NIC0, NIC1 = "0000:19:00.0", "0000:1a:00.0"
NVIDIA = {"nvidia": "550.90.07"}


def _groups(**types: str | None) -> tuple[IommuGroup, ...]:
    """Keyword = a function's short name (nic0, nic1, gpu0), value = its group type."""
    address = {"nic0": NIC0, "nic1": NIC1, "gpu0": G0}
    return tuple(
        IommuGroup(pci_address=address[k], group=str(n), type=v)
        for n, (k, v) in enumerate(types.items())
    )


def _iommu_node(groups: tuple[IommuGroup, ...], cmdline: tuple[str, ...] | None) -> Scenario:
    platform = Platform(peermem=True, iommu=True, iommu_groups=groups,
                        kernel_cmdline_iommu=cmdline)  # fmt: skip
    devices = (adapter("mlx5_0", NIC0), adapter("mlx5_1", NIC1))
    return fleet_of(node("n1", *devices, gpus=(gpu(G0),), platform=platform))


def _one(rule: str, scenario: Scenario) -> Finding | None:
    found = [f for f in scenario.findings() if f.rule == rule]
    assert len(found) <= 1
    return found[0] if found else None


PT = ("intel_iommu=on", "iommu=pt")

IOMMU = [
    pytest.param(_groups(nic0="identity", nic1="identity", gpu0="identity"), PT, None,
                 id="iommu-pt-identity-quiet"),
    pytest.param(_groups(nic0="identity", nic1="identity", gpu0="identity"), None, None,
                 id="identity-without-cmdline-quiet"),
    pytest.param(_groups(nic0="DMA-FQ", nic1="identity", gpu0="identity"), PT,
                 ("mlx5_0", "DMA-FQ", "iommu_groups"), id="one-group-switched-back-to-dma"),
    pytest.param(_groups(nic0="DMA-FQ", nic1="DMA-FQ", gpu0="DMA"), ("intel_iommu=on",),
                 ("mlx5_0,mlx5_1,0000:18:00.0", "DMA/DMA-FQ", "iommu_groups"),
                 id="intel-iommu-on-translated"),
    pytest.param(_groups(nic0="unmanaged", nic1="blocked", gpu0="identity"), None, None,
                 id="vfio-and-blocked-are-not-translated-dma"),
    pytest.param(_groups(nic0=None, nic1=None, gpu0=None), ("intel_iommu=on",),
                 ("mlx5_0,mlx5_1,0000:18:00.0", "DMA (kernel command line)", "cmdline"),
                 id="old-kernel-cmdline-translated"),
    pytest.param(_groups(nic0=None, nic1=None, gpu0=None), PT, None, id="old-kernel-cmdline-pt"),
    pytest.param(_groups(nic0=None, nic1=None, gpu0=None), None, None, id="unknown-quiet"),
    pytest.param((), None, None, id="old-agent-unknown-quiet"),
    pytest.param((), ("iommu.passthrough=1",), None, id="arm-passthrough"),
    pytest.param((), ("intel_iommu=off",), None, id="iommu-off-on-cmdline"),
]  # fmt: skip


@pytest.mark.parametrize(("groups", "cmdline", "expected"), IOMMU)
def test_iommu_translated_judges_the_real_mode(
    groups: tuple[IommuGroup, ...],
    cmdline: tuple[str, ...] | None,
    expected: tuple[str, str, str] | None,
) -> None:
    finding = _one("iommu-translated", _iommu_node(groups, cmdline))
    if expected is None:
        assert finding is None
        return
    assert finding is not None
    names, mode, source = expected
    ev = finding.evidence
    assert (ev["translated"], ev["mode"], ev["source"]) == (names, mode, source)
    assert ev["cmdline"] == (" ".join(cmdline) if cmdline else None)
    assert finding.message.startswith(f"{names.replace(',', ', ')} run with IOMMU translation")


def test_translated_despite_iommu_pt_says_so() -> None:
    finding = _one("iommu-translated", _iommu_node(_groups(nic0="DMA", gpu0="identity"), PT))
    assert finding is not None
    assert "although the kernel command line has intel_iommu=on iommu=pt" in finding.message


@pytest.mark.parametrize(
    ("params", "mode"),
    [
        pytest.param(None, None, id="not-read"),
        pytest.param((), None, id="silent"),
        pytest.param(("intel_iommu=on",), "translated", id="vtd-on"),
        pytest.param(("intel_iommu=on", "iommu=pt"), "passthrough", id="vtd-pt"),
        pytest.param(("iommu=pt", "intel_iommu=on"), "passthrough", id="pt-first"),
        pytest.param(("iommu=pt", "iommu=nopt"), "translated", id="last-wins"),
        pytest.param(("iommu.passthrough=0",), "translated", id="generic-0"),
        pytest.param(("iommu.passthrough=1",), "passthrough", id="generic-1"),
        pytest.param(("amd_iommu=off",), "off", id="amd-off"),
        pytest.param(("intel_iommu=sm_on,on",), "translated", id="vtd-options"),
    ],
)
def test_cmdline_iommu_mode(params: tuple[str, ...] | None, mode: str | None) -> None:
    assert topology.cmdline_iommu_mode(params) == mode


# --- GPUDirect paths -----------------------------------------------------------------------


def _gpu_node(
    flavour: str | None,
    release: str | None,
    *,
    peermem: bool = False,
    modules: dict[str, str | None] | None = None,
) -> NodeSnapshot:
    platform = Platform(peermem=peermem, nvidia_kernel_module=flavour, kernel_release=release)  # type: ignore[arg-type]
    return node("n1", gpus=(gpu(G0),), platform=platform,
                modules=NVIDIA if modules is None else modules)  # fmt: skip


PATHS = [
    pytest.param(_gpu_node("open", "6.8.0-45-generic"), ("dma-buf",), None,
                 id="open-modules-new-kernel-dmabuf"),
    pytest.param(_gpu_node("open", "6.8.0-45-generic", peermem=True), ("dma-buf", "peermem"),
                 None, id="both-paths"),
    pytest.param(_gpu_node("proprietary", "6.8.0-45-generic", peermem=True), ("peermem",), None,
                 id="peermem-only"),
    pytest.param(_gpu_node("open", "5.4.0-150-generic"), (),
                 "dma-buf needs Linux 5.12+ and this node runs Linux 5.4.0-150-generic",
                 id="open-modules-old-kernel"),
    pytest.param(_gpu_node("proprietary", "6.8.0-45-generic"), (),
                 "dma-buf would work on Linux 6.8.0-45-generic with the open NVIDIA kernel "
                 "modules", id="proprietary-new-kernel"),
    pytest.param(_gpu_node("proprietary", None), (), "load nvidia_peermem (modprobe",
                 id="proprietary-kernel-unknown"),
    pytest.param(_gpu_node(None, None, modules={}), (), "no NVIDIA kernel module is loaded",
                 id="no-nvidia-module"),
    pytest.param(_gpu_node(None, "6.8.0-45-generic"), (), None, id="old-agent-flavour-unknown"),
    pytest.param(_gpu_node("open", None), (), None, id="open-kernel-unknown"),
]  # fmt: skip


@pytest.mark.parametrize(("snap", "paths", "message"), PATHS)
def test_peermem_missing_only_without_either_path(
    snap: NodeSnapshot, paths: tuple[str, ...], message: str | None
) -> None:
    assert topology.gpudirect_paths(snap) == paths
    finding = _one("peermem-missing", fleet_of(snap))
    if message is None:
        assert finding is None
        return
    assert finding is not None
    assert message in finding.message
    assert finding.evidence["nvidia_kernel_module"] == snap.platform.nvidia_kernel_module
    assert finding.evidence["kernel_release"] == snap.platform.kernel_release


def test_required_gpudirect_without_a_path_is_critical() -> None:
    scenario = fleet_of(_gpu_node("proprietary", "6.8.0-45-generic"),
                        policies=policy_doc(expect={"gpuDirect": True}))  # fmt: skip
    finding = _one("peermem-missing", scenario)
    assert finding is not None and finding.severity == "critical"


@pytest.mark.parametrize(
    ("release", "version"),
    [
        ("6.8.0-45-generic", (6, 8)),
        ("5.12.0", (5, 12)),
        ("4.18.0-513.5.1.el8_9.x86_64", (4, 18)),
        ("5.15-rc1", (5, 15)),
        ("6", None),
        ("v6.1", None),
        (None, None),
    ],
)
def test_kernel_version(release: str | None, version: tuple[int, int] | None) -> None:
    assert topology.kernel_version(release) == version


# --- lab nodes end to end --------------------------------------------------------------------

PROC = FIXTURES / "kernelfacts"


def _lab(tmp: Path, spec: str, proc: str | None = None, **changes: object) -> Scenario:
    root = tmp / spec
    render(msgspec.structs.replace(load_builtin(spec), **changes), root)
    procfs = None if proc is None else Procfs(PROC / proc)
    snap = collect_snapshot(Sysfs(root), node=spec, seq=1, now=1_800_000_000.0,
                            agent_version="t", procfs=procfs)  # fmt: skip
    return fleet_of(snap, now=snap.collected_at)


def test_lab_iommu_on_names_the_translated_functions(tmp_path: Path) -> None:
    finding = _one("iommu-translated", _lab(tmp_path, "h100-iommu-acs", "proc-rhel8-translated"))
    assert finding is not None
    assert finding.evidence["mode"] == "DMA-FQ"
    assert finding.evidence["cmdline"] == "intel_iommu=on"
    assert str(finding.evidence["translated"]).split(",")[:2] == ["mlx5_0", "mlx5_1"]
    assert finding.message.startswith("mlx5_0, mlx5_1, ")


def test_lab_iommu_pt_is_quiet(tmp_path: Path) -> None:
    scenario = _lab(tmp_path, "h100-iommu-acs", "proc-ubuntu2404-pt", iommu_group_type="identity")
    assert _one("iommu-translated", scenario) is None
    # ACS is its own question: iommu=pt does not clear the redirect bits Linux set, and
    # the finding no longer suggests it does.
    acs = [f for f in scenario.findings() if f.rule == "acs-enabled"]
    assert acs and all("iommu=pt does not" in f.message for f in acs)


def test_lab_open_modules_on_a_new_kernel_need_no_peermem(tmp_path: Path) -> None:
    tuned = _lab(tmp_path, "roce-cx6dx-2", "proc-ubuntu2404-pt", nvidia_kernel_module="open")
    assert _one("peermem-missing", tuned) is None
    old = _lab(tmp_path / "old", "roce-cx6dx-2", "proc-rhel8-translated",
               nvidia_kernel_module="open")  # fmt: skip
    finding = _one("peermem-missing", old)
    assert finding is not None and "upgrade the kernel" in finding.message


def test_lab_proprietary_modules_fire_and_say_which_path_would_work(tmp_path: Path) -> None:
    finding = _one("peermem-missing", _lab(tmp_path, "roce-cx6dx-2", "proc-ubuntu2404-pt"))
    assert finding is not None
    assert "open NVIDIA kernel modules" in finding.message
    assert "modprobe nvidia_peermem" in finding.message
