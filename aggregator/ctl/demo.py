"""`nicfleetctl demo`: a whole fleet on this machine — embedded NATS, the aggregator, lab
kubelets and four lab agents with their device plugins, as separate processes — then a
port-down fault, how fast it arrived and the resource chain it broke.

Talks to the agent and aggregator only as a user would: their command lines and the
HTTP API. Every process it starts is stopped (and waited for) before it returns.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx
from rich.console import Console

from aggregator.ctl.demochain import (
    TRACED,
    kubelet_view,
    plugin_config,
    registered,
    resources_view,
    trace_view,
)
from aggregator.ctl.render import console_for, render_node, render_nodes

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

T = TypeVar("T")


class DemoError(click.ClickException):
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


def _run_json(args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode != 0:
        raise DemoError(f"{' '.join(args[:4])} failed: {done.stderr.strip() or done.stdout}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _wait(what: str, probe: Callable[[], T | None], fleet: Fleet, timeout: float) -> T:
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
def running_fleet(workdir: Path, status: Callable[[str], None]) -> Iterator[Fleet]:
    fleet = Fleet(workdir=workdir)
    try:
        for node, spec in DEMO_NODES:
            status(f"rendering lab node {node} ({spec})")
            _run_json(["-m", "agent", "lab", "render", "--builtin", spec, "--node-name", node,
                       "--out", str(workdir / node), "-o", "json"])  # fmt: skip
        # Authentication on, as in a real deployment: one NKey per agent, each allowed
        # to publish only as its own node; anonymous clients are refused.
        status("generating NATS keys (one per agent, one for the aggregator)")
        node_args = [arg for node, _ in DEMO_NODES for arg in ("--node", node)]
        keys = _run_json(["-m", "aggregator", "nats-auth", "--out", str(workdir / "nats-auth"),
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

        doc = _wait("the aggregator to become ready", read_ready, fleet, 30)
        fleet.api_url, fleet.nats_url = doc["api_url"], doc["nats_url"]
        # No Kubernetes here: one lab kubelet per node (one process serving all four dirs)
        # takes the device plugins' registrations and follows their device lists.
        status("starting lab kubelets (device-plugin registration, one per node)")
        fleet.socket_dir = Path(tempfile.mkdtemp(prefix="nf-", dir="/tmp"))
        dirs = [arg for node, _ in DEMO_NODES for arg in ("--dir", str(fleet.kubelet_dir(node)))]
        fleet.spawn("kubelet", ["-m", "agent", "lab", "kubelet", *dirs])

        def kubelets_up() -> bool | None:
            up = all((fleet.kubelet_dir(n) / KUBELET_STATE).exists() for n, _ in DEMO_NODES)
            return True if up else None

        _wait("the lab kubelets", kubelets_up, fleet, 30)
        for node, _ in DEMO_NODES:
            status(f"starting agent {node} with its device plugin")
            config = workdir / f"{node}.device-plugin.json"
            config.write_text(json.dumps(plugin_config(node), indent=2) + "\n")
            fleet.spawn(f"agent-{node}", ["-m", "agent", "run", "--nats-url", fleet.nats_url,
                                          "--sysfs-root", str(workdir / node),
                                          "--node-name", node, "--nats-nkey-seed-file",
                                          keys["agent_seeds"][node],
                                          "--device-plugin-config", str(config),
                                          "--no-desired-config", "--registration-mode", "legacy",
                                          "--device-plugin-dir", str(fleet.kubelet_dir(node)),
                                          "--plugins-registry-dir",
                                          str(fleet.kubelet_dir(node) / "plugins_registry"),
                                          ])  # fmt: skip
        yield fleet
    finally:
        status("stopping all processes")
        fleet.stop_all()
        if fleet.socket_dir is not None:
            shutil.rmtree(fleet.socket_dir, ignore_errors=True)


def _get(client: httpx.Client, path: str) -> Any:
    try:
        response = client.get(path)
    except httpx.TransportError:
        return None
    return response.json() if response.status_code == 200 else None


def run_demo(workdir: Path, console: Console, *, serve: bool, quiet: bool) -> dict[str, Any]:
    names = [n for n, _ in DEMO_NODES]

    # On a terminal a spinner shows the step in progress (start-up takes seconds).
    spinner = console.status("", spinner="dots") if console.is_terminal and not quiet else None

    def status(text: str) -> None:
        if not quiet:
            console.print(f"[bold cyan]»[/] {text}")
        if spinner is not None:
            spinner.update(f"{text}…")

    with ExitStack() as stack:
        if spinner is not None:
            stack.enter_context(spinner)
        fleet = stack.enter_context(running_fleet(workdir, status))
        client = stack.enter_context(httpx.Client(base_url=fleet.api_url, timeout=5.0))

        def all_ready() -> list[dict[str, Any]] | None:
            doc = _get(client, "/api/v1/nodes")
            items = doc["items"] if doc else []
            ok = sorted(i["name"] for i in items if i["state"] == "ready") == sorted(names)
            return items if ok else None

        status(f"waiting for {len(names)} nodes to appear in the API")
        nodes = _wait("all nodes in the API", all_ready, fleet, 60)
        if not quiet:
            render_nodes(console, nodes, wide=False)

        status("waiting for every device plugin to register with its lab kubelet")
        _wait(
            "the device plugins to register",
            lambda: True if registered(_get(client, "/api/v1/resources"), names) else None,
            fleet,
            60,
        )
        if not quiet:
            _show(console, fleet, "resources")

        status(f"injecting fault: port {FAULT_DEVICE}/{FAULT_PORT} DOWN on {FAULT_NODE}")
        fault = _run_json(["-m", "agent", "lab", "fault", "port-down", "--root",
                           str(workdir / FAULT_NODE), "--device", FAULT_DEVICE,
                           "--port", str(FAULT_PORT)])  # fmt: skip

        def fault_seen() -> dict[str, Any] | None:
            detail: dict[str, Any] | None = _get(client, f"/api/v1/nodes/{FAULT_NODE}")
            for event in (detail or {}).get("events", []):
                if (event["device"], event["port"], event["new_state"]) == (
                    FAULT_DEVICE, FAULT_PORT, "DOWN"
                ):  # fmt: skip
                    return detail
            return None

        detail = _wait("the aggregator to see the fault", fault_seen, fleet, 30)
        rail = TRACED[-1]

        def rail_broken() -> dict[str, Any] | None:
            doc = _get(client, f"/api/v1/trace?node={FAULT_NODE}&resource={rail}")
            return doc if doc is not None and doc["first_broken"] is not None else None

        status(f"waiting for the trace of {rail} on {FAULT_NODE} to show the fault")
        _wait(f"the trace of {rail} to break", rail_broken, fleet, 30)

        def kubelet_saw_it() -> dict[str, Any] | None:
            path = fleet.kubelet_dir(FAULT_NODE) / KUBELET_STATE
            view = kubelet_view(json.loads(path.read_text()))
            return view if view.get(rail, {}).get("allocatable") == 0 else None

        kubelets = {
            FAULT_NODE: _wait("the lab kubelet to see the fault", kubelet_saw_it, fleet, 30)
        }
        traces = {
            f"{FAULT_NODE} {name}": trace_view(
                _get(client, f"/api/v1/trace?node={FAULT_NODE}&resource={name}")
            )
            for name in TRACED
        }
        resources = resources_view(_get(client, "/api/v1/resources"))
        events = list(detail["events"])
        seen = next(e for e in events if e["new_state"] == "DOWN")
        fault_ms = round((seen["received_at"] - fault["injected_at"]) * 1000, 1)
        nodes = _get(client, "/api/v1/nodes")["items"]
        if not quiet:
            render_node(console, detail)
            console.print(
                f"[bold]fault → aggregator: {fault_ms} ms[/] (agent saw it "
                f"{round((seen['observed_at'] - fault['injected_at']) * 1000, 1)} ms after "
                f"injection; NATS delivery {seen['latency_ms']:.1f} ms)"
            )
            for name in TRACED:
                _show(console, fleet, "trace", FAULT_NODE, name)
            console.print(
                f"lab kubelet on {FAULT_NODE} (what it got from the plugins; not a Node "
                "object, the demo has no Kubernetes API): "
                + ", ".join(
                    f"{n} {v['allocatable']}/{v['capacity']} allocatable"
                    for n, v in kubelets[FAULT_NODE].items()
                )
            )
        if serve:
            console.print(
                f"\nFleet running. API: {fleet.api_url}   NATS: {fleet.nats_url}\n"
                f"Status page: {fleet.api_url}/ui/\n"
                f"Try: export NICFLEET_SERVER={fleet.api_url}\n"
                f"     nicfleetctl nodes\n"
                f"     nicfleetctl node {FAULT_NODE}\n"
                f"     nicfleetctl findings --node {FAULT_NODE}\n"
                f"     nicfleetctl resources\n"
                f"     nicfleetctl trace {FAULT_NODE} {TRACED[-1]}\n"
                f"     nicfleet-agent lab fault port-down --root {workdir / 'gpu-ib-02'} "
                f"--device mlx5_0\n"
                f"Logs and sysfs trees: {workdir}\n"
                f"Kubelet and device-plugin sockets: {fleet.socket_dir}\nPress Ctrl-C to stop."
            )
            if spinner is not None:
                spinner.update("fleet running; press Ctrl-C to stop")
            _wait_for_interrupt(fleet)
    return {
        "nodes": nodes,
        "events": events,
        "fault": fault,
        "fault_to_aggregator_ms": fault_ms,
        "resources": resources,
        "traces": traces,
        "lab_kubelets": kubelets,
        "socket_dir": str(fleet.socket_dir),
    }


def _show(console: Console, fleet: Fleet, *args: str) -> None:
    """Run `nicfleetctl ARGS` against the demo's API and print what a user would see."""
    done = subprocess.run(
        [sys.executable, "-m", "aggregator.ctl", "--server", fleet.api_url, *args],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    console.print(f"\n[bold]$ nicfleetctl {' '.join(args)}[/]")
    console.print(
        done.stdout.rstrip() or done.stderr.rstrip(), markup=False, highlight=False, soft_wrap=True
    )


def _wait_for_interrupt(fleet: Fleet) -> None:
    """Until Ctrl-C or SIGTERM, checking every process still runs. Both are handled here:
    a shell starts background jobs with SIGINT ignored, and an unhandled SIGTERM would
    leave the agents and the aggregator running."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            fleet.check_alive()
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@click.command()
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="json: print only a JSON summary at the end.",
)
@click.option("--serve", is_flag=True, help="Keep the fleet running until Ctrl-C.")
@click.option(
    "--workdir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where lab trees and logs go. Default: a temporary directory, removed.",
)
def demo(output: str, serve: bool, workdir: Path | None) -> None:
    """Run a 4-node lab fleet locally, inject a port-down fault, report how fast it arrived."""
    console = console_for(sys.stdout)
    quiet = output == "json"
    with ExitStack() as stack:
        if workdir is None:
            workdir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="nicfleet-demo-"))
            )
        else:
            workdir.mkdir(parents=True, exist_ok=True)
        summary = run_demo(workdir, console, serve=serve, quiet=quiet)
    if quiet:
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
    else:
        console.print("[green]demo finished; all processes stopped[/]")
