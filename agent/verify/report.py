"""The readable report of `verify`: the verdict, every reason, the evidence and the pair
test. Text only (rich markup for the verdict and failures; evidence is printed verbatim).
"""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.markup import escape

from proto.messages.validation import PairTestResult, ValidationResult


def console() -> Console:
    """Colour only on a terminal (and without NO_COLOR); never wrap piped output."""
    tty = sys.stdout.isatty()
    return Console(
        force_terminal=tty,
        no_color=not tty or bool(os.environ.get("NO_COLOR")),
        width=None if tty else 4096,
        highlight=False,
        emoji=False,
    )


def render(result: ValidationResult, out: Console) -> None:
    style = {"rdma-path": "bold green", "broken": "bold red"}.get(result.verdict, "bold yellow")
    out.print(f"verdict: [{style}]{result.verdict}[/]")
    for reason in result.reasons:
        text = escape(f"{reason.message} (missing: {reason.missing})")
        out.print(f"  - [red]{reason.code}[/]: {text}")
    ev = result.evidence
    out.out("char devices:")
    for char in ev.char_devices:
        state = "openable" if char.openable else f"NOT openable ({char.error})"
        out.out(f"  {char.path}: {state}")
    if not ev.char_devices:
        out.out("  none under /dev/infiniband")
    out.out("RDMA devices:")
    for device in ev.devices:
        for p in device.ports:
            rate = f"{p.rate_gbps:g} Gb/s" if p.rate_gbps is not None else "rate ?"
            out.out(f"  {device.name}/{p.port}: {p.state} ({p.phys_state}), {p.link_layer}, {rate}")
    if not ev.devices:
        out.out("  none in /sys/class/infiniband")
    out.out("pod interfaces:")
    for interface in ev.interfaces:
        addresses = ", ".join(interface.addresses) or "no address"
        out.out(f"  {interface.name} ({interface.operstate}): {addresses}")
    for m in ev.gid_matches:
        if m.interface:
            out.out(f"RoCE GID {m.device}/{m.port}[{m.index}] {m.type} = {m.ip} on {m.interface}")
    for r in ev.rdma_interfaces:
        out.out(f"RDMA interface {r.interface}: {r.device} (by {', '.join(r.sources)})")
    for a in ev.attachments:
        info = a.pci_address or a.rdma_device
        on = f" on {info}{f' ({a.rdma_device})' if a.rdma_device and a.pci_address else ''}"
        out.out(f"network-status {a.name}: {a.interface or '-'}"
                f"{' (default)' if a.default else ''}{on if info else ''}")  # fmt: skip
    inj = ev.injected
    if inj.matches is not None:
        devices = ",".join(inj.rdma_devices or ()) or "-"
        pci = ",".join(inj.pci_addresses or ()) or "-"
        netdevs = ",".join(inj.netdevs or ()) or "-"
        state = "match" if inj.matches else "DO NOT match"
        out.out(f"injected: devices={devices} pci={pci} {state} (host netdevs {netdevs})")
    for e in inj.sriov:
        kind = {True: "RDMA", False: "no RDMA", None: "RDMA unknown"}[e.rdma]
        rdma = f" {','.join(e.rdma_devices)}" if e.rdma_devices else ""
        out.out(
            f"SR-IOV device plugin: {e.variable}={','.join(e.device_ids) or '-'} ({kind}{rdma})"
        )
    out.out(f"verbs: {ev.verbs.detail}")
    if result.pair_test is not None:
        _render_pair(result.pair_test, out)


def _render_pair(pair: PairTestResult, out: Console) -> None:
    if pair.error is not None:
        out.print(f"pair test ({pair.method}): [red]failed[/]: {escape(pair.error)}")
        return
    rate = pair.bytes_per_second or 0.0
    out.out(
        f"pair test ({pair.method}) with {pair.peer}: {rate * 8 / 1e9:.2f} Gb/s ({rate:.0f} B/s)"
    )
    if pair.latency is not None:
        lat = pair.latency
        out.out(
            f"  latency p50 {lat.p50_us:.2f} µs, p99 {lat.p99_us:.2f} µs ({lat.samples} samples)"
        )
    out.out(f"  {pair.local_device} {pair.local_gid} -> {pair.remote_device} {pair.remote_gid}")
