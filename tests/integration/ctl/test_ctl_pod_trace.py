"""`nicfleetctl trace --pod NS/NAME` against a real API server (127.0.0.1)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from click.testing import CliRunner, Result

from aggregator.ctl.main import cli
from tests.support.api_fixtures import serve_in_thread
from tests.support.chain_fixtures import ChainHarness
from tests.support.pod_trace_fixtures import pod_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve_in_thread(ChainHarness(cluster=pod_cluster()).app()) as url:
        yield url


def ctl(*args: str) -> Result:
    env: dict[str, str | None] = {"NICFLEET_SERVER": None, "NO_COLOR": None, "FORCE_COLOR": "1"}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="nicfleetctl")


def test_a_scheduled_pod_on_a_healthy_node_exits_0(server: str) -> None:
    result = ctl("--server", server, "trace", "--pod", "ml/t-0")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "pod ml/t-0 on gpu-001 (Running), requests rdma/ib=1: ok"
    assert lines[1] == " ✔ scheduling ok"
    # Nothing broken (exit 0); never validated, so not every link is ok.
    assert (
        "rdma/ib on gpu-001: unknown: 2 links not judged (pod-interface, tested-data-path); "
        "nothing broken"
    ) in lines


def test_a_pending_pod_exits_1_with_the_schedulers_cause(server: str) -> None:
    result = ctl("--server", server, "trace", "--pod", "ml/t-9")
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert out.startswith("pod ml/t-9 not scheduled (Pending), requests rdma/ib=2: broken")
    assert " ✘ scheduling broken" in out
    assert "cause: ml/t-9 is not scheduled: 0/2 nodes are available: 2 Insufficient rdma/ib" in out
    assert "fix:   no node has rdma/ib free" in out


def test_a_pod_on_a_broken_node_exits_1_at_its_first_broken_link(server: str) -> None:
    result = ctl("--server", server, "trace", "--pod", "ml/t-2")
    assert result.exit_code == 1, result.output
    assert "rdma/ib on gpu-002: broken at link 3 (rdma-device)" in result.stdout


def test_json_is_the_api_json(server: str) -> None:
    result = ctl("--server", server, "trace", "--pod", "ml/t-9", "-o", "json")
    assert result.exit_code == 1
    api = httpx.get(f"{server}/api/v1/trace/pods/ml/t-9")
    assert json.loads(result.stdout) == api.json()


def test_an_unknown_pod_exits_1_naming_it(server: str) -> None:
    result = ctl("--server", server, "trace", "--pod", "ml/t-00")
    assert result.exit_code == 1
    assert "pod 'ml/t-00' not found" in result.stderr
    assert "ml/t-0" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("--pod", "t-0"), id="no-namespace"),
        pytest.param(("gpu-001", "--pod", "ml/t-0"), id="with-node"),
        pytest.param(("gpu-001",), id="node-without-resource"),
        pytest.param((), id="nothing"),
    ],
)
def test_bad_usage_exits_2(server: str, args: tuple[str, ...]) -> None:
    result = ctl("--server", server, "trace", *args)
    assert result.exit_code == 2, result.output
