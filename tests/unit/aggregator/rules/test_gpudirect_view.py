"""The node's GPUDirect view (aggregator.rules.gpudirect): which path(s) it can use and the
IOMMU mode, each with why. Pure table tests, and the view agrees with the tuned-host rules
on every case of their tables: a path is `none` exactly where peermem-missing fires, the
IOMMU `translated` exactly where iommu-translated does."""

from __future__ import annotations

import pytest

from aggregator.rules.gpudirect import gpudirect_of, iommu_mode
from proto.inventory import IommuGroup, NodeSnapshot, Platform
from tests.support.rules_cases import adapter, fleet_of, gpu, node
from tests.unit.aggregator.rules.test_rules_tuned import (
    G0,
    IOMMU,
    NIC0,
    PATHS,
    PT,
    _gpu_node,
    _iommu_node,
    _one,
)


def _snap(platform: Platform, **kw: object) -> NodeSnapshot:
    return node("n1", adapter("mlx5_0", NIC0), gpus=(gpu(G0),), platform=platform, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("snap", "path", "paths", "reason"),
    [
        pytest.param(_gpu_node("open", "6.8.0-45-generic", peermem=True), "both",
                     ("dma-buf", "peermem"),
                     "dma-buf: open NVIDIA kernel modules on Linux 6.8.0-45-generic; "
                     "peermem: a GPU peer-memory client is registered.", id="both"),
        pytest.param(_gpu_node("open", "6.8.0-45-generic"), "dma-buf", ("dma-buf",),
                     "peermem: nvidia_peermem not loaded", id="dma-buf-only"),
        pytest.param(_gpu_node("proprietary", "6.8.0-45-generic", peermem=True,
                               modules={"nvidia": "550", "nvidia_peermem": "550"}),
                     "peermem", ("peermem",), "dma-buf: not with the proprietary NVIDIA "
                     "kernel modules, only the open ones; peermem: nvidia_peermem loaded",
                     id="peermem-only"),
        pytest.param(_gpu_node("open", "5.4.0-150-generic"), "none", (),
                     "dma-buf: not on Linux 5.4.0-150-generic, needs 5.12+", id="old-kernel"),
        pytest.param(_gpu_node(None, None, modules={}), "none", (),
                     "dma-buf: no NVIDIA kernel module loaded", id="no-nvidia"),
        pytest.param(_gpu_node("open", None), "unknown", (),
                     "the kernel release is not reported: an agent without --proc-root",
                     id="release-unknown"),
        pytest.param(_gpu_node(None, "6.8.0-45-generic"), "unknown", (),
                     "does not report the NVIDIA kernel module flavour", id="flavour-unknown"),
        pytest.param(_gpu_node("open", "six"), "unknown", (), "kernel release 'six' not "
                     "understood", id="release-junk"),
        pytest.param(node("n1", platform=Platform(peermem=True)), "none", (),
                     "this node has no GPUs", id="no-gpus"),
    ],
)  # fmt: skip
def test_gpudirect_path(snap: NodeSnapshot, path: str, paths: tuple[str, ...], reason: str) -> None:
    view = gpudirect_of(snap)
    assert (view.path, view.paths) == (path, paths)
    assert reason in view.path_reason
    assert view.kernel_release == snap.platform.kernel_release
    assert view.nvidia_kernel_module == snap.platform.nvidia_kernel_module


@pytest.mark.parametrize(("snap", "paths", "message"), PATHS)
def test_path_none_exactly_where_peermem_missing_fires(
    snap: NodeSnapshot, paths: tuple[str, ...], message: str | None
) -> None:
    fires = _one("peermem-missing", fleet_of(snap)) is not None
    assert (gpudirect_of(snap).path == "none") == fires
    assert gpudirect_of(snap).paths == paths


@pytest.mark.parametrize(("groups", "cmdline", "expected"), IOMMU)
def test_iommu_translated_exactly_where_the_rule_fires(
    groups: tuple[IommuGroup, ...],
    cmdline: tuple[str, ...] | None,
    expected: tuple[str, str, str] | None,
) -> None:
    scenario = _iommu_node(groups, cmdline)
    (snap,) = scenario.snapshots
    mode, _ = iommu_mode(snap)
    assert (mode == "translated") == (expected is not None)


@pytest.mark.parametrize(
    ("platform", "mode", "reason"),
    [
        pytest.param(Platform(), "unknown", "could not read /sys/class/iommu", id="not-read"),
        pytest.param(Platform(iommu=False, kernel_cmdline_iommu=PT), "off",
                     "no IOMMU unit registered", id="off"),
        pytest.param(Platform(iommu=True, kernel_cmdline_iommu=PT, iommu_groups=(
            IommuGroup(pci_address=NIC0, group="1", type="identity"),
            IommuGroup(pci_address=G0, group="2", type="identity"))), "passthrough",
            "every GPU and adapter IOMMU group is identity", id="identity"),
        pytest.param(Platform(iommu=True, kernel_cmdline_iommu=PT, iommu_groups=(
            IommuGroup(pci_address=NIC0, group="1", type="DMA-FQ"),
            IommuGroup(pci_address=G0, group="2", type="identity"))), "translated",
            "DMA-FQ IOMMU groups: mlx5_0, although the command line has intel_iommu=on "
            "iommu=pt", id="translated-despite-pt"),
        pytest.param(Platform(iommu=True, kernel_cmdline_iommu=("intel_iommu=on",)),
                     "translated", "kernel command line intel_iommu=on; no IOMMU group types",
                     id="cmdline-translated"),
        pytest.param(Platform(iommu=True, kernel_cmdline_iommu=PT), "passthrough",
                     "kernel command line intel_iommu=on iommu=pt", id="cmdline-pt"),
        pytest.param(Platform(iommu=True), "unknown", "command line is not read",
                     id="no-types-no-cmdline"),
        pytest.param(Platform(iommu=True, kernel_cmdline_iommu=()), "unknown",
                     "command line is silent", id="no-types-silent-cmdline"),
    ],
)  # fmt: skip
def test_iommu_mode(platform: Platform, mode: str, reason: str) -> None:
    view = gpudirect_of(_snap(platform))
    assert view.iommu == mode
    assert reason in view.iommu_reason
