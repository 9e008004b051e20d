"""`nicfleetctl validate` against the whole validation stack (API, runner, kmock, real NATS)
served from a thread: progress, the result, the ring's matrix, JSON, exit codes."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from aggregator.api.auth import parse_token_file
from aggregator.bus.natsserver import NatsServer
from aggregator.ctl.main import cli
from proto.messages.validation import ValidationResult
from tests.support.validation_fixtures import RES, Stack, answer, stack_in_thread

pytestmark = pytest.mark.integration

READ = "read-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"


def gpu3_has_no_rdma(vid: str, role: str, node: str) -> list[ValidationResult | bytes]:
    verdict = "ordinary-interface-only" if node == "gpu-003" else "rdma-path"
    return [answer(vid, role, node, verdict=verdict)]


@pytest.fixture(scope="module")
def stack(nats_server: NatsServer) -> Iterator[Stack]:
    with stack_in_thread(nats_server.url) as running:
        yield running


@pytest.fixture(scope="module")
def degraded(nats_server: NatsServer) -> Iterator[Stack]:
    auth = parse_token_file(f"read {READ}\nadmin {ADMIN}\n", source="tokens")
    with stack_in_thread(nats_server.url, script=gpu3_has_no_rdma, auth=auth) as running:
        yield running


def ctl(server: str, *args: str, token: Path | None = None) -> Result:
    env: dict[str, str | None] = {"NICFLEET_SERVER": None, "NO_COLOR": None, "FORCE_COLOR": "1"}
    head = ["--server", server] + (["--token-file", str(token)] if token else [])
    return CliRunner().invoke(
        cli, [*head, "validate", *args, "--interval", "0.05"], env=env, prog_name="nicfleetctl"
    )


def admin(tmp_path: Path, token: str = ADMIN) -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    return path


def test_a_passing_pair_exits_0_with_progress_and_bandwidth(stack: Stack) -> None:
    result = ctl(stack.url, "gpu-001", "gpu-002", "--resource", RES)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"{RES} gpu-001 → gpu-002: passed"
    assert lines[1] == "  bandwidth: 192.0 Gb/s, latency p50: 2.1 µs"
    assert "  server (gpu-001): rdma-path, pair test ok" in lines
    assert "  client (gpu-002): rdma-path, pair test ok" in lines
    progress = result.stderr.splitlines()
    assert any(line.endswith("gpu-001 → gpu-002: pending") for line in progress), progress
    assert any(": done (server: rdma-path" in line for line in progress), progress
    assert "\x1b" not in result.stdout


def test_json_is_the_record(stack: Stack) -> None:
    result = ctl(stack.url, "gpu-002", "gpu-003", "--resource", RES, "-o", "json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert (record["phase"], record["passed"], record["nodes"]) == (
        "done",
        True,
        ["gpu-002", "gpu-003"],
    )
    assert record["client"]["pair_test"]["bytes_per_second"] == 24e9


def test_ring_prints_a_matrix(stack: Stack) -> None:
    result = ctl(stack.url, "--all", "--resource", RES, "--concurrency", "2")
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()]
    assert rows[0] == ["SERVER", "\\", "CLIENT", "gpu-001", "gpu-002", "gpu-003"]
    assert rows[1] == ["gpu-001", "-", "ok", "192.0", "Gb/s", "-"]
    assert rows[2] == ["gpu-002", "-", "-", "ok", "192.0", "Gb/s"]
    assert rows[3] == ["gpu-003", "ok", "192.0", "Gb/s", "-", "-"]
    assert rows[4] == ["3/3", "pairs", "passed"]


def test_a_node_without_rdma_fails_the_pair_and_the_ring(degraded: Stack, tmp_path: Path) -> None:
    token = admin(tmp_path)
    one = ctl(degraded.url, "gpu-001", "gpu-003", "--resource", RES, token=token)
    assert one.exit_code == 1, one.output
    assert one.stdout.splitlines()[0] == f"{RES} gpu-001 → gpu-003: not passed (done)"
    assert "  client (gpu-003): ordinary-interface-only, no pair test" in one.stdout
    ring = ctl(degraded.url, "--all", "--resource", RES, "-o", "json", token=token)
    assert ring.exit_code == 1, ring.output
    records = json.loads(ring.stdout)
    assert [(r["nodes"], r["passed"]) for r in records] == [
        (["gpu-001", "gpu-002"], True),
        (["gpu-002", "gpu-003"], False),
        (["gpu-003", "gpu-001"], False),
    ]


def test_a_read_token_is_refused_with_exit_4(degraded: Stack, tmp_path: Path) -> None:
    result = ctl(degraded.url, "gpu-001", "gpu-002", "--resource", RES, token=admin(tmp_path, READ))
    assert result.exit_code == 4, result.output
    assert "POST needs an admin token" in result.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        pytest.param(("gpu-001", "gpu-001"), 2, "two different nodes", id="same-node"),
        pytest.param(("gpu-001",), 2, "two different nodes", id="one-node"),
        pytest.param(("gpu-001", "Bad_Name"), 2, "DNS-1123", id="bad-name"),
        pytest.param(("gpu-001", "--all"), 2, "not both", id="nodes-and-all"),
        pytest.param(("gpu-001", "gpu-00"), 1, "node 'gpu-00' not found", id="unknown-node"),
        pytest.param(("gpu-001", "gpu-009"), 1, "not advertised on gpu-009", id="not-advertised"),
    ],
)
def test_bad_input(stack: Stack, args: tuple[str, ...], code: int, message: str) -> None:
    result = ctl(stack.url, *args, "--resource", RES)
    assert result.exit_code == code, result.output
    assert message in result.stderr


def test_unreachable_aggregator_exits_3() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = ctl(f"http://127.0.0.1:{port}", "gpu-001", "gpu-002", "--resource", RES)
    assert result.exit_code == 3, result.output
