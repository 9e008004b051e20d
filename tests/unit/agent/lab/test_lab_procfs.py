"""The lab's procfs (agent.lab.procfs): `lab render` writes proc/ beside the sysfs files, in
the formats the agent parses, so a lab host reports its kernel facts (release, IOMMU
command line, NVIDIA module flavour) and can be tuned (no findings) or not."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from agent.cli import main as agent_main
from agent.host import kernelparse
from agent.host.inventory import collect_snapshot
from agent.host.procfs import Procfs
from agent.host.sysfs import Sysfs
from agent.lab.nodespec import NodeSpec
from agent.lab.procfs import cmdline_text, proc_files, proc_root
from agent.lab.render import render
from agent.lab.spec import SpecError, load_builtin, parse_spec
from proto.inventory import NodeSnapshot
from tests.support.paths import REPO
from tests.support.rules_cases import fleet_of


def _spec(**changes: object) -> NodeSpec:
    return msgspec.structs.replace(load_builtin("h100-iommu-acs"), **changes)


def _snap(tmp: Path, spec: NodeSpec) -> NodeSnapshot:
    root = tmp / spec.name
    render(spec, root, overwrite=True)
    return collect_snapshot(Sysfs(root), node=spec.name, seq=1, now=1_800_000_000.0,
                            agent_version="t", procfs=Procfs(proc_root(root)))  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "cmdline"),
    [
        pytest.param({}, "BOOT_IMAGE=/boot/vmlinuz-5.15.0-105-generic root=LABEL=root ro "
                     "intel_iommu=on quiet", id="iommu-on-translated"),
        pytest.param({"iommu_group_type": "identity"}, "intel_iommu=on iommu=pt quiet",
                     id="iommu-pt"),
        pytest.param({"iommu": False}, "root=LABEL=root ro quiet", id="iommu-off"),
        pytest.param({"kernel_cmdline": "ro amd_iommu=off"}, "ro amd_iommu=off", id="given"),
    ],
)  # fmt: skip
def test_cmdline_follows_the_iommu_fields_unless_given(
    changes: dict[str, object], cmdline: str
) -> None:
    assert cmdline_text(_spec(**changes)).endswith(cmdline)


def test_files_parse_with_the_agents_parsers() -> None:
    files = proc_files(_spec(nvidia_kernel_module="open", kernel_release="6.8.0-45-generic"))
    assert sorted(files) == ["cmdline", "driver/nvidia/version", "sys/kernel/osrelease"]
    assert kernelparse.parse_osrelease(files["sys/kernel/osrelease"]) == "6.8.0-45-generic"
    assert kernelparse.parse_cmdline_iommu(files["cmdline"]) == ("intel_iommu=on",)
    assert kernelparse.parse_nvidia_version(files["driver/nvidia/version"]) == "open"
    assert "535.183.01" in files["driver/nvidia/version"]
    proprietary = proc_files(_spec())["driver/nvidia/version"]
    assert kernelparse.parse_nvidia_version(proprietary) == "proprietary"
    assert "driver/nvidia/version" not in proc_files(_spec(modules={"mlx5_core": None}))


def test_a_lab_host_reports_its_kernel_facts(tmp_path: Path) -> None:
    snap = _snap(tmp_path, _spec(iommu_group_type="identity", kernel_release="6.8.0-45-generic"))
    assert snap.platform.kernel_release == "6.8.0-45-generic"
    assert snap.platform.kernel_cmdline_iommu == ("intel_iommu=on", "iommu=pt")
    assert snap.platform.nvidia_kernel_module == "proprietary"
    assert snap.errors == ()


def test_tuned_lab_host_has_no_tuning_findings_untuned_has(tmp_path: Path) -> None:
    tuned = _spec(iommu_group_type="identity", nvidia_kernel_module="open",
                  kernel_release="6.8.0-45-generic", modules={"mlx5_core": None, "mlx5_ib": None,
                  "ib_core": None, "ib_uverbs": None, "nvidia": "550.90.07"})  # fmt: skip
    rules = {f.rule for f in fleet_of(_snap(tmp_path, tuned)).findings()}
    assert not rules & {"iommu-translated", "peermem-missing", "data-quality"}
    untuned = msgspec.structs.replace(tuned, iommu_group_type="DMA-FQ",
                                      nvidia_kernel_module="proprietary")  # fmt: skip
    rules = {f.rule for f in fleet_of(_snap(tmp_path / "u", untuned)).findings()}
    assert {"iommu-translated", "peermem-missing"} <= rules


def test_render_cli_writes_proc_and_overwrite_replaces_it(tmp_path: Path) -> None:
    out = tmp_path / "node"
    args = ["lab", "render", "--builtin", "h100-ib-12nic", "--out", str(out), "-o", "json"]
    done = CliRunner().invoke(agent_main, args)
    assert done.exit_code == 0, done.output
    assert json.loads(done.output.splitlines()[-1])["node"] == "h100-ib-12nic"
    assert (out / "proc/sys/kernel/osrelease").read_text() == "6.8.0-45-generic\n"
    (out / "proc/stray").write_text("x")
    done = CliRunner().invoke(agent_main, [*args, "--overwrite"])
    assert done.exit_code == 0, done.output
    assert not (out / "proc/stray").exists()
    assert (
        (out / "proc/driver/nvidia/version")
        .read_text()
        .startswith("NVRM version: NVIDIA UNIX Open Kernel Module")
    )


def test_kernel_release_is_checked() -> None:
    text = (REPO / "agent/lab/specs/roce-cx6dx.yaml").read_text()
    with pytest.raises(SpecError, match="kernel_release"):
        parse_spec(text + 'kernel_release: "six/../x"\n')
