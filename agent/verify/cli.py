"""`nicfleet-agent verify`: in-pod evidence of an RDMA path, and the pair test.

Parses options into VerifySettings, runs agent.verify.run, prints text (agent.verify.report)
or JSON and, in a validation pod, publishes the result (agent.verify.publish).
Exit 0 only for rdma-path (and a pair test, when asked, that produced numbers).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import cast

import click

from agent.errors import AgentError
from agent.links.netlink import NetlinkUnavailable, netns_path
from agent.verify.evidence import DEFAULT_ANNOTATIONS, EvidenceSettings
from agent.verify.pair import handshake
from agent.verify.pair import sides as pairtest
from agent.verify.publish import PublishFailed, publish_result
from agent.verify.report import console, render
from agent.verify.run import Method, VerifySettings, run_verify
from proto.codec import to_json
from proto.messages.validation import ValidationResult
from proto.runtime.cliopts import output_option
from proto.runtime.natsconnect import NatsClientSecurity
from proto.runtime.natsflags import nats_security_options
from proto.subjects import InvalidValidationId, validate_validation_id

EXIT_RDMA_PATH = 0
EXIT_BROKEN = 1
EXIT_USAGE = 2
EXIT_ORDINARY = 3
EXIT_PAIR_FAILED = 4
ENV_VALIDATION_ID = "NICFLEET_VALIDATION_ID"
ENV_ANNOTATIONS = "NICFLEET_ANNOTATIONS_FILE"


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    raise SystemExit(EXIT_USAGE)


@click.command()
@output_option("text", "json", help="text: readable report; json: the ValidationResult.")
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
    "--annotations",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_ANNOTATIONS,
    show_default=True,
    envvar=ENV_ANNOTATIONS,
    help="The pod's annotations as a downwardAPI volume writes them (Multus network-status "
    "with device-info); absent: not used.",
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
    output: str, sysfs_root: Path, dev_root: Path, netns: str | None, annotations: Path,
    verbs: str,
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
            verbs_path=verbs_path, environ=environ, annotations=annotations,
        ),
        role="server" if serve else "client" if peer else None,
        peer=peer_addr, listen=(listen_host, port), method=cast(Method, method),
        pair=pairtest.PairSettings(message_size=size, iterations=iterations,
                                   latency_iterations=latency_iterations, timeout=timeout),
        validation_id=validation_id,
    )  # fmt: skip
    try:
        result = asyncio.run(run_verify(settings, environ=environ))
    except AgentError as exc:
        _fail(str(exc))
        raise
    if output == "json":
        sys.stdout.buffer.write(to_json(result) + b"\n")
    else:
        render(result, console())
    if validation_id is not None and nats_url is not None:
        try:
            publish = publish_result(result, url=nats_url, security=nats_security, timeout=timeout)
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
