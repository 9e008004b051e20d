"""Benchmark: fault injected -> alert received, end to end on real parts.

nicfleet: a port is downed in a rendered lab tree read by a real `nicfleet-agent` process
(port-state poll, default 100 ms) -> real nats-server -> aggregator (all rules, alert
engine) -> a NATS subscriber on nicfleet.v1.alert.critical.port-down.<node>. Flap damping
is switched off here (the same ports are flipped hundreds of times on purpose).

Baseline (--baseline N): the same fault read by node_exporter (--path.sysfs on the tree,
infiniband collector) -> Prometheus (scrape/evaluation 15 s, rule `for: 1m`) ->
Alertmanager (group_wait 30 s, the documented default) -> a webhook receiver.
A script for docs/performance.md, never a test. Run: .venv/bin/python bench/alert_latency.py
(`--smoke`: a few faults, seconds; includes --netns when root, says why not otherwise)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import nats
from aiohttp import web

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.lab import faults  # noqa: E402
from agent.lab.render import render  # noqa: E402
from agent.lab.spec import load_builtin, with_node_name  # noqa: E402
from aggregator.alerts.engine import EngineSettings  # noqa: E402
from aggregator.alerts.lifecycle import LifecycleSettings  # noqa: E402
from aggregator.alerts.wiring import AlertWiring  # noqa: E402
from aggregator.bus.natsserver import NatsServer, NatsServerSettings  # noqa: E402
from aggregator.service import AggregatorService, AggregatorSettings  # noqa: E402
from proto.codec import decode  # noqa: E402
from proto.messages.alerts import Alert  # noqa: E402

# --smoke: the same paths on a few faults (make test runs it; its numbers mean nothing).
SMOKE: Final = {"faults": 3, "runs": 1}
NODE: Final = "bench-alert-01"
SPEC: Final = "h100-ib-12nic"
BIN: Final = Path(sys.executable).parent


def percentiles(samples_s: Sequence[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return {
        "n": len(ms),
        "median": round(statistics.median(ms), 1),
        "p99": round(p99, 1),
        "max": round(ms[-1], 1),
    }


def active_ports(tree: Path) -> list[tuple[str, int]]:
    """(device, port) of every port that is ACTIVE in the rendered tree."""
    found = []
    for state in sorted(tree.glob("**/infiniband/*/ports/*/state")):
        if "ACTIVE" in state.read_text():
            found.append((state.parents[2].name, int(state.parent.name)))
    return sorted(set(found))


@contextlib.asynccontextmanager
async def agent_process(nats_url: str, root: Path, poll: float) -> AsyncIterator[None]:
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "nicfleet-agent"), "run", "--nats-url", nats_url, "--sysfs-root", str(root),
        "--node-name", NODE, "--no-netlink", "--verbs", "off",
        "--state-poll-interval", str(poll),
        stdout=asyncio.subprocess.DEVNULL, stderr=None,
    )  # fmt: skip
    try:
        yield
    finally:
        proc.terminate()
        await proc.wait()


async def nicfleet_latency(workdir: Path, faults_n: int, poll: float) -> dict[str, Any]:
    root = workdir / NODE
    render(with_node_name(load_builtin(SPEC), NODE), root)
    ports = active_ports(root)
    wiring = AlertWiring(engine=EngineSettings(lifecycle=LifecycleSettings(flap_count=1_000_000)))
    settings = NatsServerSettings(store_dir=workdir / "nats")
    down: list[float] = []
    detect: list[float] = []  # fault written -> the agent saw it (event observed_at)
    up: list[float] = []
    with NatsServer(settings) as server:
        service = AggregatorService(
            AggregatorSettings(nats_url=server.url, listen_port=0, alerts=wiring)
        )
        stop = asyncio.Event()
        nc = await nats.connect(server.url)
        inbox: asyncio.Queue[tuple[float, Alert]] = asyncio.Queue()

        async def receive(msg: Any) -> None:
            inbox.put_nowait((time.perf_counter(), decode(msg.data, Alert)))

        await nc.subscribe(f"nicfleet.v1.alert.critical.port-down.{NODE}", cb=receive)
        await nc.flush()

        async def until(subject: str, state: str) -> float:
            while True:
                at, alert = await asyncio.wait_for(inbox.get(), 10)
                if alert.subject == subject and alert.state == state:
                    return at

        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(service.run(stop))
            try:
                await asyncio.wait_for(service.ready.wait(), 15)
                async with agent_process(server.url, root, poll):
                    await settled(service, *ports[0], 0.0)
                    for i in range(faults_n):
                        device, port = ports[i % len(ports)]
                        subject = f"{device}/{port}"
                        t0, wall = time.perf_counter(), time.time()
                        faults.port_down(root, device, port)
                        down.append(await until(subject, "firing") - t0)
                        detect.append(observed(service, device, port) - wall)
                        t0, repaired = time.perf_counter(), time.time()
                        faults.port_up(root, device, port)
                        up.append(await until(subject, "resolved") - t0)
                        await settled(service, device, port, repaired)
            finally:
                registry = service.metrics.registry
                total = registry.get_sample_value("nicfleet_rule_evaluation_seconds_sum") or 0.0
                count = registry.get_sample_value("nicfleet_rule_evaluation_seconds_count") or 1.0
                stop.set()
        await nc.close()
    return {
        "path": "lab tree -> agent poll -> NATS -> aggregator rules -> NATS subscriber",
        "poll_interval_s": poll,
        "fault_to_firing_ms": percentiles(down),
        "fault_to_agent_detect_ms": percentiles(detect),
        "repair_to_resolved_ms": percentiles(up),
        "target_p99_ms": poll * 1000 + 50,
        "evaluation_mean_ms": round(total / count * 1000, 2),  # all rules + lifecycle + publish
    }


NETNS_SPEC: Final = "roce-cx6dx"
NETNS_NETDEV: Final = "enp26s0f0np0"  # mlx5_0 port 1 of the roce-cx6dx lab node
NETNS_PEER: Final = "nfbenchpeer0"


def netns_missing() -> str | None:
    """Why (b) cannot run here (it adds a network namespace and a veth); None: it can."""
    if os.geteuid() != 0:
        return f"--netns needs root (uid {os.geteuid()}); path (a) only"
    if shutil.which("ip") is None:
        return "--netns needs `ip` (iproute2); path (a) only"
    return None


def ip(netns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", netns, *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def veth_namespace() -> Iterator[str]:
    """A fresh netns with an up veth pair whose one end is named like a lab RoCE netdev."""
    name = f"nfbench-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=10)
    try:
        ip(name, "link", "add", NETNS_NETDEV, "type", "veth", "peer", "name", NETNS_PEER)
        ip(name, "link", "set", NETNS_PEER, "up")
        ip(name, "link", "set", NETNS_NETDEV, "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=10)


def set_link(root: Path, netns: str, *, up: bool) -> None:
    """Flip the veth, and first the lab tree's class/net/<netdev> to match it.

    On a node sysfs and netlink are two views of one netdev. Here the agent watches the
    veth via netlink but reads its snapshots from the rendered tree, whose operstate
    stays "up" unless written: the netdev event makes the agent re-read and publish a
    snapshot ~10 ms later, that snapshot (newer than the event) restores "up" in the
    fleet, and the alert engine, which coalesces a change into the next cycle at most
    every `min_cycle_s` (0.1 s), then finds nothing to fire. Written before `ip` runs
    (the agent reads these files only for a snapshot, never in its poll) so that no
    snapshot can read the old state after the event.
    """
    netdev = root / "class" / "net" / NETNS_NETDEV
    faults.write(root, netdev / "operstate", "up\n" if up else "down\n", True)
    faults.write(root, netdev / "carrier", "1\n" if up else "0\n", True)
    ip(netns, "link", "set", NETNS_NETDEV, "up" if up else "down")


async def netns_latency(workdir: Path, faults_n: int) -> dict[str, Any]:
    """(b): a veth set down in a netns watched by a real agent (netlink) -> alert."""
    node = NODE
    root = workdir / node
    render(with_node_name(load_builtin(NETNS_SPEC), node), root)
    wiring = AlertWiring(engine=EngineSettings(lifecycle=LifecycleSettings(flap_count=1_000_000)))
    # The snapshot that follows a flip may itself wait up to min_cycle_s for its cycle; a
    # flip more than min_cycle_s after that cycle is evaluated at once (netdev_settled).
    isolated = 2 * wiring.engine.min_cycle_s + 0.02
    down: list[float] = []
    up: list[float] = []
    with (
        NatsServer(NatsServerSettings(store_dir=workdir / "nats")) as server,
        veth_namespace() as ns,
    ):
        service = AggregatorService(
            AggregatorSettings(nats_url=server.url, listen_port=0, alerts=wiring)
        )
        stop = asyncio.Event()
        nc = await nats.connect(server.url)
        inbox: asyncio.Queue[tuple[float, Alert]] = asyncio.Queue()

        async def receive(msg: Any) -> None:
            inbox.put_nowait((time.perf_counter(), decode(msg.data, Alert)))

        await nc.subscribe(f"nicfleet.v1.alert.critical.port-down.{node}", cb=receive)
        await nc.flush()

        async def until(state: str) -> float:
            while True:
                at, alert = await asyncio.wait_for(inbox.get(), 10)
                if alert.subject == "mlx5_0/1" and alert.state == state:
                    return at

        proc = await asyncio.create_subprocess_exec(
            str(BIN / "nicfleet-agent"), "run", "--nats-url", server.url, "--sysfs-root",
            str(root), "--node-name", node, "--netns", ns, "--verbs", "off",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        watching = asyncio.Event()

        async def follow_log(stream: asyncio.StreamReader) -> None:
            # A veth flipped before the agent's netlink socket is bound and dumped is in
            # its first table, not an event: no alert would ever come. The agent logs
            # "watching N netdevs via netlink" once it is; read to EOF (a full pipe
            # would block the agent).
            async for line in stream:
                if b"via netlink" in line:
                    watching.set()

        assert proc.stderr is not None
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(service.run(stop))
            tasks.create_task(follow_log(proc.stderr))
            try:
                await asyncio.wait_for(service.ready.wait(), 15)
                await asyncio.wait_for(watching.wait(), 30)
                # Ready once a snapshot (the netdev -> port map) arrived; one round trip
                # of down/up is then seen end to end before measuring.
                deadline = time.monotonic() + 30
                while (rec := service.fleet.get(node)) is None or rec.snapshot is None:
                    assert time.monotonic() < deadline, "agent never reported"
                    await asyncio.sleep(0.05)
                for attempt in range(faults_n + 1):
                    t0, broken = time.perf_counter(), time.time()
                    await asyncio.to_thread(set_link, root, ns, up=False)
                    fired = await until("firing") - t0
                    await netdev_settled(service, node, broken, "down")
                    await asyncio.sleep(isolated)
                    t0, repaired = time.perf_counter(), time.time()
                    await asyncio.to_thread(set_link, root, ns, up=True)
                    resolved = await until("resolved") - t0
                    if attempt:  # the first round only proves the watch is live
                        down.append(fired)
                        up.append(resolved)
                    await netdev_settled(service, node, repaired, "up")
                    await asyncio.sleep(isolated)
            finally:
                proc.terminate()
                await proc.wait()
                stop.set()
        await nc.close()
    return {
        "path": "veth down in a netns -> agent netlink -> NATS -> aggregator rules -> subscriber",
        "note": "t0 is taken before spawning `ip link set` (~2-4 ms of process start included); "
        "each down and up is an isolated change: it waits for the snapshot that followed the "
        "previous one, then pause_s (twice the alert engine's coalescing window min_cycle_s)",
        "min_cycle_s": wiring.engine.min_cycle_s,
        "pause_s": isolated,
        "fault_to_firing_ms": percentiles(down),
        "repair_to_resolved_ms": percentiles(up),
        "target_p99_ms": 50.0,
    }


def observed(service: AggregatorService, device: str, port: int) -> float:
    record = service.fleet.get(NODE)
    events = record.events if record is not None else ()
    return max(
        (r.event.observed_at for r in events
         if r.event.device == device and r.event.port == port and r.event.new_state == "DOWN"),
        default=float("nan"),
    )  # fmt: skip


async def settled(service: AggregatorService, device: str, port: int, since: float) -> None:
    """Bench pacing, not a measurement: wait until a snapshot collected after `since` shows
    the port ACTIVE. The agent re-reads its inventory after every port event; a snapshot
    collected during the previous fault can land after the repair and restate the port as
    DOWN (the fleet lets a full snapshot replace event-patched state), so faults are spaced
    by one snapshot round trip."""
    for _ in range(3000):
        record = service.fleet.get(NODE)
        snap = record.snapshot if record is not None else None
        if snap is not None and snap.collected_at > since:
            states = [p.state for d in snap.devices if d.name == device for p in d.ports
                      if p.port == port]  # fmt: skip
            if states == ["ACTIVE"]:
                return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"no fresh snapshot with {device}/{port} ACTIVE")


async def netdev_settled(
    service: AggregatorService, node: str, since: float, operstate: str
) -> None:
    """Bench pacing, not a measurement: wait until a snapshot collected after `since`
    shows the veth in `operstate`. A change that comes less than `min_cycle_s` after the
    alert engine's last cycle waits for the rest of it (coalescing); spaced by this and a
    pause, each down and up is an isolated change, as on a quiet node."""
    for _ in range(3000):
        record = service.fleet.get(node)
        snap = record.snapshot if record is not None else None
        if snap is not None and snap.collected_at > since:
            states = [i.operstate for d in snap.devices for i in d.interfaces
                      if i.name == NETNS_NETDEV]  # fmt: skip
            if states == [operstate]:
                return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"no fresh snapshot with {NETNS_NETDEV} {operstate}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def daemon(args: list[str], log: Path) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield
        finally:
            proc.terminate()
            proc.wait(timeout=20)


PROM_RULES: Final = """groups:
  - name: infiniband
    rules:
      - alert: InfinibandPortDown
        expr: node_infiniband_state_id != 4
        for: 1m
        labels: {severity: critical}
"""


async def baseline_latency(workdir: Path, faults_n: int) -> dict[str, Any]:
    """node_exporter -> Prometheus -> Alertmanager -> webhook, with the usual defaults."""
    for binary in ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter"):
        if shutil.which(binary) is None:
            return {"skipped": f"{binary} is not installed"}
    root = workdir / "baseline"
    render(with_node_name(load_builtin(SPEC), "baseline-01"), root)
    ports = active_ports(root)
    ne, prom, am, hook = free_port(), free_port(), free_port(), free_port()
    (workdir / "rules.yml").write_text(PROM_RULES)
    (workdir / "prometheus.yml").write_text(
        "global: {scrape_interval: 15s, evaluation_interval: 15s}\n"
        "rule_files: [rules.yml]\n"
        f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['127.0.0.1:{am}']}}]}}]}}\n"
        f"scrape_configs: [{{job_name: node, static_configs: [{{targets: ['127.0.0.1:{ne}']}}]}}]\n"
    )
    (workdir / "am.yml").write_text(
        # One group per alert (group_wait: the default 30 s); every fault uses another port,
        # so each one opens a new group instead of waiting for group_interval (5 m).
        "route: {receiver: hook, group_by: ['...']}\n"
        f"receivers: [{{name: hook, webhook_configs: [{{url: 'http://127.0.0.1:{hook}/'}}]}}]\n"
    )
    got: asyncio.Queue[tuple[float, str]] = asyncio.Queue()

    async def receive(request: web.Request) -> web.Response:
        body = await request.json()
        for alert in body.get("alerts", []):
            if alert.get("status") == "firing":
                labels = alert.get("labels", {})
                got.put_nowait(
                    (time.perf_counter(), f"{labels.get('device')}/{labels.get('port')}")
                )
        return web.Response()

    app = web.Application()
    app.router.add_post("/", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", hook).start()
    samples: list[float] = []
    try:
        with (
            daemon(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{ne}",
                    f"--path.sysfs={root}", "--collector.disable-defaults",
                    "--collector.infiniband"], workdir / "ne.log"),
            daemon(["prometheus-alertmanager", f"--config.file={workdir / 'am.yml'}",
                    f"--storage.path={workdir / 'am'}", f"--web.listen-address=127.0.0.1:{am}",
                    "--cluster.listen-address="], workdir / "am.log"),
            daemon(["prometheus", f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom}"], workdir / "prom.log"),
        ):  # fmt: skip
            await asyncio.sleep(20)  # let Prometheus scrape the healthy state first
            for i in range(faults_n):
                device, port = ports[i % len(ports)]
                t0 = time.perf_counter()
                faults.port_down(root, device, port)
                while True:
                    at, which = await asyncio.wait_for(got.get(), 600)
                    if which == f"{device}/{port}":
                        break
                samples.append(at - t0)
                faults.port_up(root, device, port)
    finally:
        await runner.cleanup()
    return {
        "path": "node_exporter -> Prometheus (15s scrape/eval, for: 1m) -> Alertmanager "
        "(group_wait 30s) -> webhook",
        "fault_to_notification_ms": percentiles(samples),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "runs": [],
    }
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="nicfleet-alert-bench-") as tmp:
            results["runs"].append(await nicfleet_latency(Path(tmp), args.faults, args.poll))
    medians = [r["fault_to_firing_ms"]["median"] for r in results["runs"]]
    p99s = [r["fault_to_firing_ms"]["p99"] for r in results["runs"]]
    results["nicfleet"] = {
        "median_ms": statistics.median(medians),
        "p99_ms": statistics.median(p99s),
    }
    if args.smoke:
        results["smoke"] = True
    if args.netns or args.smoke:
        missing = netns_missing()
        if missing is None:
            with tempfile.TemporaryDirectory(prefix="nicfleet-alert-netns-") as tmp:
                results["netns"] = await netns_latency(Path(tmp), args.faults)
        elif args.smoke:  # without --netns a smoke run still checks path (a); says so
            results["netns"] = {"skipped": missing}
        else:
            raise SystemExit(f"--netns: {missing}")
    if args.baseline:
        with tempfile.TemporaryDirectory(prefix="nicfleet-alert-baseline-") as tmp:
            base = await baseline_latency(Path(tmp), args.baseline)
        results["baseline"] = base
        if "fault_to_notification_ms" in base:
            ratio = base["fault_to_notification_ms"]["median"] / results["nicfleet"]["median_ms"]
            results["ratio_median"] = round(ratio, 1)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=100, help="faults per run (>= 100)")
    parser.add_argument("--runs", type=int, default=3, help="runs; the median is reported")
    parser.add_argument("--poll", type=float, default=0.1, help="agent port-state poll (s)")
    parser.add_argument(
        "--baseline", type=int, default=0, help="also N faults through the Prometheus stack"
    )
    parser.add_argument(
        "--netns", action="store_true", help="also (b): a veth in a netns watched via netlink"
    )
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run of the same code path, numbers meaningless "
        "(--faults 3 --runs 1, and --netns when root; options given still win)",
    )
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    results = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for run in results["runs"]:
        print(f"nicfleet fault->firing  {run['fault_to_firing_ms']}")
        print(f"of which agent detection {run['fault_to_agent_detect_ms']}")
        print(f"nicfleet repair->resolved {run['repair_to_resolved_ms']}")
        print(f"rule evaluation mean {run['evaluation_mean_ms']} ms")
    print(f"nicfleet median of runs: {results['nicfleet']}")
    if "skipped" in results.get("netns", {}):
        print(f"netns skipped: {results['netns']['skipped']}")
    elif "netns" in results:
        print(f"netns veth down->firing {results['netns']['fault_to_firing_ms']}")
    if "baseline" in results:
        print(f"baseline: {results['baseline']}")
        if "ratio_median" in results:
            print(f"ratio (baseline / nicfleet, medians): {results['ratio_median']}x")


if __name__ == "__main__":
    main()
