"""nicfleetctl against a real aggregator API served on 127.0.0.1 from a background thread."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from aggregator.ctl.main import cli
from aggregator.ctl.render import console_for, render_nodes
from aggregator.fleet.state import Fleet
from aggregator.fleet.views import summarize
from tests.support.api_fixtures import NOW, STALE_AFTER, Harness, sample_fleet, serve_in_thread

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve_in_thread(Harness(fleet=sample_fleet()).app()) as url:
        yield url


def ctl(*args: str, env: dict[str, str | None] | None = None) -> Result:
    base: dict[str, str | None] = {"NICFLEET_SERVER": None, "NO_COLOR": None, "FORCE_COLOR": "1"}
    return CliRunner().invoke(cli, list(args), env={**base, **(env or {})}, prog_name="nicfleetctl")


def test_nodes_table(server: str) -> None:
    result = ctl("--server", server, "nodes")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "NAME", "STATE", "DEVICES", "PORTS-UP", "GPUS", "LINK", "RATE", "FIRMWARE", "LAST-SEEN",
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == [
        "gpu-001", "gpu-002", "gpu-003", "gpu-010", "roce-01",
    ]  # fmt: skip
    assert lines[2].split()[:6] == ["gpu-002", "ready", "2", "1/2", "8", "InfiniBand"]
    assert "\x1b" not in result.stdout  # piped output is plain even with FORCE_COLOR set


def test_nodes_wide_and_state_filter(server: str) -> None:
    result = ctl("--server", server, "nodes", "-o", "wide", "--state", "ready")
    assert result.exit_code == 0, result.output
    assert "DOWN-PORTS" in result.stdout
    assert "mlx5_1/1" in result.stdout
    names = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert names == ["gpu-001", "gpu-002", "roce-01"]


def test_nodes_json_is_the_api_json(server: str) -> None:
    result = ctl("--server", server, "nodes", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == httpx.get(f"{server}/api/v1/nodes").json()
    assert result.stdout.startswith('{\n  "count": 5,')  # pretty, sorted keys


def test_server_from_environment(server: str) -> None:
    result = ctl("nodes", "--state", "stale", env={"NICFLEET_SERVER": server})
    assert result.exit_code == 0, result.output
    assert "gpu-003" in result.stdout


def test_no_nodes_matching(server: str) -> None:
    with serve_in_thread(Harness(fleet=Fleet()).app()) as empty:
        result = ctl("--server", empty, "nodes")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "No nodes found." in result.stderr


def test_node_detail(server: str) -> None:
    result = ctl("--server", server, "node", "gpu-002")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Node:" in out
    assert "gpu-002" in out
    assert "Down ports:  mlx5_1/1" in out
    ports = [line.split() for line in out.splitlines() if line.startswith("mlx5_")]
    assert ports[0][:9] == [
        "mlx5_0", "0000:3b:00.0", "0", "1", "ACTIVE", "LinkUp", "400G", "InfiniBand", "ibp59s0",
    ]  # fmt: skip
    assert ports[1][3:6] == ["1", "DOWN", "Disabled"]
    assert "ACTIVE -> DOWN" in out
    assert "500ms" in out  # received 0.5 s after the agent observed it


def test_node_json_and_wide(server: str) -> None:
    result = ctl("--server", server, "node", "gpu-001", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == httpx.get(f"{server}/api/v1/nodes/gpu-001").json()
    wide = ctl("--server", server, "node", "gpu-001", "-o", "wide")
    assert wide.exit_code == 0, wide.output
    assert "GPU-PCI" in wide.stdout
    assert "PCIE" in wide.stdout


def test_node_without_snapshot(server: str) -> None:
    result = ctl("--server", server, "node", "gpu-010")
    assert result.exit_code == 0, result.output
    assert "no-snapshot" in result.stdout
    assert "Events: none" in result.stdout


def test_unknown_node_exits_1_with_suggestions(server: str) -> None:
    result = ctl("--server", server, "node", "gpu-01")
    assert result.exit_code == 1
    assert "Error: unknown node 'gpu-01'; did you mean: " in result.stderr
    assert "gpu-001" in result.stderr


def test_invalid_node_name_exits_2(server: str) -> None:
    result = ctl("--server", server, "node", "GPU_01")
    assert result.exit_code == 2
    assert "DNS-1123" in result.stderr


def test_unreachable_server_exits_3() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    result = ctl("--server", url, "nodes")
    assert result.exit_code == 3
    assert f"cannot reach nicfleet aggregator at {url}" in result.stderr
    assert "NICFLEET_SERVER" in result.stderr


def test_non_nicfleet_server_exits_1() -> None:
    async def html(request: web.Request) -> web.Response:
        return web.Response(text="<html>oops</html>", status=502, content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", html)
    with serve_in_thread(app) as url:
        result = ctl("--server", url, "nodes")
    assert result.exit_code == 1
    assert "HTTP 502" in result.stderr
    assert "is this a nicfleet aggregator?" in result.stderr


@pytest.mark.parametrize(
    ("args", "code"),
    [
        pytest.param(["--server", "localhost:8080", "nodes"], 2, id="url-without-scheme"),
        pytest.param(["nodes", "-o", "xml"], 2, id="bad-output"),
        pytest.param(["nodes", "--state", "sleepy"], 2, id="bad-state"),
        pytest.param(["node"], 2, id="missing-name"),
    ],
)
def test_usage_errors_exit_2(args: list[str], code: int) -> None:
    assert ctl(*args).exit_code == code


def test_version_and_help() -> None:
    version = ctl("--version")
    assert version.exit_code == 0
    assert version.stdout.startswith("nicfleetctl, version ")
    help_ = ctl("--help")
    assert help_.exit_code == 0
    for line in ["Exit codes:", "3  the aggregator could not be reached", "NICFLEET_SERVER"]:
        assert line in help_.stdout


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stream", "env", "coloured"),
    [
        pytest.param(_Tty(), {}, True, id="terminal"),
        pytest.param(_Tty(), {"NO_COLOR": "1"}, False, id="terminal-no-color"),
        pytest.param(io.StringIO(), {"FORCE_COLOR": "1"}, False, id="pipe"),
    ],
)
def test_colour_only_on_terminals_without_no_color(
    stream: io.StringIO, env: dict[str, str], coloured: bool
) -> None:
    fleet = sample_fleet()
    record = fleet.get("gpu-001")
    assert record is not None
    render_nodes(console_for(stream, env), [summarize(record, NOW, STALE_AFTER)])
    assert ("\x1b[32m" in stream.getvalue()) is coloured  # green "ready"
    assert "gpu-001" in stream.getvalue()
