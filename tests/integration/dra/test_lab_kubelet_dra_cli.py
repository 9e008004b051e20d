"""`nicfleet-agent lab kubelet --dra-registry DIR`: the lab kubelet process with its DRA side
on the command line: it registers the DRA plugin that serves there, writes what its health
stream says to DIR/lab-kubelet-dra.json, and removes that file on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.dra.pluginrunner import DraPlugin
from agent.host.inventory import collect_port_states, collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab.kubeletrun import DRA_STATE_FILE, STATE_FILE
from tests.integration.dra.fixtures import lab_dra_settings, running
from tests.support.paths import REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

NODE = "dra-cli-01"
DRIVER = "rdma.nicfleet.io"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    root = Path(tempfile.mkdtemp(prefix="dlk", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _plugin(root: Path) -> DraPlugin:
    settings = lab_dra_settings(root, NODE, claims_from="dir")
    plugin = DraPlugin(settings, node=NODE)
    sysfs = Sysfs(root / "sys")
    snapshot = collect_snapshot(sysfs, node=NODE, seq=1, now=0.0, agent_version="t")
    plugin.update(snapshot, collect_port_states(sysfs))
    return plugin


def _drivers(registry: Path) -> dict[str, Any]:
    path = registry / DRA_STATE_FILE
    if not path.exists():
        return {}
    drivers: dict[str, Any] = json.loads(path.read_text())["drivers"]
    return drivers


async def test_the_process_registers_the_dra_plugin_and_cleans_up(short_dir: Path) -> None:
    kubelet_dir, registry = short_dir / "dp", short_dir / "registry"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "lab", "kubelet",
        "--dir", str(kubelet_dir), "--dra-registry", str(registry),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        await wait_until(lambda: (registry / DRA_STATE_FILE).exists(), what="DRA state file")
        assert _drivers(registry) == {}
        plugin = _plugin(short_dir)
        async with running(plugin):
            await wait_until(
                lambda: len(_drivers(registry).get(DRIVER, {}).get("devices", [])) == 4,
                what="the plugin's devices in the DRA state file",
            )
            await wait_until(lambda: plugin.state == "registered", what="registration")
            view = _drivers(registry)[DRIVER]
            assert view["endpoint"] == str(short_dir / "plugins" / DRIVER / "dra.sock")
            assert view["health_stream_open"] is True
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, out.decode()[-2000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert not (registry / DRA_STATE_FILE).exists()
    assert not (kubelet_dir / STATE_FILE).exists()


def test_a_dra_registry_too_long_for_its_sockets_is_refused(short_dir: Path) -> None:
    long_dir = short_dir / ("x" * 90)
    done = subprocess.run(
        [sys.executable, "-m", "agent", "lab", "kubelet", "--dir", str(short_dir / "dp"),
         "--dra-registry", str(long_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: --dra-registry {long_dir}: {DRIVER}-reg.sock would be")
    assert "Traceback" not in done.stderr
    assert not long_dir.exists()
