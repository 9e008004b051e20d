"""`nicfleetctl resources` (table, wide, JSON) and `nicfleetctl trace` for a resource the
agent leaves out of its config (`registration: config-invalid`), against a real API server:
the field at fault and the error reach the user."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from click.testing import CliRunner, Result

from aggregator.ctl.main import cli
from proto.messages.status import ResourceStatus
from tests.support.api_fixtures import serve_in_thread
from tests.support.builders import T0, plugin_status, resource_status
from tests.support.chain_fixtures import RES, ChainHarness, chain_fleet

pytestmark = pytest.mark.integration

BAD = "kubernetes.io/ib_c"
PATH = "configList[1].resourcePrefix"
ERROR = "'kubernetes.io' is reserved for Kubernetes"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    fleet = chain_fleet()
    bad = ResourceStatus(
        name=BAD, registration="config-invalid", config_path=PATH, config_error=ERROR
    )
    good = resource_status(RES, devices=("mlx5_0", "mlx5_1"))
    status = plugin_status("gpu-001", good, bad, generation=2, observed_at=T0 + 1)
    fleet.apply_status(status, T0 + 1)
    with serve_in_thread(ChainHarness(fleet=fleet).app()) as url:
        yield url


def ctl(*args: str) -> Result:
    env: dict[str, str | None] = {"NICFLEET_SERVER": None, "NO_COLOR": None, "FORCE_COLOR": "1"}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="nicfleetctl")


def test_resources_table_notes_the_field_and_the_error(server: str) -> None:
    result = ctl("--server", server, "resources")
    assert result.exit_code == 0, result.output
    note = f"note: {BAD} on gpu-001 is not served: {PATH}: {ERROR}"
    assert note in result.stdout.splitlines()
    wide = ctl("--server", server, "resources", "-o", "wide", "--name", BAD)
    assert wide.exit_code == 0, wide.output
    rows = [line.split() for line in wide.stdout.splitlines()]
    assert [BAD, "gpu-001", "ready", "0", "0", "-", "config-invalid"] in rows
    assert note in wide.stdout.splitlines()


def test_resources_json_carries_config_path_and_error(server: str) -> None:
    result = ctl("--server", server, "resources", "-o", "json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body == httpx.get(f"{server}/api/v1/resources").json()
    rows = {(i["name"], n["node"]): n for i in body["items"] for n in i["nodes"]}
    bad = rows[(BAD, "gpu-001")]
    assert (bad["registration"], bad["config_path"], bad["config_error"]) == (
        "config-invalid",
        PATH,
        ERROR,
    )
    served = rows[(RES, "gpu-001")]
    assert (served["config_path"], served["config_error"]) == (None, None)


def test_trace_names_the_field_to_correct(server: str) -> None:
    result = ctl("--server", server, "trace", "gpu-001", BAD)
    assert result.exit_code == 1, result.output
    assert f"fix:   correct {PATH} in the device-plugin config" in result.stdout
    assert f"{PATH}: {ERROR}" in result.stdout
