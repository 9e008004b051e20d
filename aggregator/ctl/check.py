"""`nicfleetctl check`: evaluate every rule on snapshot files offline, without a server —
how a node image is vetted before it joins a cluster.

Owns reading the files (snapshots as `nicfleet-agent snapshot` prints them, an optional
policy YAML) and the exit codes; the rules themselves are `aggregator.rules.engine.registry`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Final, Literal

import click
import msgspec

from aggregator.ctl.render import console_for, render_findings
from aggregator.errors import AggregatorError
from aggregator.rules.engine.registry import evaluate_snapshots
from aggregator.rules.finding import Finding
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS, ThresholdError, Thresholds, parse_alerts
from proto.codec import CodecError, from_json
from proto.inventory import NodeSnapshot
from proto.policy import Policy, PolicyError, load_policies
from proto.runtime.cliopts import output_option

MAX_FILE: Final = 16 * 1024 * 1024
CHECK_EPILOG: Final = """\b
Exit codes:
  0  no critical finding
  1  at least one critical finding
  2  usage error or bad input (unreadable or invalid snapshot/policy file)

\b
Offline, `now` is the newest snapshot's collected_at and agent-stale is off (a file has
no liveness); counter rules need live counter batches and do not fire here."""


class CheckInputError(AggregatorError, click.ClickException):
    exit_code = 2


def _read(path: Path, what: str) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_FILE:
            raise CheckInputError(f"{path}: {what} of {size} bytes exceeds {MAX_FILE}")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CheckInputError(f"{path}: cannot read {what}: {reason}") from exc


def load_snapshots(paths: tuple[Path, ...]) -> list[NodeSnapshot]:
    snaps: list[NodeSnapshot] = []
    origin: dict[str, Path] = {}
    for path in paths:
        try:
            snap = from_json(_read(path, "snapshot"), NodeSnapshot)
        except CodecError as exc:
            raise CheckInputError(f"{path}: {exc.path}: {exc.reason}") from exc
        if snap.node in origin:
            raise CheckInputError(
                f"{path}: $.node: {snap.node!r} is also the node of {origin[snap.node]}"
            )
        origin[snap.node] = path
        snaps.append(snap)
    return snaps


def load_policy_file(path: Path | None) -> tuple[tuple[Policy, ...], Thresholds]:
    if path is None:
        return (), DEFAULT_THRESHOLDS
    try:
        policies = load_policies(_read(path, "policy"), source=str(path))
    except PolicyError as exc:
        raise CheckInputError(str(exc)) from exc
    thresholds = DEFAULT_THRESHOLDS
    for policy in sorted(policies, key=lambda p: p.metadata.name):
        try:
            thresholds = parse_alerts(policy.spec.alerts, thresholds)
        except ThresholdError as exc:
            raise CheckInputError(
                f"{path}: policy {policy.metadata.name}: $.spec.{exc.path}: {exc.reason}"
            ) from exc
    return policies, thresholds


def run_check(
    snaps: list[NodeSnapshot], policies: tuple[Policy, ...], thresholds: Thresholds
) -> list[Finding]:
    offline = thresholds.with_rule("agent-stale", enabled=False)
    return evaluate_snapshots(snaps, policies, thresholds=offline)


def print_findings(findings: list[Finding], *, wide: bool = False) -> None:
    """The table `nicfleetctl findings` prints, from offline findings."""
    if not findings:
        click.echo("No findings.", err=True)
        return
    items = msgspec.to_builtins(findings)
    render_findings(console_for(sys.stdout, os.environ), items, wide=wide)


@click.command(epilog=CHECK_EPILOG)
@click.option(
    "--snapshot",
    "snapshots",
    multiple=True,
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="A snapshot JSON file as printed by `nicfleet-agent snapshot` (repeatable).",
)
@click.option(
    "--policy",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A NicFleetPolicy YAML file (one or more documents).",
)
@output_option(
    "table", "wide", "json", help="Table, wide table (with evidence), or a JSON list of findings."
)
def check(
    snapshots: tuple[Path, ...], policy: Path | None, output: Literal["table", "wide", "json"]
) -> None:
    """Evaluate every rule on snapshot files, without any server; exit 1 on a critical finding."""
    snaps = load_snapshots(snapshots)
    policies, thresholds = load_policy_file(policy)
    findings = run_check(snaps, policies, thresholds)
    if output == "json":
        click.echo(json.dumps(msgspec.to_builtins(findings), indent=2, sort_keys=True))
    else:
        print_findings(findings, wide=output == "wide")
    if any(f.severity == "critical" for f in findings):
        sys.exit(1)
