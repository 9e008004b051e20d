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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import click

from agent import __version__
from agent.deviceplugin.advertised import (
    DEFAULT_CDI_DIR,
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_PLUGINS_REGISTRY_DIR,
    DevicePluginSettings,
)
from agent.deviceplugin.checkconfig import device_plugin
from agent.deviceplugin.configsource import config_sources
from agent.deviceplugin.registration import RegistrationMode
from agent.dra.cli import dra, share_options, slice_settings
from agent.dra.pluginrunner import DraSettings
from agent.errors import AgentError
from agent.host.inventory import collect_snapshot
from agent.host.procfs import Procfs
from agent.host.sysfs import Sysfs
from agent.host.verbs import probe_verbs
from agent.lab.cli import lab
from agent.links.netlink import NetlinkUnavailable, netns_path
from agent.metrics.collector import parse_metrics_addr
from agent.service import AgentService, AgentSettings, with_verbs
from agent.verify.cli import verify
from proto.codec import to_json
from proto.dpconfig import ConfigError, parse_device_plugin_resources
from proto.runtime.cliopts import log_options, output_option
from proto.runtime.logs import LogFormat, configure_logging, tag_node
from proto.runtime.natsconnect import NatsClientSecurity
from proto.runtime.natsflags import nats_security_options
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


def _probe_verbs(mode: str, sysfs_root: Path) -> bool:
    # The probe describes the host the agent runs on; pinning its answer on a lab or
    # captured tree read through --sysfs-root would misreport that tree.
    if mode == "auto":
        return sysfs_root.resolve() == Path("/sys")
    return mode == "on"


def _proc_root(given: Path | None, sysfs_root: Path) -> Path | None:
    # Like the verbs probe: the agent's own /proc describes its own kernel, so it is read
    # by default only with the live /sys, never for a lab or captured tree.
    if given is not None:
        return given
    return Path("/proc") if sysfs_root.resolve() == Path("/sys") else None


def _host_options(command: Callable[..., None]) -> Callable[..., None]:
    """--sysfs-root, --proc-root, --node-name and the verbs probe, shared by every command
    that reads a host."""
    command = click.option(
        "--proc-root",
        type=click.Path(file_okay=False, path_type=Path),
        help="procfs to read the kernel command line and release from (IOMMU mode, "
        "dma-buf). Default: /proc when --sysfs-root is /sys, else not read. In a "
        "container its own /proc shows the host kernel's.",
    )(command)
    command = click.option(
        "--verbs-path",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help="Directory holding the pyverbs package when it is not importable as is "
        "(Debian: /usr/lib/python3/dist-packages). Only pyverbs is loaded from it.",
    )(command)
    command = click.option(
        "--verbs",
        type=click.Choice(["auto", "on", "off"]),
        default="auto",
        show_default=True,
        help="Probe libibverbs (pyverbs) for platform.verbs; auto: only when reading /sys.",
    )(command)
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
@log_options(level_default="warning; info for `run`")
@click.pass_context
def main(ctx: click.Context, verbose: int, log_level: str | None, log_format: LogFormat) -> None:
    """nicfleet per-node agent: reads every RDMA adapter on this host from sysfs,
    publishes what it sees over NATS, and renders lab nodes for tests and demos."""
    level = log_level or ["warning", "info", "debug"][min(verbose, 2)]
    ctx.meta["nicfleet.log_level_set"] = log_level is not None
    configure_logging(level, log_format)


@main.command()
@_host_options
@output_option("json", help="Output format.")
def snapshot(
    sysfs_root: Path,
    proc_root: Path | None,
    node_name: str | None,
    verbs: str,
    verbs_path: Path | None,
    output: str,
) -> None:
    """Print one node snapshot as JSON: the same data that `run` publishes."""
    node = _node_name(node_name)
    sysfs = _sysfs(sysfs_root)
    proc = _proc_root(proc_root, sysfs_root)
    snap = collect_snapshot(
        sysfs,
        node=node,
        seq=1,
        now=time.time(),
        agent_version=__version__,
        procfs=None if proc is None else Procfs(proc),
    )
    if _probe_verbs(verbs, sysfs_root):
        snap = with_verbs(snap, probe_verbs(search_path=verbs_path))
    sys.stdout.buffer.write(to_json(snap) + b"\n")


def _check_metrics_addr(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[str, int] | None:
    if value is None:
        return None
    try:
        return parse_metrics_addr(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from exc


@main.command()
@click.option("--nats-url", required=True, help="NATS server URL, e.g. nats://127.0.0.1:4222.")
@nats_security_options
@_host_options
@click.option(
    "--counter-interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between counter batches.",
)
@click.option(
    "--counter-full-every",
    type=click.IntRange(min=1),
    default=30,
    show_default=True,
    help="Counter batches per full batch; the others carry only what changed since the "
    "last full one (1: every batch full, for aggregators older than counter deltas).",
)
@click.option(
    "--state-poll-interval",
    type=click.FloatRange(min=0.01),
    default=None,
    help="Seconds between port-state polls (sysfs has no change notification). "
    "Default: 0.05 with the device plugin on (a dead port must turn Unhealthy within "
    "100 ms), else 0.1.",
)
@click.option(
    "--inventory-interval",
    "--snapshot-interval",
    "inventory_interval",
    type=click.FloatRange(min=1.0),
    default=300.0,
    show_default=True,
    help="Seconds between full inventory re-reads (each published as a snapshot) when "
    "no event triggered one. --snapshot-interval is the older name.",
)
@click.option(
    "--netns",
    metavar="NAME|PATH",
    help="Watch netdevs in this network namespace (an `ip netns` name, or a path such "
    "as /proc/PID/ns/net) instead of the agent's own. For tests and labs.",
)
@click.option(
    "--no-netlink",
    is_flag=True,
    help="Do not watch netlink; netdev changes are then only seen in periodic snapshots.",
)
@click.option(
    "--device-plugin-config",
    type=click.Path(path_type=Path, dir_okay=False),
    help="k8s-rdma-shared-dev-plugin config (JSON or YAML). Turns the kubelet device "
    "plugin on; later edits of the file are applied live.",
)
@click.option(
    "--device-plugin",
    "device_plugin_enabled",
    is_flag=True,
    help="Run the kubelet device plugin even without --device-plugin-config: its config "
    "then comes from the aggregator (nicfleet.v1.desired.<node>).",
)
@click.option(
    "--desired-config/--no-desired-config",
    default=True,
    show_default=True,
    help="With the device plugin on, follow this node's desired config from the "
    "aggregator (core NATS, no JetStream); once present it wins over --device-plugin-config.",
)
@click.option(
    "--device-plugin-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=DEFAULT_DEVICE_PLUGIN_DIR,
    show_default=True,
    help="The kubelet's device-plugin directory (kubelet.sock, plugin sockets).",
)
@click.option(
    "--plugins-registry-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=DEFAULT_PLUGINS_REGISTRY_DIR,
    show_default=True,
    help="The kubelet plugin watcher's directory.",
)
@click.option(
    "--registration-mode",
    type=click.Choice(["auto", "legacy", "watcher"]),
    default="auto",
    show_default=True,
    help="legacy: Register on kubelet.sock; watcher: a socket in --plugins-registry-dir; "
    "auto: watcher when that directory exists, falling back to legacy.",
)
@click.option("--cdi/--no-cdi", default=False, show_default=True,
              help="Write a CDI spec and answer Allocate with CDI device names.")  # fmt: skip
@click.option(
    "--cdi-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=DEFAULT_CDI_DIR,
    show_default=True,
    help="Where the CDI spec file is written.",
)
@click.option("--no-topology", is_flag=True, help="Do not attach NUMA TopologyInfo to devices.")
@click.option("--dra", is_flag=True, help="Run the DRA kubelet plugin (driver rdma.nicfleet.io; "
              "registers in --plugins-registry-dir, CDI specs in --cdi-dir).")  # fmt: skip
@click.option(
    "--dra-claims-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=DraSettings().claims_dir,
    show_default=True,
    help="With --dra and --dra-claims dir: where allocated ResourceClaims of this node are "
    "read (<uid>.json).",
)
@click.option(
    "--dra-plugins-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=DraSettings().plugins_dir,
    show_default=True,
    help="With --dra: the kubelet's plugins directory (the plugin serves "
    "DIR/rdma.nicfleet.io/dra.sock).",
)
@click.option(
    "--dra-state-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=DraSettings().state_dir,
    show_default=True,
    help="With --dra: where the prepared-claims checkpoint is kept (survives restarts).",
)
@click.option(
    "--dra-claims",
    type=click.Choice(["nats", "dir"]),
    default="nats",
    show_default=True,
    help="With --dra: where claim allocations come from: nats (asked of the aggregator, "
    "which watches ResourceClaims) or dir (--dra-claims-dir).",
)
@share_options("dra-", needs="--dra")  # as `dra slices --share/--consumable/--rail`
@click.option(
    "--metrics-addr",
    metavar="HOST:PORT",
    callback=_check_metrics_addr,
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any free port; "
    "IPv6 as [::1]:9101). Default: off.",
)
def run(**flags: Any) -> None:
    """Publish a snapshot on start, counters every second and link events as they happen."""
    given = RunFlags(**flags)
    _check_run_flags(given)
    settings = agent_settings(
        given,
        node_name=_node_name(given.node_name),
        verbs=_probe_verbs(given.verbs, given.sysfs_root),
    )
    _sysfs(given.sysfs_root)  # fail fast, before any connection attempt
    explicit = click.get_current_context().meta.get("nicfleet.log_level_set", False)
    if logging.getLogger().level > logging.INFO and not explicit:
        logging.getLogger().setLevel(logging.INFO)
    tag_node(settings.node_name)
    asyncio.run(_serve(settings))


@dataclass(frozen=True, kw_only=True)
class RunFlags:
    """The options of `run`, as click parses them (one field per option)."""

    nats_url: str
    nats_security: NatsClientSecurity
    sysfs_root: Path
    node_name: str | None
    verbs: str
    verbs_path: Path | None
    counter_interval: float
    counter_full_every: int
    state_poll_interval: float | None
    inventory_interval: float
    netns: str | None
    no_netlink: bool
    device_plugin_config: Path | None
    device_plugin_enabled: bool
    desired_config: bool
    device_plugin_dir: Path
    plugins_registry_dir: Path
    registration_mode: RegistrationMode
    cdi: bool
    cdi_dir: Path
    no_topology: bool
    metrics_addr: tuple[str, int] | None
    proc_root: Path | None = None
    dra: bool = False
    dra_claims_dir: Path = DraSettings().claims_dir
    dra_claims: Literal["nats", "dir"] = "nats"
    dra_share: int = 1
    dra_consumable: bool = False
    dra_rails: Mapping[str, int] = field(default_factory=dict)
    dra_plugins_dir: Path = DraSettings().plugins_dir
    dra_state_dir: Path = DraSettings().state_dir


def _check_run_flags(flags: RunFlags) -> None:
    """Refuse, with one message and exit 2, what cannot work: checked before settings."""
    if flags.netns is not None:
        if flags.no_netlink:
            _fail("--netns: has no effect together with --no-netlink")
        try:
            netns_path(flags.netns)
        except NetlinkUnavailable as exc:
            _fail(f"--netns: {exc}")
    if flags.device_plugin_config is not None:
        path = flags.device_plugin_config
        try:  # a config that is broken at start is an error; later edits are only logged
            # Invalid entries are served around (and reported) once running, as upstream.
            parse_device_plugin_resources(path.read_bytes(), source=str(path))
        except (OSError, ConfigError) as exc:
            _fail(f"--device-plugin-config: {exc}")
    if not flags.dra:
        for given, option in (
            (flags.dra_share != 1, "--dra-share"),
            (flags.dra_consumable, "--dra-consumable"),
            (bool(flags.dra_rails), "--dra-rail"),
        ):
            if given:
                _fail(f"{option}: needs --dra (it says how the DRA plugin's devices are shared)")


def agent_settings(flags: RunFlags, *, node_name: str, verbs: bool) -> AgentSettings:
    """Pure: the agent's settings from `run`'s options (node name and verbs resolved)."""
    plugin = config_sources(
        config_file=flags.device_plugin_config,
        plugin_enabled=flags.device_plugin_enabled,
        desired_config=flags.desired_config,
    ).plugin
    # With the device plugin on, a dead port must turn Unhealthy within 100 ms.
    plugin = plugin or flags.dra  # the DRA health stream has the same 100 ms aim
    poll = flags.state_poll_interval
    return AgentSettings(
        node_name=node_name,
        sysfs_root=flags.sysfs_root,
        proc_root=_proc_root(flags.proc_root, flags.sysfs_root),
        nats_url=flags.nats_url,
        nats_security=flags.nats_security,
        counter_interval=flags.counter_interval,
        counter_full_every=flags.counter_full_every,
        state_poll_interval=poll if poll is not None else (0.05 if plugin else 0.1),
        inventory_interval=flags.inventory_interval,
        netlink=not flags.no_netlink,
        netns=flags.netns,
        verbs=verbs,
        verbs_path=flags.verbs_path,
        device_plugin_config=flags.device_plugin_config,
        device_plugin_enabled=flags.device_plugin_enabled,
        desired_config=flags.desired_config,
        device_plugin=DevicePluginSettings(
            device_plugin_dir=flags.device_plugin_dir,
            plugins_registry_dir=flags.plugins_registry_dir,
            registration_mode=flags.registration_mode,
            cdi=flags.cdi,
            cdi_dir=flags.cdi_dir,
            topology=not flags.no_topology,
        ),
        metrics_addr=flags.metrics_addr,
        dra=DraSettings(
            plugins_registry_dir=flags.plugins_registry_dir,
            cdi_dir=flags.cdi_dir,
            claims_dir=flags.dra_claims_dir,
            claims_from=flags.dra_claims,
            slices=slice_settings(
                share=flags.dra_share, consumable=flags.dra_consumable, rails=flags.dra_rails
            ),
            plugins_dir=flags.dra_plugins_dir,
            state_dir=flags.dra_state_dir,
        )
        if flags.dra
        else None,
    )


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
main.add_command(verify)
main.add_command(device_plugin)
main.add_command(dra)
