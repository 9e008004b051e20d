"""Benchmark: device-plugin latencies a kubelet sees, over real gRPC on unix sockets.

1. fault -> Unhealthy on the ListAndWatch stream: a port is downed in a rendered lab tree;
   the agent-side detection is the port-state poll (a PortStateReader every
   --poll-interval, as the agent's state loop does) -> AdvertisedResources.update().
2. Allocate round trip with 16 adapters (shared resource, and exclusive with 8 adapters),
   plus GetPreferredAllocation of 8 of 16 exclusive adapters.
3. kubelet restart (every socket deleted, new kubelet.sock) -> registered again.
A script for docs/performance.md, never a test. Run: .venv/bin/python bench/deviceplugin_latency.py
(`--smoke`: a few faults, calls and one restart, seconds; checks the script still runs)
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
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the kubelet emulator lives in tests/

from agent.deviceplugin.advertised import AdvertisedResources, DevicePluginSettings  # noqa: E402
from agent.deviceplugin.registration import Backoff  # noqa: E402
from agent.host.inventory import collect_port_states, collect_snapshot  # noqa: E402
from agent.host.portstates import PortStateReader  # noqa: E402
from agent.host.sysfs import Sysfs  # noqa: E402
from agent.lab import faults  # noqa: E402
from agent.lab.render import render  # noqa: E402
from agent.lab.spec import load_builtin  # noqa: E402
from agent.lab.synthetic import synthetic_spec  # noqa: E402
from proto.messages.config import DevicePluginConfig, ResourceConfig, Selectors  # noqa: E402
from tests.support.kubelet import KubeletEmulator, PluginConnection  # noqa: E402

# The targets (issue 4, "Performance").
TARGET_FAULT_P99_MS: Final = 100.0
TARGET_ALLOCATE_P99_MS: Final = 5.0
# --smoke: the same path, tiny (make test runs it; its numbers mean nothing).
SMOKE: Final = {"faults": 2, "poll_interval": "0.05", "calls": 10, "restarts": 1}


def percentiles(samples_s: Sequence[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return {
        "n": len(ms),
        "median": round(statistics.median(ms), 3),
        "p99": round(p99, 3),
        "max": round(ms[-1], 3),
        "min": round(ms[0], 3),
    }


def settings(root: Path, **overrides: Any) -> DevicePluginSettings:
    return DevicePluginSettings(
        device_plugin_dir=root / "dp",
        plugins_registry_dir=root / "reg",
        registration_mode="legacy",
        cdi_dir=root / "cdi",
        backoff=Backoff(initial=0.05, maximum=0.5),
        **overrides,
    )


def resource(name: str, devices: Sequence[str], *, exclusive: bool = False) -> ResourceConfig:
    return ResourceConfig(
        resource_name=name,
        rdma_hca_max=1000,
        exclusive=exclusive,
        selectors=Selectors(rdma_devices=tuple(devices)),
    )


@contextlib.asynccontextmanager
async def serving(manager: AdvertisedResources) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        yield
    finally:
        stop.set()
        await task


async def fault_latency(root: Path, faults_n: int, poll: float) -> dict[str, Any]:
    tree = root / "sys"
    render(load_builtin("h100-ib-12nic"), tree)
    sysfs = Sysfs(tree)
    snapshot = collect_snapshot(sysfs, node="bench", seq=1, now=time.time(), agent_version="b")
    manager = AdvertisedResources(settings(root), node="bench")
    manager.apply_config(
        DevicePluginConfig(config_list=(resource("rail0", ["mlx5_0"]),)), generation=1
    )
    reader = PortStateReader(sysfs)  # what the agent's state loop polls with
    states = reader.collect()
    manager.update(snapshot, states)
    stop_poll = asyncio.Event()

    async def state_loop() -> None:  # what the agent service does, minus publishing
        nonlocal states
        while not stop_poll.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_poll.wait(), poll)
            current = await asyncio.to_thread(reader.collect)
            if current != states:
                states = current
                manager.update(snapshot, current)

    down, up = [], []
    async with KubeletEmulator(root / "dp") as kubelet, serving(manager):
        plugin = await kubelet.plugin("rdma/rail0")
        await plugin.next_list()
        poller = asyncio.create_task(state_loop())
        try:
            for _ in range(faults_n):
                await asyncio.sleep(random.uniform(0, poll))  # land anywhere in a poll cycle
                down.append(await _flip(plugin, tree, up=False))
                await asyncio.sleep(random.uniform(0, poll))
                up.append(await _flip(plugin, tree, up=True))
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


async def _flip(plugin: PluginConnection, tree: Path, *, up: bool) -> float:
    want = "Healthy" if up else "Unhealthy"
    # In a thread, as a real fault does not stop the agent's loop; timed from the last write.
    inject = faults.port_up if up else faults.port_down
    record = await asyncio.to_thread(inject, tree, "mlx5_0", 1)
    await plugin.wait_list(lambda r: {d.health for d in r.devices} == {want}, timeout=10)
    return time.time() - record.injected_at


async def allocate_latency(root: Path, calls: int) -> dict[str, Any]:
    tree = root / "sys16"
    render(synthetic_spec(16, ports_per_adapter=1), tree)
    snapshot = collect_snapshot(
        Sysfs(tree), node="bench", seq=1, now=time.time(), agent_version="b"
    )
    names = [d.name for d in snapshot.devices]
    manager = AdvertisedResources(settings(root), node="bench")
    manager.apply_config(
        DevicePluginConfig(
            config_list=(resource("shared16", names), resource("excl16", names, exclusive=True))
        ),
        generation=1,
    )
    manager.update(snapshot, collect_port_states(Sysfs(tree)))
    result: dict[str, Any] = {"adapters": len(names), "client": "separate process, sync grpc"}
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    async with KubeletEmulator(root / "dp") as kubelet, serving(manager):
        shared = await kubelet.plugin("rdma/shared16")
        excl = await kubelet.plugin("rdma/excl16")
        ids = [d.ID for d in (await excl.next_list()).devices]
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            for label, endpoint, kind in (
                ("allocate_shared_ms", shared.endpoint, "shared"),
                ("allocate_exclusive_8_ms", excl.endpoint, "exclusive"),
                ("preferred_8_of_16_ms", excl.endpoint, "preferred"),
            ):
                samples = await loop.run_in_executor(
                    pool, timed_calls, str(endpoint), kind, ids, calls
                )
                result[label] = percentiles(samples)
    result["target_p99_ms"] = TARGET_ALLOCATE_P99_MS
    return result


def timed_calls(endpoint: str, kind: str, ids: list[str], calls: int) -> list[float]:
    """In a separate process, as the kubelet is: `calls` timed RPCs after a warm-up."""
    import grpc

    from proto.deviceplugin import api_pb2, api_pb2_grpc

    def request(i: int) -> Any:
        if kind == "preferred":
            return api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=ids, allocation_size=8
                    )
                ]
            )
        chosen = [str(i % 1000)] if kind == "shared" else ids[:8]
        return api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
        )

    with grpc.insecure_channel(f"unix://{endpoint}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        call = stub.GetPreferredAllocation if kind == "preferred" else stub.Allocate
        for i in range(20):
            call(request(i), timeout=5)
        samples = []
        for i in range(calls):
            message = request(i)
            start = time.perf_counter()
            call(message, timeout=5)
            samples.append(time.perf_counter() - start)
    return samples


async def restart_latency(root: Path, restarts: int) -> dict[str, Any]:
    manager = AdvertisedResources(settings(root, watch_interval=0.1), node="bench")
    tree = root / "sys"
    snapshot = collect_snapshot(
        Sysfs(tree), node="bench", seq=1, now=time.time(), agent_version="b"
    )
    manager.apply_config(
        DevicePluginConfig(config_list=(resource("rail0", ["mlx5_0"]),)), generation=1
    )
    manager.update(snapshot, {})
    samples = []
    async with KubeletEmulator(root / "dp") as kubelet, serving(manager):
        previous = await kubelet.plugin("rdma/rail0")
        for _ in range(restarts):
            await kubelet.restart()
            start = time.monotonic()
            previous = await kubelet.reconnected("rdma/rail0", previous)
            samples.append(time.monotonic() - start)
    return {"watch_interval_ms": 100.0, "kubelet_restart_to_registered_ms": percentiles(samples)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    # unix socket paths are limited to 107 bytes: a short base directory.
    root = Path(tempfile.mkdtemp(prefix="dpb", dir="/tmp"))
    try:
        polls = [float(p) for p in args.poll_interval.split(",")]
        report: dict[str, Any] = {
            "machine": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
            },
            "fault": [
                await fault_latency(root / f"f{i}", args.faults, p) for i, p in enumerate(polls)
            ],
            "allocate": await allocate_latency(root / "a", args.calls),
            "restart": await restart_latency(root / "f0", args.restarts),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report


def print_report(report: dict[str, Any]) -> None:
    for fault in report["fault"]:
        d, u = fault["fault_to_unhealthy_ms"], fault["recovery_to_healthy_ms"]
        print(
            f"poll {fault['poll_interval_ms']:.0f} ms: fault->Unhealthy median {d['median']:.1f}"
            f" p99 {d['p99']:.1f} ms; recovery->Healthy median {u['median']:.1f}"
            f" p99 {u['p99']:.1f} ms ({d['n']} faults)"
        )
    a = report["allocate"]
    for key in ("allocate_shared_ms", "allocate_exclusive_8_ms", "preferred_8_of_16_ms"):
        stat = a[key]
        print(
            f"{key} ({a['adapters']} adapters): median {stat['median']:.2f} p99 {stat['p99']:.2f}"
        )
    r = report["restart"]["kubelet_restart_to_registered_ms"]
    print(f"kubelet restart -> registered: median {r['median']:.1f} p99 {r['p99']:.1f} ms")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--faults", type=int, default=100, help="faults per poll interval (>= 100)")
    parser.add_argument("--poll-interval", default="0.1,0.05", help="seconds, comma-separated")
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per RPC")
    parser.add_argument("--restarts", type=int, default=20)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run that checks the script still works, numbers meaningless "
        "(--faults 2 --poll-interval 0.05 --calls 10 --restarts 1; options given still win)",
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
