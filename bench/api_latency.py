"""Benchmark: aggregator API latency at 1k/3k/10k nodes, paged (now) and whole lists (before).

A server process runs the real API (build_app + alert routes) over a fleet of copies of a
rendered 12-NIC lab snapshot and synthetic findings (~1.5 per node; the rule engine is not
timed here); a separate client process (httpx) times each endpoint sequentially and with 8
requests in flight. `before_*` are the handlers as they were before paging (summarize every
node / sort every finding per request, return all), served by the same process for
comparison. Never a test. Run: .venv/bin/python bench/api_latency.py --json
(`--smoke`: a tiny fleet and a few requests, seconds; checks the script still runs)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import httpx
import msgspec

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aiohttp import web  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from agent.host.inventory import collect_snapshot  # noqa: E402
from agent.host.sysfs import Sysfs  # noqa: E402
from agent.lab.render import render  # noqa: E402
from agent.lab.spec import load_builtin, with_node_name  # noqa: E402
from aggregator.alerts.delivery import Broker  # noqa: E402
from aggregator.alerts.engine import AlertEngine, EngineSettings  # noqa: E402
from aggregator.alerts.metrics import AlertMetrics  # noqa: E402
from aggregator.api.alerts import SEVERITIES, add_alert_routes  # noqa: E402
from aggregator.api.app import ApiSettings, build_app  # noqa: E402
from aggregator.api.errors import json_response  # noqa: E402
from aggregator.cluster import NO_CLUSTER, ClusterView  # noqa: E402
from aggregator.fleet.changefeed import ChangeFeed  # noqa: E402
from aggregator.fleet.state import Fleet  # noqa: E402
from aggregator.fleet.views import summarize  # noqa: E402
from aggregator.rules.finding import Finding  # noqa: E402
from proto.policy import Policy  # noqa: E402

CONCURRENCY: Final = 8
# --smoke: the same path on a tiny fleet (make test runs it; its numbers mean nothing).
SMOKE: Final = {"nodes": [20], "runs": 1, "requests": 3, "slow_requests": 2}
SEVERITY_CYCLE: Final = ("info", "warning", "warning", "critical")  # 1 in 4 nodes critical


def fleet_of(count: int, now: float, work: Path) -> Fleet:
    root = work / "template"
    render(with_node_name(load_builtin("h100-ib-12nic"), "template"), root)
    template = collect_snapshot(Sysfs(root), node="template", seq=1, now=now, agent_version="b")
    fleet = Fleet()
    for i in range(count):
        fleet.apply_snapshot(msgspec.structs.replace(template, node=f"bench-{i:05d}"), now)
    return fleet


def synthetic_findings(names: Sequence[str]) -> list[Finding]:
    """One finding per node (severity cycling), a second on every other node, one fleet-wide."""
    found = []
    for i, name in enumerate(names):
        found.append(Finding(rule="port-down", severity=SEVERITY_CYCLE[i % 4], node=name,  # type: ignore[arg-type]
                             subject=f"mlx5_{i % 12}/1", message="port down"))  # fmt: skip
        if i % 2:
            found.append(
                Finding(
                    rule="counter-errors",
                    severity="info",
                    node=name,
                    subject="mlx5_0/1",
                    message="errors",
                    evidence={"n": i},
                )
            )
    found.append(Finding(rule="rail-mismatch", severity="warning", node=None, subject="fleet",
                         message="rails"))  # fmt: skip
    return found


def add_before_routes(app: web.Application, fleet: Fleet, engine: AlertEngine, now: float) -> None:
    """The list handlers as they were before paging: every node summarized, every finding
    sorted, per request; the whole list returned (GET /before/nodes, /before/findings)."""
    rank = {s: i for i, s in enumerate(SEVERITIES)}

    async def nodes(request: web.Request) -> web.Response:
        items = tuple(summarize(r, now, 30.0) for r in fleet.records())
        return json_response({"items": items, "count": len(items), "total": len(items),
                              "offset": 0, "limit": None})  # fmt: skip

    async def findings(request: web.Request) -> web.Response:
        severity = request.query.get("severity")
        ordered = sorted(
            engine.findings, key=lambda f: (rank[f.severity], f.node or "", f.rule, f.subject)
        )
        items = [f for f in ordered if severity is None or f.severity == severity]
        return json_response({"items": items, "count": len(items),
                              "evaluated_at": engine.evaluated_at})  # fmt: skip

    app.router.add_get("/before/nodes", nodes)
    app.router.add_get("/before/findings", findings)


def add_cpu_timing(app: web.Application) -> None:
    """Server CPU per request (thread time, insensitive to other load on the host) by
    route and query; GET /bench/cpu answers p50/p99 in ms per key."""
    spent: dict[str, list[float]] = {}

    @web.middleware
    async def timed(request: web.Request, handler: Any) -> web.StreamResponse:
        started = time.thread_time()
        response: web.StreamResponse = await handler(request)
        resource = request.match_info.route.resource
        path = resource.canonical if resource is not None else request.path
        key = f"{path}?{request.query_string}" if request.query_string else path
        spent.setdefault(key, []).append(time.thread_time() - started)
        return response

    async def report(request: web.Request) -> web.Response:
        return web.json_response({k: percentiles(v) for k, v in spent.items()})

    app.middlewares.append(timed)
    app.router.add_get("/bench/cpu", report)


async def serve(count: int, port_file: Path) -> None:
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="nicfleet-bench-") as tmp:
        fleet = fleet_of(count, now, Path(tmp))
    found = synthetic_findings(fleet.names())

    def rules(
        fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, at: float
    ) -> Sequence[Finding]:
        return found

    app = build_app(fleet=fleet, settings=ApiSettings(), readiness=lambda: (True, "ok"),
                    clock=lambda: now, metrics=CollectorRegistry())  # fmt: skip
    engine = AlertEngine(
        fleet=fleet, changes=ChangeFeed().subscribe(), evaluate=rules, policies=lambda: (),
        cluster=lambda: NO_CLUSTER, settings=EngineSettings(startup_grace_s=0.0),
        metrics=AlertMetrics.create(CollectorRegistry()), broker=Broker(first_id=1),
        clock=lambda: now,
    )  # fmt: skip
    add_alert_routes(app, engine=engine)
    add_before_routes(app, fleet, engine, now)
    add_cpu_timing(app)
    await engine.cycle("bench")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await asyncio.to_thread(port_file.write_text, str(runner.addresses[0][1]))
    await stop.wait()
    await runner.cleanup()


def start_server(count: int, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = work / f"port-{count}"
    argv = [sys.executable, __file__, "--serve", str(count), "--port-file", str(port_file)]
    proc = subprocess.Popen(argv, cwd=REPO)
    deadline = time.monotonic() + 600
    while not port_file.exists() or not port_file.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"bench API server for {count} nodes did not start")
        time.sleep(0.05)  # polling the server's port file, a bench process
    return proc, f"http://127.0.0.1:{port_file.read_text()}"


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 2), "p99_ms": round(p99 * 1000, 2)}


def sequential(client: httpx.Client, paths: Iterable[str]) -> list[float]:
    times = []
    for path in paths:
        started = time.perf_counter()
        response = client.get(path)
        response.raise_for_status()
        _ = response.content
        times.append(time.perf_counter() - started)
    return times


async def concurrent(url: str, paths: list[str]) -> list[float]:
    times: list[float] = []
    queue = list(reversed(paths))
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def worker() -> None:
            while queue:
                path = queue.pop()
                started = time.perf_counter()
                response = await client.get(path)
                response.raise_for_status()
                times.append(time.perf_counter() - started)

        async with asyncio.TaskGroup() as group:
            for _ in range(CONCURRENCY):
                group.create_task(worker())
    return times


def walk_all(client: httpx.Client, path: str) -> float:
    """Seconds to read a whole list in pages of 5000, following `continue`."""
    started, token = time.perf_counter(), None
    while True:
        params = {"limit": 5000, **({"continue": token} if token else {})}
        body = client.get(path, params=params).raise_for_status().json()
        token = body.get("continue")
        if token is None:
            return time.perf_counter() - started


def endpoints(count: int, rng: random.Random, requests: int, slow: int) -> dict[str, list[str]]:
    names = [f"bench-{rng.randrange(count):05d}" for _ in range(requests)]
    return {
        "nodes?limit=500": ["/api/v1/nodes?limit=500"] * requests,
        "nodes/{node}": [f"/api/v1/nodes/{n}" for n in names],
        "findings?limit=500": ["/api/v1/findings?limit=500"] * requests,
        "findings?severity=critical": ["/api/v1/findings?severity=critical"] * requests,
        "before: nodes (all)": ["/before/nodes"] * slow,
        "before: findings (all)": ["/before/findings"] * slow,
        "before: findings?severity=critical (all)": ["/before/findings?severity=critical"] * slow,
    }


def measure(count: int, runs: int, requests: int, slow: int, work: Path) -> dict[str, Any]:
    proc, url = start_server(count, work)
    rng = random.Random(count)
    per_run: dict[str, dict[str, list[dict[str, float]]]] = {}
    walks: dict[str, list[float]] = {"nodes": [], "findings": []}
    sizes: dict[str, int] = {}
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            for path in ("/api/v1/nodes?limit=500", "/api/v1/findings?limit=500", "/before/nodes",
                         "/before/findings"):  # fmt: skip
                sizes[path] = len(client.get(path).content)  # also warms up
            for _ in range(runs):
                for name, paths in endpoints(count, rng, requests, slow).items():
                    modes = per_run.setdefault(name, {"sequential": [], "concurrency_8": []})
                    modes["sequential"].append(percentiles(sequential(client, paths)))
                    modes["concurrency_8"].append(
                        percentiles(asyncio.run(concurrent(url, paths * 2)))
                    )
                walks["nodes"].append(walk_all(client, "/api/v1/nodes"))
                walks["findings"].append(walk_all(client, "/api/v1/findings"))
            cpu = client.get("/bench/cpu").json()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    latency = {
        name: {mode: {k: statistics.median(r[k] for r in results) for k in ("p50_ms", "p99_ms")}
               for mode, results in modes.items()}
        for name, modes in per_run.items()
    }  # fmt: skip
    return {
        "nodes": count,
        "findings": len(synthetic_findings([f"n{i}" for i in range(count)])),
        "runs": runs,
        "latency": latency,
        "server_cpu_ms": {k: v for k, v in cpu.items() if "limit=5000" not in k},
        "walk_all_pages_of_5000_s": {k: round(statistics.median(v), 3) for k, v in walks.items()},
        "response_bytes": sizes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="per endpoint and run")
    parser.add_argument("--slow-requests", type=int, default=20, help="for the before_* lists")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run that checks the script still works, numbers meaningless "
        "(--nodes 20 --runs 1 --requests 3 --slow-requests 2; options given still win)",
    )
    opts = parser.parse_args()
    if opts.smoke:
        parser.set_defaults(**SMOKE)
        opts = parser.parse_args()
    if opts.serve is not None:
        asyncio.run(serve(opts.serve, opts.port_file))
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="nicfleet-bench-") as tmp:
        for n in opts.nodes:
            results.append(measure(n, opts.runs, opts.requests, opts.slow_requests, Path(tmp)))
            print(json.dumps(results[-1]), file=sys.stderr)
    result = {
        "benchmark": "api_latency",
        "concurrency": CONCURRENCY,
        "sizes": results,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg": [round(x, 2) for x in os.getloadavg()],
                    "note": "shared with other engineers' work; client and server on one host"},
        **({"smoke": True} if opts.smoke else {}),
    }  # fmt: skip
    if opts.json:
        print(json.dumps(result, indent=2))
        return
    for size in results:
        for name, modes in size["latency"].items():
            seq, conc = modes["sequential"], modes["concurrency_8"]
            print(f"{size['nodes']:>6} nodes  {name:<42} seq p50 {seq['p50_ms']:>8} ms "
                  f"p99 {seq['p99_ms']:>8} ms | c8 p50 {conc['p50_ms']:>8} "
                  f"p99 {conc['p99_ms']:>8}")  # fmt: skip


if __name__ == "__main__":
    main()
