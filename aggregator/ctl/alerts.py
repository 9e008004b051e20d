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
from aggregator.ctl.render import console_for
from aggregator.rules.catalog import SEVERITY_ORDER
from proto.runtime.cliopts import output_option

EPILOG: Final = """\b
Exit codes:
  0  success (for --follow: also when stopped with Ctrl-C)
  1  the aggregator answered with an error
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
    columns = ["SEVERITY", "RULE", "NODE", "SUBJECT", "MESSAGE"]
    table = _table([*columns, "EVIDENCE"] if output == "wide" else columns)
    for f in items:
        row: list[str | Text] = [
            _styled(f.get("severity")),
            str(f.get("rule")),
            str(f.get("node") or "_fleet"),
            str(f.get("subject")),
            str(f.get("message")),
        ]
        if output == "wide":
            row.append(_evidence(f.get("evidence")))
        table.add_row(*row)
    _console().print(table)


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
            str(a.get("rule")),
            str(a.get("node")),
            str(a.get("subject")),
            _when(a.get("starts_at")),
            str(a.get("message")),
        ]
        if output == "wide":
            row += [_when(a.get("ends_at")), str(a.get("fingerprint"))]
        table.add_row(*row)
    _console().print(table)


def _follow(server: str, params: dict[str, str], output: str) -> None:
    last_id: str | None = None
    connected_once = False
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
                        _show(event, output)
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


def _show(event: dict[str, str], output: str) -> None:
    data = json.loads(event["data"])
    if event.get("event") == "resync":
        for alert in data.get("alerts", []):
            _line(alert, output, prefix="current")
        return
    _line(data, output)


def _line(alert: Mapping[str, Any], output: str, prefix: str = "") -> None:
    if output == "json":
        click.echo(json.dumps(alert, sort_keys=True), nl=True)
        return
    stamp = _when(
        alert.get("ends_at") if alert.get("state") == "resolved" else alert.get("starts_at")
    )
    text = Text(f"{stamp}  ")
    text.append_text(_styled(prefix or alert.get("state")))
    text.append(f"  {alert.get('severity')}  {alert.get('rule')}  {alert.get('node')}  ")
    text.append(f"{alert.get('subject')}  {alert.get('message')}")
    _console().print(text)
    sys.stdout.flush()


def _items(body: dict[str, Any]) -> list[dict[str, Any]]:
    items = body.get("items")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ApiError("unexpected answer from the aggregator: no list of items")
    return items


def _table(columns: list[str]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=column not in ("MESSAGE", "EVIDENCE"))
    return table


def _styled(value: object) -> Text:
    text = str(value) if value is not None else NONE
    return Text(text, style=_STYLE.get(text, ""))


def _evidence(value: object) -> str:
    if not isinstance(value, dict) or not value:
        return NONE
    return " ".join(f"{k}={v}" for k, v in sorted(value.items()))


def _when(value: object) -> str:
    if not isinstance(value, int | float):
        return NONE
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _console() -> Console:
    return console_for(sys.stdout, os.environ)
