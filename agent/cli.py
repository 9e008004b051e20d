"""`nicfleet-agent`: the command line of the per-node agent.

Parses arguments into explicit settings and hands them to the service or the snapshot
collector; turns expected failures (missing sysfs root, bad node name) into one clear
message and exit code 2, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from agent import __version__
from agent.errors import AgentError
from agent.inventory import collect_snapshot
from agent.lab.cli import lab
from agent.service import AgentService, AgentSettings
from agent.sysfs import Sysfs
from proto.codec import to_json
from proto.subjects import InvalidNodeName, validate_node_name

EXIT_USAGE = 2


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    raise SystemExit(EXIT_USAGE)


def _node_name(value: str | None) -> str:
    name = value or socket.gethostname().split(".")[0].lower()
    try:
        return validate_node_name(name)
    except InvalidNodeName as exc:
        _fail(f"--node-name: {exc}")
        raise  # unreachable, keeps mypy aware


def _sysfs(root: Path) -> Sysfs:
    try:
        return Sysfs(root)
    except AgentError as exc:
        _fail(f"--sysfs-root: {exc}")
        raise


def _host_options(command: Callable[..., None]) -> Callable[..., None]:
    """--sysfs-root and --node-name, shared by every command that reads a host."""
    command = click.option(
        "--node-name", help="Node name (DNS-1123). Default: this host's short name."
    )(command)
    return click.option(
        "--sysfs-root",
        type=click.Path(path_type=Path),
        default=Path("/sys"),
        show_default=True,
        help="Root of the sysfs tree to read.",
    )(command)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nicfleet-agent")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """nicfleet per-node agent: reads every RDMA adapter on this host from sysfs,
    publishes what it sees over NATS, and renders lab nodes for tests and demos."""
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@_host_options
@click.option(
    "-o",
    "--output",
    type=click.Choice(["json"]),
    default="json",
    show_default=True,
    help="Output format.",
)
def snapshot(sysfs_root: Path, node_name: str | None, output: str) -> None:
    """Print one node snapshot as JSON: the same data that `run` publishes."""
    node = _node_name(node_name)
    sysfs = _sysfs(sysfs_root)
    snap = collect_snapshot(sysfs, node=node, seq=1, now=time.time(), agent_version=__version__)
    sys.stdout.buffer.write(to_json(snap) + b"\n")


@main.command()
@click.option("--nats-url", required=True, help="NATS server URL, e.g. nats://127.0.0.1:4222.")
@_host_options
@click.option(
    "--counter-interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between counter batches.",
)
@click.option(
    "--state-poll-interval",
    type=click.FloatRange(min=0.01),
    default=0.1,
    show_default=True,
    help="Seconds between port-state polls.",
)
@click.option(
    "--snapshot-interval",
    type=click.FloatRange(min=1.0),
    default=300.0,
    show_default=True,
    help="Seconds between full snapshots (anti-entropy).",
)
def run(
    nats_url: str,
    sysfs_root: Path,
    node_name: str | None,
    counter_interval: float,
    state_poll_interval: float,
    snapshot_interval: float,
) -> None:
    """Publish a snapshot on start, counters every second and port events as they happen."""
    settings = AgentSettings(
        node_name=_node_name(node_name),
        sysfs_root=sysfs_root,
        nats_url=nats_url,
        counter_interval=counter_interval,
        state_poll_interval=state_poll_interval,
        snapshot_interval=snapshot_interval,
    )
    _sysfs(sysfs_root)  # fail fast, before any connection attempt
    if logging.getLogger().level > logging.INFO:
        logging.getLogger().setLevel(logging.INFO)
    asyncio.run(_serve(settings))


async def _serve(settings: AgentSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await AgentService(settings).run(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):
                loop.remove_signal_handler(sig)


main.add_command(lab)
