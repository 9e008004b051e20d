"""`nicfleetctl audit nicclusterpolicy` without --snapshot: the nodes come from a real
aggregator API on 127.0.0.1 (every node that has sent a snapshot)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from aggregator.ctl.main import cli
from tests.support.api_fixtures import Harness, sample_fleet, serve_in_thread

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve_in_thread(Harness(fleet=sample_fleet()).app()) as url:
        yield url


def test_live_fleet(server: str, tmp_path: Path) -> None:
    config = {"configList": [{"resourceName": "ib", "rdmaHcaMax": 4,
                              "selectors": {"linkTypes": ["infiniband"]}}]}  # fmt: skip
    policy = tmp_path / "ncp.yaml"
    policy.write_text(
        json.dumps(
            {
                "kind": "NicClusterPolicy",
                "metadata": {"name": "nic-cluster-policy"},
                "spec": {"rdmaSharedDevicePlugin": {"config": json.dumps(config)}},
            }
        )
    )
    args = ["--server", server, "audit", "nicclusterpolicy", "-f", str(policy), "-o", "json"]
    result = CliRunner().invoke(cli, args, env={"NICFLEET_SERVER": None}, prog_name="nicfleetctl")
    body = json.loads(result.stdout)
    nodes = {n["node"]: n["resources"][0] for n in body["policies"][0]["nodes"]}
    # gpu-010 has sent no snapshot. The sample fleet's adapters report no /dev/infiniband
    # nodes, so upstream drops every one of them.
    assert sorted(nodes) == ["gpu-001", "gpu-002", "gpu-003", "roce-01"]
    assert all(r["advertised"] == 0 for r in nodes.values())
    assert 'RDMA device "rdma_cm" not found' in nodes["gpu-001"]["why"]
    assert result.exit_code == 1
