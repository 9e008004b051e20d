"""Benchmark: aggregator restart time with N nodes stored in the `nicfleet-nodes` KV bucket.

A real nats-server; the bucket seeded with N copies of a rendered 12-NIC lab node's snapshot;
then, per run, `python -m aggregator run` is started and timed until its ready file
appears (NATS connect, fleet rebuilt from KV, API up), and killed with SIGKILL.
Variants in the same run, interleaved: `current` (the code as it is), `legacy` (the same
process with the KV load of before: key listing + one get per key) and, with `--before DIR`,
`before` (the aggregator of another source tree, e.g. a `git archive HEAD` copy). Wall and
CPU seconds (CPU is what a loaded machine does not inflate); also the bare KV load
in-process, and a py-spy profile of one start. Never a test.
Run: .venv/bin/python bench/aggregator_restart.py --json   (`--smoke`: seconds, checks it runs)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final

import msgspec
import nats
from nats.js.kv import KeyValue

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.host.inventory import collect_snapshot  # noqa: E402
from agent.host.sysfs import Sysfs  # noqa: E402
from agent.lab.render import render  # noqa: E402
from agent.lab.spec import load_builtin, with_node_name  # noqa: E402
from aggregator.bus.natsserver import NatsServer, NatsServerSettings  # noqa: E402
from aggregator.fleet.store import StoredNode, load_nodes, open_bucket  # noqa: E402
from proto import subjects  # noqa: E402
from proto.codec import decode, encode  # noqa: E402
from proto.inventory import NodeSnapshot  # noqa: E402

TARGET_S: Final = 10.0
VARIANTS: Final = ("legacy", "current")
# --smoke: the same path on a tiny bucket (make test runs it; its numbers mean nothing).
SMOKE: Final = {"nodes": [20], "runs": 1}
log = logging.getLogger("bench.aggregator_restart")


async def legacy_load_nodes(kv: KeyValue) -> AsyncIterator[StoredNode]:
    """The load path before issue 8: list the keys, then one KV get per key."""
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        return
    for key in keys:
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            continue
        if entry.value is not None:
            yield decode(entry.value, StoredNode)


def snapshot_template(work: Path) -> bytes:
    root = work / "template"
    render(with_node_name(load_builtin("h100-ib-12nic"), "template"), root)
    snap = collect_snapshot(Sysfs(root), node="template", seq=1, now=1.0, agent_version="b")
    return encode(snap)


async def seed(url: str, template: bytes, count: int) -> int:
    """Put `count` nodes (each a separately encoded copy); returns the bucket's bytes."""
    tpl = decode(template, NodeSnapshot)
    nc = await nats.connect(url)
    try:
        kv = await open_bucket(nc.jetstream())
        for start in range(0, count, 64):
            puts = []
            for i in range(start, min(count, start + 64)):
                snap = msgspec.structs.replace(tpl, node=f"bench-{i:05d}")
                stored = StoredNode(snapshot=snap, received_at=time.time())
                puts.append(kv.put(subjects.node_token(snap.node), encode(stored)))
            await asyncio.gather(*puts)
        status = await kv.status()
        return int(status.stream_info.state.bytes)
    finally:
        await nc.close()


async def time_load(url: str, load: Callable[[KeyValue], AsyncIterator[StoredNode]]) -> float:
    nc = await nats.connect(url)
    try:
        kv = await open_bucket(nc.jetstream())
        started = time.process_time()
        count = sum([1 async for _ in load(kv)])
        elapsed = time.process_time() - started
        assert count > 0
        return elapsed
    finally:
        await nc.close()


def aggregator_argv(variant: str, url: str, ready: Path) -> list[str]:
    run = ["run", "--nats-url", url, "--listen", "127.0.0.1:0", "--ready-file", str(ready)]
    if variant == "legacy":
        return [sys.executable, __file__, "--serve-legacy", *run]
    return [sys.executable, "-m", "aggregator", *run]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` so far (/proc/PID/stat utime, stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_to_ready(
    argv: list[str], ready: Path, timeout: float = 300.0, cwd: Path = REPO
) -> tuple[float, float, float]:
    """Seconds until the ready file appears, the process's CPU seconds by then (what a
    loaded machine does not inflate), and seconds until /readyz then answers (any status:
    a first rule evaluation that held the event loop would show here)."""
    started = time.perf_counter()
    errors = ready.with_suffix(".stderr")
    with errors.open("wb") as sink:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        while not ready.exists():
            if proc.poll() is not None:
                tail = errors.read_text(errors="replace")[-2000:]
                raise SystemExit(f"aggregator exited with {proc.returncode}: {tail}")
            if time.perf_counter() - started > timeout:
                raise SystemExit(f"aggregator not ready within {timeout}s")
            time.sleep(0.005)
        ready_s = time.perf_counter() - started
        cpu = cpu_s(proc.pid)
        api_url = json.loads(ready.read_text())["api_url"]
        with contextlib.suppress(urllib.error.HTTPError):  # answered, if not with 200
            urllib.request.urlopen(f"{api_url}/readyz", timeout=timeout).close()
        return ready_s, cpu, time.perf_counter() - started
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)


def profile_start(url: str, work: Path, out: Path) -> None:
    """One `current` start under py-spy (raw collapsed stacks); SIGTERM once ready."""
    ready = work / "ready-profile"
    argv = [str(REPO / ".venv/bin/py-spy"), "record", "--rate", "100", "--format", "raw",
            "-o", str(out), "--", *aggregator_argv("current", url, ready)]  # fmt: skip
    spy = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not ready.exists():
        if spy.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("profiled aggregator did not become ready")
        time.sleep(0.01)
    child = subprocess.run(["pgrep", "-P", str(spy.pid)], capture_output=True, text=True)
    for pid in child.stdout.split():
        os.kill(int(pid), signal.SIGTERM)
    spy.wait(timeout=60)


def summarize_profile(raw: Path, top: int = 12) -> dict[str, Any]:
    """py-spy raw (collapsed) stacks: share of samples per frame, inclusive and leaf."""
    total = 0
    inclusive: dict[str, int] = {}
    leaf: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1]
                  + ")" for f in stack.split(";")]  # fmt: skip
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + n

    def share(counts: dict[str, int]) -> list[list[Any]]:
        best = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [[frame, round(100 * n / total, 1)] for frame, n in best]

    return {"samples": total, "inclusive_pct": share(inclusive), "leaf_pct": share(leaf)}


def stats(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def measure(
    nodes: int, runs: int, variants: list[str], profile: Path | None, before: Path | None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="nicfleet-bench-") as tmp:
        work = Path(tmp)
        template = snapshot_template(work)
        with NatsServer(NatsServerSettings(store_dir=work / "js")) as server:
            kv_bytes = asyncio.run(seed(server.url, template, nodes))
            warmup, _, _ = time_to_ready(
                aggregator_argv("current", server.url, work / "w"), work / "w"
            )
            times: dict[str, list[float]] = {v: [] for v in variants}
            api: dict[str, list[float]] = {v: [] for v in variants}
            cpu: dict[str, list[float]] = {v: [] for v in variants}
            loads: dict[str, list[float]] = {v: [] for v in variants}
            failed: dict[str, list[str]] = {v: [] for v in variants}
            for run in range(runs):  # interleaved, so load on the machine hits both alike
                for v in variants:
                    ready = work / f"ready-{v}-{run}"
                    tree = before if v == "before" and before is not None else REPO
                    try:
                        ready_s, cpu_ready, api_s = time_to_ready(
                            aggregator_argv(v, server.url, ready), ready, cwd=tree
                        )
                    except SystemExit as exc:  # e.g. the load stalled: counted, not fatal
                        failed[v].append(str(exc)[-300:])
                        continue
                    times[v].append(ready_s)
                    cpu[v].append(cpu_ready)
                    api[v].append(api_s)
                    if v != "before":  # the bare load of this tree (current) or legacy
                        load = legacy_load_nodes if v == "legacy" else load_nodes
                        loads[v].append(asyncio.run(time_load(server.url, load)))
            if profile is not None:
                profile_start(server.url, work, profile)
    summary = summarize_profile(profile) if profile is not None else None
    return {
        "nodes": nodes,
        "runs": runs,
        "snapshot_bytes": len(template),
        "kv_bytes": kv_bytes,
        "warmup_s": round(warmup, 3),
        "time_to_ready_s": {v: stats(times[v]) for v in variants if times[v]},
        "cpu_to_ready_s": {v: stats(cpu[v]) for v in variants if cpu[v]},
        "api_answers_s": {v: stats(api[v]) for v in variants if api[v]},
        "failed_starts": {v: failed[v] for v in variants if failed[v]},
        "kv_load_cpu_s": {v: stats(loads[v]) for v in variants if loads[v]},
        **({"profile": summary} if summary else {}),
    }


def serve_legacy(argv: list[str]) -> None:
    """`python -m aggregator ARGV` with the legacy KV load (the `legacy` variant)."""
    import aggregator.service

    aggregator.service.load_nodes = legacy_load_nodes  # type: ignore[assignment]
    from aggregator.cli.main import main as aggregator_main

    sys.argv = ["aggregator", *argv]
    aggregator_main()


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--summarize":
        print(json.dumps(summarize_profile(Path(sys.argv[2])), indent=1))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-legacy":
        serve_legacy(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--before",
        type=Path,
        help="adds variant `before`: the aggregator "
        "of this source tree (e.g. a `git archive HEAD` copy)",
    )
    parser.add_argument("--profile", type=Path, help="py-spy raw output of one start (largest N)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run that checks the script still works, numbers meaningless "
        "(--nodes 20 --runs 1; options given still win)",
    )
    opts = parser.parse_args()
    if opts.smoke:
        parser.set_defaults(**SMOKE)
        opts = parser.parse_args()
    variants = [v for v in opts.variants.split(",") if v]
    if opts.before is not None and "before" not in variants:
        variants.insert(0, "before")
    sizes = []
    for n in opts.nodes:
        profile = opts.profile if n == max(opts.nodes) else None
        sizes.append(measure(n, opts.runs, variants, profile, opts.before))
        print(json.dumps(sizes[-1]), file=sys.stderr)
    result = {
        "benchmark": "aggregator_restart",
        "target_s": TARGET_S,
        "sizes": sizes,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg": [round(x, 2) for x in os.getloadavg()]},
        **({"smoke": True} if opts.smoke else {}),
    }  # fmt: skip
    if opts.json:
        print(json.dumps(result, indent=2))
    else:
        print_sizes(sizes, variants)
    if opts.smoke and any(size["failed_starts"] for size in sizes):
        raise SystemExit("smoke: an aggregator start failed (see failed_starts)")


def print_sizes(sizes: list[dict[str, Any]], variants: list[str]) -> None:
    for size in sizes:
        for v in variants:
            if v not in size["time_to_ready_s"]:
                print(f"{size['nodes']} nodes, {v}: every start failed")
                continue
            ready, cpu = size["time_to_ready_s"][v], size["cpu_to_ready_s"][v]
            print(f"{size['nodes']} nodes, {v}: ready in {ready['median']} s "
                  f"({cpu['median']} CPU s), median of {size['runs']}")  # fmt: skip


if __name__ == "__main__":
    main()
