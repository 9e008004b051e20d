"""Benchmark: recovery after the agent process is SIGKILLed and started again.

A real nats-server, an in-process aggregator and kubelet emulator, `python -m agent run`
on a rendered lab tree with its device plugin on. Per run: SIGKILL the agent, flip a port
while it is dead, start it again; timed from the process start until the kubelet sees a
new registration, and until the aggregator's fleet shows the flipped port.
A script for docs/reliability.md, never a test. Run: .venv/bin/python bench/agent_restart.py
(`--smoke`: one restart, seconds; checks the script still runs)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the kubelet emulator and the agent process live in tests/

from agent.lab.faults import port_down, port_up  # noqa: E402
from agent.lab.render import render  # noqa: E402
from agent.lab.spec import load_builtin, with_node_name  # noqa: E402
from aggregator.bus.natsserver import NatsServer, NatsServerSettings  # noqa: E402
from aggregator.service import AggregatorService, AggregatorSettings  # noqa: E402
from tests.support.faults import AgentProcess  # noqa: E402
from tests.support.kubelet import KubeletEmulator  # noqa: E402

NODE = "bench-agent-01"
RESOURCE = "rdma/ib_gpu0"
# --smoke: the same path with one kill (make test runs it; its numbers mean nothing).
SMOKE = {"runs": 1}
CONFIG = {
    "configList": [
        {"resourceName": "ib_gpu0", "rdmaHcaMax": 8, "selectors": {"rdmaDevices": ["mlx5_0"]}}
    ]
}


def port_state(agg: AggregatorService) -> str | None:
    record = agg.fleet.get(NODE)
    if record is None or record.snapshot is None:
        return None
    return record.snapshot.devices[0].ports[0].state


async def wait_for(predicate: Callable[[], bool], timeout: float = 60.0) -> float:
    """Wait until `predicate()`; return the perf_counter time it was first seen true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        await asyncio.sleep(0.002)
    return time.perf_counter()


async def measure(work: Path, sockets: Path, runs: int) -> dict[str, list[float]]:
    root = work / NODE
    render(with_node_name(load_builtin("h100-ib-12nic"), NODE), root)
    config = sockets / "config.json"
    config.write_text(json.dumps(CONFIG))
    plugins = sockets / "device-plugins"
    server = NatsServer(NatsServerSettings(store_dir=work / "js")).start()
    agg = AggregatorService(AggregatorSettings(nats_url=server.url, listen_port=0))
    proc = AgentProcess(server.url, root, NODE, work=work, plugin_dir=plugins, config=config)
    stop = asyncio.Event()
    times: dict[str, list[float]] = {"registered_s": [], "fleet_updated_s": []}
    try:
        async with KubeletEmulator(plugins) as kubelet, asyncio.TaskGroup() as tasks:
            tasks.create_task(agg.run(stop))
            try:
                proc.start()
                await wait_for(lambda: port_state(agg) == "ACTIVE")
                for run in range(runs):
                    await asyncio.to_thread(proc.kill)
                    down = run % 2 == 0
                    (port_down if down else port_up)(root, "mlx5_0", 1)
                    wanted = "DOWN" if down else "ACTIVE"
                    seen = len(kubelet.registrations)
                    started = time.perf_counter()
                    proc.start()
                    registered = await wait_for(
                        lambda s=seen: len(kubelet.registrations) > s  # type: ignore[misc]
                    )
                    updated = await wait_for(lambda w=wanted: port_state(agg) == w)  # type: ignore[misc]
                    times["registered_s"].append(registered - started)
                    times["fleet_updated_s"].append(updated - started)
            finally:
                stop.set()
    finally:
        await asyncio.to_thread(proc.stop)
        server.close()
    return times


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run that checks the script still works, numbers meaningless "
        "(--runs 1; options given still win)",
    )
    opts = parser.parse_args()
    if opts.smoke:
        parser.set_defaults(**SMOKE)
        opts = parser.parse_args()
    sockets = Path(tempfile.mkdtemp(prefix="nfb", dir="/tmp"))  # unix socket path limit
    try:
        with tempfile.TemporaryDirectory(prefix="nicfleet-bench-") as tmp:
            times = asyncio.run(measure(Path(tmp), sockets, opts.runs))
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    result = {
        "benchmark": "agent_restart",
        "runs": opts.runs,
        "registered_s": summary(times["registered_s"]),
        "fleet_updated_s": summary(times["fleet_updated_s"]),
        **({"smoke": True} if opts.smoke else {}),
    }
    print(json.dumps(result) if opts.json else f"recovery after agent SIGKILL: {result}")


if __name__ == "__main__":
    main()
