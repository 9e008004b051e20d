"""Benchmark (issue 8, scale out): counter batches applied per second by 1, 2, 3 sharded
aggregator replicas (`run --partitions`, docs/scaling.md) at 1 Hz per node, and the largest
node count each replica count sustains (applied >= 95 % of offered over the window).

One nats-server with the partition mapping, the replicas as processes, bench/loadgen.py's
simulated agents. On a 2-core machine the load generator, nats-server and the replicas share
the cores, so this shows the trend only. Never a test.
Run: .venv/bin/python bench/shard_scale.py --replicas 1 2 3 --nodes 1000 3000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the fixtures live in tests/

import aiohttp
from loadgen import LoadGen, LoadSpec, build_templates
from prometheus_client.parser import text_string_to_metric_families
from scale_probes import cpu_s

from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.bus.permissions import render_mappings_config
from tests.integration.replicas.test_shards import (
    Fleetwide,
    ShardReplica,
    replica_processes,
)
from tests.support.waits import wait_until

SUSTAINED: Final = 0.95


async def applied_counters(http: aiohttp.ClientSession, api_url: str) -> float:
    async with http.get(f"{api_url}/metrics") as resp:
        text = await resp.text()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        if family.name == "nicfleet_ingest_messages"
        for s in family.samples
        if s.name.endswith("_total") and s.labels.get("kind") == "counters"
    )


async def total(http: aiohttp.ClientSession, replicas: list[ShardReplica]) -> float:
    return sum([await applied_counters(http, r.api_url) for r in replicas])


async def one(replicas: int, nodes: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    config = work / "mappings.conf"
    config.write_text(render_mappings_config(args.partitions))
    with (
        NatsServer(NatsServerSettings(store_dir=work / "nats", config_file=config)) as server,
        replica_processes([server.url] * replicas, work, args.partitions) as running,
    ):
        await wait_until(lambda: all(r.is_ready() for r in running), timeout=120,
                         interval=0.2, what="replicas ready")  # fmt: skip
        fleet = Fleetwide(running)

        async def settled() -> bool:
            held = await fleet.poll() and sorted(p for v in fleet.views for p in v["held"])
            return held == list(range(args.partitions))

        if args.partitions:  # 0: plain (unsharded) aggregators, the baseline
            await wait_until(settled, timeout=60, interval=0.2, what="partitions held")
        spec = LoadSpec(nats_url=server.url, nodes=nodes, processes=args.processes,
                        duration_s=args.duration, hz=1.0)  # fmt: skip
        gen = LoadGen(spec, build_templates(spec.shape))
        try:
            await asyncio.to_thread(gen.start)
            start_at = gen.go()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                await asyncio.sleep(max(0.0, start_at - time.time()) + args.duration / 2)
                t0, c0 = time.monotonic(), await total(http, running)
                cpu0 = replica_cpu_s(running)
                await asyncio.sleep(args.duration / 2 - 1)
                t1, c1 = time.monotonic(), await total(http, running)
                cpu1 = replica_cpu_s(running)
            await asyncio.to_thread(gen.finish)
        finally:
            gen.stop()
    rate = (c1 - c0) / (t1 - t0)
    busy = [round(100 * (b - a) / (t1 - t0)) for a, b in zip(cpu0, cpu1, strict=True)]
    spent = sum(cpu1) - sum(cpu0)
    return {
        "replicas": replicas,
        "nodes": nodes,
        "offered_msgs_s": nodes,
        "applied_msgs_s": round(rate, 1),
        "sustained": rate >= SUSTAINED * nodes,
        "replica_cpu_pct": busy,  # each replica's share of one core over the window
        # Replica CPU per applied message, all replicas together: flat when sharding adds no
        # per-message work, so N replicas on N free cores apply N times one replica's rate.
        "replica_cpu_us_per_msg": round(1e6 * spent / (c1 - c0), 1) if c1 > c0 else None,
    }


def replica_cpu_s(running: Sequence[ShardReplica]) -> list[float]:
    return [cpu_s(r.proc.pid) if r.proc is not None else 0.0 for r in running]


# --smoke: the same path, shortest (make test runs it; its numbers mean nothing).
SMOKE = {"replicas": [2], "nodes": [50], "duration": 3.0, "processes": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 3000])
    parser.add_argument("--partitions", type=int, default=12, help="0: unsharded baseline")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--processes", type=int, default=2, help="load generator processes")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run of the same code path, numbers meaningless "
        "(--replicas 2 --nodes 50 --duration 3 --processes 1; options given still win)",
    )
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    rows = []
    for replicas in args.replicas:
        for nodes in args.nodes:
            with tempfile.TemporaryDirectory(prefix="nicfleet-shards-") as tmp:
                try:
                    rows.append(asyncio.run(one(replicas, nodes, args, Path(tmp))))
                except Exception as exc:  # a replica died: keep going, say which and why
                    logs = {p.name: p.read_text()[-1500:] for p in Path(tmp).glob("r*.log")}
                    print(json.dumps({"replicas": replicas, "nodes": nodes, "logs": logs}),
                          file=sys.stderr)  # fmt: skip
                    rows.append({"replicas": replicas, "nodes": nodes, "error": repr(exc),
                                 "sustained": False})  # fmt: skip
    best = {
        r: max((row["nodes"] for row in rows if row["replicas"] == r and row["sustained"]),
               default=0)
        for r in args.replicas
    }  # fmt: skip
    doc = {
        "benchmark": "shard_scale",
        "partitions": args.partitions,
        "load_average_1m": round(os.getloadavg()[0], 1),
        "rows": rows,
        "max_sustained_nodes": best,
    }
    if args.smoke:
        doc["smoke"] = True
    print(json.dumps(doc) if args.json else json.dumps(doc, indent=1))
    if args.smoke and any("error" in row for row in rows):
        raise SystemExit("--smoke: a replica died (its log is on stderr)")


if __name__ == "__main__":
    main()
