"""`nicfleet-agent verify`: in-pod evidence of an RDMA path, and the pair test.

Collects evidence (agent.evidence), judges it (agent.verdict), optionally runs the pair
test (agent.pairtest), prints text or JSON and, in a validation pod, publishes the result.
Exit 0 only for rdma-path (and a pair test, when asked, that produced numbers).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from agent import handshake, pairtest
from agent.errors import AgentError
from agent.evidence import EvidenceSettings, collect_evidence
from agent.netlink import NetlinkUnavailable, netns_path
from agent.rdmatest import PyverbsQueuePair, RdmaTestError
from agent.validationpublish import PublishFailed, publish_result
from agent.verbs import load_pyverbs
from agent.verdict import choose_port, judge
from proto.codec import to_json
from proto.messages import Evidence, PairTestResult, Reason, ValidationResult, ValidationRole
from proto.natsconnect import NatsClientSecurity
from proto.natsflags import nats_security_options
from proto.subjects import InvalidValidationId, validate_validation_id

EXIT_RDMA_PATH = 0
EXIT_BROKEN = 1
EXIT_USAGE = 2
EXIT_ORDINARY = 3
EXIT_PAIR_FAILED = 4
ENV_VALIDATION_ID = "NICFLEET_VALIDATION_ID"


@dataclass(frozen=True, kw_only=True)
class VerifySettings:
    evidence: EvidenceSettings
    role: ValidationRole | None = None
    peer: tuple[str, int] | None = None
    listen: tuple[str, int] = ("0.0.0.0", pairtest.DEFAULT_PORT)
    method: str = "auto"  # auto | pyverbs | perftest
    pair: pairtest.PairSettings = field(default_factory=pairtest.PairSettings)
    validation_id: str | None = None
    nats_url: str | None = None
    nats_security: NatsClientSecurity | None = None


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    raise SystemExit(EXIT_USAGE)


@click.command()
@click.option(
    "-o",
    "--output",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: readable report; json: the ValidationResult.",
)
@click.option(
    "--sysfs-root",
    type=click.Path(path_type=Path),
    default=Path("/sys"),
    show_default=True,
    help="Root of the sysfs tree to read.",
)
@click.option(
    "--dev-root",
    type=click.Path(path_type=Path),
    default=Path("/dev"),
    show_default=True,
    help="Where /dev/infiniband is looked for.",
)
@click.option(
    "--netns",
    metavar="NAME|PATH",
    help="Read interfaces of this network namespace instead of the pod's own.",
)
@click.option(
    "--verbs",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    show_default=True,
    help="Open device contexts with pyverbs; auto: only on /sys.",
)
@click.option(
    "--verbs-path",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Directory holding the pyverbs package (Debian: /usr/lib/python3/dist-packages).",
)
@click.option("--serve", is_flag=True, help="Pair test: wait for one --peer and serve it.")
@click.option("--peer", metavar="HOST[:PORT]", help="Pair test: run against a --serve side.")
@click.option(
    "--listen",
    "listen_host",
    default="0.0.0.0",
    show_default=True,
    help="Address --serve listens on.",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=pairtest.DEFAULT_PORT,
    show_default=True,
    help="Handshake port (--serve; --peer's default).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds any single wait of the pair test may take.",
)
@click.option(
    "--method",
    type=click.Choice(["auto", "pyverbs", "perftest"]),
    default="auto",
    show_default=True,
    help="auto: perftest when ib_write_bw and ib_send_lat are "
    "on PATH, else pyverbs. Both sides must use the same.",
)
@click.option(
    "--size",
    type=click.IntRange(1, 1 << 30),
    default=65536,
    show_default=True,
    help="Bytes per RDMA write.",
)
@click.option(
    "--iterations",
    type=click.IntRange(1, 10_000_000),
    default=5000,
    show_default=True,
    help="RDMA writes for the bandwidth test.",
)
@click.option(
    "--latency-iterations",
    type=click.IntRange(1, 5000),
    default=1000,
    show_default=True,
    help="Ping-pongs for the latency test.",
)
@click.option(
    "--validation-id",
    envvar=ENV_VALIDATION_ID,
    help="Set in validation pods: publish the result on nicfleet.v1.validation.<id>.",
)
@click.option("--nats-url", envvar="NICFLEET_NATS_URL", help="NATS to publish the result on.")
@nats_security_options
def verify(
    output: str, sysfs_root: Path, dev_root: Path, netns: str | None, verbs: str,
    verbs_path: Path | None, serve: bool, peer: str | None, listen_host: str, port: int,
    timeout: float, method: str, size: int, iterations: int, latency_iterations: int,
    validation_id: str | None, nats_url: str | None, nats_security: NatsClientSecurity,
) -> None:  # fmt: skip
    """Prove (or disprove) that this pod has an RDMA-capable path, with every reason."""
    if serve and peer:
        _fail("--serve and --peer exclude each other")
    peer_addr = None
    if peer is not None:
        try:
            peer_addr = handshake.parse_peer(peer, port)
        except ValueError as exc:
            _fail(f"--peer: {exc}")
    if netns is not None:
        try:
            netns_path(netns)
        except NetlinkUnavailable as exc:
            _fail(f"--netns: {exc}")
    if validation_id is not None:
        try:
            validate_validation_id(validation_id)
        except InvalidValidationId as exc:
            _fail(f"--validation-id: {exc}")
        if nats_url is None:
            _fail("--validation-id needs --nats-url (or NICFLEET_NATS_URL)")
    environ = dict(os.environ)
    settings = VerifySettings(
        evidence=EvidenceSettings(
            sysfs_root=sysfs_root, dev_root=dev_root, netns=netns,
            verbs=verbs == "on" or (verbs == "auto" and sysfs_root.resolve() == Path("/sys")),
            verbs_path=verbs_path, environ=environ,
        ),
        role="server" if serve else "client" if peer else None,
        peer=peer_addr, listen=(listen_host, port), method=method,
        pair=pairtest.PairSettings(message_size=size, iterations=iterations,
                                   latency_iterations=latency_iterations, timeout=timeout),
        validation_id=validation_id, nats_url=nats_url, nats_security=nats_security,
    )  # fmt: skip
    try:
        result = asyncio.run(run_verify(settings, environ=environ))
    except AgentError as exc:
        _fail(str(exc))
        raise
    if output == "json":
        sys.stdout.buffer.write(to_json(result) + b"\n")
    else:
        render(result, _console())
    if settings.validation_id is not None and settings.nats_url is not None:
        try:
            publish = publish_result(
                result, url=settings.nats_url, security=nats_security, timeout=timeout
            )
            subject = asyncio.run(publish)
        except PublishFailed as exc:
            click.echo(f"error: {exc}", err=True)
            raise SystemExit(EXIT_PAIR_FAILED) from exc
        click.echo(f"published on {subject}", err=True)
    raise SystemExit(exit_code(result))


def exit_code(result: ValidationResult) -> int:
    if result.verdict == "ordinary-interface-only":
        return EXIT_ORDINARY
    if result.verdict == "broken":
        return EXIT_BROKEN
    if result.pair_test is not None and result.pair_test.error is not None:
        return EXIT_PAIR_FAILED
    return EXIT_RDMA_PATH


async def run_verify(settings: VerifySettings, *, environ: Mapping[str, str]) -> ValidationResult:
    """Evidence, verdict and (when asked) the pair test, as one ValidationResult."""
    started = time.time()
    evidence = await collect_evidence(settings.evidence)
    verdict, reasons = judge(evidence)
    pair: PairTestResult | None = None
    if settings.role is not None:
        pair = await _pair_test(settings, evidence, verdict, reasons)
    return ValidationResult(
        validation_id=settings.validation_id,
        role=settings.role,
        node=environ.get("NODE_NAME"),
        pod=environ.get("POD_NAME") or socket.gethostname(),
        verdict=verdict,
        reasons=reasons,
        evidence=evidence,
        pair_test=pair,
        started_at=started,
        finished_at=time.time(),
    )


async def _pair_test(
    settings: VerifySettings, evidence: Evidence, verdict: str, reasons: tuple[Reason, ...]
) -> PairTestResult:
    method = settings.method
    if method == "auto":
        method = "perftest" if pairtest.perftest_available() else "pyverbs"
    chosen = choose_port(evidence) if verdict == "rdma-path" else None
    refusal = None
    if verdict != "rdma-path":
        refusal = f"evidence verdict is {verdict}: " + "; ".join(r.message for r in reasons)
    elif chosen is None:
        refusal = "no ACTIVE port with a usable GID on the pod's RDMA devices"
    peer_text = f"{settings.peer[0]}:{settings.peer[1]}" if settings.peer else None
    if refusal is not None:
        await _tell_peer(settings, refusal)
        return PairTestResult(method="pyverbs" if method == "pyverbs" else "perftest",
                              peer=peer_text, error=refusal)  # fmt: skip
    assert chosen is not None
    device, port, gid_index = chosen
    if method == "perftest":
        return await pairtest.run_perftest(
            device=device, gid_index=gid_index, port=settings.listen[1] if settings.peer is None
            else settings.peer[1], peer=settings.peer[0] if settings.peer else None,
            settings=settings.pair,
        )  # fmt: skip

    def open_qp() -> PyverbsQueuePair:
        try:
            pv = load_pyverbs(settings.evidence.verbs_path)
        except ImportError as exc:
            raise RdmaTestError(f"pyverbs cannot be loaded: {exc}") from exc
        return PyverbsQueuePair(pv, device=device, port=port, gid_index=gid_index,
                                size=settings.pair.message_size)  # fmt: skip

    if settings.peer is not None:
        return await pairtest.run_pyverbs(*settings.peer, open_qp, settings.pair)
    server, queue = await pairtest.listen(*settings.listen, settings.pair.timeout)
    try:
        channel = await pairtest.accept_one(server, queue, settings.pair.timeout)
    except handshake.HandshakeError as exc:
        return PairTestResult(method="pyverbs", error=str(exc))
    return await pairtest.serve_pyverbs(channel, open_qp, settings.pair)


async def _tell_peer(settings: VerifySettings, reason: str) -> None:
    """Fail the other side fast: it gets our reason instead of waiting for a timeout."""
    try:
        if settings.peer is not None:
            channel = await handshake.connect(*settings.peer, timeout=settings.pair.timeout)
        else:
            server, queue = await pairtest.listen(*settings.listen, settings.pair.timeout)
            channel = await pairtest.accept_one(server, queue, settings.pair.timeout)
    except handshake.HandshakeError:
        return  # the peer is not there either; our own result says why
    await pairtest.refuse(channel, reason)


def _console() -> Console:
    """Colour only on a terminal (and without NO_COLOR); never wrap piped output."""
    tty = sys.stdout.isatty()
    return Console(force_terminal=tty, no_color=not tty or bool(os.environ.get("NO_COLOR")),
                   width=None if tty else 4096, highlight=False, emoji=False)  # fmt: skip


def render(result: ValidationResult, console: Console) -> None:
    """The readable report: verdict, every reason, the evidence and the pair test."""
    style = {"rdma-path": "bold green", "broken": "bold red"}.get(result.verdict, "bold yellow")
    console.print(f"verdict: [{style}]{result.verdict}[/]")
    for reason in result.reasons:
        text = escape(f"{reason.message} (missing: {reason.missing})")
        console.print(f"  - [red]{reason.code}[/]: {text}")
    ev = result.evidence
    console.out("char devices:")
    for char in ev.char_devices or ():
        state = "openable" if char.openable else f"NOT openable ({char.error})"
        console.out(f"  {char.path}: {state}")
    if not ev.char_devices:
        console.out("  none under /dev/infiniband")
    console.out("RDMA devices:")
    for device in ev.devices:
        for p in device.ports:
            rate = f"{p.rate_gbps:g} Gb/s" if p.rate_gbps is not None else "rate ?"
            console.out(f"  {device.name}/{p.port}: {p.state} ({p.phys_state}), "
                          f"{p.link_layer}, {rate}")  # fmt: skip
    if not ev.devices:
        console.out("  none in /sys/class/infiniband")
    console.out("pod interfaces:")
    for interface in ev.interfaces:
        addresses = ", ".join(interface.addresses) or "no address"
        console.out(f"  {interface.name} ({interface.operstate}): {addresses}")
    for match in ev.gid_matches:
        if match.interface:
            console.out(f"RoCE GID {match.device}/{match.port}[{match.index}] {match.type} = "
                          f"{match.ip} on {match.interface}")  # fmt: skip
    inj = ev.injected
    if inj.matches is not None:
        console.out(f"injected: devices={','.join(inj.rdma_devices or ()) or '-'} "
                      f"netdevs={','.join(inj.netdevs or ()) or '-'} "
                      f"{'match' if inj.matches else 'DO NOT match'}")  # fmt: skip
    console.out(f"verbs: {ev.verbs.detail}")
    if result.pair_test is not None:
        _render_pair(result.pair_test, console)


def _render_pair(pair: PairTestResult, console: Console) -> None:
    if pair.error is not None:
        console.print(f"pair test ({pair.method}): [red]failed[/]: {escape(pair.error)}")
        return
    gbps = (pair.bytes_per_second or 0) * 8 / 1e9
    console.out(f"pair test ({pair.method}) with {pair.peer}: {gbps:.2f} Gb/s "
                  f"({pair.bytes_per_second:.0f} B/s)")  # fmt: skip
    if pair.latency is not None:
        lat = pair.latency
        console.out(f"  latency p50 {lat.p50_us:.2f} µs, p99 {lat.p99_us:.2f} µs "
                      f"({lat.samples} samples)")  # fmt: skip
    console.out(f"  {pair.local_device} {pair.local_gid} -> {pair.remote_device} {pair.remote_gid}")
