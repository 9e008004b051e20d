"""The `lab` click group: render specs into sysfs trees, list built-ins, inject faults.

Owns argument parsing and output only (text for people, one JSON line for scripts); the
work is in spec, render and faults. Bad input (unknown spec, malformed YAML, missing
device, non-empty output dir) ends with `error: ...` on stderr and exit code 2.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import click
import msgspec

from agent.lab.faults import FaultError, FaultRecord, bump_counter, pcie_width_drop
from agent.lab.faults import port_down as inject_port_down
from agent.lab.faults import port_up as inject_port_up
from agent.lab.render import RenderError, render
from agent.lab.spec import SpecError, builtin_specs, load_builtin, load_spec, with_node_name

_OUTPUT = click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)
_ROOT = click.option(
    "--root",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="A tree rendered by `lab render`.",
)
_DEVICE = click.option("--device", required=True, help="RDMA device, e.g. mlx5_0.")
_PORT = click.option("--port", default=1, show_default=True, type=click.IntRange(min=1))
_IN_PLACE = click.option(
    "--in-place",
    is_flag=True,
    help="Rewrite files in place instead of replacing them (for readers that cache fds).",
)


class BadInput(click.ClickException):
    """Printed as `error: ...` with exit code 2, the code click uses for usage errors."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


@click.group("lab")
def lab() -> None:
    """Simulated RDMA nodes: render sysfs trees from node specs and inject faults."""


@lab.command("render")
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--builtin", "builtin_name", help="A built-in spec (see `lab list`).")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--node-name", help="Render under this node name (hardware ids unchanged).")
@click.option("--overwrite", is_flag=True, help="Replace a tree previously rendered there.")
@_OUTPUT
def render_cmd(
    spec_file: Path | None,
    builtin_name: str | None,
    out: Path,
    node_name: str | None,
    overwrite: bool,
    output: str,
) -> None:
    """Render a node spec (--spec FILE or --builtin NAME) as a sysfs tree in --out."""
    if (spec_file is None) == (builtin_name is None):
        raise BadInput("give exactly one of --spec FILE or --builtin NAME")
    try:
        spec = load_spec(spec_file) if spec_file else load_builtin(str(builtin_name))
        if node_name is not None:
            spec = with_node_name(spec, node_name)
        render(spec, out, overwrite=overwrite)
    except (SpecError, RenderError) as exc:
        raise BadInput(str(exc)) from exc
    netdevs = sum(p.netdev is not None for a in spec.adapters for p in a.ports)
    summary = {
        "node": spec.name,
        "root": str(out),
        "gpus": len(spec.gpus),
        "adapters": len(spec.adapters),
        "netdevs": netdevs,
    }
    if output == "json":
        click.echo(json.dumps(summary))
    else:
        click.echo(
            f"rendered {spec.name} into {out}: {len(spec.gpus)} GPUs, "
            f"{len(spec.adapters)} RDMA devices, {netdevs} netdevs"
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
@_IN_PLACE
def counter_cmd(root: Path, device: str, port: int, name: str, delta: int, in_place: bool) -> None:
    """Increase a port counter (PMA counters saturate, hw_counters wrap at 32 bits)."""
    _emit(lambda: bump_counter(root, device, port, name, delta, atomic=not in_place))


@fault.command("pcie-width")
@_ROOT
@click.option("--address", required=True, help="PCI address, e.g. 0000:19:00.0.")
@click.option("--width", required=True, type=int, help="New current_link_width.")
@_IN_PLACE
def pcie_width_cmd(root: Path, address: str, width: int, in_place: bool) -> None:
    """Drop a function's negotiated PCIe link width."""
    _emit(lambda: pcie_width_drop(root, address, width, atomic=not in_place))


def _emit(inject: Callable[[], FaultRecord]) -> None:
    try:
        record = inject()
    except FaultError as exc:
        raise BadInput(str(exc)) from exc
    click.echo(msgspec.json.encode(record).decode())
