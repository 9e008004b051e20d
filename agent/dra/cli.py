"""`nicfleet-agent dra`: the DRA driver's offline commands. `slices` prints the
ResourceSlices a node would publish (proto.draslices over a fresh snapshot of the sysfs
tree given), the same objects the driver publishes, for people and tests.

Only argument handling and output here; the objects come from the pure builder. The
sharing options' parsing (`parse_rails` as a click callback, `slice_settings`) is shared
with `nicfleet-agent run --dra-share/--dra-consumable/--dra-rail`: one definition.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from agent import __version__
from agent.errors import AgentError
from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from proto import draslices
from proto.runtime.cliopts import output_option
from proto.subjects import InvalidNodeName, validate_node_name

FC = TypeVar("FC", bound=Callable[..., Any])


@click.group()
def dra() -> None:
    """DRA driver (rdma.nicfleet.io): what the node publishes to resource.k8s.io/v1."""


def parse_rails(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, int]:
    """Click callback of a repeatable RDMA_DEVICE=RAIL option: the rails by RDMA device
    (click names the option in the error)."""
    rails: dict[str, int] = {}
    for value in values:
        device, sep, rail = value.partition("=")
        if not sep or not device or not rail.isdigit():
            raise click.BadParameter(f"{value!r}: expected RDMA_DEVICE=RAIL", ctx, param)
        rails[device] = int(rail)
    return rails


def slice_settings(
    *, share: int, consumable: bool, rails: Mapping[str, int]
) -> draslices.SliceSettings:
    """Pure: `--share N` (`--dra-share`) above 1 publishes N copies per device, or with
    `--consumable` one device of N shares; 1 without --consumable: exclusive."""
    sharing: draslices.Sharing = (
        "consumable" if consumable else "copies" if share > 1 else "exclusive"
    )
    return draslices.SliceSettings(sharing=sharing, share=share, rails=dict(rails))


SHARE_HELP = (
    "Allocations one RDMA device may serve at once (the shared device plugin's "
    "rdmaHcaMax). Above 1, without {consumable}: N devices <name>-s<i> per RDMA device."
)
CONSUMABLE_HELP = (
    "Publish {share} as consumable capacity `shares` of one device with "
    "allowMultipleAllocations (feature gate DRAConsumableCapacity: alpha in Kubernetes "
    "1.34, beta and default-on since 1.36) instead of N devices."
)


def share_options(prefix: str, *, needs: str | None = None) -> Callable[[FC], FC]:
    """The three sharing options `--<prefix>share`, `--<prefix>consumable`, `--<prefix>rail`
    (parameters `<prefix>share`, `<prefix>consumable`, `<prefix>rails`, '-' as '_'), for
    `slices` (no prefix) and `run` (`dra-`, needing `--dra`)."""
    share, consumable = f"--{prefix}share", f"--{prefix}consumable"
    first = f"With {needs}: " if needs else ""
    param = prefix.replace("-", "_")
    options = (
        click.option(
            share,
            f"{param}share",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help=first + SHARE_HELP.format(consumable=consumable),
        ),
        click.option(
            consumable,
            f"{param}consumable",
            is_flag=True,
            help=first + CONSUMABLE_HELP.format(share=share),
        ),
        click.option(
            f"--{prefix}rail",
            f"{param}rails",
            multiple=True,
            callback=parse_rails,
            help=first + "RDMA_DEVICE=RAIL (repeatable).",
        ),
    )

    def decorate(command: FC) -> FC:
        for option in reversed(options):  # listed in --help in this order
            command = option(command)
        return command

    return decorate


@dra.command()
@click.option(
    "--sysfs-root",
    type=click.Path(path_type=Path),
    default=Path("/sys"),
    show_default=True,
    help="Root of the sysfs tree to read.",
)
@click.option("--node-name", required=True, help="Node name (DNS-1123): the pool and nodeName.")
@output_option("json", "yaml", help="Output format (json: a v1 List).")
@share_options("")
def slices(
    sysfs_root: Path,
    node_name: str,
    output: str,
    share: int,
    consumable: bool,
    rails: dict[str, int],
) -> None:
    """Print the ResourceSlices this node would publish."""
    try:
        node = validate_node_name(node_name)
    except InvalidNodeName as exc:
        raise click.BadParameter(str(exc), param_hint="--node-name") from exc
    try:
        sysfs = Sysfs(sysfs_root)
    except AgentError as exc:
        raise click.BadParameter(str(exc), param_hint="--sysfs-root") from exc
    settings = slice_settings(share=share, consumable=consumable, rails=rails)
    snapshot = collect_snapshot(sysfs, node=node, seq=1, now=time.time(), agent_version=__version__)
    objects = draslices.build_slices(snapshot, {}, settings)
    if output == "yaml":
        sys.stdout.buffer.write(b"---\n".join(msgspec.yaml.encode(o) for o in objects))
    else:
        listing = {"apiVersion": "v1", "kind": "List", "items": objects}
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
