"""Benchmark (issue 8): how many nodes one aggregator ingests at 1 Hz, beside the ceiling.

Per node count the same bench/loadgen.py load runs twice, each on a fresh nats-server
(127.0.0.1): with only a bare decode-only subscriber (bench/bare_subscriber.py) attached,
then with only the real aggregator (`python -m aggregator run`) — each has the machine to
itself (`--concurrent`: both on one run). Reports applied msgs/s of both and their ratio,
lag, event->alert latency, RSS and CPU, slow consumers. Optional py-spy. Never a test.
Run: .venv/bin/python bench/ingest_scale.py --nodes 1000 3000 10000
(`--smoke`: 10 nodes for 3 s, one run each side; checks the script still runs)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import aiohttp
import nats
from ingest_verdict import BARE_KEYS, HEADER, MEDIAN_KEYS, analyse, capacity, row_text
from loadgen import (
    ENCODINGS,
    LoadGen,
    LoadSpec,
    NodeShape,
    Templates,
    build_templates,
    spread_port_downs,
)
from scale_probes import (
    Aggregator,
    Bare,
    cpu_s,
    free_port,
    nats_monitor,
    rss_kb,
    summarize_profile,
    wait_for,
)

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aggregator.bus.natsserver import NatsServer, NatsServerSettings  # noqa: E402
from proto.codec import decode, encode_map  # noqa: E402
from proto.messages.alerts import Alert  # noqa: E402
from proto.messages.counters import CounterBatch  # noqa: E402

ATTACH: Final = ("both", "bare", "aggregator")  # who subscribes during one load run
# --smoke: the same path, tiny and short (make test runs it; its numbers mean nothing).
SMOKE: Final = {
    "nodes": [10],
    "duration": 3.0,
    "warmup": 1.0,
    "processes": 1,
    "port_downs": 1,
    "every": 0.5,
    "snapshot_timeout": 20.0,
}


async def measure(
    nodes: int, args: argparse.Namespace, tpl: Templates, workdir: Path, attach: str = "both"
) -> dict[str, Any]:
    """One load run on a fresh nats-server with the bare subscriber, the aggregator or
    both attached. A bare-only run skips the snapshot phase (nothing to fill)."""
    workdir = fresh_dir(workdir)
    mon = free_port()
    settings = NatsServerSettings(store_dir=workdir / "nats", extra_args=("-m", str(mon)))
    result: dict[str, Any] = {"nodes": nodes, "offered_msgs_s": nodes * args.hz, "attach": attach}
    with NatsServer(settings) as server:
        agg = Aggregator(server.url, workdir) if attach != "bare" else None
        bare = Bare() if attach != "aggregator" else None
        gen: LoadGen | None = None
        nc = await nats.connect(server.url, name="bench-harness")
        alerts: dict[str, float] = {}

        async def on_alert(msg: Any) -> None:
            alert = decode(msg.data, Alert)
            if alert.state == "firing":
                alerts.setdefault(alert.node, time.time())

        await nc.subscribe("nicfleet.v1.alert.critical.port-down.>", cb=on_alert)
        timeout = aiohttp.ClientTimeout(total=10)
        rss0 = rss_snap = 0
        final: dict[str, float] = {}
        async with aiohttp.ClientSession(timeout=timeout) as http:
            try:
                if agg is not None:
                    await agg.ready(http)
                    rss0 = rss_kb(agg.proc.pid)
                if bare is not None:
                    await bare.start(server.url)
                spec = LoadSpec(
                    nats_url=server.url,
                    nodes=nodes,
                    processes=args.processes,
                    duration_s=args.duration,
                    hz=args.hz,
                    snapshot_rate=args.snapshot_rate,
                    shape=args.shape,
                    port_down=spread_port_downs(
                        nodes, args.port_downs, args.warmup, args.duration - 3
                    ),
                    encoding=args.encoding,
                    full_every=args.full_every,
                    snapshots=agg is not None,
                )
                gen = LoadGen(spec, tpl)
                t_snap = time.monotonic()
                await asyncio.to_thread(gen.start)
                if agg is not None:
                    result["snapshots_applied"] = await snapshots_in(agg, http, nodes, args)
                    result["snapshot_ingest_s"] = round(time.monotonic() - t_snap, 2)
                    result["slow_consumers_after_snapshots"] = (await nats_monitor(http, mon))[
                        "slow_consumers"
                    ]
                    rss_snap = rss_kb(agg.proc.pid)
                t0 = gen.go()
                samples = await sample(agg, bare, http, mon, t0, nodes, args)
                load = await asyncio.to_thread(gen.finish)
                if agg is not None:
                    final = await drained(agg, http, samples)
                    result["aggregator_nats_trouble"] = agg.nats_trouble()
                result["nats_after"] = await nats_monitor(http, mon)
                await asyncio.sleep(args.every)  # one more bare report line
            finally:
                if gen is not None:
                    gen.stop()
                if bare is not None:
                    await bare.stop()
                if agg is not None:
                    agg.stop()
                await nc.close()
    lines = bare.lines if bare is not None else None
    result.update(analyse(samples, load, final, lines, alerts, t0, args))
    if agg is not None:
        end_rss = (samples[-1]["rss_kb"] if samples else None) or rss_snap
        result["rss_kb"] = {"idle": rss0, "after_snapshots": rss_snap, "end": end_rss}
        result["rss_per_node_kb"] = round((end_rss - rss0) / nodes, 1)
    result["load"] = {k: v for k, v in load.items() if k != "events"}
    profiled = [r["profile"] for r in samples if "profile" in r]
    if profiled:
        result["profile"] = profiled[0]
    return result


def fresh_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


async def snapshots_in(
    agg: Aggregator, http: aiohttp.ClientSession, nodes: int, args: argparse.Namespace
) -> float:
    """Snapshots the aggregator applied once all are in or none more came for 5 s."""
    seen = [-1.0, time.monotonic()]

    async def done() -> bool:
        count = (await agg.applied(http)).get("messages:snapshot", 0)
        if count >= nodes:
            seen[0] = count
            return True
        if count == seen[0]:
            return time.monotonic() - seen[1] > 5
        seen[:] = [count, time.monotonic()]
        return False

    with contextlib.suppress(TimeoutError, aiohttp.ClientError):
        await wait_for(done, args.snapshot_timeout, "snapshots", 0.5)
    return seen[0] if seen[0] >= 0 else nodes


async def drained(
    agg: Aggregator, http: aiohttp.ClientSession, samples: list[dict[str, Any]]
) -> dict[str, float]:
    """The aggregator's applied counts once they stopped growing for 1 s (30 s at most)."""

    async def still() -> bool:
        before = (await agg.applied(http)).get("messages:counters", 0)
        await asyncio.sleep(1.0)
        return (await agg.applied(http)).get("messages:counters", 0) == before

    final = {"messages:counters": max((r.get("applied", 0) for r in samples), default=0)}
    with contextlib.suppress(TimeoutError, aiohttp.ClientError):
        await wait_for(still, 30, "the aggregator to drain", 0.0)
        final = await agg.applied(http)
    return final


async def measure_point(
    nodes: int, args: argparse.Namespace, tpl: Templates, workdir: Path
) -> dict[str, Any]:
    """Default: the same load twice, a fresh nats-server each time — first only the bare
    subscriber attached, then only the aggregator — so each has the machine to itself.
    `--concurrent`: both attached to one run (they share the cores)."""
    if args.concurrent:
        return await measure(nodes, args, tpl, workdir / "both", "both")
    bare = await measure(nodes, args, tpl, workdir / "bare", "bare")
    out = await measure(nodes, args, tpl, workdir / "aggregator", "aggregator")
    for key in BARE_KEYS:
        out[key] = bare.get(key)
    out["bare_phase"] = {
        "published": bare["published"],
        "generator_late_ms_p99": bare["load"]["late_ms_p99_worst"],
        "generator_cpu_ms_per_1000_msgs": bare["load"]["cpu_ms_per_1000_msgs"],
        "slow_consumers": bare["nats_after"]["slow_consumers"],
    }
    if out.get("bare_msgs_s") and out.get("aggregator_msgs_s") is not None:
        out["ratio_aggregator_to_bare"] = round(out["aggregator_msgs_s"] / out["bare_msgs_s"], 2)
    return out


async def sample(
    agg: Aggregator | None,
    bare: Bare | None,
    http: aiohttp.ClientSession,
    mon: int,
    t0: float,
    nodes: int,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """One row per `every` seconds until the load ends; py-spy runs in the middle if asked."""
    probes = [f"sim-{i:05d}" for i in (0, nodes // 3, 2 * nodes // 3, nodes - 1)]
    rows: list[dict[str, Any]] = []
    spy: asyncio.subprocess.Process | None = None
    spy_out = Path(tempfile.mkdtemp(prefix="nicfleet-spy-")) / "profile.txt"
    while time.time() < t0 + args.duration + 0.5:
        await asyncio.sleep(args.every)
        row: dict[str, Any] = {"t": time.time()}
        if agg is not None:
            if args.profile_at == nodes and spy is None and time.time() >= t0 + args.warmup:
                spy = await start_py_spy(agg, args, spy_out)
            row["rss_kb"], row["cpu_s"] = rss_kb(agg.proc.pid), cpu_s(agg.proc.pid)
            try:
                counts = await agg.applied(http)
                row["applied"] = counts.get("messages:counters", 0)
                for key in ("rule_cycles", "findings", "alerts_firing"):
                    row[key] = counts.get(key)
                lags = [await agg.lag(http, p) for p in probes]
                row["lag_s"] = [lag[0] for lag in lags if lag is not None]
                row["age_s"] = [lag[1] for lag in lags if lag is not None]
            except (aiohttp.ClientError, TimeoutError):
                row["api_timeout"] = True
        if bare is not None:
            row["bare"] = bare.counters()
            row["bare_t"] = bare.lines[-1]["t"] if bare.lines else row["t"]
            row["bare_lag_p50_s"] = bare.lines[-1].get("lag_p50_s") if bare.lines else None
            row["bare_cpu_s"] = cpu_s(bare.proc.pid) if bare.proc else None
        rows.append(row)
    if spy is not None:
        await spy.wait()
        if spy_out.exists():
            rows[-1]["profile"] = summarize_profile(spy_out)
        else:
            print(f"py-spy wrote no profile (exit {spy.returncode})", file=sys.stderr)
    shutil.rmtree(spy_out.parent, ignore_errors=True)
    return rows


async def start_py_spy(
    agg: Aggregator, args: argparse.Namespace, out: Path
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        args.py_spy,
        "record",
        "--pid",
        str(agg.proc.pid),
        "--duration",
        str(max(1, int(args.duration - args.warmup - 1))),
        "--rate",
        "100",
        "--format",
        "raw",
        "--output",
        str(out),
        "--nonblocking",
        stdout=asyncio.subprocess.DEVNULL,
    )


# Snapshots/s at the start: the pace the aggregator asks a fleet to answer a resync at
# (aggregator/bus/resyncrequest.py ResyncRequestSettings.rate_nodes_per_s; 10,000 nodes = 50 s).
SNAPSHOT_RATE: Final = 200.0


def full_batch(tpl: Templates, encoding: str) -> bytes:
    """The full counter batch as the load generator sends it in `encoding`."""
    return tpl.counters if encoding == "packed" else encode_map(decode(tpl.counters, CounterBatch))


def tree_state() -> dict[str, Any]:
    """The commit measured and how many files differed from it (others edit concurrently)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD"),
        "changed_files": len(git("status", "--porcelain").splitlines()),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tpl = build_templates(args.shape)
    results: dict[str, Any] = {
        "tree": tree_state(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_at_start": os.getloadavg(),
        },
        "encoding": args.encoding,
        "full_every": args.full_every,
        # a full batch as sent; the mean over fulls and deltas is in each point's "load"
        "counter_bytes_per_msg": len(full_batch(tpl, args.encoding)),
        "snapshot_bytes": len(tpl.snapshot),
        "hz": args.hz,
        "duration_s": args.duration,
        "mode": "concurrent" if args.concurrent else "separate",
        "snapshot_rate": args.snapshot_rate,
        "warmup_s": args.warmup,
        "points": [],
    }
    for nodes in args.nodes:
        runs = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="nicfleet-scale-") as tmp:
                runs.append(await measure_point(nodes, args, tpl, Path(tmp)))
        point = dict(runs[len(runs) // 2])
        for key in MEDIAN_KEYS:
            values = [r[key] for r in runs if r.get(key) is not None]
            if values:
                point[key] = statistics.median(values)
        point["sustained"] = all(r["sustained"] for r in runs)
        point["runs"] = runs if args.runs > 1 else None
        results["points"].append(point)
        print(row_text(point), file=sys.stderr, flush=True)
        if args.stop_when_broken and not point["sustained"]:
            break
    results["capacity"] = capacity(results["points"], args.hz)
    results["largest_sustained_nodes"] = results["capacity"]["largest_sustained_nodes"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of counters")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds left out at start")
    parser.add_argument("--hz", type=float, default=1.0)
    parser.add_argument("--processes", type=int, default=2, help="load generator processes")
    parser.add_argument("--port-downs", type=int, default=20, help="port-down events per point")
    parser.add_argument("--runs", type=int, default=1, help="runs per point (median)")
    parser.add_argument("--every", type=float, default=1.0, help="sampling interval (s)")
    parser.add_argument("--snapshot-timeout", type=float, default=300.0)
    parser.add_argument(
        "--snapshot-rate",
        type=float,
        default=SNAPSHOT_RATE,
        help="snapshots/s at start (default: the aggregator's resync pace)",
    )
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="bare subscriber and aggregator on the same run (default: one run each)",
    )
    parser.add_argument("--counters", type=int, default=21, help="PMA counters per port")
    parser.add_argument("--hw-counters", type=int, default=30, help="hw_counters per port")
    parser.add_argument("--encoding", choices=ENCODINGS, default="packed", help="of counters")
    parser.add_argument("--full-every", type=int, default=30, help="1: no deltas (as before)")
    parser.add_argument("--profile-at", type=int, help="py-spy the aggregator at this count")
    parser.add_argument("--stop-when-broken", action="store_true")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run that checks the script still works, numbers meaningless "
        "(--nodes 10 --duration 3 --warmup 1 --processes 1 --port-downs 1 --every 0.5 "
        "--snapshot-timeout 20; options given still win)",
    )
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    args.shape = replace(NodeShape(), counters=args.counters, hw_counters=args.hw_counters)
    args.py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not args.json:
        print(HEADER, file=sys.stderr)
    results = asyncio.run(main_async(args))
    if args.smoke:
        results["smoke"] = True
    if args.json:
        print(json.dumps(results, indent=2, default=str))
        return
    cap = results["capacity"]
    print(
        f"\ncounter batch {results['counter_bytes_per_msg']} B; capacity at {cap['hz']:g} Hz: "
        f"largest sustained {cap['largest_sustained_nodes']} nodes "
        f"({cap['largest_sustained_msgs_s']} msgs/s) of {cap['tried']}; smallest not "
        f"sustained {cap['smallest_broken_nodes']}; load average at start "
        f"{results['machine']['load_avg_at_start']}"
    )
    for p in results["points"]:
        if "profile" in p:
            print(f"\nprofile at {p['nodes']} nodes ({p['profile']['samples']} samples), self %:")
            for entry in p["profile"]["self"]:
                print(f"  {entry['pct']:5.1f}  {entry['function']}")
            print("inclusive %:")
            for entry in p["profile"]["inclusive"]:
                print(f"  {entry['pct']:5.1f}  {entry['function']}")


if __name__ == "__main__":
    main()
