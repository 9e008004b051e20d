"""Tables for nicfleetctl (and the demo): API views in, rich tables out to a given Console.

No HTTP here. `console_for` decides colour from the stream and NO_COLOR; renderers take
typed views or the API's JSON dicts. Data cells are `Text`, never parsed as markup.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import IO, Any, Final, TypeVar, cast

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from proto.http import EventView, GpuDirect, NodeDetail, NodeSummary
from proto.ibta import ACTIVE_STATES
from proto.inventory import Device, Port

T = TypeVar("T", bound=msgspec.Struct)
RECENT_EVENTS: Final = 10
NONE: Final = "-"
_STATE_STYLE: Final = {"ready": "green", "stale": "yellow", "no-snapshot": "red"}
# Wide enough that piped tables are never wrapped or truncated mid-cell.
_PIPE_WIDTH: Final = 4096


# Trailing blanks (and the colour codes among them) before a line end: a rich table pads
# its last column to its width, which `grep 'x$'`, diffs and copy-paste then trip on.
_TRAILING: Final = re.compile(r"(?:[ ]|\x1b\[[0-9;]*m)+(?=\n)")
_SGR: Final = re.compile(r"\x1b\[[0-9;]*m")


def trim_lines(text: str) -> str:
    """`text` without blanks before any line end; colour codes among them are kept."""
    return _TRAILING.sub(lambda m: "".join(_SGR.findall(m.group(0))), text)


class _TrimmedStream:
    """A text stream that passes writes on without trailing blanks on any line. Rich writes
    a whole `print` at once, so a line is never split across two writes."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(trim_lines(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, ...
        return getattr(self._stream, name)


class TerminalBuffer(io.StringIO):
    """Captures what would go to a terminal of `width` columns (`--watch` redraws it)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.terminal_width = width

    def isatty(self) -> bool:
        return True


def console_for(stream: IO[str], environ: Mapping[str, str] | None = None) -> Console:
    """Colour only on a terminal and only when NO_COLOR is unset; plain text otherwise."""
    env = os.environ if environ is None else environ
    tty = stream.isatty()
    return Console(
        file=cast(IO[str], _TrimmedStream(stream)),
        force_terminal=tty,  # explicit, so FORCE_COLOR cannot put escapes into a pipe
        no_color=not tty or bool(env.get("NO_COLOR")),
        width=getattr(stream, "terminal_width", None) if tty else _PIPE_WIDTH,
        highlight=False,
        emoji=False,
    )


def render_nodes(
    console: Console,
    nodes: Iterable[NodeSummary] | Iterable[Mapping[str, Any]],
    *,
    wide: bool = False,
) -> None:
    """The `nodes` table; raw API items are accepted and validated (msgspec)."""
    # LAST-SEEN, not AGE: kubectl's AGE is the time since creation; this is since the
    # agent was last heard (a node's first sighting is in `nicfleetctl node`).
    columns = ["NAME", "STATE", "DEVICES", "PORTS-UP", "GPUS", "LINK", "RATE", "FIRMWARE"]
    columns += ["DOWN-PORTS", "AGENT", "READ-ERRORS", "LAST-SEEN-AT"] if wide else []
    columns.append("LAST-SEEN")
    table = _table(columns)
    for n in (_typed(item, NodeSummary) for item in nodes):
        row: list[str | Text] = [
            n.name,
            _state(n.state),
            str(n.devices),
            f"{n.ports_active}/{n.ports_total}",
            str(n.gpus),
            _join(n.link_layers),
            _rate(n.max_rate_gbps),
            _join(n.firmware),
        ]
        if wide:
            row += [
                _join(n.ports_down),
                n.agent_version or NONE,
                str(n.errors),
                _timestamp(n.last_seen),
            ]
        table.add_row(*row, _age(n.age_s))
    console.print(table)


def render_node(
    console: Console, detail: NodeDetail | Mapping[str, Any], *, wide: bool = False
) -> None:
    """Header, per-device/port table and recent events of one node."""
    view = _typed(detail, NodeDetail)
    s = view.summary
    now = s.last_seen + s.age_s  # the server's clock at answer time
    header = Table.grid(padding=(0, 2))
    header.add_column(style="bold")
    header.add_column()
    header.add_row("Node:", Text(s.name))
    header.add_row("State:", Text.assemble(_state(s.state), f" (last seen {_age(s.age_s)} ago)"))
    header.add_row(
        "First seen:",
        Text(f"{_timestamp(view.first_seen)} ({_age(now - view.first_seen)} ago)"),
    )
    snap = view.snapshot
    if snap is not None:
        header.add_row(
            "Agent:",
            Text(
                f"{snap.agent_version}, snapshot seq {snap.seq} "
                f"collected {_timestamp(snap.collected_at)}"
            ),
        )
    header.add_row(
        "Summary:",
        Text(
            f"{s.devices} RDMA devices, {s.ports_active}/{s.ports_total} ports up, "
            f"{s.gpus} GPUs, firmware {_join(s.firmware)}"
        ),
    )
    header.add_row("Down ports:", Text(_join(s.ports_down)))
    if view.gpudirect is not None:
        header.add_row("GPUDirect:", _gpudirect_text(view.gpudirect, gpus=s.gpus))
        header.add_row("IOMMU:", Text(f"{view.gpudirect.iommu} ({view.gpudirect.iommu_reason})"))
    if s.errors:
        header.add_row("Read errors:", Text(str(s.errors)))
    console.print(header)
    if snap is not None:
        console.print()
        console.print(_ports_table(snap.devices, wide=wide))
        if wide and snap.gpus:
            console.print()
            gpus = _table(["GPU-PCI", "NUMA", "DEVICE-ID"])
            for gpu in snap.gpus:
                gpus.add_row(gpu.pci_address, _opt(gpu.numa_node), gpu.device_id or NONE)
            console.print(gpus)
    plugin = view.device_plugin
    # An agent running only the DRA plugin reports no resources: no device-plugin lines.
    if plugin is not None and (plugin.resources or plugin.dra is None):
        console.print()
        registered = "registered" if plugin.registered else "NOT registered"
        console.print(
            Text(f"Device plugin (config generation {plugin.config_generation}, {registered}):")
        )
        resources = _table(["RESOURCE", "ADVERTISED", "HEALTHY", "DEVICES"])
        for res in plugin.resources:
            resources.add_row(res.name, str(res.advertised), str(res.healthy), _join(res.devices))
        console.print(resources)
    if plugin is not None and plugin.dra is not None:
        dra = plugin.dra
        console.print()
        console.print(
            Text(
                f"DRA plugin: {dra.state}, {len(dra.prepared)} claims prepared, "
                f"{len(dra.failed)} failed"
            )
        )
    events = view.events if wide else view.events[-RECENT_EVENTS:]
    console.print()
    if not events:
        console.print(Text("Events: none"))
        return
    console.print(Text(f"Events (last {len(events)} of {len(view.events)}, oldest first):"))
    console.print(_events_table(events, now))


def _gpudirect_text(gd: GpuDirect, *, gpus: int) -> Text:
    """`dma-buf, peermem (dma-buf: ...; peermem: ...)`: the paths, then why."""
    shown = ", ".join(gd.paths) if gd.paths else gd.path
    style = "red" if gd.path == "none" and gpus else "yellow" if gd.path == "unknown" else ""
    return Text.assemble((shown, style), f" ({gd.path_reason.rstrip('.')})")


def _ports_table(devices: Iterable[Device], *, wide: bool) -> Table:
    columns = ["DEVICE", "PCI", "NUMA", "PORT", "STATE", "PHYS", "RATE", "LINK", "NETDEV", "FW"]
    table = _table([*columns, "PCIE"] if wide else columns)
    for device in devices:
        ident = [device.name, device.pci_address or NONE, _opt(device.numa_node)]
        tail = [device.fw_ver or NONE]
        if wide:
            tail.append(_pcie(device))
        if not device.ports:
            table.add_row(*ident, NONE, NONE, NONE, NONE, NONE, NONE, *tail)
        for port in device.ports:
            table.add_row(
                *ident,
                str(port.port),
                _port_state(port),
                port.phys_state or NONE,
                _rate(port.rate_gbps),
                port.link_layer,
                _join(_netdevs(device, port)),
                *tail,
            )
    return table


def _events_table(events: Iterable[EventView], now: float) -> Table:
    table = _table(["AGE", "KIND", "DEVICE", "PORT", "NETDEV", "CHANGE", "PHYS", "LATENCY"])
    for e in events:
        change = f"{e.old_state or '?'} -> {e.new_state}" if e.new_state else NONE
        table.add_row(
            _age(now - e.observed_at),
            e.kind,
            e.device or NONE,
            _opt(e.port),
            e.netdev or NONE,
            change,
            e.phys_state or NONE,
            f"{e.latency_ms:.0f}ms",
        )
    return table


def _table(columns: Iterable[str]) -> Table:
    return plain_table(columns)


def plain_table(columns: Iterable[str], *, wrap: Iterable[str] = ()) -> Table:
    """A borderless table whose string cells are literal text; only the `wrap` columns
    may wrap (on a narrow terminal), the others never break a name."""
    wrapping = set(wrap)
    table = _PlainTable(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=column not in wrapping)
    return table


class _PlainTable(Table):
    """A Table whose string cells are literal text: agent-supplied strings stay unparsed."""

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        super().add_row(*(Text(c) if isinstance(c, str) else c for c in cells), **kwargs)


def _typed(value: T | Mapping[str, Any], type_: type[T]) -> T:
    return value if isinstance(value, type_) else msgspec.convert(value, type_)


def _netdevs(device: Device, port: Port) -> tuple[str, ...]:
    matched = tuple(i.name for i in device.interfaces if i.port == port.port)
    if matched or len(device.ports) > 1:
        return matched
    return device.netdevs  # one port: every netdev of the function belongs to it


def _pcie(device: Device) -> str:
    link = device.pcie
    if link is None or link.current_speed_gts is None:
        return NONE
    text = f"{link.current_speed_gts:g}GT/s x{_opt(link.current_width)}"
    if link.max_speed_gts is not None:
        text += f" (max {link.max_speed_gts:g}GT/s x{_opt(link.max_width)})"
    if link.degraded:
        text += " DEGRADED"
    return text


def _state(state: str) -> Text:
    return Text(state, style=_STATE_STYLE.get(state, ""))


def _port_state(port: Port) -> Text:
    return Text(port.state, style="" if port.state in ACTIVE_STATES else "red")


def _rate(gbps: float | None) -> str:
    return NONE if gbps is None else f"{gbps:g}G"


def _join(values: Iterable[str]) -> str:
    return ",".join(values) or NONE


def _opt(value: int | None) -> str:
    return NONE if value is None else str(value)


def _timestamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age(seconds: float) -> str:
    """kubectl-style age: 45s, 12m, 5h, 3d."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 2 * 3600:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


FINDING_COLUMNS: Final = ("SEVERITY", "RULE", "NODE", "SUBJECT", "MESSAGE")
SEVERITY_STYLE: Final = {"critical": "red", "warning": "yellow", "info": "blue"}
FLEET_NODE: Final = "_fleet"  # the node column of fleet-wide findings (the API's filter)


def render_findings(
    console: Console, findings: Iterable[Mapping[str, Any]], *, wide: bool = False
) -> None:
    """The findings table of `findings` (live) and `check` (offline): the same columns in
    the same order; `wide` adds the evidence. Items are the API's (or `to_builtins`) dicts."""
    columns = [*FINDING_COLUMNS, "EVIDENCE"] if wide else list(FINDING_COLUMNS)
    table = plain_table(columns, wrap=("MESSAGE", "EVIDENCE"))
    for f in findings:
        severity = text_of(f.get("severity"))
        row: list[str | Text] = [
            Text(severity, style=SEVERITY_STYLE.get(severity, "")),
            text_of(f.get("rule")),
            text_of(f.get("node"), FLEET_NODE),
            text_of(f.get("subject")),
            text_of(f.get("message")),
        ]
        if wide:
            row.append(evidence_text(f.get("evidence")))
        table.add_row(*row)
    console.print(table)


def text_of(value: object, missing: str = NONE) -> str:
    """A cell from an API value: `missing` for null or absent, never the text "None"."""
    return missing if value is None or value == "" else str(value)


def evidence_text(value: object) -> str:
    """`key=value` pairs, sorted; JSON spellings (null, true) for non-strings."""
    if not isinstance(value, Mapping) or not value:
        return NONE
    return " ".join(f"{k}={_json_scalar(v)}" for k, v in sorted(value.items()))


def _json_scalar(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
