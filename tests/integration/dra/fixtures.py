"""What the DRA integration tests share: a lab node's DRA plugin settings (a rendered
roce-cx6dx sysfs tree, the kubelet's directories under one short root) and `running`, a
service or plugin served until the block ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal, Protocol

from agent.deviceplugin.registration import Backoff
from agent.dra.pluginrunner import DraSettings
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name


class Runs(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


@asynccontextmanager
async def running(*services: Runs) -> AsyncIterator[None]:
    """Run each of `services` until the block ends; then stop them and wait for them."""
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        for service in services:
            tasks.create_task(service.run(stop))
        try:
            yield
        finally:
            stop.set()


def lab_dra_settings(
    root: Path, node: str, *, claims_from: Literal["nats", "dir"] = "nats"
) -> DraSettings:
    """Render `node`'s roce-cx6dx tree at root/sys; the plugin's settings with the kubelet's
    directories, CDI and state under `root` (keep it short: unix sockets, 107 bytes), quick
    to watch and to retry registration. The registry exists, as the kubelet made it."""
    render(with_node_name(load_builtin("roce-cx6dx"), node), root / "sys")
    settings = DraSettings(
        plugins_dir=root / "plugins",
        plugins_registry_dir=root / "registry",
        cdi_dir=root / "cdi",
        state_dir=root / "state",
        claims_dir=root / "claims",
        claims_from=claims_from,
        watch_interval=0.02,
        backoff=Backoff(initial=0.05, maximum=0.5),
    )
    settings.plugins_registry_dir.mkdir(parents=True, exist_ok=True)
    return settings
