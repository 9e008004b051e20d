"""`--proc-root`: where the agent reads the kernel command line and release. By default
the live /proc only with the live /sys (never for a lab or captured tree, which the
agent's own kernel would misreport); explicit, as the DaemonSet passes it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import agent_settings, main
from agent.lab.render import render
from agent.lab.spec import load_builtin
from tests.support.paths import FIXTURES
from tests.unit.agent.test_cli_settings import DEFAULTS

PROC = FIXTURES / "kernelfacts" / "proc-ubuntu2404-pt"


@pytest.mark.parametrize(
    ("sysfs_root", "proc_root", "expected"),
    [
        pytest.param(Path("/sys"), None, Path("/proc"), id="live-host-default"),
        pytest.param(Path("/tmp/lab-node"), None, None, id="lab-tree-not-read"),
        pytest.param(Path("/host/sys"), Path("/proc"), Path("/proc"), id="daemonset-explicit"),
        pytest.param(Path("/tmp/lab-node"), PROC, PROC, id="lab-with-fixture"),
    ],
)
def test_run_settings_proc_root(
    sysfs_root: Path, proc_root: Path | None, expected: Path | None
) -> None:
    flags = dataclasses.replace(DEFAULTS, sysfs_root=sysfs_root, proc_root=proc_root)
    assert agent_settings(flags, node_name="n1", verbs=False).proc_root == expected


def test_snapshot_reads_the_given_procfs(tmp_path: Path) -> None:
    render(load_builtin("h100-iommu-acs"), tmp_path)
    base = ["snapshot", "--sysfs-root", str(tmp_path), "--node-name", "n1"]
    runner = CliRunner()
    plain = runner.invoke(main, base)
    tuned = runner.invoke(main, [*base, "--proc-root", str(PROC)])
    assert (plain.exit_code, tuned.exit_code) == (0, 0), plain.output + tuned.output
    without, with_proc = json.loads(plain.stdout)["platform"], json.loads(tuned.stdout)["platform"]
    assert (without["kernel_release"], without["kernel_cmdline_iommu"]) == (None, None)
    assert with_proc["kernel_release"] == "6.8.0-45-generic"
    assert with_proc["kernel_cmdline_iommu"] == ["intel_iommu=on", "iommu=pt"]
    assert {g["type"] for g in with_proc["iommu_groups"]} == {"DMA-FQ"}
