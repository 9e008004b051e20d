"""`nicfleetctl check` as a user runs it: snapshots printed by `nicfleet-agent snapshot`
from lab trees, findings out, exit code 0/1 by severity, 2 naming the bad file and field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.lab.render import render
from agent.lab.spec import load_builtin

pytestmark = pytest.mark.integration


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, check=False
    )


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return run("-m", "aggregator.ctl", "check", *args)


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """spec -> a snapshot file written by `nicfleet-agent snapshot` from its lab tree."""
    out = tmp_path_factory.mktemp("snapshots")
    files = {}
    for spec in ("h100-ib-12nic", "roce-cx6dx", "roce-cx6dx-2"):
        root = out / spec
        render(load_builtin(spec), root)
        done = run("-m", "agent", "snapshot", "--sysfs-root", str(root), "--node-name", spec)
        assert done.returncode == 0, done.stderr
        files[spec] = out / f"{spec}.json"
        files[spec].write_text(done.stdout)
    return files


def test_port_down_node_exits_1_with_json_findings(snapshots: dict[str, Path]) -> None:
    done = check("--snapshot", str(snapshots["h100-ib-12nic"]), "-o", "json")
    assert done.returncode == 1, done.stderr
    findings = json.loads(done.stdout)
    assert [(f["rule"], f["severity"], f["subject"]) for f in findings] == [
        ("port-down", "critical", "mlx5_1/1"),
        ("port-down", "critical", "mlx5_2/1"),
    ]
    assert set(findings[0]) == {"rule", "severity", "node", "subject", "message", "evidence"}
    assert findings[0]["evidence"]["state"] == "DOWN"


def test_warnings_only_exit_0_and_print_a_table(snapshots: dict[str, Path]) -> None:
    done = check("--snapshot", str(snapshots["roce-cx6dx"]))
    assert done.returncode == 0, done.stderr
    assert "gpu-nic-affinity" in done.stdout
    assert "0000:cb:00.0" in done.stdout


def test_fleet_of_files_with_a_policy(snapshots: dict[str, Path], tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: nicfleet.io/v1alpha1\nkind: NicFleetPolicy\nmetadata: {name: roce}\n"
        "spec:\n  expect:\n    minFirmware: {ConnectX-6 Dx: '22.39.1002'}\n"
        "    maxGpuNicRelation: SYS\n  alerts:\n    port-down: {for: 5s}\n"
    )
    done = check(
        "--snapshot", str(snapshots["roce-cx6dx"]), "--snapshot", str(snapshots["roce-cx6dx-2"]),
        "--policy", str(policy), "-o", "json",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    rows = {(f["rule"], f["node"], f["subject"]) for f in json.loads(done.stdout)}
    assert ("fw-below-minimum", "roce-cx6dx-2", "mlx5_0") in rows
    assert ("fw-skew", "roce-cx6dx-2", "mlx5_1") in rows
    assert not any(rule == "gpu-nic-affinity" for rule, _, _ in rows)  # SYS allowed
    assert not any(rule == "agent-stale" for rule, _, _ in rows)


def test_no_findings(snapshots: dict[str, Path], tmp_path: Path) -> None:
    policy = tmp_path / "quiet.yaml"
    policy.write_text(
        "apiVersion: nicfleet.io/v1alpha1\nkind: NicFleetPolicy\nmetadata: {name: q}\n"
        "spec:\n  alerts:\n    gpu-nic-affinity: {enabled: false}\n"
    )
    done = check("--snapshot", str(snapshots["roce-cx6dx"]), "--policy", str(policy))
    assert done.returncode == 0, done.stderr
    assert "No findings." in done.stderr  # as `nicfleetctl findings` says it
    done = check("--snapshot", str(snapshots["roce-cx6dx"]), "--policy", str(policy), "-o", "json")
    assert json.loads(done.stdout) == []


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        pytest.param("{not json", "$", id="not-json"),
        pytest.param('{"schema": "nicfleet.v1.NodeSnapshot", "node": "x"}', "agent_version",
                     id="missing-field"),
        pytest.param('{"schema": "nicfleet.v1.NodeSnapshot", "node": "x", "agent_version": "t",'
                     ' "seq": 1, "collected_at": "yesterday"}', "$.collected_at", id="wrong-type"),
        pytest.param('{"schema": "nicfleet.v1.CounterBatch", "node": "x", "seq": 1,'
                     ' "collected_at": 1}', "schema", id="other-message"),
    ],
)  # fmt: skip
def test_bad_snapshot_file_exits_2_naming_file_and_field(
    tmp_path: Path, content: str, needle: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    done = check("--snapshot", str(bad))
    assert done.returncode == 2
    assert str(bad) in done.stderr
    assert needle in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_file_and_bad_policy_exit_2(snapshots: dict[str, Path], tmp_path: Path) -> None:
    done = check("--snapshot", str(tmp_path / "nope.json"))
    assert done.returncode == 2
    assert "nope.json" in done.stderr
    policy = tmp_path / "typo.yaml"
    policy.write_text(
        "apiVersion: nicfleet.io/v1alpha1\nkind: NicFleetPolicy\nmetadata: {name: t}\n"
        "spec:\n  alerts:\n    port-dwon: {for: 5s}\n"
    )
    done = check("--snapshot", str(snapshots["roce-cx6dx"]), "--policy", str(policy))
    assert done.returncode == 2
    assert "alerts.port-dwon" in done.stderr
    assert str(policy) in done.stderr
    assert "Traceback" not in done.stderr


def test_same_node_twice_exits_2(snapshots: dict[str, Path]) -> None:
    path = str(snapshots["roce-cx6dx"])
    done = check("--snapshot", path, "--snapshot", path)
    assert done.returncode == 2
    assert "roce-cx6dx" in done.stderr
    assert "Traceback" not in done.stderr
