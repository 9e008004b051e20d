"""`nicfleet-agent device-plugin check-config FILE`: is a device-plugin config valid for
nicfleet, resource by resource, which adapters each resource selects on this host (or a
snapshot), and what the upstream k8s-rdma-shared-dev-plugin would do with the same file.

Owns the command's I/O (the file, the snapshot or this host's sysfs) and exit codes; the
decisions are proto.dpconfig's (the resource-by-resource check the running agent applies),
agent.deviceplugin.selectors' and proto.rsdpupstream's.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Final

import click
import msgspec

from agent import __version__
from agent.deviceplugin.selectors import select_devices
from agent.errors import AgentError
from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from proto import rsdpupstream as upstream
from proto.codec import CodecError, from_json
from proto.dpconfig import ConfigError, InvalidResource, parse_device_plugin_resources
from proto.dpconfigdecode import Invalid, decode
from proto.inventory import NodeSnapshot
from proto.messages.config import ResourceConfig
from proto.nicclusterpolicy import nicfleet_entries
from proto.runtime.cliopts import output_option

MAX_FILE: Final = 4 * 1024 * 1024
EPILOG: Final = """\b
Exit codes:
  0  every resource is valid for nicfleet and selects at least one adapter
  1  a resource is invalid, or selects no adapter here
  2  usage error or bad input (unreadable file, not JSON/YAML, bad snapshot)"""


class ConfigCheckInputError(AgentError, click.ClickException):
    """Unreadable or undecodable input: `error: ...` and exit 2, like the agent's usage errors."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class ResourceCheck(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    resource: str  # <prefix>/<name> as written ("?" when the entry has no name)
    served: bool = False  # the agent would serve it (False: invalid, or the config refused)
    errors: tuple[str, ...] = ()  # why the agent leaves it out: "path (resource 'x'): reason"
    selected: tuple[str, ...] = ()  # RDMA devices nicfleet serves it with
    unmatched: tuple[str, ...] = ()  # "mlx5_1: reason"
    upstream_advertised: int | None = None  # None: upstream would not start
    upstream_selected: tuple[str, ...] = ()  # PCI addresses


class CheckReport(msgspec.Struct, frozen=True, kw_only=True):
    file: str
    node: str
    errors: tuple[str, ...] = ()  # why the agent refuses the whole document (serves nothing)
    resources: tuple[ResourceCheck, ...] = ()
    upstream_start_failure: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors and all(not r.errors and r.selected for r in self.resources)


@click.group("device-plugin")
def device_plugin() -> None:
    """The kubelet device plugin's configuration."""


@device_plugin.command("check-config", epilog=EPILOG)
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--snapshot",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A snapshot JSON file (`nicfleet-agent snapshot`). Default: this host's sysfs.",
)
@click.option(
    "--sysfs-root",
    type=click.Path(path_type=Path),
    default=Path("/sys"),
    show_default=True,
    help="Root of the sysfs tree to read when no --snapshot is given.",
)
@output_option("text", "json", help="Output format.")
def check_config(file: Path, snapshot: Path | None, sysfs_root: Path, output: str) -> None:
    """Validate FILE (the device plugin's JSON/YAML config, upstream's format) resource by
    resource, list the adapters each resource selects, and predict the upstream plugin."""
    data = _read(file, "FILE")
    snap = _snapshot(snapshot, sysfs_root)
    report = check(data, snap, source=str(file))
    if output == "json":
        click.echo(json.dumps(msgspec.to_builtins(report), indent=2, sort_keys=True))
    else:
        click.echo(render_text(report), nl=False)
    raise SystemExit(0 if report.ok else 1)


def check(data: bytes, snap: NodeSnapshot, *, source: str) -> CheckReport:
    """The report for one config document against one node (pure). Validity is the agent's
    own resource-by-resource check (proto.dpconfig), so "selects N" is what it would serve."""
    try:
        document = decode(data)
    except Invalid as exc:
        raise ConfigCheckInputError(f"{source}: {exc.path}: {exc.reason}") from None
    entries = document.get("configList") if isinstance(document, dict) else None
    items = list(entries) if isinstance(entries, list) else []
    try:
        checked = parse_device_plugin_resources(data, source=source)
        whole: tuple[str, ...] = ()
        served = nicfleet_entries(checked)
    except ConfigError as exc:  # the agent refuses such a file whole and serves nothing
        entry = "" if exc.resource_name is None else f" (resourceName {exc.resource_name!r})"
        whole, served = (f"{exc.path}{entry}: {exc.reason}",), []
    predicted = upstream.read_config(data)
    failure = None
    if isinstance(predicted, upstream.StartFailure):
        failure = f"{predicted.path or '$'}: {predicted.reason}"
    resources = [
        _check_entry(i, entry, served[i] if i < len(served) else None, snap, predicted)
        for i, entry in enumerate(items)
    ]
    return CheckReport(
        file=source,
        node=snap.node,
        errors=whole,
        resources=tuple(resources),
        upstream_start_failure=failure,
    )


def _check_entry(
    i: int,
    entry: object,
    served: ResourceConfig | InvalidResource | None,
    snap: NodeSnapshot,
    predicted: upstream.Config | upstream.StartFailure,
) -> ResourceCheck:
    fields = entry if isinstance(entry, Mapping) else {}
    name = f"{fields.get('resourcePrefix') or 'rdma'}/{fields.get('resourceName') or '?'}"
    errors = (served.message,) if isinstance(served, InvalidResource) else ()
    selected: tuple[str, ...] = ()
    unmatched: tuple[str, ...] = ()
    if isinstance(served, ResourceConfig):
        selection = select_devices(snap, served)
        selected = tuple(d.name for d in selection.selected)
        unmatched = tuple(
            f"{e.device}: {e.reason}" for e in (*selection.excluded, *selection.unmatched)
        )
    up_count: int | None = None
    up_selected: tuple[str, ...] = ()
    if isinstance(predicted, upstream.Config) and i < len(predicted.resources):
        prediction = upstream.predict(predicted.resources[i], upstream.adapters(snap))
        up_count, up_selected = prediction.advertised, prediction.selected
    return ResourceCheck(
        index=i,
        resource=name,
        served=isinstance(served, ResourceConfig),
        errors=errors,
        selected=selected,
        unmatched=unmatched,
        upstream_advertised=up_count,
        upstream_selected=up_selected,
    )


def render_text(report: CheckReport) -> str:
    lines = [f"{report.file} on {report.node}"]
    lines.extend(f"  error: {e}" for e in report.errors)
    for r in report.resources:
        state = (
            "invalid"
            if r.errors
            else f"selects {len(r.selected)}"
            if r.served
            else "not served (the config is refused whole)"
        )
        lines.append(f"  configList[{r.index}] {r.resource}: {state}")
        lines.extend(f"    error: {e}" for e in r.errors)
        if r.selected:
            lines.append(f"    adapters: {', '.join(r.selected)}")
        lines.extend(f"    not selected: {u}" for u in r.unmatched if not r.selected)
        if r.upstream_advertised is not None:
            n = len(r.upstream_selected)
            plural = "" if n == 1 else "s"
            lines.append(f"    upstream advertises {r.upstream_advertised} ({n} adapter{plural})")
    if report.upstream_start_failure:
        lines.append(f"  upstream would not start: {report.upstream_start_failure}")
    return "\n".join(lines) + "\n"


def _read(path: Path, what: str) -> bytes:
    try:
        if path.stat().st_size > MAX_FILE:
            raise ConfigCheckInputError(f"{what} {path}: larger than {MAX_FILE} bytes")
        return path.read_bytes()
    except OSError as exc:
        raise ConfigCheckInputError(f"{what} {path}: {exc.strerror or exc}") from exc


def _snapshot(path: Path | None, sysfs_root: Path) -> NodeSnapshot:
    if path is not None:
        try:
            return from_json(_read(path, "--snapshot"), NodeSnapshot)
        except CodecError as exc:
            raise ConfigCheckInputError(f"--snapshot {path}: {exc.path}: {exc.reason}") from exc
    try:
        sysfs = Sysfs(sysfs_root)
    except AgentError as exc:
        raise ConfigCheckInputError(f"--sysfs-root: {exc}") from exc
    node = socket.gethostname().split(".")[0].lower() or "localhost"
    return collect_snapshot(sysfs, node=node, seq=1, now=time.time(), agent_version=__version__)
