"""`nicfleet-agent dra`: the DRA driver's offline commands. `slices` prints the
ResourceSlices a node would publish (proto.draslices over a fresh snapshot of the sysfs
tree given), the same objects the driver publishes, for people and tests.

Only argument handling and output here; the objects come from the pure builder.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
import msgspec

from agent import __version__
from agent.errors import AgentError
from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from proto import draslices
from proto.runtime.cliopts import output_option
from proto.subjects import InvalidNodeName, validate_node_name


@click.group()
def dra() -> None:
    """DRA driver (rdma.nicfleet.io): what the node publishes to resource.k8s.io/v1."""


def _rails(values: tuple[str, ...]) -> dict[str, int]:
    rails: dict[str, int] = {}
    for value in values:
        device, sep, rail = value.partition("=")
        if not sep or not device or not rail.isdigit():
            raise click.BadParameter(f"{value!r}: expected RDMA_DEVICE=RAIL", param_hint="--rail")
        rails[device] = int(rail)
    return rails


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
@click.option(
    "--share",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Allocations one RDMA device may serve at once (the shared device plugin's "
    "rdmaHcaMax). Above 1, without --consumable: N devices <name>-s<i> per RDMA device.",
)
@click.option(
    "--consumable",
    is_flag=True,
    help="Publish --share as consumable capacity `shares` of one device with "
    "allowMultipleAllocations (feature gate DRAConsumableCapacity: alpha in Kubernetes "
    "1.34, beta and default-on since 1.36) instead of N devices.",
)
@click.option("--rail", "rails", multiple=True, help="RDMA_DEVICE=RAIL (repeatable).")
def slices(
    sysfs_root: Path,
    node_name: str,
    output: str,
    share: int,
    consumable: bool,
    rails: tuple[str, ...],
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
    sharing: draslices.Sharing = (
        "consumable" if consumable else "copies" if share > 1 else "exclusive"
    )
    settings = draslices.SliceSettings(sharing=sharing, share=share, rails=_rails(rails))
    snapshot = collect_snapshot(sysfs, node=node, seq=1, now=time.time(), agent_version=__version__)
    objects = draslices.build_slices(snapshot, {}, settings)
    if output == "yaml":
        sys.stdout.buffer.write(b"---\n".join(msgspec.yaml.encode(o) for o in objects))
    else:
        listing = {"apiVersion": "v1", "kind": "List", "items": objects}
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
