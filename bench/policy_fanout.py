"""Benchmark: policy change -> every one of N simulated agents reports the new config applied.

One real nats-server, one `nicfleet-aggregator run --policy FILE` process and N lightweight
simulated agents (bench/fanout_agents.py: asyncio tasks spread over --procs processes; each
follows its desired config over core NATS like agent/bus/desired.py — its own
nicfleet.v1.desired.<token>, one .get answered into _INBOX.<token>. — and publishes a
DevicePluginStatus with the new rdmaHcaMax, no real device plugin). The policy file is
rewritten --changes times; per change the latency of each node (file written -> its status
with the new config received here) and the CPU seconds of the aggregator and nats-server
are recorded. `--tree DIR` runs the aggregator of another source tree (A/B; the agents stay
this tree's); `--profile OUT` records it with py-spy during the changes.
Never a test. Run: .venv/bin/python bench/policy_fanout.py [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import nats
import yaml

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fanout_agents import sim_main  # noqa: E402

from aggregator.bus.natsserver import NatsServer, NatsServerSettings  # noqa: E402
from proto import subjects  # noqa: E402
from proto.codec import decode  # noqa: E402
from proto.messages.config import DesiredConfig, DesiredUpdate  # noqa: E402
from proto.messages.status import DevicePluginStatus  # noqa: E402

TARGET_P99_S: Final = 2.0


def policy_text(hca_max: int) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "nicfleet.io/v1alpha1",
            "kind": "NicFleetPolicy",
            "metadata": {"name": "bench"},
            "spec": {
                "rdmaSharedDevicePlugin": {
                    "configList": [
                        {"resourceName": "bench", "rdmaHcaMax": hca_max,
                         "selectors": {"vendors": ["15b3"]}}
                    ]
                }
            },
        }
    )  # fmt: skip


# --- the measuring side ---------------------------------------------------------------


def spawn(argv: list[str], *, quiet: bool = False, cwd: Path = REPO) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=cwd, stderr=subprocess.DEVNULL if quiet else None)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` so far (/proc/PID/stat utime, stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy recording `pid` (raw collapsed stacks, 100 Hz) until sent SIGINT."""
    argv = [str(REPO / ".venv/bin/py-spy"), "record", "--rate", "100", "--format", "raw",
            "--pid", str(pid), "-o", str(out)]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def reconcile_totals(api_url: str) -> tuple[float, float]:
    """(rounds, seconds) of the aggregator's reconcile rounds so far, from /metrics."""
    with urllib.request.urlopen(f"{api_url}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = {"count": 0.0, "sum": 0.0}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        for part in found:
            if name == f"nicfleet_reconcile_duration_seconds_{part}":
                found[part] = float(value)
    return found["count"], found["sum"]


def desired_feed_totals(api_url: str) -> dict[str, float]:
    """The aggregator's desired-config feed counters (0 for a tree without the feed): that
    the agents asked and were answered, and that nothing was refused."""
    with urllib.request.urlopen(f"{api_url}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = {"answered": 0.0, "refused": 0.0, "announced": 0.0}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        for part, metric in (("answered", "nicfleet_desired_requests_answered_total"),
                             ("refused", "nicfleet_desired_requests_refused_total{"),
                             ("announced", "nicfleet_desired_announced_total")):  # fmt: skip
            if name == metric or (metric.endswith("{") and name.startswith(metric)):
                found[part] += float(value)
    return found


def nats_server_pid() -> int:
    """The nats-server this process started (NatsServer does not expose its pid)."""
    found = subprocess.run(["pgrep", "-P", str(os.getpid()), "nats-server"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    return int(found.stdout.split()[0])


def exists(path: Path) -> bool:
    return path.exists()


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def wait_file(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not exists(path):
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout}s")
        await asyncio.sleep(0.05)


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    server = NatsServer(NatsServerSettings(store_dir=work / "js")).start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        policy = work / "policy.yaml"
        policy.write_text(policy_text(1))
        agg_ready = work / "aggregator.ready"
        procs.append(spawn(
            [sys.executable, "-m", "aggregator", "run", "--nats-url", server.url,
             "--policy", str(policy), "--listen", "127.0.0.1:0", "--ready-file", str(agg_ready)],
            quiet=True, cwd=args.tree,
        ))  # fmt: skip
        aggregator_pid, server_pid = procs[0].pid, nats_server_pid()
        await wait_file(agg_ready, procs[0], 30)
        api_url = json.loads(agg_ready.read_text())["api_url"]
        latest: dict[str, int] = {}
        arrivals: dict[str, float] = {}
        target = [1]
        nc = await nats.connect(server.url)

        # Keyed by the policy's rdmaHcaMax that the node advertises (1, 2, 3, ... per change),
        # not by config generation: the aggregator may bump a node's generation for other
        # reasons (e.g. while 10,000 nodes join), which would look like the change applied.
        async def on_status(msg: Any) -> None:
            status = decode(msg.data, DevicePluginStatus)
            hca = status.resources[0].advertised if status.resources else 0
            latest[status.node] = max(latest.get(status.node, 0), hca)
            if hca >= target[0] and status.node not in arrivals:
                arrivals[status.node] = time.time()

        await nc.subscribe(subjects.NODE_WILDCARD.replace(".*.*", ".*.status"), cb=on_status)
        announced: dict[str, float] = {}  # --split: when the node's announcement was seen

        async def on_announced(msg: Any) -> None:
            update = decode(msg.data, DesiredUpdate)
            if update.config is not None and update.node not in announced:
                config = decode(update.config, DesiredConfig)
                if config.device_plugin.config_list[0].rdma_hca_max >= target[0]:
                    announced[update.node] = time.time()

        if args.split:
            await nc.subscribe(subjects.DESIRED_WILDCARD, cb=on_announced)
        per_proc = -(-args.agents // args.procs)
        started = time.monotonic()
        for p in range(args.procs):
            first, count = p * per_proc, min(per_proc, args.agents - p * per_proc)
            ready = work / f"sim-{p}.ready"
            procs.append(spawn(
                [sys.executable, __file__, "--sim", server.url, str(first), str(count), str(ready),
                 str(args.per_connection)],
            ))  # fmt: skip
        for p in range(args.procs):
            await wait_file(work / f"sim-{p}.ready", procs[1 + p], 300 + args.agents / 20)
        setup_s = time.monotonic() - started
        await wait_all(latest, args.agents, 1, timeout=120 + args.agents / 50)
        spy = None if args.profile is None else profiler(aggregator_pid, args.profile)
        changes = []
        for change in range(args.changes):
            generation = change + 2
            arrivals.clear()
            announced.clear()
            target[0] = generation
            t0 = time.time()
            cpu0 = cpu_s(aggregator_pid), cpu_s(server_pid)
            rounds0 = await asyncio.to_thread(reconcile_totals, api_url)
            tmp = policy.with_name("policy.yaml.tmp")
            tmp.write_text(policy_text(generation))
            tmp.replace(policy)
            await wait_all(latest, args.agents, generation, timeout=60 + args.agents / 50)
            lat = [arrivals[n] - t0 for n in arrivals]
            sent = sorted(announced[n] - t0 for n in announced)
            await asyncio.sleep(args.pause)  # let the fleet settle between changes
            rounds = await asyncio.to_thread(reconcile_totals, api_url)
            changes.append({
                "p50_s": round(quantile(lat, 0.5), 3), "p99_s": round(quantile(lat, 0.99), 3),
                "all_s": round(max(lat), 3), "first_s": round(min(lat), 3), "nodes": len(lat),
                # CPU from the file write to the end of the pause (the statuses' ingest too)
                "aggregator_cpu_s": round(cpu_s(aggregator_pid) - cpu0[0], 3),
                "nats_server_cpu_s": round(cpu_s(server_pid) - cpu0[1], 3),
                "reconcile_rounds": int(rounds[0] - rounds0[0]),
                "reconcile_s": round(rounds[1] - rounds0[1], 3),
            })  # fmt: skip
            if sent:  # file written -> the aggregator's announcement seen here (--split)
                changes[-1] |= {"announced_p50_s": round(quantile(sent, 0.5), 3),
                                "announced_all_s": round(sent[-1], 3)}  # fmt: skip
        feed = await asyncio.to_thread(desired_feed_totals, api_url)
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            spy.wait(timeout=60)
        await nc.close()
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.close()
    return {
        "agents": args.agents,
        "sim_processes": args.procs,
        "agents_per_connection": args.per_connection,
        "changes": changes,
        "median_p50_s": round(statistics.median(c["p50_s"] for c in changes), 3),
        "median_p99_s": round(statistics.median(c["p99_s"] for c in changes), 3),
        "median_all_s": round(statistics.median(c["all_s"] for c in changes), 3),
        # first_s is mostly the policy-file poll (0-0.5 s); all_s - first_s is the fan-out.
        "median_spread_s": round(statistics.median(c["all_s"] - c["first_s"] for c in changes), 3),
        "median_aggregator_cpu_s": statistics.median(c["aggregator_cpu_s"] for c in changes),
        "median_nats_server_cpu_s": statistics.median(c["nats_server_cpu_s"] for c in changes),
        "median_reconcile_rounds": statistics.median(c["reconcile_rounds"] for c in changes),
        "median_reconcile_s": statistics.median(c["reconcile_s"] for c in changes),
        "desired_feed": feed,
        "tree": str(args.tree),
        "target_p99_s": TARGET_P99_S,
        "setup_s": round(setup_s, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg": os.getloadavg()},
    }  # fmt: skip


async def wait_all(latest: dict[str, int], agents: int, generation: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while sum(g >= generation for g in latest.values()) < agents:
        if time.monotonic() > deadline:
            done = sum(g >= generation for g in latest.values())
            raise TimeoutError(f"only {done}/{agents} agents at generation {generation}")
        await asyncio.sleep(0.01)


# --smoke: the same path, shortest (make test runs it; its numbers mean nothing).
SMOKE = {"agents": 20, "procs": 1, "changes": 2, "pause": 0.2}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--procs", type=int, default=2, help="simulated-agent processes")
    parser.add_argument("--changes", type=int, default=5, help="policy changes measured")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between changes")
    parser.add_argument(
        "--tree",
        type=Path,
        default=REPO,
        help="source tree whose aggregator runs (e.g. a `git archive` copy)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy raw profile of the aggregator "
        "during the changes (summary: bench/aggregator_restart.py --summarize)",
    )
    parser.add_argument(
        "--per-connection",
        type=int,
        default=100,
        help="simulated agents per NATS connection (1: each its own, with its node's inbox "
        "prefix, as the real agent connects)",
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="also time the aggregator's announcements (file written -> announcement seen), "
        "splitting the latency into aggregator and agent side; adds decoding to this process",
    )
    parser.add_argument("--sim", nargs=5, metavar=("URL", "FIRST", "COUNT", "READY", "PER"),
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run of the same code path, numbers meaningless "
        "(--agents 20 --procs 1 --changes 2 --pause 0.2; options given still win)",
    )
    args = parser.parse_args(argv)
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    if args.sim:
        url, first, count, ready, per_conn = args.sim
        asyncio.run(sim_main(url, int(first), int(count), Path(ready), int(per_conn)))
        return 0
    with tempfile.TemporaryDirectory(prefix="nicfleet-fanout-") as tmp:
        report = asyncio.run(measure(args, Path(tmp)))
    if args.smoke:
        report["smoke"] = True
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        for i, c in enumerate(report["changes"]):
            print(f"change {i + 1}: p50 {c['p50_s']} s, p99 {c['p99_s']} s, all {c['all_s']} s")
        print(f"median over {len(report['changes'])} changes: p50 {report['median_p50_s']} s, "
              f"p99 {report['median_p99_s']} s (target < {TARGET_P99_S} s), "
              f"all {report['median_all_s']} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
