"""`nicfleet-aggregator`: the command line of the central service.

Turns arguments into `AggregatorSettings`, installs signal handlers and runs the
service; bad arguments are one clear message and exit code 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path

import click

from aggregator import __version__
from aggregator.api.limits import HttpLimitSettings
from aggregator.api.tokenreview import ReviewSettings
from aggregator.bus.calloutservice import CalloutSettings
from aggregator.bus.keys import nats_auth
from aggregator.cli.calloutflags import nats_callout_options
from aggregator.cli.httpflags import http_limit_options
from aggregator.cli.reviewflags import token_review_options
from aggregator.cli.runsettings import (
    FlagError,
    RunFlags,
    aggregator_settings,
    announce_auth,
    read_api_auth,
    read_policies,
)
from aggregator.cli.validationflags import (
    ValidationFlags,
    validation_options,
)
from aggregator.errors import AggregatorError
from aggregator.service import AggregatorService, AggregatorSettings
from proto.runtime.cliopts import log_options
from proto.runtime.logs import LogFormat, configure_logging
from proto.runtime.natsconnect import NatsClientSecurity
from proto.runtime.natsflags import nats_security_options


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` or `[IPv6]:PORT` → (host, port); port 0 lets the OS choose."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port must be 0-65535, got {port_text!r}")
    return host, int(port_text)


class _Listen(click.ParamType):  # type: ignore[type-arg]
    name = "HOST:PORT"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        try:
            return parse_listen(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _check_alertmanager_url(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> str | None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise click.BadParameter(f"{value!r} is not an http:// or https:// URL", ctx, param)
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nicfleet-aggregator")
def main() -> None:
    """nicfleet aggregator: the fleet view of every node's RDMA path, served over HTTP."""


@main.command()
@click.option("--nats-url", help="NATS server URL. Default: start an embedded nats-server.")
@nats_security_options
@click.option(
    "--nats-server-config",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="Config file of the embedded nats-server, e.g. the server-auth.conf written by "
    "`nicfleet-aggregator nats-auth` (users, permissions, TLS).",
)
@click.option(
    "--listen",
    type=_Listen(),
    default="127.0.0.1:8080",
    show_default=True,
    help="Address of the HTTP API (port 0: any free port).",
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="Policy YAML file (used when there is no cluster).",
)
@click.option(
    "--stale-after",
    type=click.FloatRange(min=1.0),
    default=30.0,
    show_default=True,
    help="Seconds without messages after which a node is stale.",
)
@click.option(
    "--nats-store-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="JetStream store of the embedded nats-server. Default: a temporary dir.",
)
@click.option(
    "--ready-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write {api_url, nats_url, pid} as JSON here once ready.",
)
@click.option(
    "--alertmanager-url",
    callback=_check_alertmanager_url,
    help="Post alerts to this Alertmanager (v2 API), e.g. http://alertmanager:9093.",
)
@click.option(
    "--kubeconfig",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="Use the Kubernetes cluster of this kubeconfig: NicFleetPolicy objects instead "
    "of --policy, node allocatable, status/Events/labels written back.",
)
@click.option("--kube-context", help="Context of --kubeconfig (default: its current one).")
@click.option("--in-cluster", is_flag=True, help="Use the pod's service account.")
@click.option(
    "--kube-api",
    metavar="URL",
    help="Talk to this API server URL without credentials (kubectl proxy, tests).",
)
@click.option(
    "--identity",
    help="This replica's name in leader election. Default: <hostname>-<pid>.",
)
@click.option(
    "--kv-replicas",
    type=click.IntRange(1, 5),
    default=1,
    show_default=True,
    help="Copies of every KV bucket in a JetStream cluster (3 for a 3-server cluster, so a "
    "bucket survives a server); an existing bucket with fewer is raised.",
)
@validation_options
@click.option(
    "--partitions",
    type=click.IntRange(0, 1024),
    default=0,
    show_default=True,
    help="Run as one replica of a sharded aggregator: node subjects are split in N "
    "partitions by nats-server (`nats-auth --partitions N`, docs/scaling.md). 0: one process.",
)
@click.option(
    "--api-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Require 'Authorization: Bearer <token>' on the API (all but /healthz, /readyz). "
    "One '<scope> <token>' per line, scope read (GET) or admin (any method); # comments. "
    "Default: no authentication (local/demo use only).",
)
@click.option(
    "--metrics-public",
    is_flag=True,
    help="With --api-token-file/--api-token-review: leave /metrics open to scrapers.",
)
@click.option(
    "--dra-publish",
    is_flag=True,
    help="The leader publishes every node's rdma.nicfleet.io DRA ResourceSlices "
    "(needs a cluster; docs/dra.md). Default: none are written.",
)
@token_review_options
@nats_callout_options
@http_limit_options
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@log_options(level_default="info")
def run(
    nats_url: str | None,
    nats_security: NatsClientSecurity,
    nats_server_config: Path | None,
    listen: tuple[str, int],
    policy_file: Path | None,
    stale_after: float,
    nats_store_dir: Path | None,
    ready_file: Path | None,
    alertmanager_url: str | None,
    kubeconfig: Path | None,
    kube_context: str | None,
    in_cluster: bool,
    kube_api: str | None,
    identity: str | None,
    kv_replicas: int,
    validation_flags: ValidationFlags,
    partitions: int,
    api_token_file: Path | None,
    metrics_public: bool,
    api_token_review: ReviewSettings | None,
    nats_callout: CalloutSettings | None,
    http_limits: HttpLimitSettings,
    dra_publish: bool,
    verbose: int,
    log_level: str | None,
    log_format: LogFormat,
) -> None:
    """Consume node messages from NATS, keep the fleet view and serve the API."""
    configure_logging(log_level or ["info", "info", "debug"][min(verbose, 2)], log_format)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    flags = RunFlags(
        nats_url=nats_url, nats_security=nats_security, nats_server_config=nats_server_config,
        listen=listen, policy_file=policy_file, stale_after=stale_after,
        nats_store_dir=nats_store_dir, ready_file=ready_file, alertmanager_url=alertmanager_url,
        kubeconfig=kubeconfig, kube_context=kube_context, in_cluster=in_cluster,
        kube_api=kube_api, identity=identity, kv_replicas=kv_replicas,
        validation_flags=validation_flags, partitions=partitions,
        api_token_file=api_token_file, metrics_public=metrics_public,
        api_token_review=api_token_review, http=http_limits, nats_callout=nats_callout,
        dra_publish=dra_publish,
    )  # fmt: skip
    try:
        policies = read_policies(policy_file)
        api_auth = read_api_auth(flags)
        settings = aggregator_settings(flags, policies=policies, api_auth=api_auth)
    except FlagError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from exc
    announce_auth(flags, api_auth)
    try:
        asyncio.run(_serve(settings))
    except (AggregatorError, OSError) as exc:  # OSError: e.g. the listen address is taken
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from exc


main.add_command(nats_auth)


async def _serve(settings: AggregatorSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await AggregatorService(settings).run(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):
                loop.remove_signal_handler(sig)
