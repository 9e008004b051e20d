"""`nicfleetctl claim explain` without --slices: the aggregator's GET /api/v1/dra/slices
(proto.draslices over the fleet's snapshots), served for real on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner, Result

from aggregator.ctl.main import cli
from aggregator.fleet.state import Fleet
from tests.support.api_fixtures import Harness, serve_in_thread
from tests.support.builders import T0, nic, snapshot

pytestmark = pytest.mark.integration

CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "one-ib"},
    "spec": {
        "devices": {
            "requests": [{"name": "nic", "exactly": {"deviceClassName": "ib.rdma.nicfleet.io"}}]
        }
    },
}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    fleet = Fleet()
    fleet.apply_snapshot(snapshot("gpu-ib-01", devices=(nic("mlx5_0"),)), T0)
    fleet.apply_snapshot(snapshot("gpu-ib-02", devices=(nic("mlx5_3", state="DOWN"),)), T0)
    with serve_in_thread(Harness(fleet).app()) as url:
        yield url


def explain(server: str, *args: str) -> Result:
    env: dict[str, str | None] = {"NICFLEET_SERVER": None, "NO_COLOR": "1"}
    return CliRunner().invoke(
        cli, ["--server", server, "claim", "explain", *args], env=env, prog_name="nicfleetctl"
    )


def test_the_endpoint_is_a_list_of_resource_slices(server: str) -> None:
    body = httpx.get(f"{server}/api/v1/dra/slices").json()
    assert body["kind"] == "List"
    assert [s["spec"]["nodeName"] for s in body["items"]] == ["gpu-ib-01", "gpu-ib-02"]
    assert {s["spec"]["driver"] for s in body["items"]} == {"rdma.nicfleet.io"}
    bad = httpx.get(f"{server}/api/v1/dra/slices", params={"node": "x"})
    assert bad.status_code == 400


def test_explain_against_the_live_fleet(server: str, tmp_path: Path) -> None:
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(CLAIM))
    got = explain(server, "-f", str(path), "-o", "json")
    assert got.exit_code == 0, got.output
    nodes = {n["node"]: n for n in json.loads(got.stdout)["nodes"]}
    assert nodes["gpu-ib-01"]["requests"][0]["devices"] == ["mlx5-0"]
    assert not nodes["gpu-ib-02"]["ok"]
    assert "mlx5-3 port DOWN" in nodes["gpu-ib-02"]["requests"][0]["why"]
