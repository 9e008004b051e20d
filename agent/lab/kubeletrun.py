"""`lab kubelet`: serve one lab kubelet per directory until stopped, each writing what it
sees to <dir>/lab-kubelet.json on every registration and device list (atomically), the way
a real kubelet keeps its device-manager checkpoint next to kubelet.sock. With DRA
registries it also plays the kubelet's DRA side there (plugin watcher, health watch),
writing <registry>/lab-kubelet-dra.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from agent.lab.kubelet import KubeletEmulator
from agent.lab.kubeletdra import DraKubeletEmulator

STATE_FILE: Final = "lab-kubelet.json"
DRA_STATE_FILE: Final = "lab-kubelet-dra.json"
# sockaddr_un.sun_path is 108 bytes with the terminating NUL.
MAX_SOCKET_PATH: Final = 107


def socket_path_problem(directory: Path, name: str = "kubelet.sock") -> str | None:
    """Why a unix socket `name` cannot live in `directory` (path too long), or None."""
    path = os.fsencode(os.path.abspath(directory / name))
    if len(path) > MAX_SOCKET_PATH:
        return (
            f"{directory}: {name} would be {len(path)} bytes, over the {MAX_SOCKET_PATH}-byte "
            "unix socket limit; use a shorter directory"
        )
    return None


def state_of(kubelet: KubeletEmulator, now: float) -> dict[str, Any]:
    """The JSON document of one kubelet: per resource capacity/allocatable as it counts them."""
    resources = {
        name: {
            "endpoint": view.endpoint,
            "capacity": view.capacity,
            "allocatable": view.allocatable,
            "unhealthy": list(view.unhealthy),
            "stream_open": view.stream_open,
        }
        for name, view in kubelet.view().items()
    }
    return {
        "socket": str(kubelet.socket),
        "registrations": len(kubelet.registrations),
        "resources": resources,
        "updated_at": now,
    }


def write_state(kubelet: KubeletEmulator) -> None:
    path = kubelet.dir / STATE_FILE
    tmp = path.with_name(f".{STATE_FILE}.tmp")
    tmp.write_text(json.dumps(state_of(kubelet, time.time()), sort_keys=True) + "\n")
    os.replace(tmp, path)


def dra_state_of(kubelet: DraKubeletEmulator, now: float) -> dict[str, Any]:
    """The JSON document of one DRA side: per driver its endpoint and device health."""
    drivers = {
        name: {
            "endpoint": str(plugin.endpoint),
            "devices": sorted(
                d.device.device_name
                for d in (plugin.latest_health.devices if plugin.latest_health else ())
            ),
            "unhealthy": sorted(plugin.unhealthy()),
            "health_stream_open": not plugin.health_ended.is_set(),
        }
        for name, plugin in sorted(kubelet.plugins.items())
    }
    return {"registry": str(kubelet.registry), "drivers": drivers, "updated_at": now}


def write_dra_state(kubelet: DraKubeletEmulator) -> None:
    path = kubelet.registry / DRA_STATE_FILE
    tmp = path.with_name(f".{DRA_STATE_FILE}.tmp")
    tmp.write_text(json.dumps(dra_state_of(kubelet, time.time()), sort_keys=True) + "\n")
    os.replace(tmp, path)


async def serve(
    dirs: Sequence[Path], stop: asyncio.Event, *, dra_registries: Sequence[Path] = ()
) -> None:
    """Run a kubelet in each of `dirs` (and a DRA side watching each of `dra_registries`)
    until `stop` is set; removes its socket and state files on the way out."""
    kubelets = [KubeletEmulator(Path(d)) for d in dirs]
    dras = [DraKubeletEmulator(Path(r)) for r in dra_registries]
    try:
        for kubelet in kubelets:
            await kubelet.start()
            write_state(kubelet)
        for dra in dras:
            await dra.start()
            write_dra_state(dra)
        async with asyncio.TaskGroup() as group:
            followers = [group.create_task(_follow(k)) for k in kubelets]
            followers += [group.create_task(_follow_dra(d)) for d in dras]
            await stop.wait()
            for task in followers:
                task.cancel()
    finally:
        for kubelet in kubelets:
            await kubelet.stop()
            kubelet.socket.unlink(missing_ok=True)
            (kubelet.dir / STATE_FILE).unlink(missing_ok=True)
        for dra in dras:
            await dra.stop()
            (dra.registry / DRA_STATE_FILE).unlink(missing_ok=True)


async def _follow(kubelet: KubeletEmulator) -> None:
    while True:
        await kubelet.changed.wait()
        kubelet.changed.clear()
        write_state(kubelet)


async def _follow_dra(kubelet: DraKubeletEmulator) -> None:
    while True:
        await kubelet.changed.wait()
        kubelet.changed.clear()
        write_dra_state(kubelet)
