"""Benchmark: sharded aggregators (docs/scaling.md) — time from SIGKILLing one of 3
replicas until the survivors hold every node again and find what they found before.

3-server NATS cluster with the partition mapping, 3 `nicfleet-aggregator run --partitions`
processes, simulated agents answering resyncs (tests/integration/replicas/test_shards.py); a fresh
cluster per run. Never a test. Run: .venv/bin/python bench/shard_takeover.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the fixtures live in tests/

from aggregator.bus.permissions import render_mappings_config
from tests.integration.replicas.test_shards import (
    NODES,
    ODD,
    PARTS,
    Fleetwide,
    expected_findings,
    jetstream_ready,
    replica_processes,
    simulated_agents,
)
from tests.support.jscluster import js_cluster
from tests.support.waits import wait_until


async def until(check: Fleetwide, predicate: Callable[[], bool], timeout: float) -> None:
    async def polled() -> bool:
        return await check.poll() and predicate()

    await wait_until(polled, timeout=timeout, interval=0.05, what="replicas settled")


async def one_run(work: Path) -> float:
    config = work / "mappings.conf"
    config.write_text(render_mappings_config(PARTS))
    expected = expected_findings()
    with js_cluster(work, config=config, name="bench") as servers:
        urls = [s.url for s in servers.values()]
        await jetstream_ready(urls[0])
        with replica_processes(urls, work) as replicas:
            await wait_until(lambda: all(r.is_ready() for r in replicas), timeout=60,
                             interval=0.1, what="replicas ready")  # fmt: skip
            fleet = Fleetwide(replicas)
            await until(fleet, fleet.held_once, 30)
            async with simulated_agents(urls, []):  # resync requests: not recorded here
                await until(fleet, lambda: fleet.nodes_once() and fleet.findings() == expected, 30)
                victim = next(
                    r for r, v in zip(replicas, fleet.views, strict=True)
                    if ODD in v["node_names"]
                )  # fmt: skip
                killed = time.monotonic()
                victim.kill()
                survivors = Fleetwide([r for r in replicas if r is not victim])
                await until(
                    survivors,
                    lambda: (
                        survivors.held_once()
                        and survivors.nodes_once()
                        and survivors.findings() == expected
                    ),
                    60,
                )
                return time.monotonic() - killed


# --smoke: the same path, shortest (make test runs it; its numbers mean nothing).
SMOKE = {"runs": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run of the same code path, numbers meaningless "
        "(--runs 1; a takeover waits for the 6 s TTL; options given still win)",
    )
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    times = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            times.append(asyncio.run(one_run(Path(tmp))))
    doc = {
        "benchmark": "shard_takeover",
        "replicas": 3,
        "nats_servers": 3,
        "partitions": PARTS,
        "nodes": len(NODES),
        "heartbeat_s": 1.0,
        "ttl_s": 6.0,
        "takeover_s": [round(t, 2) for t in times],
        "median_s": round(statistics.median(times), 2),
    }
    if args.smoke:
        doc["smoke"] = True
    print(json.dumps(doc) if args.json else "\n".join(f"{k}: {v}" for k, v in doc.items()))


if __name__ == "__main__":
    main()
