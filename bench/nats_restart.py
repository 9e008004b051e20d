"""Benchmark: recovery after the nats-server is SIGKILLed and started again.

A real nats-server, an in-process aggregator and agent on a rendered lab tree; per run a
port goes down while NATS is down; timed from the new server accepting connections until
the aggregator's fleet shows the DOWN port (reconnect, re-publish, ingest).
A script for docs/reliability.md, never a test. Run: .venv/bin/python bench/nats_restart.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from agent.lab.faults import port_down, port_up
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.service import AggregatorService, AggregatorSettings

NODE = "bench-restart-01"


def port_state(agg: AggregatorService) -> str | None:
    record = agg.fleet.get(NODE)
    if record is None or record.snapshot is None:
        return None
    return record.snapshot.devices[0].ports[0].state


async def wait_for(predicate: object, timeout: float = 60.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        await asyncio.sleep(0.002)


async def measure(work: Path, runs: int) -> list[float]:
    root = work / NODE
    render(with_node_name(load_builtin("roce-cx6dx"), NODE), root)
    server = NatsServer(NatsServerSettings(store_dir=work / "js")).start()
    agg = AggregatorService(AggregatorSettings(nats_url=server.url, listen_port=0))
    agent = AgentService(AgentSettings(node_name=NODE, sysfs_root=root, nats_url=server.url))
    stop = asyncio.Event()
    times: list[float] = []
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(agg.run(stop))
            tasks.create_task(agent.run(stop))
            try:
                # Killed before its startup is done (KV buckets, alert states loaded), the
                # aggregator stops with a StoreError instead of reconnecting: a loaded
                # machine got there before the first snapshot did.
                await asyncio.wait_for(agg.ready.wait(), 60)
                await wait_for(lambda: port_state(agg) == "ACTIVE")
                for _ in range(runs):
                    await asyncio.to_thread(server.stop, kill=True)
                    port_down(root, "mlx5_0", 1)
                    await asyncio.to_thread(server.start)
                    started = time.perf_counter()
                    await wait_for(lambda: port_state(agg) == "DOWN")
                    times.append(time.perf_counter() - started)
                    port_up(root, "mlx5_0", 1)
                    await wait_for(lambda: port_state(agg) == "ACTIVE")
            finally:
                stop.set()
    finally:
        server.close()
    return times


# --smoke: the same path, shortest (make test runs it; its numbers mean nothing).
SMOKE = {"runs": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run of the same code path, numbers meaningless "
        "(--runs 1; options given still win)",
    )
    opts = parser.parse_args()
    if opts.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**SMOKE)
        opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nicfleet-bench-") as tmp:
        times = asyncio.run(measure(Path(tmp), opts.runs))
    result = {
        "benchmark": "nats_restart",
        "runs": opts.runs,
        "recovery_s": {
            "median": round(statistics.median(times), 3),
            "min": round(min(times), 3),
            "max": round(max(times), 3),
        },
    }
    if opts.smoke:
        result["smoke"] = True
    print(json.dumps(result) if opts.json else f"recovery after NATS SIGKILL: {result}")


if __name__ == "__main__":
    main()
