"""`nicfleetctl findings` and `nicfleetctl alerts [--follow]`: the rule findings and the
alerts, from /api/v1/findings, /api/v1/alerts and the SSE stream /api/v1/alerts/stream.

`--follow` prints every transition as it arrives, reconnecting with `Last-Event-ID`
when the stream breaks; Ctrl-C ends it with exit code 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import click
import httpx
from rich.console import Console
from rich.table import Table
from rich.text import Text

from aggregator.ctl.client import (
    AggregatorClient,
    ApiError,
    AuthRefused,
    BadInput,
    Unreachable,
    auth_headers,
    fail_if_partial,
)
from aggregator.ctl.render import (
    FLEET_NODE,
    console_for,
    plain_table,
    render_findings,
    text_of,
)
from aggregator.rules.catalog import SEVERITY_ORDER
from proto.runtime.cliopts import output_option

EPILOG: Final = """\b
Exit codes:
  0  success (for --follow: also when stopped with Ctrl-C)
  1  the aggregator answered with an error, or --node/--rule names a node or rule it
     does not know (the message lists close matches)
  2  usage error or bad input (invalid option value)
  3  the aggregator could not be reached (check --server / NICFLEET_SERVER)"""
SEVERITIES: Final = ("critical", "warning", "info")
_STYLE: Final = {"critical": "red", "warning": "yellow", "info": "blue", "firing": "red",
                 "resolved": "green"}  # fmt: skip
RECONNECT_S: Final = 1.0
NONE: Final = "-"


class _AlertsClient(AggregatorClient):
    def findings(self, params: dict[str, str]) -> dict[str, Any]:
        return self.get_fleet("/api/v1/findings", params, key=_finding_key)

    def alerts(self, params: dict[str, str]) -> dict[str, Any]:
        return self.get_fleet("/api/v1/alerts", params, key=_alert_key)


def _finding_key(item: dict[str, Any]) -> tuple[int, str, str, str]:
    """The API's order (`aggregator.rules.engine.registry.sort_key`): most severe first."""
    severity = SEVERITY_ORDER.get(str(item.get("severity")), len(SEVERITY_ORDER))
    return severity, str(item.get("node") or ""), str(item.get("rule")), str(item.get("subject"))


def _alert_key(item: dict[str, Any]) -> tuple[bool, int, str, str, str]:
    """The API's order: firing first, then most severe, node, rule, subject."""
    return (item.get("state") != "firing", *_finding_key(item))


def _filters(**values: str | None) -> dict[str, str]:
    return {key: value for key, value in values.items() if value is not None}


node_option = click.option("--node", help="Only this node (`_fleet`: fleet-wide ones).")
rule_option = click.option("--rule", help="Only this rule id, e.g. port-down.")
severity_option = click.option("--severity", type=click.Choice(SEVERITIES), help="Only this one.")


@click.command(epilog=EPILOG)
@node_option
@rule_option
@severity_option
@output_option(
    "table", "wide", "json", help="Table, wide table (with evidence), or the API's JSON."
)
@click.pass_obj
def findings(
    server: str, node: str | None, rule: str | None, severity: str | None, output: str
) -> None:
    """What the rules say about the fleet right now, most severe first.

    Against a replica of a sharded aggregator, every replica's findings (exit 1 naming any
    replica that could not be read)."""
    client = _AlertsClient(server)
    with client:
        body = client.findings(_filters(node=node, rule=rule, severity=severity))
    if output == "json":
        click.echo(json.dumps(body, indent=2, sort_keys=True))
    else:
        _print_findings(_items(body), output)
    fail_if_partial(body)


def _print_findings(items: list[dict[str, Any]], output: str) -> None:
    if not items:
        click.echo("No findings.", err=True)
        return
    render_findings(_console(), items, wide=output == "wide")


@click.command(epilog=EPILOG)
@click.option("-f", "--follow", is_flag=True, help="Stream transitions as they happen.")
@node_option
@rule_option
@severity_option
@click.option("--status", type=click.Choice(["firing", "resolved"]), help="Only this state.")
@output_option(
    "table", "wide", "json", help="Table, wide table, or JSON (with --follow: one object per line)."
)
@click.pass_obj
def alerts(
    server: str,
    follow: bool,
    node: str | None,
    rule: str | None,
    severity: str | None,
    status: str | None,
    output: str,
) -> None:
    """Firing and recently resolved alerts; --follow streams every fire/resolve.

    Against a replica of a sharded aggregator, the list is every replica's (exit 1 naming
    any replica that could not be read); --follow streams the asked replica's own."""
    params = _filters(node=node, rule=rule, severity=severity)
    if follow:
        if status is not None:
            raise BadInput("--status cannot be combined with --follow")
        with contextlib.suppress(KeyboardInterrupt):
            _follow(server, params, output)
        return
    client = _AlertsClient(server)
    with client:
        body = client.alerts({**params, **_filters(status=status)})
    if output == "json":
        click.echo(json.dumps(body, indent=2, sort_keys=True))
    else:
        _print_alerts(_items(body), output)
    fail_if_partial(body)


def _print_alerts(items: list[dict[str, Any]], output: str) -> None:
    if not items:
        click.echo("No alerts.", err=True)
        return
    columns = ["STATE", "SEVERITY", "RULE", "NODE", "SUBJECT", "SINCE", "MESSAGE"]
    table = _table([*columns, "ENDED", "FINGERPRINT"] if output == "wide" else columns)
    for a in items:
        row: list[str | Text] = [
            _styled(a.get("state")),
            _styled(a.get("severity")),
            text_of(a.get("rule")),
            text_of(a.get("node"), FLEET_NODE),
            text_of(a.get("subject")),
            _when(a.get("starts_at")),
            text_of(a.get("message")),
        ]
        if output == "wide":
            row += [_when(a.get("ends_at")), text_of(a.get("fingerprint"))]
        table.add_row(*row)
    _console().print(table)


def _follow(server: str, params: dict[str, str], output: str) -> None:
    last_id: str | None = None
    connected_once = False
    lines = _FollowLines(output)
    with httpx.Client(base_url=server.rstrip("/"), timeout=httpx.Timeout(10, read=None)) as http:
        while True:
            headers = {"Accept": "text/event-stream", **auth_headers()}
            if last_id is not None:
                headers["Last-Event-ID"] = last_id
            try:
                with http.stream(
                    "GET", "/api/v1/alerts/stream", params=params, headers=headers
                ) as response:
                    if response.status_code != 200:
                        _raise_for(response)
                    connected_once = True
                    for event in _events(response.iter_lines()):
                        last_id = event.get("id", last_id)
                        lines.show(event)
            except (httpx.ConnectError, httpx.TimeoutException) as exc:
                if not connected_once:
                    raise Unreachable(
                        f"cannot reach nicfleet aggregator at {server}: {exc}. "
                        "Set --server or NICFLEET_SERVER."
                    ) from exc
            except httpx.HTTPError:
                pass  # the stream broke; resume below
            click.echo("stream interrupted; reconnecting…", err=True)
            time.sleep(RECONNECT_S)  # a human-facing retry pause, not a wait for a condition


def _raise_for(response: httpx.Response) -> None:
    response.read()
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {response.status_code}"
    if response.status_code == 400:
        raise BadInput(message)
    if response.status_code in (401, 403):
        raise AuthRefused(
            f"authentication refused by {response.url}: {message}; "
            "check --token-file (or NICFLEET_TOKEN_FILE)"
        )
    raise ApiError(f"aggregator answered HTTP {response.status_code}: {message}")


def _events(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    """Server-Sent Events from text lines (comments and `retry:` skipped)."""
    event: dict[str, str] = {}
    for line in lines:
        if line == "":
            if "data" in event:
                yield event
            event = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            event[key] = event[key] + "\n" + value if key == "data" and key in event else value


FOLLOW_COLUMNS: Final = ("TIME", "STATE", "SEVERITY", "RULE", "NODE", "SUBJECT", "MESSAGE")


class _FollowLines:
    """`alerts --follow` as a table that grows a line at a time: a header first, columns
    as wide as the header and the values seen so far (the first batch is the currently
    firing alerts), as `kubectl get --watch` does; a longer value widens later lines."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.widths = {c: len(c) for c in FOLLOW_COLUMNS[:-1]}
        self.widths["TIME"] = len("2006-01-02T15:04:05Z")
        self.widths["STATE"] = len("resolved")
        self.widths["SEVERITY"] = len("critical")
        self.header_shown = False

    def show(self, event: dict[str, str]) -> None:
        data = json.loads(event["data"])
        if event.get("event") == "resync":
            alerts = [a for a in data.get("alerts", []) if isinstance(a, dict)]
            self._widen(alerts)
            for alert in alerts:
                self.line(alert, prefix="current")
        else:
            self.line(data)
        sys.stdout.flush()

    def _widen(self, alerts: list[dict[str, Any]]) -> None:
        for alert in alerts:
            for column, value in zip(FOLLOW_COLUMNS[:-1], self._cells(alert, ""), strict=False):
                self.widths[column] = max(self.widths[column], len(value))

    def _cells(self, alert: Mapping[str, Any], prefix: str) -> list[str]:
        ended = alert.get("state") == "resolved"
        return [
            _when(alert.get("ends_at") if ended else alert.get("starts_at")),
            prefix or text_of(alert.get("state")),
            text_of(alert.get("severity")),
            text_of(alert.get("rule")),
            text_of(alert.get("node"), FLEET_NODE),
            text_of(alert.get("subject")),
            text_of(alert.get("message")),
        ]

    def line(self, alert: Mapping[str, Any], prefix: str = "") -> None:
        if self.output == "json":
            click.echo(json.dumps(alert, sort_keys=True))
            return
        console = _console()
        if not self.header_shown:
            console.print(self._row(list(FOLLOW_COLUMNS), header=True))
            self.header_shown = True
        self._widen([dict(alert)])
        console.print(self._row(self._cells(alert, prefix)))

    def _row(self, cells: list[str], *, header: bool = False) -> Text:
        text = Text()
        for column, value in zip(FOLLOW_COLUMNS, cells, strict=True):
            style = "bold" if header else _STYLE.get(value, "")
            text.append(value, style=style)
            if column != FOLLOW_COLUMNS[-1]:
                text.append(" " * (self.widths[column] - len(value) + 2))
        return text


def _items(body: dict[str, Any]) -> list[dict[str, Any]]:
    items = body.get("items")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ApiError("unexpected answer from the aggregator: no list of items")
    return items


def _table(columns: list[str]) -> Table:
    return plain_table(columns, wrap=("MESSAGE",))


def _styled(value: object) -> Text:
    text = text_of(value)
    return Text(text, style=_STYLE.get(text, ""))


def _when(value: object) -> str:
    if not isinstance(value, int | float):
        return NONE
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _console() -> Console:
    return console_for(sys.stdout, os.environ)
