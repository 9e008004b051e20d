"""nicfleetctl's kubectl habits against a real aggregator API (nodes, resources, findings and
alerts routes with the real rule registry) on 127.0.0.1: global options on either side of
the command, typo-proof filters, the best NIC with a port down, and tables that line up
(no trailing blanks, no `None`, the same finding columns offline and live)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest
from aiohttp import web
from click.testing import CliRunner, Result
from prometheus_client import CollectorRegistry

from aggregator.alerts.delivery import Broker
from aggregator.alerts.engine import AlertEngine, EngineSettings
from aggregator.alerts.metrics import AlertMetrics
from aggregator.api.alerts import StreamSettings, add_alert_routes
from aggregator.api.app import ApiSettings, build_app
from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.ctl.main import cli
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.finding import Finding
from proto.inventory import GpuNicRelation
from proto.policy import Policy
from tests.support.api_fixtures import NOW, STALE_AFTER, sample_fleet
from tests.support.builders import T0, device, plugin_status, port, resource_status, snapshot
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

TOPO_NODE = "gpu-topo-01"
GPU0, GPU1 = "0000:18:00.0", "0000:19:00.0"


def habits_fleet() -> Fleet:
    """The sample fleet, plus a 2-GPU node whose mlx5_0 (GPU0's closest NIC) is down and
    whose GPU1 is NODE away from every NIC (a gpu-nic-affinity warning), and device-plugin
    status on gpu-001: rdma/ib served, rdma/empty advertising 0."""
    fleet = sample_fleet()
    base = snapshot(
        TOPO_NODE,
        collected_at=T0,
        gpus=2,
        devices=(
            device("mlx5_0", pci="0000:1a:00.0", numa=0, ports=(port(1, "DOWN"),)),
            device("mlx5_1", pci="0000:86:00.0", numa=1),
        ),
    )
    topo = msgspec.structs.replace(
        base,
        gpu_nic_topology=(
            GpuNicRelation(gpu=GPU0, nic="mlx5_0", relation="PIX"),
            GpuNicRelation(gpu=GPU0, nic="mlx5_1", relation="SYS"),
            GpuNicRelation(gpu=GPU1, nic="mlx5_0", relation="SYS"),
            GpuNicRelation(gpu=GPU1, nic="mlx5_1", relation="NODE"),
        ),
    )
    fleet.apply_snapshot(topo, T0)
    ib = resource_status("rdma/ib", devices=("mlx5_0", "mlx5_1"))
    empty = resource_status("rdma/empty", devices=(), advertised=0)
    fleet.apply_status(plugin_status("gpu-001", ib, empty), T0)
    return fleet


@asynccontextmanager
async def served() -> AsyncIterator[str]:
    """The node, resource, trace, findings and alert routes over `habits_fleet`, the real
    rules evaluated once."""
    fleet = habits_fleet()

    def rules(
        fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float
    ) -> Sequence[Finding]:
        return evaluate(fleet.view(), policies, cluster, now)

    engine = AlertEngine(
        fleet=fleet, changes=ChangeFeed().subscribe(), evaluate=rules,
        policies=lambda: (), cluster=lambda: NO_CLUSTER, settings=EngineSettings(),
        metrics=AlertMetrics.create(CollectorRegistry()), broker=Broker(first_id=1),
        clock=lambda: NOW,
    )  # fmt: skip
    await engine.cycle("test")
    app = build_app(
        fleet=fleet,
        settings=ApiSettings(stale_after=STALE_AFTER),
        readiness=lambda: (True, "ok"),
        clock=lambda: NOW,
    )
    add_alert_routes(app, engine=engine, settings=StreamSettings(heartbeat_s=0.2))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        engine.broker.close()
        await runner.cleanup()


BASE_ENV: dict[str, str | None] = {
    "NICFLEET_SERVER": None,
    "NICFLEET_TOKEN_FILE": None,
    "NICFLEET_CONFIG": "/nonexistent/nicfleet-config.yaml",
    "NO_COLOR": "1",
}


async def ctl(*args: str, env: dict[str, str | None] | None = None) -> Result:
    """The CLI in a thread: its synchronous HTTP calls reach the server on this loop."""
    merged = {**BASE_ENV, **(env or {})}
    runner = CliRunner()
    return await asyncio.to_thread(
        runner.invoke, cli, list(args), env=merged, prog_name="nicfleetctl"
    )


def closed_url() -> str:
    return "http://127.0.0.1:9"  # discard: nothing listens there


async def test_global_options_work_before_and_after_the_command(tmp_path: Path) -> None:
    async with served() as url:
        before = await ctl("--server", url, "-o", "json", "nodes")
        after = await ctl("nodes", "--server", url, "-o", "json")
        assert before.exit_code == after.exit_code == 0, (before.output, after.output)
        assert json.loads(before.stdout) == json.loads(after.stdout)
        # Given on both sides, the later one wins (kubectl's last-flag rule).
        later = await ctl("--server", closed_url(), "nodes", "--server", url)
        assert later.exit_code == 0, later.output
        # A flag after the command still beats the environment.
        env = await ctl("nodes", "--server", url, env={"NICFLEET_SERVER": closed_url()})
        assert env.exit_code == 0, env.output
        # --context after the command, from a context file.
        config = tmp_path / "config.yaml"
        config.write_text(f"contexts:\n- name: lab\n  server: {url}\n")
        with_context = await ctl("findings", "--context", "lab",
                                 env={"NICFLEET_CONFIG": str(config)})  # fmt: skip
        assert with_context.exit_code == 0, with_context.output
        assert "gpu-nic-affinity" in with_context.stdout
        # The group's -o applies unless the command has its own.
        group_o = await ctl("-o", "json", "--server", url, "findings", "-o", "wide")
        assert group_o.exit_code == 0 and "EVIDENCE" in group_o.stdout
        wrong = await ctl("--server", url, "-o", "wide", "version")
        assert wrong.exit_code == 2 and "'wide' is not one of" in wrong.stderr
        bad = await ctl("nodes", "--server", "ftp://x")
        assert bad.exit_code == 2 and "is not an http:// or https:// URL" in bad.stderr
        # Deeper commands too: the NicClusterPolicy audit reads the live fleet.
        policy = tmp_path / "ncp.yaml"
        policy.write_text("apiVersion: mellanox.com/v1alpha1\nkind: NicClusterPolicy\n"
                          "metadata: {name: nic-cluster-policy}\nspec: {}\n")  # fmt: skip
        audit = await ctl("audit", "nicclusterpolicy", "-f", str(policy), "--server", url)
        assert audit.exit_code in (0, 1), audit.output
        assert "NicClusterPolicy/nic-cluster-policy" in audit.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["findings", "--node", "gpu-01"], "unknown node 'gpu-01'; did you mean: "
                     "gpu-010, gpu-001", id="findings-node"),
        pytest.param(["findings", "--rule", "port-dwn"], "unknown rule 'port-dwn'; did you "
                     "mean: port-down?", id="findings-rule"),
        pytest.param(["alerts", "--node", "roce-1"], "did you mean: roce-01?", id="alerts-node"),
        pytest.param(["alerts", "--rule", "gpu-nic-afinity"], "did you mean: gpu-nic-affinity?",
                     id="alerts-rule"),
        pytest.param(["alerts", "--follow", "--node", "roce-1"], "did you mean: roce-01?",
                     id="alerts-follow-node"),
        pytest.param(["resources", "--node", "gpu-0001"], "unknown node 'gpu-0001'; did you "
                     "mean: gpu-001", id="resources-node"),
        pytest.param(["resources", "--name", "rdma/ibb"], "unknown resource 'rdma/ibb'; did "
                     "you mean: rdma/ib", id="resources-name"),
        pytest.param(["findings", "--node", "zzzzzz-q"], "none of the 6 known nodes is close",
                     id="nothing-close"),
        pytest.param(["resources", "--name", "rdma/ibb", "-o", "json"], "did you mean: rdma/ib",
                     id="json-too"),
        pytest.param(["resources", "--name", "rdma/ibb", "-w", "0.1", "--watch-count", "2"],
                     "did you mean: rdma/ib", id="watch-stops"),
    ],
)  # fmt: skip
async def test_an_unknown_name_in_a_filter_exits_1_with_close_matches(
    args: list[str], message: str
) -> None:
    async with served() as url:
        result = await ctl("--server", url, *args)
    assert result.exit_code == 1, result.output
    assert message in result.stderr
    assert result.stdout == ""  # nothing that reads as an empty, all-clear answer


@pytest.mark.parametrize(
    ("args", "empty"),
    [
        pytest.param(["findings", "--node", "gpu-010", "--severity", "info"], "No findings.",
                     id="known-node"),
        pytest.param(["findings", "--node", "_fleet", "--rule", "driver-skew"], "No findings.",
                     id="fleet-wide"),
        pytest.param(["findings", "--rule", "nvidia-policy-section"], "No findings.",
                     id="audit-rule"),
        pytest.param(["alerts", "--rule", "link-flap"], "No alerts.", id="catalogued-rule"),
        pytest.param(["resources", "--node", "roce-01"], "No resources found.", id="no-plugin"),
    ],
)  # fmt: skip
async def test_a_known_name_with_nothing_to_show_is_still_exit_0(
    args: list[str], empty: str
) -> None:
    async with served() as url:
        result = await ctl("--server", url, *args)
    assert result.exit_code == 0, result.output
    assert empty in result.stderr


COMMANDS = [
    ["nodes"], ["nodes", "-o", "wide"], ["node", "gpu-001"], ["node", "gpu-002", "-o", "wide"],
    ["node", "gpu-003"], ["node", "gpu-010"], ["node", "roce-01", "-o", "wide"],
    ["node", TOPO_NODE, "-o", "wide"], ["topology", TOPO_NODE], ["topology", TOPO_NODE, "-o",
    "wide"], ["resources"], ["resources", "-o", "wide"], ["findings"], ["findings", "-o",
    "wide"], ["alerts"], ["alerts", "-o", "wide"], ["trace", "gpu-001", "rdma/ib"],
    ["trace", "gpu-001", "rdma/ib", "-o", "wide"], ["version"],
]  # fmt: skip


async def test_no_table_has_trailing_blanks_or_a_python_none() -> None:
    async with served() as url:
        for args in COMMANDS:
            result = await ctl("--server", url, *args)
            assert result.exit_code in (0, 1), (args, result.output)
            assert result.stdout.strip(), args
            for line in result.stdout.splitlines():
                assert line == line.rstrip(), (args, line)
                assert not re.search(r"\bNone\b", line), (args, line)


async def test_check_and_findings_print_the_same_columns(tmp_path: Path) -> None:
    snap = habits_fleet().view()[TOPO_NODE].snapshot
    assert snap is not None
    path = tmp_path / "node.json"
    path.write_bytes(msgspec.json.encode(snap))
    async with served() as url:
        live = await ctl("--server", url, "findings", "--node", TOPO_NODE)
    offline = await ctl("check", "--snapshot", str(path))
    assert live.exit_code == 0 and offline.exit_code == 1, (live.output, offline.output)
    header = ["SEVERITY", "RULE", "NODE", "SUBJECT", "MESSAGE"]
    assert live.stdout.splitlines()[0].split() == offline.stdout.splitlines()[0].split() == header
    rows = {tuple(line.split()[:4]) for line in live.stdout.splitlines()[1:]}
    assert ("warning", "gpu-nic-affinity", TOPO_NODE, GPU1) in rows
    assert ("warning", "gpu-nic-affinity", TOPO_NODE, GPU1) in {
        tuple(line.split()[:4]) for line in offline.stdout.splitlines()[1:]
    }
    wide = await ctl("check", "--snapshot", str(path), "-o", "wide")
    assert "EVIDENCE" in wide.stdout.splitlines()[0]
    assert "best_nic=mlx5_1" in wide.stdout and "gpu_numa_node=0" in wide.stdout


async def test_topology_marks_down_nics_and_names_gpus_as_findings_do() -> None:
    async with served() as url:
        result = await ctl("--server", url, "topology", TOPO_NODE)
        doc = json.loads((await ctl("--server", url, "topology", TOPO_NODE, "-o", "json")).stdout)
        finding = json.loads(
            (
                await ctl("--server", url, "findings", "--rule", "gpu-nic-affinity", "-o", "json")
            ).stdout
        )["items"][0]
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()]
    assert rows[0] == ["PCI", "mlx5_0", "mlx5_1", "NUMA", "BEST-NIC"]
    assert rows[1] == ["PORT", "DOWN", "ACTIVE"]  # the down NIC is marked
    # GPU0's closest NIC is down: its best is the closest one still up, though it is SYS.
    assert rows[2] == ["GPU0", GPU0, "PIX", "SYS*", "0", "mlx5_1", "(SYS)"]
    assert rows[3] == ["GPU1", GPU1, "SYS", "NODE*", "0", "mlx5_1", "(NODE)"]
    # The GPU a finding names (its PCI address) is a row of the matrix.
    assert finding["subject"] == GPU1 and rows[3][1] == finding["subject"]
    assert [(n["name"], n["active"], n["port_state"]) for n in doc["nics"]] == [
        ("mlx5_0", False, "DOWN"), ("mlx5_1", True, "ACTIVE"),
    ]  # fmt: skip
    assert [g["best_nic"] for g in doc["gpus"]] == ["mlx5_1", "mlx5_1"]


async def test_nodes_last_seen_is_not_called_age() -> None:
    async with served() as url:
        table = await ctl("--server", url, "nodes")
        wide = await ctl("--server", url, "nodes", "-o", "wide")
        one = await ctl("--server", url, "node", "gpu-001")
    assert table.stdout.splitlines()[0].split()[-1] == "LAST-SEEN"
    assert "AGE" not in table.stdout.splitlines()[0].split()
    assert wide.stdout.splitlines()[0].split()[-2:] == ["LAST-SEEN-AT", "LAST-SEEN"]
    gpu_001 = next(line.split() for line in table.stdout.splitlines() if line.startswith("gpu-001"))
    assert re.fullmatch(r"\d+[smhd]", gpu_001[-1]), gpu_001  # kubectl's units: 4s, 5m, 3h, 2d
    assert "First seen:" in one.stdout


async def test_follow_prints_a_header_and_aligned_columns() -> None:
    async with served() as url:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aggregator.ctl", "alerts", "--follow", "--server", url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1",
                 "NICFLEET_CONFIG": "/nonexistent/nicfleet-config.yaml"},
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            header = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
            first = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
            second = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        finally:
            proc.send_signal(signal.SIGINT)
            code = await asyncio.wait_for(proc.wait(), 20)
    assert code == 0
    columns = ["TIME", "STATE", "SEVERITY", "RULE", "NODE", "SUBJECT", "MESSAGE"]
    assert header.split() == columns
    starts = [header.index(c) for c in columns]
    for line in (first, second):
        assert line.rstrip("\n") == line.rstrip(), line
        cells = [line[s:].split(" ", 1)[0] for s in starts[:-1]]
        assert cells[1] == "current" and cells[2] in ("critical", "warning", "info"), line
        assert all(cells) and all(line[s - 1] == " " for s in starts[1:]), line


async def test_node_names_complete_with_the_server_given_after_the_command() -> None:
    async with served() as url:
        words = f"nicfleetctl findings --server {url} --node roce"
        env: dict[str, str | None] = {"_NICFLEETCTL_COMPLETE": "bash_complete", "COMP_WORDS": words,
               "COMP_CWORD": str(len(words.split()) - 1)}  # fmt: skip
        result = await ctl(env=env)
    assert result.exit_code == 0, result.output
    assert [line.split(",", 1)[1] for line in result.stdout.splitlines()] == ["roce-01"]
