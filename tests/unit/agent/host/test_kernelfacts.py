"""The kernel facts behind the IOMMU and GPUDirect rules: pure parsers (table tests on the
kernel's own formats), then the readers on lab sysfs trees (IOMMU group types, module
taint) and the procfs fixtures of tests/data/kernelfacts (command line, release, NVIDIA
version line; see its README for where the formats come from)."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from agent.errors import ParseError, ReadFailed
from agent.host import kernelparse
from agent.host.inventory import collect_snapshot
from agent.host.procfs import Procfs
from agent.host.sysfs import Sysfs
from agent.lab.render import render
from agent.lab.spec import load_builtin
from proto.codec import decode, encode
from proto.inventory import IommuGroup, NodeSnapshot, Platform
from tests.support.paths import FIXTURES

PROC_PT = FIXTURES / "kernelfacts" / "proc-ubuntu2404-pt"
PROC_RHEL8 = FIXTURES / "kernelfacts" / "proc-rhel8-translated"
# h100-iommu-acs: the RDMA functions and GPUs, each in its own group (VFs included).
GPUS = ("0000:18:00.0", "0000:9a:00.0")


# --- pure parsers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("DMA-FQ\n", "DMA-FQ", id="dma-fq"),
        pytest.param("DMA\n", "DMA", id="dma-strict"),
        pytest.param("identity\n", "identity", id="passthrough"),
        pytest.param("blocked\n", "blocked", id="blocked"),
        pytest.param("unmanaged\n", "unmanaged", id="vfio"),
        pytest.param("unknown\n", "unknown", id="kernel-unknown"),
    ],
)
def test_group_type(text: str, expected: str) -> None:
    assert kernelparse.parse_group_type(text) == expected


@pytest.mark.parametrize("text", ["", "auto\n", "dma\n", "DMA FQ\n"])
def test_group_type_junk(text: str) -> None:
    with pytest.raises(ParseError):
        kernelparse.parse_group_type(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param((PROC_PT / "cmdline").read_text(), ("intel_iommu=on", "iommu=pt"),
                     id="ubuntu-pt"),
        pytest.param((PROC_RHEL8 / "cmdline").read_text(), ("intel_iommu=on",),
                     id="rhel8-translated"),
        pytest.param("BOOT_IMAGE=/vmlinuz ro quiet\n", (), id="none"),
        pytest.param("amd_iommu=off iommu.passthrough=1 iommu.strict=0 iommu_foo=1\n",
                     ("amd_iommu=off", "iommu.passthrough=1", "iommu.strict=0"), id="arm-amd"),
        pytest.param('x="iommu=pt quoted" iommu=nopt', ("iommu=nopt",),
                     id="a-quoted-value-is-not-a-parameter"),
    ],
)  # fmt: skip
def test_cmdline_iommu(text: str, expected: tuple[str, ...]) -> None:
    assert kernelparse.parse_cmdline_iommu(text) == expected


def test_cmdline_with_nul_is_junk() -> None:
    with pytest.raises(ParseError):
        kernelparse.parse_cmdline_iommu("iommu=pt\0")


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        pytest.param("6.8.0-45-generic\n", True, id="ubuntu"),
        pytest.param("4.18.0-513.5.1.el8_9.x86_64\n", True, id="rhel8"),
        pytest.param("5.15.0\n", True, id="plain"),
        pytest.param("\n", False, id="empty"),
        pytest.param("Linux\n", False, id="word"),
        pytest.param("6\n", False, id="no-minor"),
    ],
)
def test_osrelease(text: str, ok: bool) -> None:
    if ok:
        assert kernelparse.parse_osrelease(text) == text.strip()
    else:
        with pytest.raises(ParseError):
            kernelparse.parse_osrelease(text)


@pytest.mark.parametrize(
    ("text", "flavour"),
    [
        pytest.param("POE\n", "proprietary", id="proprietary-unsigned"),
        pytest.param("PO\n", "proprietary", id="proprietary-signed"),
        pytest.param("OE\n", "open", id="open-unsigned"),
        pytest.param("O\n", "open", id="open-signed"),
        pytest.param("\n", "open", id="in-tree-gpl"),
    ],
)
def test_module_taint(text: str, flavour: str) -> None:
    assert kernelparse.parse_module_taint(text) == flavour


def test_module_taint_junk() -> None:
    with pytest.raises(ParseError):
        kernelparse.parse_module_taint("P O\n")


@pytest.mark.parametrize(
    ("path", "flavour"),
    [
        pytest.param(PROC_PT / "driver/nvidia/version", "open", id="open-550"),
        pytest.param(PROC_RHEL8 / "driver/nvidia/version", "proprietary", id="proprietary-535"),
    ],
)
def test_nvidia_version_line(path: Path, flavour: str) -> None:
    assert kernelparse.parse_nvidia_version(path.read_text()) == flavour


@pytest.mark.parametrize("text", ["", "GCC version: 13\n", "NVRM version: something else\n"])
def test_nvidia_version_junk(text: str) -> None:
    with pytest.raises(ParseError):
        kernelparse.parse_nvidia_version(text)


# --- procfs reader ---------------------------------------------------------------------------


def test_procfs_reads_and_names_errors_as_proc(tmp_path: Path) -> None:
    proc = Procfs(PROC_PT)
    assert proc.read_text("sys/kernel/osrelease") == "6.8.0-45-generic\n"
    with pytest.raises(ReadFailed) as missing:
        Procfs(tmp_path).read_text("cmdline")
    assert (missing.value.path, missing.value.error) == ("/proc/cmdline", "ENOENT")
    with pytest.raises(ReadFailed) as escape:
        proc.read_text("../proc-rhel8-translated/cmdline")
    assert escape.value.error == "EINVAL"
    (tmp_path / "cmdline").write_text("x" * 5000)
    with pytest.raises(ReadFailed) as big:
        Procfs(tmp_path).read_text("cmdline")
    assert big.value.error == "EFBIG"


# --- on lab trees ----------------------------------------------------------------------------


def _tree(tmp_path: Path, **changes: object) -> Path:
    spec = msgspec.structs.replace(load_builtin("h100-iommu-acs"), **changes)
    render(spec, tmp_path)
    return tmp_path


def _snap(root: Path, proc: Path | None = None) -> NodeSnapshot:
    procfs = None if proc is None else Procfs(proc)
    return collect_snapshot(
        Sysfs(root), node="lab", seq=1, now=0.0, agent_version="t", procfs=procfs
    )


def test_translated_groups_are_read_per_function(tmp_path: Path) -> None:
    snap = _snap(_tree(tmp_path), PROC_RHEL8)
    groups = snap.platform.iommu_groups
    rdma = {d.pci_address for d in snap.devices}
    assert {g.pci_address for g in groups} == rdma | set(GPUS)
    assert [g.pci_address for g in groups] == sorted(g.pci_address for g in groups)
    assert {g.type for g in groups} == {"DMA-FQ"}
    assert len({g.group for g in groups}) == len(groups)  # isolated: one group each
    assert snap.platform.kernel_cmdline_iommu == ("intel_iommu=on",)
    assert snap.platform.kernel_release == "4.18.0-513.5.1.el8_9.x86_64"
    assert snap.platform.nvidia_kernel_module == "proprietary"  # from module/nvidia/taint
    assert snap.errors == ()


def test_a_host_tuned_with_iommu_pt_and_open_modules(tmp_path: Path) -> None:
    root = _tree(tmp_path, iommu_group_type="identity", nvidia_kernel_module="open")
    snap = _snap(root, PROC_PT)
    assert {g.type for g in snap.platform.iommu_groups} == {"identity"}
    assert snap.platform.kernel_cmdline_iommu == ("intel_iommu=on", "iommu=pt")
    assert snap.platform.kernel_release == "6.8.0-45-generic"
    assert snap.platform.nvidia_kernel_module == "open"
    assert snap.platform.iommu is True  # the unit is still registered: not the question


def test_without_procfs_the_kernel_facts_are_null_not_guessed(tmp_path: Path) -> None:
    snap = _snap(_tree(tmp_path))
    assert (snap.platform.kernel_cmdline_iommu, snap.platform.kernel_release) == (None, None)
    assert snap.platform.nvidia_kernel_module == "proprietary"  # sysfs alone tells this
    assert snap.errors == ()


def test_no_iommu_means_no_groups(tmp_path: Path) -> None:
    snap = _snap(_tree(tmp_path, iommu=False), PROC_PT)
    assert snap.platform.iommu_groups == ()
    assert snap.errors == ()


def test_a_kernel_without_group_types_reports_null_without_an_error(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    for kind in root.glob("kernel/iommu_groups/*/type"):
        kind.unlink()  # before Linux 5.4 the file does not exist
    snap = _snap(root)
    assert snap.platform.iommu_groups
    assert {g.type for g in snap.platform.iommu_groups} == {None}
    assert snap.errors == ()


def test_unreadable_facts_are_recorded_and_null(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    first = (root / "bus/pci/devices" / GPUS[0] / "iommu_group").resolve() / "type"
    first.write_text("sideways\n")
    (root / "module/nvidia/taint").unlink()  # then /proc/driver/nvidia/version decides
    proc = tmp_path.parent / "proc"
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "cmdline").write_bytes(b"iommu=pt\0")
    (proc / "sys/kernel/osrelease").write_text("Linux\n")
    (proc / "driver/nvidia").mkdir(parents=True)
    (proc / "driver/nvidia/version").write_text((PROC_PT / "driver/nvidia/version").read_text())
    snap = _snap(root, proc)
    assert snap.platform.kernel_cmdline_iommu is None
    assert snap.platform.kernel_release is None
    assert snap.platform.nvidia_kernel_module == "open"
    assert sum(g.type is None for g in snap.platform.iommu_groups) == 1
    errors = {e.path: e.error for e in snap.errors}
    assert errors["/proc/cmdline"].startswith("unparsable")
    assert errors["/proc/sys/kernel/osrelease"] == "unparsable: 'Linux'"
    group = os.path.relpath(first.parent, root)
    assert errors[f"/{group}/type"] == "unparsable: 'sideways'"


# --- wire ------------------------------------------------------------------------------------


def test_new_platform_fields_round_trip_and_default_for_old_agents() -> None:
    platform = Platform(
        iommu=True,
        iommu_groups=(IommuGroup(pci_address="0000:18:00.0", group="12", type="identity"),),
        kernel_cmdline_iommu=("iommu=pt",),
        kernel_release="6.8.0-45-generic",
        nvidia_kernel_module="open",
    )
    assert decode(encode(platform), Platform) == platform
    old = msgspec.msgpack.encode({"iommu": True, "peermem": False, "acs_enabled_bridges": []})
    assert decode(old, Platform) == Platform(iommu=True)
    assert Platform().iommu_groups == () and Platform().kernel_cmdline_iommu is None
