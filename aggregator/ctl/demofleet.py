"""The demo's processes: lab trees rendered, NATS keys made, the aggregator, the lab
kubelets, the agents (with their device and DRA plugins) and the lab traffic started as a user
would start them, and every one of them stopped and waited for; the kubelet socket dir
removed. Each child is also told to stop when the demo dies without stopping it (SIGKILL):
Linux's parent-death signal, so no agent or aggregator outlives a killed demo.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click

from aggregator.ctl.demochain import plugin_config
from aggregator.ctl.demodra import DRA_STATE, agent_dra_args, registry_dir
from aggregator.errors import AggregatorError

# (node name, built-in lab spec): distinct specs, so no two nodes share GUIDs or MACs.
# gpu-ib-01 reproduces a real 8xH100 `nvidia-smi topo -m` matrix.
DEMO_NODES: tuple[tuple[str, str], ...] = (
    ("gpu-ib-01", "h100-ib-12nic"),
    ("gpu-ib-02", "a100-ib-4nic"),
    ("gpu-roce-01", "roce-cx6dx"),
    ("gpu-roce-02", "roce-cx6dx-2"),
)
FAULT_NODE, FAULT_DEVICE, FAULT_PORT = "gpu-ib-01", "mlx5_3", 1
KUBELET_STATE = "lab-kubelet.json"  # what `nicfleet-agent lab kubelet` writes per dir
# Where `lab render` puts a tree's procfs files (agent.lab.procfs.PROC_DIR; nicfleetctl may
# not import the agent): the kernel release, command line and NVIDIA driver flavour, so the
# demo's nodes report the facts a real agent reads from /proc.
LAB_PROC = "proc"
# Ports, counters and devices reach an agent at once (its 100 ms poll, 1 s counters); a
# PCIe width or ACS change only at its next inventory, every 300 s by default: the demo's
# agents re-read every 10 s so `lab fault pcie-width` shows while one watches (~30 ms each).
INVENTORY_INTERVAL_S = 10

T = TypeVar("T")
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_this_process() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGTERM when this process dies, however it
    dies (None off Linux). SIGTERM, not SIGKILL: the aggregator then stops its embedded
    nats-server and the agents remove their sockets, as on Ctrl-C. The signal follows the
    thread that forked, so spawn from the thread that lives as long as the demo."""
    if not sys.platform.startswith("linux"):
        return None
    # Resolved here, not in the child: between fork and exec only async-signal-safe work
    # belongs there (the demo runs a spinner thread), and prctl through a bound function
    # pointer is one syscall.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the demo died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


class DemoError(AggregatorError, click.ClickException):
    exit_code = 1


@dataclass
class Fleet:
    """The processes of one demo run and where they write."""

    workdir: Path
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    api_url: str = ""
    nats_url: str = ""
    # Kubelet and plugin sockets: a short dir of its own (/tmp/nf-XXXX), since a unix socket
    # path must fit 107 bytes and --workdir may be long.
    socket_dir: Path | None = None

    def kubelet_dir(self, node: str) -> Path:
        assert self.socket_dir is not None
        return self.socket_dir / node

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in the terminal reaches only us; we stop them
            preexec_fn=die_with_this_process(),
        )
        log.close()
        self.procs.append((name, proc))
        return proc

    def stop_all(self, timeout: float = 10.0) -> None:
        # Agents first, the aggregator (and its embedded nats-server) last.
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-1500:]
                raise DemoError(f"{name} exited with code {proc.returncode}:\n{tail}")


def run_json(args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode != 0:
        raise DemoError(f"{' '.join(args[:4])} failed: {done.stderr.strip() or done.stdout}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def wait_for(what: str, probe: Callable[[], T | None], fleet: Fleet, timeout: float) -> T:
    """Poll `probe` until it returns a value, bounded by `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fleet.check_alive()
        value = probe()
        if value is not None:
            return value
        time.sleep(0.02)
    raise DemoError(f"timed out after {timeout:.0f}s waiting for {what} (logs: {fleet.workdir})")


@contextmanager
def running_fleet(
    workdir: Path, status: Callable[[str], None], *, traffic_load: float = 0.0
) -> Iterator[Fleet]:
    """The whole fleet, up; `traffic_load` > 0 also runs `lab traffic` on every node
    (that share of each ACTIVE port's rate, in and out)."""
    fleet = Fleet(workdir=workdir)
    try:
        for node, spec in DEMO_NODES:
            status(f"rendering lab node {node} ({spec})")
            run_json(["-m", "agent", "lab", "render", "--builtin", spec, "--node-name", node,
                       "--out", str(workdir / node), "-o", "json"])  # fmt: skip
        # Authentication on, as in a real deployment: one NKey per agent, each allowed
        # to publish only as its own node; anonymous clients are refused.
        status("generating NATS keys (one per agent, one for the aggregator)")
        node_args = [arg for node, _ in DEMO_NODES for arg in ("--node", node)]
        keys = run_json(["-m", "aggregator", "nats-auth", "--out", str(workdir / "nats-auth"),
                          *node_args, "-o", "json"])  # fmt: skip
        status("starting aggregator with embedded NATS")
        ready = workdir / "aggregator.ready"
        fleet.spawn("aggregator", ["-m", "aggregator", "run", "--listen", "127.0.0.1:0",
                                   "--ready-file", str(ready), "--stale-after", "10",
                                   "--nats-store-dir", str(workdir / "nats"),
                                   "--nats-server-config", keys["config"],
                                   "--nats-nkey-seed-file", keys["aggregator_seed"]])  # fmt: skip

        def read_ready() -> dict[str, Any] | None:
            return json.loads(ready.read_text()) if ready.exists() else None

        doc = wait_for("the aggregator to become ready", read_ready, fleet, 30)
        fleet.api_url, fleet.nats_url = doc["api_url"], doc["nats_url"]
        # No Kubernetes here: one lab kubelet per node (one process serving all four dirs)
        # takes the device plugins' registrations and follows their device lists.
        status("starting lab kubelets (device-plugin and DRA registration, one per node)")
        fleet.socket_dir = Path(tempfile.mkdtemp(prefix="nf-", dir="/tmp"))
        dirs = [arg for node, _ in DEMO_NODES for arg in ("--dir", str(fleet.kubelet_dir(node)))]
        dirs += [
            arg
            for node, _ in DEMO_NODES
            for arg in ("--dra-registry", str(registry_dir(fleet.kubelet_dir(node))))
        ]
        fleet.spawn("kubelet", ["-m", "agent", "lab", "kubelet", *dirs])

        def kubelets_up() -> bool | None:
            up = all(
                (fleet.kubelet_dir(n) / KUBELET_STATE).exists()
                and (registry_dir(fleet.kubelet_dir(n)) / DRA_STATE).exists()
                for n, _ in DEMO_NODES
            )
            return True if up else None

        wait_for("the lab kubelets", kubelets_up, fleet, 30)
        for node, _ in DEMO_NODES:
            status(f"starting agent {node} with its device and DRA plugins")
            config = workdir / f"{node}.device-plugin.json"
            config.write_text(json.dumps(plugin_config(node), indent=2) + "\n")
            fleet.spawn(f"agent-{node}", ["-m", "agent", "run", "--nats-url", fleet.nats_url,
                                          "--sysfs-root", str(workdir / node),
                                          "--proc-root", str(workdir / node / LAB_PROC),
                                          "--node-name", node, "--nats-nkey-seed-file",
                                          keys["agent_seeds"][node],
                                          "--device-plugin-config", str(config),
                                          "--no-desired-config", "--registration-mode", "legacy",
                                          "--inventory-interval", str(INVENTORY_INTERVAL_S),
                                          "--device-plugin-dir", str(fleet.kubelet_dir(node)),
                                          "--plugins-registry-dir",
                                          str(registry_dir(fleet.kubelet_dir(node))),
                                          *agent_dra_args(fleet.kubelet_dir(node),
                                                          workdir / f"{node}.dra"),
                                          ])  # fmt: skip
        if traffic_load > 0:
            status(f"starting lab traffic ({traffic_load:.0%} of each active port's rate)")
            roots = [arg for node, _ in DEMO_NODES for arg in ("--root", str(workdir / node))]
            fleet.spawn("traffic", ["-m", "agent", "lab", "traffic", *roots,
                                    "--load", str(traffic_load)])  # fmt: skip
        yield fleet
    finally:
        status("stopping all processes")
        fleet.stop_all()
        if fleet.socket_dir is not None:
            shutil.rmtree(fleet.socket_dir, ignore_errors=True)
