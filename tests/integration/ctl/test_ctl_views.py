"""nicfleetctl topology, version, -o yaml and --watch against a real aggregator API served on
127.0.0.1; the topology node is the lab's 12-NIC H100 whose `nvidia-smi topo -m` we hold."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml
from click.testing import CliRunner, Result

from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.host.topology import parse_topo_matrix
from agent.lab.render import render
from agent.lab.spec import load_builtin
from aggregator.ctl.main import cli
from tests.support.api_fixtures import NOW, Harness, sample_fleet, serve_in_thread
from tests.support.paths import REPO
from tests.support.sysfs_trees import TOPOLOGY

pytestmark = pytest.mark.integration
H100_MATRIX = TOPOLOGY / "nvidia_smi_topo_h100_12nic_2numa.txt"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("h100") / "sys"
    render(load_builtin("h100-ib-12nic"), root)
    snap = collect_snapshot(Sysfs(root), node="gpu-ib-01", seq=1, now=NOW - 1, agent_version="t")
    fleet = sample_fleet()
    fleet.apply_snapshot(snap, NOW - 1)
    with serve_in_thread(Harness(fleet=fleet).app()) as url:
        yield url


def ctl(*args: str, env: dict[str, str | None] | None = None) -> Result:
    base: dict[str, str | None] = {
        "NICFLEET_SERVER": None,
        "NICFLEET_TOKEN_FILE": None,
        "NICFLEET_CONFIG": "/nonexistent/nicfleet-config.yaml",
        "NO_COLOR": None,
        "FORCE_COLOR": "1",
    }
    return CliRunner().invoke(cli, list(args), env={**base, **(env or {})}, prog_name="nicfleetctl")


def _matrix_cells(out: str) -> dict[tuple[str, str], str]:
    lines = [line.split() for line in out.splitlines() if line.strip()]
    header = lines[0]
    nics = [c for c in header if c.startswith("mlx5_")]
    return {
        (row[0], nic): cell
        for row in lines
        if re.fullmatch(r"GPU\d+", row[0])  # GPU0 0000:18:00.0 PIX ...
        for nic, cell in zip(nics, row[2 : 2 + len(nics)], strict=True)
    }


def test_topology_is_the_captured_nvidia_smi_matrix(server: str) -> None:
    result = ctl("--server", server, "topology", "gpu-ib-01")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout  # piped: plain text
    ours = _matrix_cells(result.stdout)
    captured = {
        key: cell
        for key, cell in parse_topo_matrix(H100_MATRIX.read_text()).items()
        if key[0].startswith("GPU") and key[1].startswith("mlx5_")
    }
    assert {key: cell.rstrip("*") for key, cell in ours.items()} == captured
    # One best NIC per GPU, the compute rail NIC behind its PCIe switch.
    best = sorted(key for key, cell in ours.items() if cell.endswith("*"))
    rail = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
    assert best == sorted((f"GPU{i}", nic) for i, nic in enumerate(rail))
    assert "GPU6  " in result.stdout
    assert "mlx5_10 (PIX)" in result.stdout
    assert "SYS  across the NUMA interconnect" in result.stdout


def test_topology_wide_json_and_yaml(server: str) -> None:
    wide = ctl("--server", server, "topology", "gpu-ib-01", "-o", "wide")
    assert wide.exit_code == 0, wide.output
    assert "0000:18:00.0" in wide.stdout  # GPU0's PCI address
    assert "InfiniBand" in wide.stdout
    doc = json.loads(ctl("--server", server, "topology", "gpu-ib-01", "-o", "json").stdout)
    assert doc["node"] == "gpu-ib-01"
    assert [g["best_nic"] for g in doc["gpus"]][:2] == ["mlx5_0", "mlx5_3"]
    assert doc["gpus"][0]["relations"]["mlx5_6"] == "SYS"
    as_yaml = ctl("--server", server, "topology", "gpu-ib-01", "-o", "yaml")
    assert yaml.safe_load(as_yaml.stdout) == doc


def test_topology_colours_relations_on_a_terminal(server: str) -> None:
    out = _run_on_pty("--server", server, "topology", "gpu-ib-01")
    assert "\x1b[" in out
    assert re.search(r"\x1b\[[0-9;]*31m[^\x1b]*SYS", out)  # SYS red
    assert re.search(r"\x1b\[[0-9;]*32m[^\x1b]*PIX\*", out)  # best NIC green (and marked)


def test_topology_of_node_without_snapshot_or_gpus(server: str) -> None:
    none = ctl("--server", server, "topology", "gpu-010")
    assert none.exit_code == 1
    assert "has sent no snapshot yet" in none.stderr
    roce = ctl("--server", server, "topology", "roce-01")
    assert roce.exit_code == 0, roce.output
    assert "roce-01: no GPUs in the latest snapshot." in roce.stdout


def test_yaml_is_the_json_of_every_list_command(server: str) -> None:
    for args in (("nodes",), ("node", "gpu-002"), ("resources",)):
        as_json = ctl("--server", server, *args, "-o", "json")
        as_yaml = ctl("--server", server, *args, "-o", "yaml")
        assert as_yaml.exit_code == as_json.exit_code, (args, as_yaml.output)
        assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout), args


def test_yaml_with_follow_is_refused(server: str) -> None:
    result = ctl("--server", server, "alerts", "--follow", "-o", "yaml")
    assert result.exit_code == 2
    assert "use -o json with --follow" in result.stderr


def test_watch_prints_a_block_per_interval_when_piped(server: str) -> None:
    result = ctl("--server", server, "nodes", "--watch", "0.1", "--watch-count", "3")
    assert result.exit_code == 0, result.output
    headers = [line for line in result.stdout.splitlines() if line.startswith("Every 0.1s:")]
    assert len(headers) == 3
    assert "nicfleetctl nodes" in headers[0]
    assert result.stdout.count("gpu-002") == 3


def test_watch_default_interval_and_bad_values(server: str) -> None:
    result = ctl("--server", server, "resources", "-w", "--watch-count", "1")
    assert result.exit_code == 0, result.output
    assert result.stderr == "No resources found.\n"  # the sample fleet has no device plugin
    assert result.stdout.startswith("Every 2s: nicfleetctl resources")
    bad = ctl("--server", server, "nodes", "--watch", "0")
    assert bad.exit_code == 2
    assert "--watch" in bad.stderr
    follow = ctl("--server", server, "alerts", "--follow", "--watch", "1")
    assert follow.exit_code == 2
    assert "--watch cannot be combined with --follow" in follow.stderr


def test_watch_keeps_going_when_the_server_goes_away() -> None:
    with serve_in_thread(Harness(fleet=sample_fleet()).app()) as url:
        pass  # stopped: its port is closed now
    result = ctl("--server", url, "nodes", "--watch", "0.1", "--watch-count", "2")
    assert result.exit_code == 0, result.output
    assert result.stderr.count(f"cannot reach nicfleet aggregator at {url}") == 2
    assert "(retrying)" in result.stderr


def test_watch_redraws_in_place_on_a_terminal(server: str) -> None:
    out = _run_on_pty("--server", server, "nodes", "--watch", "0.1", "--watch-count", "2")
    assert out.count("Every 0.1s: nicfleetctl nodes") >= 2  # Live redraws once more at exit
    assert "\x1b[2K" in out or "\x1b[1A" in out  # rich Live moves the cursor up to redraw
    assert "\x1b[32mready" in out or re.search(r"\x1b\[[0-9;]*32mready", out)


def test_version_with_and_without_server(server: str) -> None:
    result = ctl("--server", server, "version")
    assert result.exit_code == 0, result.output
    mine = httpx.get(f"{server}/api/v1/openapi.json").json()["info"]["version"]
    assert result.stdout.splitlines() == [
        f"Client: nicfleetctl {mine}",
        f"Server: {mine} ({server}, from --server)",
    ]
    doc = json.loads(ctl("--server", server, "version", "-o", "json").stdout)
    assert doc == {"client": mine, "server": mine, "server_url": server, "server_error": None}
    down = ctl("--server", "http://127.0.0.1:9", "version", "-o", "yaml")
    assert down.exit_code == 0
    answer = yaml.safe_load(down.stdout)
    assert answer["server"] is None
    assert "cannot reach nicfleet aggregator at http://127.0.0.1:9" in answer["server_error"]


def _run_on_pty(*args: str) -> str:
    """Run nicfleetctl with its stdout on a real pseudo-terminal; everything it printed."""
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "NICFLEET_SERVER")}
    env.update(COLUMNS="200", LINES="50", TERM="xterm-256color")
    env["NICFLEET_CONFIG"] = "/nonexistent/nicfleet-config.yaml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggregator.ctl", *args],
        stdout=secondary,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=REPO,
    )
    os.close(secondary)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 1.0)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            data = os.read(primary, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(primary)
    assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    return b"".join(chunks).decode(errors="replace")
