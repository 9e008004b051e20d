"""`nicfleetctl demo`: a whole fleet on this machine — embedded NATS, the aggregator, lab
kubelets, four lab agents with their device and DRA plugins and lab traffic on their
ports, as separate processes — then a port-down fault, how fast it arrived, the resource
chain it broke and the DRA device it took out of the node's ResourceSlice.

Talks to the agent and aggregator only as a user would: their command lines and the
HTTP API. Every process it starts is stopped (and waited for) before it returns.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click
import httpx
from rich.console import Console

from aggregator.ctl.demochain import (
    TRACED,
    kubelet_view,
    registered,
    resources_view,
    trace_view,
)
from aggregator.ctl.demodra import (
    DRA_STATE,
    SLICE_COLUMNS,
    dra_registered,
    kubelet_unhealthy,
    port_state,
    registry_dir,
    row_cells,
    slice_rows,
)
from aggregator.ctl.demofleet import (
    DEMO_NODES,
    FAULT_DEVICE,
    FAULT_NODE,
    FAULT_PORT,
    KUBELET_STATE,
    DemoError,
    Fleet,
    run_json,
    running_fleet,
    wait_for,
)
from aggregator.ctl.render import console_for, plain_table, render_node, render_nodes
from proto.dranames import device_name
from proto.runtime.cliopts import output_option

# The agents' default counter interval is 1 s; 10% of a 200G port is 2.5 GB/s each way.
DEFAULT_TRAFFIC_LOAD = 0.1


def _get(client: httpx.Client, path: str) -> Any:
    try:
        response = client.get(path)
    except httpx.TransportError:
        return None
    return response.json() if response.status_code == 200 else None


def run_demo(
    workdir: Path, console: Console, *, serve: bool, quiet: bool, traffic_load: float = 0.0
) -> dict[str, Any]:
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
        fleet = stack.enter_context(running_fleet(workdir, status, traffic_load=traffic_load))
        client = stack.enter_context(httpx.Client(base_url=fleet.api_url, timeout=5.0))

        def all_ready() -> list[dict[str, Any]] | None:
            doc = _get(client, "/api/v1/nodes")
            items = doc["items"] if doc else []
            ok = sorted(i["name"] for i in items if i["state"] == "ready") == sorted(names)
            return items if ok else None

        status(f"waiting for {len(names)} nodes to appear in the API")
        nodes = wait_for("all nodes in the API", all_ready, fleet, 60)
        if not quiet:
            render_nodes(console, nodes, wide=False)

        status("waiting for every device plugin to register with its lab kubelet")
        wait_for(
            "the device plugins to register",
            lambda: True if registered(_get(client, "/api/v1/resources"), names) else None,
            fleet,
            60,
        )
        if not quiet:
            _show(console, fleet, "resources")

        status("waiting for every DRA plugin to register with its lab kubelet")
        wait_for(
            "the DRA plugins to register",
            lambda: True if all(dra_registered(_dra_state(fleet, n)) for n in names) else None,
            fleet,
            30,
        )
        slices_before = slice_rows(_get(client, "/api/v1/dra/slices"), FAULT_NODE)
        unhealthy_before = kubelet_unhealthy(_dra_state(fleet, FAULT_NODE))
        if not quiet:
            _show_slices(console, slices_before)

        status(f"injecting fault: port {FAULT_DEVICE}/{FAULT_PORT} DOWN on {FAULT_NODE}")
        fault = run_json(["-m", "agent", "lab", "fault", "port-down", "--root",
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

        detail = wait_for("the aggregator to see the fault", fault_seen, fleet, 30)
        rail = TRACED[-1]

        def rail_broken() -> dict[str, Any] | None:
            doc = _get(client, f"/api/v1/trace?node={FAULT_NODE}&resource={rail}")
            return doc if doc is not None and doc["first_broken"] is not None else None

        status(f"waiting for the trace of {rail} on {FAULT_NODE} to show the fault")
        wait_for(f"the trace of {rail} to break", rail_broken, fleet, 30)

        def kubelet_saw_it() -> dict[str, Any] | None:
            path = fleet.kubelet_dir(FAULT_NODE) / KUBELET_STATE
            view = kubelet_view(json.loads(path.read_text()))
            whole = view.get(TRACED[0], {})
            dropped = whole.get("allocatable", 0) < whole.get("capacity", 0)
            return view if dropped and view.get(rail, {}).get("allocatable") == 0 else None

        kubelets = {
            FAULT_NODE: wait_for("the lab kubelet to see the fault", kubelet_saw_it, fleet, 30)
        }
        dra_device = device_name(FAULT_DEVICE)

        def dra_saw_it() -> tuple[list[dict[str, str]], list[str]] | None:
            rows = slice_rows(_get(client, "/api/v1/dra/slices"), FAULT_NODE)
            unhealthy = kubelet_unhealthy(_dra_state(fleet, FAULT_NODE))
            down = port_state(rows, dra_device) == "DOWN" and dra_device in unhealthy
            return (rows, unhealthy) if down else None

        slices_after, dra_unhealthy = wait_for(
            "the DRA side to see the fault", dra_saw_it, fleet, 30
        )
        traces = {f"{FAULT_NODE} {name}": trace_view(_trace(client, name)) for name in TRACED}
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
            already = [d for d in unhealthy_before if d != dra_device]
            console.print(
                f"DRA on {FAULT_NODE}: {dra_device} reads portState "
                f"{port_state(slices_after, dra_device)} in GET /api/v1/dra/slices (the "
                "ResourceSlice the aggregator publishes with --dra-publish); the lab kubelet's "
                f"DRA health stream calls it Unhealthy"
                + (f" (already before the fault: {', '.join(already)})" if already else "")
            )
        if serve:
            console.print(
                f"\nFleet running. API: {fleet.api_url}   NATS: {fleet.nats_url}\n"
                f"Status page: {fleet.api_url}/ui/\n"
                + (
                    f"Lab traffic: {traffic_load:.0%} of each active port's rate "
                    "(rx/tx and sparklines on the status page)\n"
                    if traffic_load > 0
                    else ""
                )
                + f"Try: export NICFLEET_SERVER={fleet.api_url}\n"
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
        "dra": {
            "node": FAULT_NODE,
            "device": dra_device,
            "slices_before": slices_before,
            "slices_after": slices_after,
            "kubelet_unhealthy_before": unhealthy_before,
            "kubelet_unhealthy": dra_unhealthy,
        },
        "socket_dir": str(fleet.socket_dir),
    }


def _trace(client: httpx.Client, resource: str) -> dict[str, Any]:
    doc: dict[str, Any] | None = _get(
        client, f"/api/v1/trace?node={FAULT_NODE}&resource={resource}"
    )
    if doc is None:
        raise DemoError(f"GET /api/v1/trace of {resource} on {FAULT_NODE} failed")
    return doc


def _dra_state(fleet: Fleet, node: str) -> dict[str, Any] | None:
    """The lab kubelet's DRA state file of `node` (None until written, or mid-replace)."""
    path = registry_dir(fleet.kubelet_dir(node)) / DRA_STATE
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc


def _show_slices(console: Console, rows: list[dict[str, str]]) -> None:
    console.print(
        f"\n[bold]DRA: the ResourceSlice of {FAULT_NODE} (GET /api/v1/dra/slices, "
        "driver rdma.nicfleet.io)[/]"
    )
    table = plain_table(SLICE_COLUMNS)
    for row in rows:
        table.add_row(*row_cells(row))
    console.print(table)


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
@output_option("table", "json", help="json: print only a JSON summary at the end.")
@click.option("--serve", is_flag=True, help="Keep the fleet running until Ctrl-C.")
@click.option(
    "--traffic-load",
    default=DEFAULT_TRAFFIC_LOAD,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="Lab traffic on every active port, as a share of its rate (rates and sparklines "
    "show it); 0: none.",
)
@click.option(
    "--workdir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where lab trees and logs go. Default: a temporary directory, removed.",
)
def demo(output: str, serve: bool, traffic_load: float, workdir: Path | None) -> None:
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
        summary = run_demo(workdir, console, serve=serve, quiet=quiet, traffic_load=traffic_load)
    if quiet:
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
    else:
        console.print("[green]demo finished; all processes stopped[/]")
