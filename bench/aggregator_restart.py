"""Benchmark: aggregator restart time with N nodes stored in the `nicfleet-nodes` KV bucket.

A real nats-server; the bucket seeded with N copies of a rendered lab node's snapshot;
then, per run, `python -m aggregator run` is started and timed until its ready file
appears (NATS connect, fleet rebuilt from KV, API up), and killed with SIGKILL.
A script for docs/reliability.md, never a test. Run: .venv/bin/python bench/aggregator_restart.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import nats

from agent.inventory import collect_snapshot
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from agent.sysfs import Sysfs
from aggregator.natsserver import NatsServer, NatsServerSettings
from aggregator.store import StoredNode, open_bucket
from proto import subjects
from proto.codec import encode

REPO = Path(__file__).resolve().parents[1]


async def seed(url: str, work: Path, count: int) -> None:
    root = work / "template"
    render(with_node_name(load_builtin("h100-ib-12nic"), "template"), root)
    template = collect_snapshot(Sysfs(root), node="template", seq=1, now=1.0, agent_version="b")
    nc = await nats.connect(url)
    try:
        kv = await open_bucket(nc.jetstream())
        for i in range(count):
            snap = msgspec.structs.replace(template, node=f"bench-{i:05d}")
            stored = StoredNode(snapshot=snap, received_at=time.time())
            await kv.put(subjects.node_token(snap.node), encode(stored))
    finally:
        await nc.close()


def time_to_ready(url: str, work: Path, run: int, timeout: float = 120.0) -> float:
    ready = work / f"ready-{run}"
    args = [sys.executable, "-m", "aggregator", "run", "--nats-url", url,
            "--listen", "127.0.0.1:0", "--ready-file", str(ready)]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not ready.exists():
            if proc.poll() is not None:
                raise SystemExit(f"aggregator exited with {proc.returncode}")
            if time.perf_counter() - started > timeout:
                raise SystemExit(f"aggregator not ready within {timeout}s")
            time.sleep(0.005)
        return time.perf_counter() - started
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nicfleet-bench-") as tmp:
        work = Path(tmp)
        with NatsServer(NatsServerSettings(store_dir=work / "js")) as server:
            asyncio.run(seed(server.url, work, opts.nodes))
            empty_ready = time_to_ready(server.url, work, -1)  # warm-up (imports, caches)
            times = [time_to_ready(server.url, work, run) for run in range(opts.runs)]
    result = {
        "benchmark": "aggregator_restart",
        "nodes": opts.nodes,
        "runs": opts.runs,
        "time_to_ready_s": {
            "median": round(statistics.median(times), 3),
            "min": round(min(times), 3),
            "max": round(max(times), 3),
        },
        "warmup_s": round(empty_ready, 3),
    }
    if opts.json:
        print(json.dumps(result))
    else:
        print(f"time to ready with {opts.nodes} nodes in KV: median "
              f"{result['time_to_ready_s']['median']} s over {opts.runs} runs")  # fmt: skip


if __name__ == "__main__":
    main()
