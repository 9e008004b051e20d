"""`nicfleetctl trace` and `nicfleetctl resources` against a real API server (127.0.0.1)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import msgspec
import pytest
from click.testing import CliRunner, Result

from aggregator.ctl.main import cli
from aggregator.fleet.state import Fleet
from aggregator.trace.chain import LINK_NAMES
from proto.http import ValidationRecord
from proto.messages.validation import Evidence, RdmaInterface, Reason, ValidationResult
from tests.support.api_fixtures import NOW, serve_in_thread
from tests.support.builders import T0, modules, nic, plugin_status, resource_status, snapshot
from tests.support.chain_fixtures import RES, ChainHarness, chain_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve_in_thread(ChainHarness(cluster=chain_cluster()).app()) as url:
        yield url


def ctl(*args: str) -> Result:
    env: dict[str, str | None] = {"NICFLEET_SERVER": None, "NO_COLOR": None, "FORCE_COLOR": "1"}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="nicfleetctl")


def test_trace_not_validated_is_unknown_not_ok_and_exits_0(server: str) -> None:
    result = ctl("--server", server, "trace", "gpu-001", RES)
    assert result.exit_code == 0, result.output  # nothing is broken
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "rdma/ib on gpu-001: unknown: 2 links not judged (pod-interface, tested-data-path); "
        "nothing broken"
    )
    assert lines[1] == " ✔ components ok"  # the cluster's part on the node, beside the chain
    assert [line.split()[:3] for line in lines[2:5]] == [
        ["✔", "0", "agent"],
        ["✔", "1", "adapter"],
        ["✔", "2", "driver"],
    ]
    # Every link but the never-validated pod-interface and tested-data-path, and components.
    assert len([line for line in lines if line.startswith(" ✔")]) == len(LINK_NAMES) - 1
    assert "\x1b" not in result.stdout


def test_trace_broken_exits_1_with_cause_and_fix(server: str) -> None:
    result = ctl("--server", server, "trace", "gpu-002", RES)
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert out.startswith("rdma/ib on gpu-002: broken at link 3 (rdma-device)")
    assert " ✘ 3 rdma-device      broken  <- first broken link" in out
    assert "cause: no active port on the selected adapters (mlx5_0/1, mlx5_1/1)" in out
    assert "fix:   check cable, transceiver and switch port" in out
    assert '"mlx5_0/1": "DOWN/Disabled InfiniBand"' in out  # evidence of a broken link
    assert result.stderr == ""


def test_trace_json_is_the_api_json_and_keeps_the_exit_code(server: str) -> None:
    result = ctl("--server", server, "trace", "gpu-002", RES, "-o", "json")
    assert result.exit_code == 1
    api = httpx.get(f"{server}/api/v1/trace", params={"node": "gpu-002", "resource": RES})
    assert json.loads(result.stdout) == api.json()


def test_trace_wide_shows_evidence_of_every_link(server: str) -> None:
    result = ctl("--server", server, "trace", "gpu-001", RES, "-o", "wide")
    assert result.exit_code == 0, result.output
    # Every link's (with tested-data-path) and the components section's.
    assert result.stdout.count("evidence:") == len(LINK_NAMES) + 1
    assert '"registration": "registered"' in result.stdout


def verified(*, found: bool) -> ValidationRecord:
    """gpu-001's newest validation: its pod's verify found net1, or only eth0."""
    primary = Reason(
        code="primary-interface-only", missing="RoCE GID of mlx5_0 equal to a pod address",
        message="the pod has only its primary interface (eth0) and no RoCE GID of mlx5_0 "
        "carries its address: no secondary (RDMA) network is attached",
    )  # fmt: skip
    net1 = RdmaInterface(interface="net1", device="mlx5_0", sources=("gid-address", "device-info"))
    server = ValidationResult(
        role="server", pod="nicfleet-validate-v1-server",
        verdict="rdma-path" if found else "ordinary-interface-only",
        reasons=() if found else (primary,),
        evidence=Evidence(rdma_interfaces=(net1,) if found else ()),
        started_at=NOW - 30, finished_at=NOW - 10,
    )  # fmt: skip
    return ValidationRecord(
        id="v1", nodes=("gpu-001", "gpu-003"), resource=RES, namespace="nicfleet-system",
        phase="done" if found else "failed", passed=found, created_at=NOW - 60,
        updated_at=NOW, phase_since=NOW, finished_at=NOW, server=server,
    )  # fmt: skip


def test_trace_shows_the_pods_interface_from_the_newest_validation() -> None:
    harness = ChainHarness(cluster=chain_cluster(), validations={"gpu-001": verified(found=False)})
    with serve_in_thread(harness.app()) as url:
        broken = ctl("--server", url, "trace", "gpu-001", RES)
        harness.validations["gpu-001"] = verified(found=True)
        ok = ctl("--server", url, "trace", "gpu-001", RES, "-o", "wide")
        api = httpx.get(f"{url}/api/v1/trace", params={"node": "gpu-001", "resource": RES})
    index = LINK_NAMES.index("pod-interface")
    assert broken.exit_code == 1, broken.output
    assert broken.stdout.startswith(f"rdma/ib on gpu-001: broken at link {index} (pod-interface)")
    assert "cause: verify in nicfleet-system/nicfleet-validate-v1-server: the pod has only" in (
        broken.stdout
    )
    assert "fix:   request the RDMA network in `k8s.v1.cni.cncf.io/networks`" in broken.stdout
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.startswith("rdma/ib on gpu-001: chain ok\n")  # every link is ok
    assert f" ✔ {index} pod-interface" in ok.stdout
    assert '"interfaces": ["net1 (gid-address, device-info)"]' in ok.stdout
    link = api.json()["links"][index]
    assert (link["name"], link["status"]) == ("pod-interface", "ok")
    assert link["evidence"]["verified"][0]["devices"] == {"net1": ["mlx5_0"]}


def test_trace_unknown_node_and_resource_exit_1(server: str) -> None:
    node = ctl("--server", server, "trace", "gpu-01", RES)
    assert node.exit_code == 1
    assert "Error: unknown node 'gpu-01'; did you mean: gpu-001" in node.stderr
    resource = ctl("--server", server, "trace", "gpu-001", "rdma/ibb")
    assert resource.exit_code == 1
    assert "'rdma/ibb' is neither configured nor served on 'gpu-001'" in resource.stderr
    assert "known here: rdma/ib" in resource.stderr


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["trace", "GPU_1", RES], id="invalid-node"),
        pytest.param(["trace", "gpu-001", "ib"], id="bare-resource"),
        pytest.param(["trace", "gpu-001"], id="missing-resource"),
        pytest.param(["trace", "gpu-001", RES, "-o", "xml"], id="bad-output"),
        pytest.param(["resources", "--node", "Bad_Node"], id="resources-invalid-node"),
        pytest.param(["resources", "--name", "nope"], id="resources-bad-name-from-server"),
    ],
)
def test_bad_input_exits_2(server: str, args: list[str]) -> None:
    result = ctl("--server", server, *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_unreachable_exits_3() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for args in (["trace", "gpu-001", RES], ["resources"]):
        result = ctl("--server", url, *args)
        assert result.exit_code == 3
        assert f"cannot reach nicfleet aggregator at {url}" in result.stderr


def test_resources_table_and_wide(server: str) -> None:
    result = ctl("--server", server, "resources")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "RESOURCE", "NODES", "CAPACITY", "HEALTHY", "ALLOCATABLE", "ZERO", "UNHEALTHY",
    ]  # fmt: skip
    assert lines[1].split() == ["rdma/ib", "2/2", "4", "2", "4", "0", "1"]
    wide = ctl("--server", server, "resources", "-o", "wide", "--node", "gpu-002")
    assert wide.exit_code == 0, wide.output
    rows = [line.split() for line in wide.stdout.splitlines()]
    assert ["rdma/ib", "gpu-002", "ready", "2", "0", "2", "registered"] in rows
    assert not any("gpu-001" in row for row in rows)


def test_resources_json_and_empty(server: str) -> None:
    result = ctl("--server", server, "resources", "-o", "json")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == httpx.get(f"{server}/api/v1/resources").json()
    # A name the fleet does not have is a typo, not an empty list (test_ctl_habits.py).
    unknown = ctl("--server", server, "resources", "--name", "rdma/none")
    assert unknown.exit_code == 1 and "unknown resource 'rdma/none'" in unknown.stderr
    assert unknown.stdout == ""


def degraded_fleet() -> Fleet:
    """gpu-ib-01: eight rdma/ib adapters, mlx5_3's port down; the plugin 7 of 8 healthy."""
    devices = tuple(
        msgspec.structs.replace(
            nic(f"mlx5_{i}", index=i, netdevs=(f"ib{i}",), state="DOWN" if i == 3 else "ACTIVE"),
            fw_ver="28.39.1002",
        )
        for i in range(8)
    )
    fleet = Fleet()
    snap = msgspec.structs.replace(snapshot("gpu-ib-01", devices=devices), modules=modules())
    fleet.apply_snapshot(snap, T0)
    status = resource_status(
        RES, devices=tuple(d.name for d in devices), healthy=7,
        unhealthy={"mlx5_3": "no port ACTIVE/LinkUp (1:DOWN/Disabled)"},
    )  # fmt: skip
    fleet.apply_status(plugin_status("gpu-ib-01", status), T0)
    return fleet


def test_trace_one_of_eight_adapters_down_is_degraded_and_names_it() -> None:
    with serve_in_thread(ChainHarness(fleet=degraded_fleet()).app()) as url:
        result = ctl("--server", url, "trace", "gpu-ib-01", RES)
        api = httpx.get(f"{url}/api/v1/trace", params={"node": "gpu-ib-01", "resource": RES})
    assert result.exit_code == 0, result.output  # degraded is not broken: pods still fit
    lines = result.stdout.splitlines()
    assert (
        lines[0]
        == "rdma/ib on gpu-ib-01: degraded: capacity reduced on mlx5_3 (rdma-device, advertised)"
    )
    assert " ! 3 rdma-device      degraded" in lines
    assert " ! 6 advertised       degraded" in lines
    assert (
        "     cause: 7 of 8 devices healthy (mlx5_3: no port ACTIVE/LinkUp (1:DOWN/Disabled))"
        in lines
    )
    body = api.json()
    assert (body["verdict"], body["ok"], body["first_broken"]) == ("degraded", False, None)
    assert body["verdict_reason"] == "capacity reduced on mlx5_3 (rdma-device, advertised)"
    assert body["links"][3]["evidence"]["degraded_adapters"] == ["mlx5_3"]
