"""Benchmark: the DRA kubelet plugin's latencies, beside the device plugin's, in one run.

1. NodePrepareResources of one fresh claim of 8 devices (16-adapter synthetic node), over
   real gRPC on a unix socket from a separate process (as the kubelet is); the claim object
   is written and the claim unprepared between timed calls, untimed. Baseline: the device
   plugin's Allocate of 8 exclusive adapters, same node, same client. Where the time goes:
   the checkpoint + CDI spec write (`ClaimPreparer._write`) timed alone, with and
   without os.fsync (a bare fsync of a file that size too).
2. Port fault -> UNHEALTHY on the NodeWatchResources stream (lab `port-down` written in
   place, the agent's port-state poll -> DraPlugin.update), over repeated down/up cycles,
   beside the device plugin's fault -> Unhealthy on ListAndWatch (bench/deviceplugin_latency).
3. ResourceSlice size (JSON bytes, devices, attributes) and build time of
   proto.draslices.build_slices for `nicfleet-agent lab render --synthetic 16`.
4. Port fault -> ResourceSlice updated: the aggregator's publisher (`--dra-publish`,
   aggregator.dra.publisher through aggregator.kube.client over loopback HTTP) against kmock
   (tests/integration/kube/sliceapi.py), a fleet of `--nodes` 16-adapter nodes already
   published; a port event fed to the fleet and its change feed as ingest does, timed until
   kmock has stored the slice with that device's portState flipped (down and up in turn).
A script for docs/performance.md, never a test. Run: .venv/bin/python bench/dra_latency.py
(`--smoke`: a few calls and faults, seconds; checks the script still runs)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import platform
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import deviceplugin_latency as dp  # noqa: E402  (bench/ is this script's directory)

from agent.deviceplugin.advertised import AdvertisedResources  # noqa: E402
from agent.deviceplugin.registration import Backoff  # noqa: E402
from agent.dra import checkpoint  # noqa: E402
from agent.dra.pluginrunner import DraPlugin, DraSettings  # noqa: E402
from agent.host.inventory import collect_port_states, collect_snapshot  # noqa: E402
from agent.host.portstates import PortStateReader  # noqa: E402
from agent.host.sysfs import Sysfs  # noqa: E402
from agent.lab import faults  # noqa: E402
from agent.lab.kubeletdra import DraKubeletEmulator, DraPluginConnection  # noqa: E402
from agent.lab.render import render  # noqa: E402
from agent.lab.spec import load_builtin, with_node_name  # noqa: E402
from agent.lab.synthetic import synthetic_spec  # noqa: E402
from aggregator.dra.publisher import PublishSettings, SlicePublisher  # noqa: E402
from aggregator.fleet.changefeed import ChangeFeed  # noqa: E402
from aggregator.fleet.state import Fleet  # noqa: E402
from aggregator.kube.client import KubeClient, KubeSettings  # noqa: E402
from proto import draslices  # noqa: E402
from proto.dra import health_pb2  # noqa: E402
from proto.dranames import DRIVER, device_name  # noqa: E402
from proto.messages.config import DevicePluginConfig  # noqa: E402
from proto.messages.events import LinkEvent  # noqa: E402

NODE: Final = "bench"
DEVICES_PER_CLAIM: Final = 8
# The targets (issue 22, "Measured").
TARGET_PREPARE_P99_MS: Final = 5.0
TARGET_FAULT_P99_MS: Final = 100.0
TARGET_SLICE_P99_MS: Final = 1000.0  # port fault -> ResourceSlice updated
# --smoke: the same path, tiny (make test runs it; its numbers mean nothing).
SMOKE: Final = {
    "calls": 5, "faults": 2, "poll_interval": 0.05, "writes": 5, "builds": 2,
    "nodes": 3, "publishes": 6,
}  # fmt: skip

percentiles = dp.percentiles


def dra_settings(root: Path, files: Path, cdi: Path | None = None) -> DraSettings:
    """`cdi`: where the CDI specs go when not beside the checkpoint under `files`."""
    return DraSettings(
        plugins_dir=root / "plugins",
        plugins_registry_dir=root / "reg",
        cdi_dir=(cdi or files) / "cdi",
        state_dir=files / "state",
        claims_dir=files / "claims",
        watch_interval=0.1,
        backoff=Backoff(initial=0.05, maximum=0.5),
    )


@contextlib.asynccontextmanager
async def serving(plugin: DraPlugin) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    try:
        yield
    finally:
        stop.set()
        await task


def sixteen(root: Path) -> tuple[Path, Any]:
    tree = root / "sys16"
    render(with_node_name(synthetic_spec(16, ports_per_adapter=1), NODE), tree)
    sysfs = Sysfs(tree)
    snapshot = collect_snapshot(sysfs, node=NODE, seq=1, now=time.time(), agent_version="b")
    return tree, snapshot


async def prepare_latency(
    root: Path, files: Path, calls: int, cdi: Path | None = None
) -> dict[str, Any]:
    tree, snapshot = sixteen(root)
    states = collect_port_states(Sysfs(tree))
    names = [d.name for d in snapshot.devices]
    chosen = [device_name(n) for n in names[:DEVICES_PER_CLAIM]]
    settings = dra_settings(root, files, cdi)
    plugin = DraPlugin(settings, node=NODE)
    plugin.update(snapshot, states)
    result: dict[str, Any] = {
        "adapters": len(names),
        "devices_per_claim": len(chosen),
        "client": "separate process, sync grpc; fresh claim per call, unprepared untimed",
        "files_dir": str(files),
    }
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        async with DraKubeletEmulator(settings.plugins_registry_dir) as kubelet, serving(plugin):
            conn = await kubelet.plugin(DRIVER, timeout=10)
            samples, unprepare = await loop.run_in_executor(
                pool,
                timed_prepares,
                str(conn.endpoint),
                str(settings.claims_dir),
                chosen,
                calls,
            )
        result["prepare_8_ms"] = percentiles(samples)
        result["unprepare_8_ms"] = percentiles(unprepare)
        result["in_process_prepare_8_ms"] = await in_process_prepares(
            plugin, settings.claims_dir, chosen, calls
        )
        result["device_plugin_allocate_exclusive_8_ms"] = await allocate_baseline(
            root, snapshot, states, pool, calls
        )
    result["target_p99_ms"] = TARGET_PREPARE_P99_MS
    return result


async def allocate_baseline(
    root: Path, snapshot: Any, states: Any, pool: ProcessPoolExecutor, calls: int
) -> dict[str, Any]:
    names = [d.name for d in snapshot.devices]
    manager = AdvertisedResources(dp.settings(root / "dpa"), node=NODE)
    manager.apply_config(
        DevicePluginConfig(config_list=(dp.resource("excl16", names, exclusive=True),)),
        generation=1,
    )
    manager.update(snapshot, states)
    async with dp.KubeletEmulator(root / "dpa" / "dp") as kubelet, dp.serving(manager):
        excl = await kubelet.plugin("rdma/excl16")
        ids = [d.ID for d in (await excl.next_list()).devices]
        samples = await asyncio.get_running_loop().run_in_executor(
            pool, dp.timed_calls, str(excl.endpoint), "exclusive", ids, calls
        )
    return percentiles(samples)


async def in_process_prepares(
    plugin: DraPlugin, claims_dir: Path, devices: list[str], calls: int
) -> dict[str, Any]:
    """ClaimPreparer.prepare awaited directly (no gRPC): the claim read, the plan and the
    two file writes, with their thread hops; what gRPC adds is the difference."""
    from agent.dra.pluginclaims import ClaimRef
    from agent.lab.kubeletdra import claim_object, write_claim

    samples = []
    for i in range(10 + calls):
        uid = str(uuid.uuid4())
        ref = ClaimRef(namespace="bench", uid=uid, name=f"c-{uid[:8]}")
        results = [(f"r{n}", DRIVER, NODE, d) for n, d in enumerate(devices)]
        write_claim(claims_dir, claim_object((ref.namespace, uid, ref.name), results))
        start = time.perf_counter()
        prepared = await plugin.preparer.prepare(ref)
        took = time.perf_counter() - start
        if prepared.error:
            raise RuntimeError(f"prepare failed: {prepared.error}")
        await plugin.preparer.unprepare(ref)
        if i >= 10:
            samples.append(took)
    return percentiles(samples)


def timed_prepares(
    endpoint: str, claims_dir: str, devices: list[str], calls: int
) -> tuple[list[float], list[float]]:
    """In a separate process, as the kubelet is: a warm-up, then `calls` timed prepares of
    fresh claims (the API server's part, writing the allocated claim, is untimed)."""
    import grpc

    from agent.lab.kubeletdra import claim_object, write_claim
    from proto.dra import api_pb2, api_pb2_grpc

    def claim() -> api_pb2.Claim:
        uid = str(uuid.uuid4())
        ref = ("bench", uid, f"c-{uid[:8]}")
        results = [(f"r{i}", DRIVER, NODE, d) for i, d in enumerate(devices)]
        write_claim(Path(claims_dir), claim_object(ref, results))
        return api_pb2.Claim(namespace=ref[0], uid=uid, name=ref[2])

    prepared, unprepared = [], []
    with grpc.insecure_channel(f"unix://{endpoint}") as channel:
        stub = api_pb2_grpc.DRAPluginStub(channel)
        for i in range(10 + calls):
            message = claim()
            start = time.perf_counter()
            answer = stub.NodePrepareResources(
                api_pb2.NodePrepareResourcesRequest(claims=[message]), timeout=5
            )
            took = time.perf_counter() - start
            entry = answer.claims[message.uid]
            if entry.error or len(entry.devices) != len(devices):
                raise RuntimeError(f"prepare failed: {entry.error or len(entry.devices)}")
            start = time.perf_counter()
            stub.NodeUnprepareResources(
                api_pb2.NodeUnprepareResourcesRequest(claims=[message]), timeout=5
            )
            if i >= 10:  # the first ten warm the channel and the plugin up
                prepared.append(took)
                unprepared.append(time.perf_counter() - start)
    return prepared, unprepared


def write_breakdown(
    root: Path, files: Path, writes: int, cdi: Path | None = None
) -> dict[str, Any]:
    """Where prepare's file work goes: the two atomic writes as `ClaimPreparer._write` does
    them (one 8-device claim in the checkpoint), then the same without fsync, and a bare
    fsync of a checkpoint-sized file."""
    _tree, snapshot = sixteen(root / "w")
    settings = dra_settings(root / "w", files / "w", cdi / "w" if cdi else None)
    plugin = DraPlugin(settings, node=NODE)
    plugin.update(snapshot, {})
    preparer = plugin.preparer
    from agent.dra.cdi import claim_spec, spec_file_name

    devices = [(device_name(d.name), d) for d in snapshot.devices[:DEVICES_PER_CLAIM]]
    uid = str(uuid.uuid4())
    spec = claim_spec(uid, devices)
    record = checkpoint.PreparedClaim(
        uid=uid,
        namespace="bench",
        name="c",
        devices=tuple(
            checkpoint.PreparedDevice(
                request_names=("r",), pool=NODE, device=n, cdi_ids=(f"{DRIVER}/claim={uid}-{n}",)
            )
            for n, _ in devices
        ),
        cdi_spec=spec_file_name(uid),
    )
    claims = {uid: record}

    def timed(fn: Any) -> list[float]:
        out = []
        for _ in range(writes):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
        return out

    with_fsync = timed(lambda: preparer._write(uid, spec, claims))
    real_fsync = os.fsync
    os.fsync = lambda fd: None  # a bench-only measurement, restored below
    try:
        without = timed(lambda: preparer._write(uid, spec, claims))
    finally:
        os.fsync = real_fsync
    size = settings.checkpoint.stat().st_size
    probe = files / "w" / "fsync-probe"
    with probe.open("wb") as f:

        def one() -> None:
            f.seek(0)
            f.write(b"x" * size)
            f.flush()
            os.fsync(f.fileno())

        bare = timed(one)
    return {
        "what": "spec + checkpoint written atomically (ClaimPreparer._write), in process",
        "writes": writes,
        "with_fsync_ms": percentiles(with_fsync),
        "without_fsync_ms": percentiles(without),
        "bare_fsync_ms": percentiles(bare),
        "checkpoint_bytes": size,
        "spec_bytes": (settings.cdi_dir / spec_file_name(uid)).stat().st_size,
    }


async def fault_latency(root: Path, faults_n: int, poll: float) -> dict[str, Any]:
    tree = root / "sys"
    render(with_node_name(load_builtin("h100-ib-12nic"), NODE), tree)
    sysfs = Sysfs(tree)
    snapshot = collect_snapshot(sysfs, node=NODE, seq=1, now=time.time(), agent_version="b")
    settings = dra_settings(root, root / "files")
    plugin = DraPlugin(settings, node=NODE)
    reader = PortStateReader(sysfs)  # what the agent's state loop polls with
    states = reader.collect()
    plugin.update(snapshot, states)
    stop_poll = asyncio.Event()

    async def state_loop() -> None:  # what the agent service does, minus publishing
        nonlocal states
        while not stop_poll.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_poll.wait(), poll)
            current = await asyncio.to_thread(reader.collect)
            if current != states:
                states = current
                plugin.update(snapshot, current)

    down, up = [], []
    async with DraKubeletEmulator(settings.plugins_registry_dir) as kubelet, serving(plugin):
        conn = await kubelet.plugin(DRIVER, timeout=10)
        await conn.wait_health(lambda r: len(r.devices) > 0, timeout=10)
        poller = asyncio.create_task(state_loop())
        try:
            for _ in range(faults_n):
                await asyncio.sleep(random.uniform(0, poll))  # land anywhere in a poll cycle
                down.append(await _flip(conn, tree, up=False))
                await asyncio.sleep(random.uniform(0, poll))
                up.append(await _flip(conn, tree, up=True))
        finally:
            stop_poll.set()
            await poller
            reader.close()
    return {
        "poll_interval_ms": poll * 1000,
        "fault_to_unhealthy_ms": percentiles(down),
        "recovery_to_healthy_ms": percentiles(up),
        "target_p99_ms": TARGET_FAULT_P99_MS,
    }


async def _flip(conn: DraPluginConnection, tree: Path, *, up: bool) -> float:
    want = health_pb2.HEALTHY if up else health_pb2.UNHEALTHY
    while not conn.health_updates.empty():  # only messages sent after the fault count
        conn.health_updates.get_nowait()
    inject = faults.port_up if up else faults.port_down
    record = await asyncio.to_thread(inject, tree, "mlx5_0", 1)

    def seen(response: health_pb2.NodeWatchResourcesResponse) -> bool:
        return any(d.device.device_name == "mlx5-0" and d.health == want for d in response.devices)

    await conn.wait_health(seen, timeout=10)
    return time.time() - record.injected_at


def slice_size(tree: Path, snapshot: Any, builds: int) -> dict[str, Any]:
    states = collect_port_states(Sysfs(tree))
    settings = draslices.SliceSettings()
    took = []
    for _ in range(builds):
        start = time.perf_counter()
        slices = draslices.build_slices(snapshot, states, settings)
        took.append(time.perf_counter() - start)
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    return {
        "node": "lab render --synthetic 16 (1 port each)",
        "slices": len(slices),
        "devices": len(devices),
        "attributes": sum(len(d.get("attributes", {})) for d in devices),
        "json_bytes": sum(len(json.dumps(s, separators=(",", ":"))) for s in slices),
        "build_ms": percentiles(took),
    }


async def publish_latency(template: Any, nodes: int, rounds: int) -> dict[str, Any]:
    """The publisher's part of a port fault: event into the fleet -> slice stored."""
    import kmock
    import msgspec

    from tests.integration.kube.sliceapi import port_state, slices_api

    names = [f"{NODE}-{i:04d}" for i in range(nodes)]
    api = slices_api()
    fleet, changes = Fleet(), ChangeFeed()
    waiting: dict[str, tuple[str, asyncio.Future[float]]] = {}  # slice -> (state, when)
    created: set[str] = set()
    all_created = asyncio.Event()

    def stored(obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        created.add(name)
        if len(created) == nodes:
            all_created.set()
        wanted = waiting.get(name)
        state_now = port_state(obj, "mlx5-0")
        if wanted is not None and state_now == wanted[0] and not wanted[1].done():
            wanted[1].set_result(time.perf_counter())

    api.on_write = stored
    samples: list[float] = []
    async with api, kmock.Server(api) as server:
        kube = await KubeClient.connect(KubeSettings(host=str(server.url)))
        async with kube:
            publisher = SlicePublisher(
                PublishSettings(stale_after=1e9),
                api=kube,
                changes=changes.subscribe(),
                records=fleet.view,
                cluster_nodes=lambda: {n: f"uid-{n}" for n in names},
                is_leader=lambda: True,
            )
            stop = asyncio.Event()
            task = asyncio.create_task(publisher.run(stop))
            try:
                now = time.time()
                for name in names:
                    fleet.apply_snapshot(msgspec.structs.replace(template, node=name), now)
                    changes.publish(name, "snapshot")
                await asyncio.wait_for(all_created.wait(), 120)  # one slice per node
                loop = asyncio.get_running_loop()
                down = dict.fromkeys(names, False)
                for seq in range(1, rounds + 1):
                    name = random.choice(names)
                    down[name] = not down[name]
                    new, old = ("DOWN", "ACTIVE") if down[name] else ("ACTIVE", "DOWN")
                    event = LinkEvent(
                        node=name, seq=seq, kind="port-state", device="mlx5_0", port=1,
                        old_state=old, new_state=new,
                        phys_state="Disabled" if down[name] else "LinkUp",
                        observed_at=time.time(),
                    )  # fmt: skip
                    done = loop.create_future()
                    waiting[draslices.slice_name(name, DRIVER, 0)] = (new, done)
                    await asyncio.sleep(random.uniform(0, 0.01))  # not in lockstep with it
                    start = time.perf_counter()
                    fleet.apply_event(event, received_at=time.time())
                    changes.publish(name, "event")
                    samples.append(await asyncio.wait_for(done, 10) - start)
            finally:
                stop.set()
                await task
    return {
        "nodes": nodes,
        "adapters_per_node": len(template.devices),
        "what": "port event into the fleet -> kmock stored the ResourceSlice (publisher, "
        "KubeClient over loopback HTTP, one PUT)",
        "fault_to_slice_ms": percentiles(samples),
        "writes_ok": sum(
            s.value
            for m in publisher.metrics.writes.collect()
            for s in m.samples
            if s.name.endswith("_total") and s.labels["result"] == "ok"
        ),
        "target_p99_ms": TARGET_SLICE_P99_MS,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    # unix socket paths are limited to 107 bytes: a short base directory.
    root = Path(tempfile.mkdtemp(prefix="drb", dir="/tmp"))
    files = (
        Path(tempfile.mkdtemp(prefix="drb-files", dir=args.files_dir)) if args.files_dir else root
    )
    cdi = Path(tempfile.mkdtemp(prefix="drb-cdi", dir=args.cdi_dir)) if args.cdi_dir else None
    try:
        tree16, snapshot16 = sixteen(root / "s")  # rendering takes seconds: once for 3. and 4.
        return {
            "machine": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "files_fs": str(files),
                "cdi_fs": str(cdi or files),
            },
            "prepare": await prepare_latency(
                root / "p", files / "p", args.calls, cdi / "p" if cdi else None
            ),
            "writes": write_breakdown(root, files, args.writes, cdi),
            "fault": {
                "dra": await fault_latency(root / "fd", args.faults, args.poll_interval),
                "device_plugin": await dp.fault_latency(
                    root / "fp", args.faults, args.poll_interval
                ),
            },
            "slices": slice_size(tree16, snapshot16, args.builds),
            "publish": await publish_latency(snapshot16, args.nodes, args.publishes),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if files != root:
            shutil.rmtree(files, ignore_errors=True)
        if cdi is not None:
            shutil.rmtree(cdi, ignore_errors=True)


def print_report(report: dict[str, Any]) -> None:
    p = report["prepare"]
    for key in (
        "prepare_8_ms",
        "in_process_prepare_8_ms",
        "unprepare_8_ms",
        "device_plugin_allocate_exclusive_8_ms",
    ):
        s = p[key]
        print(f"{key}: median {s['median']:.2f} p99 {s['p99']:.2f} ms ({s['n']} calls)")
    w = report["writes"]
    for key in ("with_fsync_ms", "without_fsync_ms", "bare_fsync_ms"):
        print(f"prepare files {key}: median {w[key]['median']:.3f} p99 {w[key]['p99']:.3f} ms")
    for side, fault in report["fault"].items():
        d, u = fault["fault_to_unhealthy_ms"], fault["recovery_to_healthy_ms"]
        print(
            f"{side} poll {fault['poll_interval_ms']:.0f} ms: fault->unhealthy median "
            f"{d['median']:.1f} p99 {d['p99']:.1f}; recovery median {u['median']:.1f} "
            f"p99 {u['p99']:.1f} ms ({d['n']} faults)"
        )
    s = report["slices"]
    print(
        f"slices: {s['slices']} slice(s), {s['devices']} devices, {s['attributes']} attributes,"
        f" {s['json_bytes']} JSON bytes; build median {s['build_ms']['median']:.2f} ms"
    )
    u = report["publish"]
    f = u["fault_to_slice_ms"]
    print(
        f"publisher, {u['nodes']} nodes: port event -> ResourceSlice stored median "
        f"{f['median']:.1f} p99 {f['p99']:.1f} ms ({f['n']} faults; target p99 "
        f"{u['target_p99_ms']:.0f} ms)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--calls", type=int, default=500, help="timed prepares and Allocates")
    parser.add_argument("--faults", type=int, default=100, help="down/up cycles per side")
    parser.add_argument("--poll-interval", type=float, default=0.05, help="port poll, seconds")
    parser.add_argument("--writes", type=int, default=200, help="timed file writes per variant")
    parser.add_argument("--builds", type=int, default=200, help="timed build_slices calls")
    parser.add_argument("--nodes", type=int, default=100, help="nodes the publisher holds")
    parser.add_argument("--publishes", type=int, default=200, help="timed port faults, publisher")
    parser.add_argument(
        "--files-dir",
        type=Path,
        help="put the CDI specs and checkpoint on this filesystem (default: under /tmp)",
    )
    parser.add_argument(
        "--cdi-dir",
        type=Path,
        help="put the CDI specs on this filesystem instead, the checkpoint staying on "
        "--files-dir: a node's layout is /var/run/cdi on a tmpfs and the checkpoint on disk "
        "(e.g. --cdi-dir /dev/shm)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run that checks the script still works, numbers meaningless "
        "(--calls 5 --faults 2 --poll-interval 0.05 --writes 5 --builds 2 --nodes 3 "
        "--publishes 6; options given win)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(args))
    if args.smoke:
        report["smoke"] = True
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
