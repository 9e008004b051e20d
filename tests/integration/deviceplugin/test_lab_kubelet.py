"""`nicfleet-agent lab kubelet` as the demo runs it: a separate process serving kubelet.sock
in each --dir; the agent's real device plugin registers there, and the state file shows
capacity and allocatable as the kubelet counts them. Stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from agent.deviceplugin.advertised import AdvertisedResources, DevicePluginSettings
from agent.deviceplugin.registration import Backoff
from agent.lab.kubelet import KubeletEmulator
from agent.lab.kubeletrun import STATE_FILE, state_of
from proto.inventory import Platform
from tests.support.dpfakes import config, node, rdma_device, resource
from tests.support.paths import REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

EXCL = "rdma/excl"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="nf-", dir="/tmp"))  # unix socket paths: 107 bytes
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _manager(plugins: Path) -> AdvertisedResources:
    settings = DevicePluginSettings(
        device_plugin_dir=plugins,
        plugins_registry_dir=plugins / "registry",
        registration_mode="legacy",
        cdi_dir=plugins / "cdi",
        watch_interval=0.02,
        call_timeout=1.0,
        backoff=Backoff(initial=0.05, maximum=0.5),
    )
    manager = AdvertisedResources(settings, node="gpu-001")
    manager.apply_config(config(resource("excl", exclusive=True)), generation=1)
    snapshot = node(
        rdma_device("mlx5_0", 0, ports=[("ACTIVE", "LinkUp")]),
        rdma_device("mlx5_1", 1, ports=[("DOWN", "Disabled")]),
    )
    manager.update(snapshot, {})
    return manager


@contextlib.asynccontextmanager
async def running(manager: AdvertisedResources) -> AsyncIterator[None]:
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(manager.run(stop))
        try:
            yield
        finally:
            stop.set()


def _state(directory: Path) -> dict[str, Any] | None:
    path = directory / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else None


async def test_kubelet_process_counts_healthy_devices_and_cleans_up(short_dir: Path) -> None:
    a, b = short_dir / "node-a", short_dir / "node-b"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "lab", "kubelet", "--dir", str(a), "--dir", str(b),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        await wait_until(lambda: _state(a) is not None and _state(b) is not None, what="ready")
        assert _state(a)["resources"] == {}  # type: ignore[index]
        async with running(_manager(a)):

            def counted() -> bool:
                doc = _state(a) or {}
                return bool(doc.get("resources", {}).get(EXCL, {}).get("capacity") == 2)

            await wait_until(counted, what="the plugin's device list in the state file")
            view = _state(a)["resources"][EXCL]  # type: ignore[index]
            assert (view["capacity"], view["allocatable"], view["stream_open"]) == (2, 1, True)
            assert view["unhealthy"] == ["0000:29:00.0"]
            assert view["endpoint"] == str(a / "nicfleet-rdma_excl.sock")
        assert _state(b)["resources"] == {}  # type: ignore[index]
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, out.decode()[-2000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    for d in (a, b):
        assert not (d / "kubelet.sock").exists() and not (d / STATE_FILE).exists()


def test_a_socket_path_over_107_bytes_is_refused_naming_the_dir(short_dir: Path) -> None:
    long_dir = short_dir / ("x" * 100)
    done = subprocess.run(
        [sys.executable, "-m", "agent", "lab", "kubelet", "--dir", str(long_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: --dir {long_dir}: kubelet.sock would be")
    assert "107-byte unix socket limit" in done.stderr
    assert "Traceback" not in done.stderr
    assert not long_dir.exists()


async def test_state_of_an_in_process_kubelet(short_dir: Path) -> None:
    async with KubeletEmulator(short_dir) as kubelet, running(_manager(short_dir)):
        plugin = await kubelet.plugin(EXCL)
        await plugin.wait_list(lambda r: len(r.devices) == 2)
        await wait_until(lambda: kubelet.changed.is_set(), what="change flag")
        doc = state_of(kubelet, now=1.5)
    assert doc["socket"] == str(short_dir / "kubelet.sock")
    assert doc["registrations"] == 1 and doc["updated_at"] == 1.5
    assert doc["resources"][EXCL]["allocatable"] == 1


async def test_exclusive_netns_mode_leaves_capacity_and_no_allocatable(short_dir: Path) -> None:
    # What `kubectl describe node` would show for a shared resource in exclusive RDMA netns
    # mode: the resource stays (capacity), nothing is allocatable; an exclusive one is not
    # affected (rdma-cni moves its adapter into the pod's netns).
    manager = _manager(short_dir)
    manager.apply_config(
        config(resource("excl", exclusive=True), resource("shared", hca_max=3)), generation=2
    )
    snapshot = node(rdma_device("mlx5_0", 0), rdma_device("mlx5_1", 1))
    manager.update(replace(snapshot, platform=Platform(rdma_netns_mode="exclusive")), {})
    async with KubeletEmulator(short_dir) as kubelet, running(manager):
        shared = await kubelet.plugin("rdma/shared")
        await shared.wait_list(lambda r: {d.health for d in r.devices} == {"Unhealthy"})
        counted = {"rdma/shared": 3, EXCL: 2}

        def both_counted() -> bool:
            doc = state_of(kubelet, now=0.0)["resources"]
            return all(doc.get(n, {}).get("capacity") == c for n, c in counted.items())

        await wait_until(both_counted, what="both resources counted")
        doc = state_of(kubelet, now=0.0)["resources"]
    assert (doc["rdma/shared"]["capacity"], doc["rdma/shared"]["allocatable"]) == (3, 0)
    assert (doc[EXCL]["capacity"], doc[EXCL]["allocatable"]) == (2, 2)
