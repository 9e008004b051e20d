"""Micro-benchmark (issue 8): how long the aggregator's SnapshotWriter takes to persist a
burst of node snapshots (every agent starting at once) to the `nicfleet-nodes` KV bucket of
a real nats-server on 127.0.0.1. Wall time of one `flush()` of N pending snapshots, median
of --runs. Not a test. Run: .venv/bin/python bench/kv_writes.py --nodes 2000 --json
(`--smoke`: 20 nodes, one run, seconds; checks the script still runs)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Final

import msgspec
import nats

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from loadgen import NodeShape, build_templates  # noqa: E402

from aggregator.bus.natsserver import NatsServer, NatsServerSettings  # noqa: E402
from aggregator.fleet.store import SnapshotWriter, open_bucket  # noqa: E402
from aggregator.metrics import Metrics  # noqa: E402
from proto import codec  # noqa: E402
from proto.inventory import NodeSnapshot  # noqa: E402

# --smoke: the same path, tiny (make test runs it; its numbers mean nothing).
SMOKE: Final = {"nodes": 20, "runs": 1}


async def measure(url: str, nodes: int, runs: int) -> dict[str, Any]:
    snap = codec.decode(build_templates(NodeShape()).snapshot, NodeSnapshot)
    snaps = [msgspec.structs.replace(snap, node=f"kv-{i:05d}") for i in range(nodes)]
    nc = await nats.connect(url, name="bench-kv-writes")
    try:
        kv = await open_bucket(nc.jetstream())
        seconds = []
        for _ in range(runs):
            writer = SnapshotWriter(kv, Metrics.create())
            for s in snaps:
                writer.submit(s, time.time())
            start = time.perf_counter()
            await writer.flush()
            seconds.append(time.perf_counter() - start)
            assert writer.pending == 0 and writer.healthy
    finally:
        await nc.close()
    median = statistics.median(seconds)
    return {
        "nodes": nodes,
        "snapshot_bytes": len(codec.encode(snap)),
        "flush_s": round(median, 3),
        "writes_per_s": round(nodes / median),
        "runs_s": [round(s, 3) for s in seconds],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run that checks the script still works, numbers meaningless "
        "(--nodes 20 --runs 1; options given still win)",
    )
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    with NatsServer(NatsServerSettings()) as server:  # store in a removed temporary dir
        result = asyncio.run(measure(server.url, args.nodes, args.runs))
    if args.smoke:
        result["smoke"] = True
    print(json.dumps(result, indent=None if not args.json else 2))


if __name__ == "__main__":
    main()
