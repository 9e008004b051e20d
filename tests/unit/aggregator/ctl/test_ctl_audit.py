"""`nicfleetctl audit nicclusterpolicy`: the operator's sample policies against lab-node
snapshot files (as `nicfleet-agent snapshot` prints them), in text and JSON; exit codes;
errors that name the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from aggregator.ctl.main import cli
from proto.codec import to_json
from tests.support.labsnapshots import lab_snapshot
from tests.support.paths import REPO

SAMPLES = REPO / "tests/data/network-operator"
CR = SAMPLES / "mellanox.com_v1alpha1_nicclusterpolicy_cr.yaml"


@pytest.fixture(scope="module")
def snaps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in ("a100-ib-4nic", "roce-cx6dx"):
        root = tmp_path_factory.mktemp(name)
        path = root / "snapshot.json"
        path.write_bytes(to_json(lab_snapshot(name, root / "sys")))
        out[name] = path
    return out


def ctl(*args: str | Path) -> Result:
    env = {"NICFLEET_SERVER": None, "NO_COLOR": "1"}
    return CliRunner().invoke(cli, [str(a) for a in args], env=env, prog_name="nicfleetctl")


def with_snaps(snaps: dict[str, Path]) -> list[str | Path]:
    return [a for p in snaps.values() for a in ("--snapshot", p)]


def test_text_per_node(snaps: dict[str, Path]) -> None:
    result = ctl("audit", "nicclusterpolicy", "-f", CR, *with_snaps(snaps))
    assert result.exit_code == 1, result.output  # roce-cx6dx advertises 0
    lines = result.stdout.splitlines()
    assert lines[0] == "NicClusterPolicy/nic-cluster-policy"
    assert any(
        line.startswith(
            "  a100-ib-4nic: upstream advertises 63 for rdma/rdma_shared_device_a (4 adapters:"
        )
        for line in lines
    )
    roce = next(line for line in lines if line.startswith("  roce-cx6dx: "))
    assert "upstream advertises 0 for rdma/rdma_shared_device_a: no adapter matches" in roce
    assert "deviceIDs ['101b'] does not contain '101d'" in roce


def test_json(snaps: dict[str, Path]) -> None:
    result = ctl("audit", "nicclusterpolicy", "-f", CR, *with_snaps(snaps), "-o", "json")
    assert result.exit_code == 1, result.output
    body = json.loads(result.stdout)
    (policy,) = body["policies"]
    assert (policy["kind"], policy["name"]) == ("NicClusterPolicy", "nic-cluster-policy")
    by_node = {n["node"]: n for n in policy["nodes"]}
    assert by_node["a100-ib-4nic"]["verdict"] == "advertises"
    (resource,) = by_node["a100-ib-4nic"]["resources"]
    assert (resource["resource"], resource["advertised"], len(resource["selected"])) == (
        "rdma/rdma_shared_device_a",
        63,
        4,
    )
    assert by_node["roce-cx6dx"]["resources"][0]["advertised"] == 0
    assert {n["section"] for n in policy["notes"]} == {"ofedDriver"}


def test_a_fitting_policy_exits_0(snaps: dict[str, Path], tmp_path: Path) -> None:
    policy = tmp_path / "ncp.json"
    config = {"configList": [{"resourceName": "ib", "rdmaHcaMax": 8,
                              "selectors": {"linkTypes": ["infiniband"]}}]}  # fmt: skip
    policy.write_text(
        json.dumps(
            {
                "kind": "NicClusterPolicy",
                "metadata": {"name": "nic-cluster-policy"},
                # The webhook refuses a section with no repository (its own or global's).
                "spec": {
                    "global": {"repository": "nvcr.io/nvidia/mellanox"},
                    "rdmaSharedDevicePlugin": {"config": json.dumps(config)},
                },
            }
        )
    )
    result = ctl("audit", "nicclusterpolicy", "-f", policy, "--snapshot", snaps["a100-ib-4nic"])
    assert result.exit_code == 0, result.output
    assert "upstream advertises 8 for rdma/ib" in result.stdout


def test_node_policy_and_list_documents(snaps: dict[str, Path], tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    node = (SAMPLES / "mellanox.com_v1alpha1_nicnodepolicy.yaml").read_text()
    both.write_text(CR.read_text() + "\n---\n" + node)
    result = ctl("audit", "nicclusterpolicy", "-f", both, *with_snaps(snaps), "-o", "json")
    kinds = [p["kind"] for p in json.loads(result.stdout)["policies"]]
    assert kinds == ["NicClusterPolicy", "NicNodePolicy"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        pytest.param("kind: ConfigMap\n", "kind: no NicClusterPolicy", id="no-policy"),
        pytest.param("a: [\n", "not YAML or JSON", id="not-yaml"),
    ],
)
def test_bad_policy_file_exits_2(
    snaps: dict[str, Path], tmp_path: Path, content: str, words: str
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(content)
    result = ctl("audit", "nicclusterpolicy", "-f", path, *with_snaps(snaps))
    assert result.exit_code == 2
    assert str(path) in result.output and words in result.output


def test_missing_file_and_bad_snapshot_exit_2(tmp_path: Path) -> None:
    missing = ctl("audit", "nicclusterpolicy", "-f", tmp_path / "nope.yaml", "--snapshot", CR)
    assert missing.exit_code == 2 and "cannot read the policy" in missing.output
    bad = tmp_path / "snap.json"
    bad.write_text("{}")
    result = ctl("audit", "nicclusterpolicy", "-f", CR, "--snapshot", bad)
    assert result.exit_code == 2 and str(bad) in result.output


def test_help_documents_exit_codes() -> None:
    result = ctl("audit", "nicclusterpolicy", "--help")
    assert result.exit_code == 0
    assert "Exit codes:" in result.stdout and "--snapshot" in result.stdout
