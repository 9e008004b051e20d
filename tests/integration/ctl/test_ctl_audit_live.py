"""`nicfleetctl audit nicclusterpolicy` without --snapshot: the nodes come from a real
aggregator API on 127.0.0.1 (every node that has sent a snapshot)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from aggregator.api.app import ApiSettings, build_app
from aggregator.cluster import ClusterNode, ClusterView
from aggregator.ctl.main import cli
from tests.support.api_fixtures import STALE_AFTER, Harness, sample_fleet, serve_in_thread

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


def test_node_policy_picks_its_nodes_by_the_live_labels(tmp_path: Path) -> None:
    pools = {"gpu-001": "gpu", "gpu-002": "gpu", "roce-01": "eth"}
    view = ClusterView(present=True, nodes={
        n: ClusterNode(name=n, labels={"kubernetes.io/hostname": n, "pool": pool})
        for n, pool in pools.items()})  # fmt: skip
    harness = Harness(fleet=sample_fleet())
    app = build_app(
        fleet=harness.fleet, settings=ApiSettings(stale_after=STALE_AFTER),
        readiness=harness.readiness, clock=harness.clock, metrics=harness.registry,
        cluster_source=lambda: view,
    )  # fmt: skip
    config = {"configList": [{"resourceName": "ib", "rdmaHcaMax": 4,
                              "selectors": {"linkTypes": ["infiniband"]}}]}  # fmt: skip
    policy = tmp_path / "nnp.yaml"
    policy.write_text(json.dumps({
        "kind": "NicNodePolicy", "metadata": {"name": "gpu-nodes"},
        "spec": {"nodeSelector": {"pool": "gpu"},
                 "rdmaSharedDevicePlugin": {"config": json.dumps(config)}},
    }))  # fmt: skip
    with serve_in_thread(app) as url:
        args = ["--server", url, "audit", "nicclusterpolicy", "-f", str(policy), "-o", "json"]
        result = CliRunner().invoke(cli, args, env={"NICFLEET_SERVER": None},
                                    prog_name="nicfleetctl")  # fmt: skip
    body = json.loads(result.stdout)
    (audited,) = body["policies"]
    assert [n["node"] for n in audited["nodes"]] == ["gpu-001", "gpu-002"]
    (note,) = [n for n in audited["notes"] if n["section"] == "nicNodePolicy"]
    assert note["message"].startswith("applies to 2 of 4 nodes by their labels (pool=gpu)")


def test_node_policy_without_labels_to_select_by(server: str, tmp_path: Path) -> None:
    # The sample aggregator has no cluster: no node carries a label, so nothing is narrowed.
    policy = tmp_path / "nnp.yaml"
    policy.write_text(json.dumps({
        "kind": "NicNodePolicy", "metadata": {"name": "gpu-nodes"},
        "spec": {"nodeSelector": {"pool": "gpu"}},
    }))  # fmt: skip
    args = ["--server", server, "audit", "nicclusterpolicy", "-f", str(policy), "-o", "json"]
    result = CliRunner().invoke(cli, args, env={"NICFLEET_SERVER": None}, prog_name="nicfleetctl")
    (audited,) = json.loads(result.stdout)["policies"]
    (note,) = [n for n in audited["notes"] if n["section"] == "nicNodePolicy"]
    assert "carry no node labels" in note["message"]
    assert note["severity"] == "info"


def test_node_policies_overlapping_on_the_live_labels(tmp_path: Path) -> None:
    # The operator's webhook lists the Nodes each nodeSelector matches (none: every node) and
    # refuses a second policy on a node; the audit reads the same from the aggregator.
    pools = {"gpu-001": "gpu", "gpu-002": "gpu", "roce-01": "eth"}
    view = ClusterView(present=True, nodes={
        n: ClusterNode(name=n, labels={"kubernetes.io/hostname": n, "pool": pool})
        for n, pool in pools.items()})  # fmt: skip
    harness = Harness(fleet=sample_fleet())
    app = build_app(
        fleet=harness.fleet, settings=ApiSettings(stale_after=STALE_AFTER),
        readiness=harness.readiness, clock=harness.clock, metrics=harness.registry,
        cluster_source=lambda: view,
    )  # fmt: skip
    policies = [
        {"kind": "NicNodePolicy", "metadata": {"name": "gpu-nodes"},
         "spec": {"nodeSelector": {"pool": "gpu"}}},
        {"kind": "NicNodePolicy", "metadata": {"name": "eth-nodes"},
         "spec": {"nodeSelector": {"pool": "eth"}}},
        {"kind": "NicNodePolicy", "metadata": {"name": "everywhere"}, "spec": {}},
    ]  # fmt: skip
    path = tmp_path / "nnp.yaml"
    path.write_text(json.dumps({"kind": "List", "items": policies}))
    with serve_in_thread(app) as url:
        args = ["--server", url, "audit", "nicclusterpolicy", "-f", str(path), "-o", "json"]
        result = CliRunner().invoke(cli, args, env={"NICFLEET_SERVER": None},
                                    prog_name="nicfleetctl")  # fmt: skip
    body = json.loads(result.stdout)
    found = {p["name"]: [n["message"] for n in p["notes"] if n["path"] == "spec.nodeSelector"
                         and n["section"] == "webhook"] for p in body["policies"]}  # fmt: skip
    assert found["gpu-nodes"] == [] and found["eth-nodes"] == []
    assert [m.split(":")[0] for m in found["everywhere"]] == [
        "NicNodePolicies gpu-nodes and everywhere both select gpu-001, gpu-002",
        "NicNodePolicies eth-nodes and everywhere both select roce-01",
    ]
    assert result.exit_code == 1
