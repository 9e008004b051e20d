"""`nicfleetctl resources` and `nicfleetctl trace` for a shared resource the agent advertises
all Unhealthy because the node's RDMA subsystem is in exclusive netns mode, against a real
API server: the agent's reason (ResourceStatus.unhealthy_reason) reaches the user."""

from __future__ import annotations

import json
from collections.abc import Iterator

import msgspec
import pytest
from click.testing import CliRunner, Result

from agent.deviceplugin.plan import NETNS_EXCLUSIVE_REASON
from aggregator.ctl.main import cli
from tests.support.api_fixtures import serve_in_thread
from tests.support.builders import T0, plugin_status, resource_status
from tests.support.chain_fixtures import RES, ChainHarness, chain_fleet

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    fleet = chain_fleet()
    served = resource_status(RES, devices=("mlx5_0", "mlx5_1"), advertised=4, healthy=0)
    blocked = msgspec.structs.replace(served, unhealthy_reason=NETNS_EXCLUSIVE_REASON)
    fleet.apply_status(plugin_status("gpu-001", blocked, generation=2, observed_at=T0 + 1), T0 + 1)
    with serve_in_thread(ChainHarness(fleet=fleet).app()) as url:
        yield url


def ctl(*args: str) -> Result:
    env: dict[str, str | None] = {"NICFLEET_SERVER": None, "NO_COLOR": "1"}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="nicfleetctl")


def test_resources_table_and_json_carry_the_reason(server: str) -> None:
    result = ctl("--server", server, "resources")
    note = f"note: {RES} on gpu-001: every device unhealthy: {NETNS_EXCLUSIVE_REASON}"
    assert note in result.stdout.splitlines(), result.output
    body = json.loads(ctl("--server", server, "resources", "-o", "json").stdout)
    rows = {(i["name"], n["node"]): n for i in body["items"] for n in i["nodes"]}
    assert rows[(RES, "gpu-001")]["unhealthy_reason"] == NETNS_EXCLUSIVE_REASON


def test_trace_says_why_every_device_is_unhealthy(server: str) -> None:
    result = ctl("--server", server, "trace", "gpu-001", RES, "-o", "json")
    links = {link["name"]: link for link in json.loads(result.stdout)["links"]}
    cause = links["advertised"]["cause"]
    assert cause == f"all 4 devices are unhealthy ({NETNS_EXCLUSIVE_REASON})"
    assert result.exit_code == 1
