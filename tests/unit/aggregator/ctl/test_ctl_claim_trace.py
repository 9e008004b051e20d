"""`nicfleetctl trace --pod` for a pod with DRA claims, against the real API app on
127.0.0.1: the claim chain prints like a resource chain (verdict line, numbered links,
cause and fix of the first broken one), `-o json` carries it in `claims`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

from aggregator.api.app import ApiSettings, build_app
from aggregator.cluster import PodClaim
from aggregator.ctl.main import cli
from aggregator.fleet.state import Fleet
from proto.messages.status import DevicePluginStatus
from tests.support.api_fixtures import STALE_AFTER, FakeClock, Readiness, serve_in_thread
from tests.support.builders import T0
from tests.unit.aggregator.trace import drafixtures as fx


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    fleet = Fleet()
    for snap in fx.nodes().values():
        fleet.apply_snapshot(snap, T0)
        fleet.apply_status(
            DevicePluginStatus(node=snap.node, observed_at=T0, dra=fx.prepared()), T0
        )
    waiting = fx.pod(name="w-1", claims=(PodClaim(name="nic", template="nic-tpl"),))
    cluster = fx.cluster(pods=(fx.pod(), waiting))
    app = build_app(
        fleet=fleet, settings=ApiSettings(stale_after=STALE_AFTER), readiness=Readiness(),
        clock=FakeClock(), cluster_source=lambda: cluster, policy_source=lambda: (),
    )  # fmt: skip
    with serve_in_thread(app) as url:
        yield url


def ctl(*args: str) -> Result:
    env: dict[str, str | None] = {"NICFLEET_SERVER": None, "NO_COLOR": "1", "FORCE_COLOR": None}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="nicfleetctl")


def test_an_ok_claim_chain_prints_every_link(server: str) -> None:
    result = ctl("--server", server, "trace", "--pod", "ml/w-0")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "pod ml/w-0 on gpu-ib-01 (Running), requests no resource, claims nic: ok"
    assert "claim/nic on gpu-ib-01: chain ok" in lines
    start = lines.index("claim/nic on gpu-ib-01: chain ok")
    assert [line.split()[1:3] for line in lines[start + 1 :]] == [
        ["0", "claim"], ["1", "slice-published"], ["2", "device-healthy"],
        ["3", "claim-allocated"], ["4", "prepared"], ["5", "pod"],
    ]  # fmt: skip


def test_a_broken_claim_chain_names_its_first_broken_link_and_exits_1(server: str) -> None:
    result = ctl("--server", server, "trace", "--pod", "ml/w-1")
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "claim/nic on gpu-ib-01: broken at link 0 (claim)" in out
    assert " ✘ 0 claim           broken  <- first broken link" in out
    assert (
        "     cause: the resourceclaim controller has not created the claim of template "
        "ml/nic-tpl for ml/w-1"
    ) in out


def test_json_carries_the_claim_chains(server: str) -> None:
    result = ctl("--server", server, "trace", "--pod", "ml/w-0", "-o", "json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["traces"] == [] and body["ok"] is True
    (claim,) = body["claims"]
    assert (claim["resource"], claim["node"], claim["verdict"]) == ("claim/nic", "gpu-ib-01", "ok")
    assert claim["links"][4]["evidence"]["cdi_ids"] == ["rdma.nicfleet.io/claim=u-1"]
