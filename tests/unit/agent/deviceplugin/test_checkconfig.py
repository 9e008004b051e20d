"""`nicfleet-agent device-plugin check-config`: per-resource validation, the adapters each
resource selects on a lab node (a snapshot file, or the rendered sysfs tree itself), the
upstream plugin's prediction, text and JSON, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agent.cli import main
from proto.codec import to_json
from tests.support.labsnapshots import lab_snapshot


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(snapshot file, sysfs root) of the a100-ib-4nic lab node: 4 ConnectX-6 IB adapters."""
    root = tmp_path_factory.mktemp("a100")
    snap = lab_snapshot("a100-ib-4nic", root / "sys")
    path = root / "snapshot.json"
    path.write_bytes(to_json(snap))
    return path, root / "sys"


def write(tmp_path: Path, *entries: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"configList": list(entries)}))
    return path


def agent(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="nicfleet-agent")


IB = {"resourceName": "ib", "rdmaHcaMax": 8, "selectors": {"deviceIDs": ["0x101b"]}}
ETH = {"resourceName": "eth", "rdmaHcaMax": 8, "selectors": {"linkTypes": ["ether"]}}
NO_MAX = {"resourceName": "nomax", "selectors": {"vendors": ["15b3"]}}


def test_every_resource_is_checked_on_its_own(lab: tuple[Path, Path], tmp_path: Path) -> None:
    config = write(tmp_path, IB, NO_MAX, ETH)
    result = agent("device-plugin", "check-config", config, "--snapshot", lab[0], "-o", "json")
    assert result.exit_code == 1, result.output
    body = json.loads(result.stdout)
    ib, nomax, eth = body["resources"]
    assert (ib["resource"], ib["errors"], ib["selected"]) == (
        "rdma/ib",
        [],
        ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"],
    )
    # Upstream reads "0x101b" literally: it serves none of them.
    assert (ib["upstream_advertised"], ib["upstream_selected"]) == (0, [])
    (error,) = nomax["errors"]
    assert error.startswith("configList[1].rdmaHcaMax (resource 'rdma/nomax'): required")
    assert eth["errors"] == [] and eth["selected"] == []
    assert any("linkTypes" in u for u in eth["unmatched"])
    assert body["upstream_start_failure"] is None  # upstream starts: nomax advertises 0


def test_text_output(lab: tuple[Path, Path], tmp_path: Path) -> None:
    result = agent("device-plugin", "check-config", write(tmp_path, IB), "--snapshot", lab[0])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"{tmp_path / 'config.json'} on a100-ib-4nic",
        "  configList[0] rdma/ib: selects 4",
        "    adapters: mlx5_0, mlx5_1, mlx5_2, mlx5_3",
        "    upstream advertises 0 (0 adapters)",
    ]


def test_reads_the_host_tree_without_a_snapshot(lab: tuple[Path, Path], tmp_path: Path) -> None:
    good = {"resourceName": "ib", "rdmaHcaMax": 8, "selectors": {"deviceIDs": ["101b"]}}
    result = agent(
        "device-plugin", "check-config", write(tmp_path, good), "--sysfs-root", lab[1], "-o", "json"
    )
    assert result.exit_code == 0, result.output
    (resource,) = json.loads(result.stdout)["resources"]
    assert (len(resource["selected"]), resource["upstream_advertised"]) == (4, 8)


def test_upstream_start_failure_is_reported(lab: tuple[Path, Path], tmp_path: Path) -> None:
    dashed = {**IB, "resourceName": "rdma-ib"}
    result = agent("device-plugin", "check-config", write(tmp_path, dashed), "--snapshot", lab[0])
    assert "upstream would not start: configList[0].resourceName" in result.stdout


@pytest.mark.parametrize(
    ("content", "words"),
    [
        pytest.param(None, "No such file", id="missing"),
        pytest.param("{[", "config.json", id="not-json-or-yaml"),
    ],
)
def test_bad_input_exits_2(
    lab: tuple[Path, Path], tmp_path: Path, content: str | None, words: str
) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    result = agent("device-plugin", "check-config", path, "--snapshot", lab[0])
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and words in result.output


def test_bad_snapshot_exits_2(tmp_path: Path) -> None:
    snap = tmp_path / "snap.json"
    snap.write_text("{}")
    result = agent("device-plugin", "check-config", write(tmp_path, IB), "--snapshot", snap)
    assert result.exit_code == 2 and "--snapshot" in result.output


def test_help() -> None:
    result = agent("device-plugin", "check-config", "--help")
    assert result.exit_code == 0 and "Exit codes:" in result.stdout
