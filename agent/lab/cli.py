"""The `lab` click group: render specs (files, built-ins, synthetic) into sysfs trees, list
built-ins, inject faults, run lab kubelets. Owns argument parsing and output only (text
for people, one JSON line for scripts). Bad input (unknown spec, malformed YAML, missing
device, non-empty output dir) ends with `error: ...` on stderr and exit code 2.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import click
import msgspec

from agent.errors import AgentError
from agent.lab import traffic
from agent.lab.faults import (
    FaultError,
    FaultRecord,
    bump_counter,
    counter_reset,
    pcie_width_drop,
    set_acs,
)
from agent.lab.faults import port_down as inject_port_down
from agent.lab.faults import port_up as inject_port_up
from agent.lab.hotplug import device_add, device_remove
from agent.lab.layout import plan
from agent.lab.nodespec import NodeSpec
from agent.lab.rdma import vf_adapters
from agent.lab.render import RenderError, render
from agent.lab.spec import (
    SpecError,
    builtin_specs,
    load_builtin,
    load_spec,
    with_node_name,
)
from agent.lab.synthetic import MAX_COUNTERS, MAX_HW_COUNTERS, synthetic_spec
from proto.dranames import DRIVER
from proto.runtime.cliopts import output_option

_OUTPUT = output_option("text", "json")
_ROOT = click.option(
    "--root",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="A tree rendered by `lab render`.",
)
_DEVICE = click.option("--device", required=True, help="RDMA device, e.g. mlx5_0.")
_PORT = click.option("--port", default=1, show_default=True, type=click.IntRange(min=1))
_IN_PLACE = click.option(
    "--in-place/--atomic",
    "in_place",
    default=True,
    show_default=True,
    help="In place: rewrite each file's inode, so a running agent (which keeps counter and "
    "port-state files open) sees it. --atomic: replace the file (temp file + rename), for "
    "readers that reopen it every time.",
)
# What ends a command that runs for a while (lab traffic, counter --repeat) cleanly.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class LabInputError(AgentError, click.ClickException):
    """Printed as `error: ...` with exit code 2, the code click uses for usage errors."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


# Same help options as when reached through `nicfleet-agent` (tests invoke the group alone).
@click.group("lab", context_settings={"help_option_names": ["-h", "--help"]})
def lab() -> None:
    """Simulated RDMA nodes: render sysfs trees from node specs and inject faults."""


@lab.command("render")
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--builtin", "builtin_name", help="A built-in spec (see `lab list`).")
@click.option(
    "--synthetic",
    type=click.IntRange(1, 128),
    help="A synthetic node with this many ConnectX-7 cards (benchmarks).",
)
@click.option(
    "--ports",
    default=2,
    show_default=True,
    type=click.IntRange(1, 8),
    help="--synthetic: ports per card (one PCI function and mlx5 device each).",
)
@click.option(
    "--gpus",
    default=8,
    show_default=True,
    type=click.IntRange(0, 32),
    help="--synthetic: H100 GPUs.",
)
@click.option(
    "--counters",
    default=MAX_COUNTERS,
    show_default=True,
    type=click.IntRange(0, MAX_COUNTERS),
    help="--synthetic: counters/ files per port.",
)
@click.option(
    "--hw-counters",
    default=MAX_HW_COUNTERS,
    show_default=True,
    type=click.IntRange(0, MAX_HW_COUNTERS),
    help="--synthetic: hw_counters/ files per port (lifespan included).",
)
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--node-name", help="Render under this node name (hardware ids unchanged).")
@click.option("--overwrite", is_flag=True, help="Replace a tree previously rendered there.")
@_OUTPUT
def render_cmd(
    spec_file: Path | None,
    builtin_name: str | None,
    synthetic: int | None,
    ports: int,
    gpus: int,
    counters: int,
    hw_counters: int,
    out: Path,
    node_name: str | None,
    overwrite: bool,
    output: str,
) -> None:
    """Render a node spec (--spec FILE, --builtin NAME or --synthetic N) into --out."""
    if [spec_file, builtin_name, synthetic].count(None) != 2:
        raise LabInputError("give exactly one of --spec FILE, --builtin NAME or --synthetic N")
    try:
        spec: NodeSpec
        if synthetic is not None:
            spec = synthetic_spec(synthetic, ports, hw_counters, counters, gpus)
        elif spec_file is not None:
            spec = load_spec(spec_file)
        else:
            spec = load_builtin(str(builtin_name))
        if node_name is not None:
            spec = with_node_name(spec, node_name)
        render(spec, out, overwrite=overwrite)
    except (SpecError, RenderError, ValueError) as exc:
        raise LabInputError(str(exc)) from exc
    netdevs = sum(p.netdev is not None for a in spec.adapters for p in a.ports)
    devices = len(spec.adapters) + len(vf_adapters(spec, plan(spec)))  # VFs' RDMA devices too
    summary = {
        "node": spec.name,
        "root": str(out),
        "gpus": len(spec.gpus),
        "adapters": devices,
        "netdevs": netdevs,
    }
    if output == "json":
        click.echo(json.dumps(summary))
    else:
        click.echo(
            f"rendered {spec.name} into {out}: {len(spec.gpus)} GPUs, "
            f"{devices} RDMA devices, {netdevs} netdevs"
        )


@lab.command("list")
@_OUTPUT
def list_cmd(output: str) -> None:
    """List the built-in node specs."""
    specs = [(name, load_builtin(name).description) for name in builtin_specs()]
    if output == "json":
        click.echo(json.dumps([{"name": n, "description": d} for n, d in specs]))
        return
    width = max((len(n) for n, _ in specs), default=0)
    for name, description in specs:
        click.echo(f"{name:<{width}}  {description}")


@lab.group("fault")
def fault() -> None:
    """Inject a fault into a rendered tree; prints one JSON line describing the change."""


@fault.command("port-down")
@_ROOT
@_DEVICE
@_PORT
@_IN_PLACE
def port_down_cmd(root: Path, device: str, port: int, in_place: bool) -> None:
    """Take a port down: DOWN / Disabled, its netdevs down without carrier."""
    _emit(lambda: inject_port_down(root, device, port, atomic=not in_place))


@fault.command("port-up")
@_ROOT
@_DEVICE
@_PORT
@_IN_PLACE
def port_up_cmd(root: Path, device: str, port: int, in_place: bool) -> None:
    """Bring a port up: ACTIVE / LinkUp, its netdevs up with carrier."""
    _emit(lambda: inject_port_up(root, device, port, atomic=not in_place))


@fault.command("counter")
@_ROOT
@_DEVICE
@_PORT
@click.option("--name", required=True, help="Counter, e.g. port_rcv_errors or hw_counters/x.")
@click.option("--delta", default=1, show_default=True, type=click.IntRange(min=0))
@click.option(
    "--repeat",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Add --delta this many times, --every seconds apart (one JSON line each): a rate "
    "that lasts, as a bad cable's errors do, for rules that judge rates over time.",
)
@click.option(
    "--every",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds between two repeats.",
)
@_IN_PLACE
def counter_cmd(
    root: Path,
    device: str,
    port: int,
    name: str,
    delta: int,
    repeat: int,
    every: float,
    in_place: bool,
) -> None:
    """Increase a port counter (PMA counters saturate, hw_counters wrap at 32 bits)."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _STOP_SIGNALS}
    try:
        for i in range(repeat):
            if i and stop.wait(every):
                break  # SIGTERM/Ctrl-C between two bumps: what was added stays
            _emit(lambda: bump_counter(root, device, port, name, delta, atomic=not in_place))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@fault.command("pcie-width")
@_ROOT
@click.option("--address", required=True, help="PCI address, e.g. 0000:19:00.0.")
@click.option("--width", required=True, type=int, help="New current_link_width.")
@_IN_PLACE
def pcie_width_cmd(root: Path, address: str, width: int, in_place: bool) -> None:
    """Drop a function's negotiated PCIe link width."""
    _emit(lambda: pcie_width_drop(root, address, width, atomic=not in_place))


@fault.command("counter-reset")
@_ROOT
@_DEVICE
@click.option("--port", type=click.IntRange(min=1), help="One port (default: all ports).")
@_IN_PLACE
def counter_reset_cmd(root: Path, device: str, port: int | None, in_place: bool) -> None:
    """Reset every counter of a device (or one port) to 0, as a driver reload does."""
    _emit(lambda: counter_reset(root, device, port, atomic=not in_place))


@fault.command("acs")
@_ROOT
@click.option("--address", required=True, help="A root or downstream port, e.g. 0000:17:01.0.")
@click.option("--control", required=True, help="New ACS control register, e.g. 0x1d or 0.")
@_IN_PLACE
def acs_cmd(root: Path, address: str, control: str, in_place: bool) -> None:
    """Set a bridge's ACS control register (SV 0x01 TB 0x02 RR 0x04 CR 0x08 UF 0x10 ...)."""
    try:
        value = int(control, 0)
    except ValueError:
        raise LabInputError(f"--control: not a number: {control!r}") from None
    _emit(lambda: set_acs(root, address, value, atomic=not in_place))


@fault.command("device-remove")
@_ROOT
@_DEVICE
def device_remove_cmd(root: Path, device: str) -> None:
    """Unregister an RDMA device: its class entry, ports and char devices disappear."""
    _emit(lambda: device_remove(root, device))


@fault.command("device-add")
@_ROOT
@_DEVICE
def device_add_cmd(root: Path, device: str) -> None:
    """Bring back a device removed with device-remove."""
    _emit(lambda: device_add(root, device))


@lab.command("traffic")
@click.option(
    "--root",
    "roots",
    required=True,
    multiple=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="A tree rendered by `lab render` (repeat for several nodes).",
)
@click.option(
    "--load",
    default=traffic.DEFAULT_LOAD,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="Mean share of each ACTIVE port's rate sent and received (swings ±20%).",
)
@click.option(
    "--interval",
    default=traffic.DEFAULT_INTERVAL_S,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds between two counter updates.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0.0),
    help="Stop after this many seconds (default: until SIGTERM/Ctrl-C).",
)
def traffic_cmd(
    roots: tuple[Path, ...], load: float, interval: float, duration: float | None
) -> None:
    """Move the data and packet counters of every ACTIVE port, in place, so a running
    agent sees traffic (rates, sparklines); error counters are left alone."""
    settings = traffic.TrafficSettings(load=load, interval_s=interval)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _STOP_SIGNALS}
    timer = threading.Timer(duration, stop.set) if duration is not None else None
    try:
        if timer is not None:
            timer.start()
        traffic.drive(roots, settings, stop)
    finally:
        if timer is not None:
            timer.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@lab.command("kubelet")
@click.option(
    "--dir",
    "dirs",
    required=True,
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="A device-plugins directory to serve kubelet.sock in (repeat for several nodes).",
)
@click.option(
    "--dra-registry",
    "dra_registries",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Also play the kubelet's DRA side: watch this plugins_registry directory for DRA "
    "drivers, follow their health streams, write DIR/lab-kubelet-dra.json (repeatable).",
)
def kubelet_cmd(dirs: tuple[Path, ...], dra_registries: tuple[Path, ...]) -> None:
    """Lab kubelets (v1beta1 Registration, dial-back, ListAndWatch) until SIGTERM/Ctrl-C;
    each writes what it sees (capacity, allocatable per resource) to DIR/lab-kubelet.json."""
    from agent.lab import kubeletrun  # grpc: loaded only by this command

    for d in dirs:
        problem = kubeletrun.socket_path_problem(d)
        if problem is not None:
            raise LabInputError(f"--dir {problem}")
    for r in dra_registries:
        # The registration sockets the watcher dials live there (`<driver>-reg.sock`).
        problem = kubeletrun.socket_path_problem(r, f"{DRIVER}-reg.sock")
        if problem is not None:
            raise LabInputError(f"--dra-registry {problem}")
    asyncio.run(_serve_kubelets(dirs, dra_registries))


async def _serve_kubelets(dirs: tuple[Path, ...], dra_registries: tuple[Path, ...] = ()) -> None:
    from agent.lab import kubeletrun

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await kubeletrun.serve(dirs, stop, dra_registries=dra_registries)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _emit(inject: Callable[[], FaultRecord]) -> None:
    try:
        record = inject()
    except FaultError as exc:
        raise LabInputError(str(exc)) from exc
    click.echo(msgspec.json.encode(record).decode())
