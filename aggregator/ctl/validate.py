"""`nicfleetctl validate A B --resource R` and `validate --all --resource R`: start pair
validations (POST /api/v1/validations), follow them (GET .../{id}) with live progress on
stderr, print the result or the ring's matrix. Exit 0 only when every pair passed.

HTTP through `client.AggregatorClient`; the aggregator runs the pods, never this process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Final

import click
import httpx
import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from aggregator.ctl.client import (
    AggregatorClient,
    ApiError,
    BadInput,
    Unreachable,
    _api_error,
    _json_object,
    _reason,
)
from aggregator.ctl.render import console_for
from proto.http import FINAL_PHASES, ResourceSummary, ValidationRecord
from proto.runtime.cliopts import output_option
from proto.subjects import InvalidNodeName, validate_node_name

EPILOG: Final = """\b
Exit codes:
  0  every pair passed: both sides rdma-path with a pair test result
  1  a pair failed, timed out or did not pass, or the aggregator answered with an error
  2  usage error or bad input (node names, resource, a node twice)
  3  the aggregator could not be reached (check --server / NICFLEET_SERVER)
  4  authentication refused: POST needs an admin token (check --token-file)"""
PATH: Final = "/api/v1/validations"


class _ValidationClient(AggregatorClient):
    def start(self, server: str, client: str, resource: str, network: str | None) -> str:
        body: dict[str, Any] = {"nodes": [server, client], "resource": resource}
        if network is not None:
            body["network"] = network
        answer = self._post(PATH, body)
        record: ValidationRecord = _typed(answer, ValidationRecord)
        return record.id

    def get(self, validation_id: str) -> dict[str, Any]:
        return self._get(f"{PATH}/{validation_id}", {})

    def advertising(self, resource: str) -> list[str]:
        """Live nodes advertising `resource`, from /api/v1/resources, sorted."""
        body = self._get("/api/v1/resources", {"name": resource})
        items: tuple[ResourceSummary, ...] = _typed(body.get("items"), tuple[ResourceSummary, ...])
        return sorted(
            {
                n.node
                for r in items
                for n in r.nodes
                if n.state != "stale" and ((n.advertised or 0) > 0 or (n.allocatable or 0) > 0)
            }
        )

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._http.post(path, json=body)
        except (httpx.ConnectError, httpx.TimeoutException) as exc:
            raise Unreachable(
                f"cannot reach nicfleet aggregator at {self.server}: {_reason(exc)}. "
                "Set --server or NICFLEET_SERVER."
            ) from exc
        except httpx.HTTPError as exc:
            raise ApiError(f"error talking to {self.server}: {_reason(exc)}") from exc
        answer = _json_object(response)
        if response.is_success and answer is not None:
            return answer
        raise _api_error(self.server, response, answer)


@click.command(epilog=EPILOG)
@click.argument("nodes", nargs=-1)
@click.option("--resource", required=True, help="The extended resource, e.g. rdma/ib.")
@click.option("--network", help="NetworkAttachmentDefinition to attach, [namespace/]name.")
@click.option("--all", "ring", is_flag=True, help="Every node advertising RESOURCE, in a ring.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 16),
    default=2,
    show_default=True,
    help="With --all: pairs running at the same time.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between progress polls.",
)
@output_option("table", "json", help="A summary (or matrix), or the API's JSON records.")
@click.pass_context
def validate(
    ctx: click.Context,
    nodes: tuple[str, ...],
    resource: str,
    network: str | None,
    ring: bool,
    concurrency: int,
    interval: float,
    output: str,
) -> None:
    """Test the RDMA data path between two nodes (server on the first, client on the
    second) in two pods requesting RESOURCE, or with --all between every node advertising
    it and the next one (a ring)."""
    for node in nodes:
        try:
            validate_node_name(node)
        except InvalidNodeName as exc:
            raise BadInput(str(exc)) from exc
    if ring and nodes:
        raise BadInput("give either two NODES or --all, not both")
    if not ring and (len(nodes) != 2 or nodes[0] == nodes[1]):
        raise BadInput("give two different nodes (server, client), or --all")
    progress = console_for(sys.stderr, os.environ)
    client = _ValidationClient(ctx.obj)
    with client:
        if ring:
            members = client.advertising(resource)
            if len(members) < 2:
                raise ApiError(f"{resource}: {len(members)} node(s) advertise it; a ring needs 2")
            pairs = [(a, members[(i + 1) % len(members)]) for i, a in enumerate(members)]
            if len(members) == 2:
                pairs = pairs[:1]
        else:
            pairs = [(nodes[0], nodes[1])]
        records = _run(client, pairs, resource, network, concurrency, interval, progress)
    if output == "json":
        docs = [msgspec.to_builtins(r) for r in records]
        click.echo(json.dumps(docs[0] if not ring else docs, indent=2, sort_keys=True))
    elif ring:
        _render_matrix(_console(), records)
    else:
        _render_one(_console(), records[0])
    ctx.exit(0 if all(r.passed for r in records) else 1)


def _run(
    client: _ValidationClient,
    pairs: list[tuple[str, str]],
    resource: str,
    network: str | None,
    concurrency: int,
    interval: float,
    console: Console,
) -> list[ValidationRecord]:
    """Start at most `concurrency` pairs at a time; poll until every one is final."""
    waiting = list(pairs)
    running: dict[str, tuple[str, str]] = {}
    done: dict[tuple[str, str], ValidationRecord] = {}
    shown: dict[str, str] = {}
    say = _reporter(console)
    with console.status("starting", spinner="dots") if console.is_terminal else _Quiet() as status:
        while waiting or running:
            while waiting and len(running) < concurrency:
                pair = waiting.pop(0)
                running[client.start(*pair, resource, network)] = pair
            for validation_id, pair in list(running.items()):
                record: ValidationRecord = _typed(client.get(validation_id), ValidationRecord)
                line = f"{record.id} {pair[0]} → {pair[1]}: {record.phase}"
                if shown.get(validation_id) != line:
                    shown[validation_id] = line
                    say(line + (f" ({record.reason})" if record.reason else ""))
                if record.phase in FINAL_PHASES:
                    done[pair] = record
                    del running[validation_id]
            status.update(f"{len(done)}/{len(pairs)} done, {len(running)} running")
            if running or waiting:
                time.sleep(interval)  # polling the API is how progress is seen
    return [done[pair] for pair in pairs]


class _Quiet:
    def __enter__(self) -> _Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, text: str) -> None:
        return None


def _reporter(console: Console) -> Callable[[str], None]:
    def say(line: str) -> None:
        console.print(Text(line, style="dim"))

    return say


def _render_one(console: Console, r: ValidationRecord) -> None:
    style = "green" if r.passed else "bold red"
    verdict = "passed" if r.passed else f"not passed ({r.phase})"
    console.print(Text.assemble(f"{r.resource} {r.nodes[0]} → {r.nodes[1]}: ", (verdict, style)))
    console.print(Text(f"  bandwidth: {_rate(r.bytes_per_second)}, latency p50: {_us(r)}"))
    for role, result in (("server", r.server), ("client", r.client)):
        if result is None:
            console.print(Text(f"  {role}: no result", style="red"))
            continue
        test = result.pair_test
        pair = "no pair test" if test is None else (test.error or "pair test ok")
        mark = "green" if result.verdict == "rdma-path" else "red"
        console.print(
            Text.assemble(f"  {role} ({result.node}): ", (result.verdict, mark), f", {pair}")
        )
        for reason in result.reasons:
            console.print(Text(f"    - {reason.code}: {reason.message}", style="dim"))
    if r.reason:
        console.print(Text(f"  reason: {r.reason}", style="" if r.passed else "red"))


def _render_matrix(console: Console, records: list[ValidationRecord]) -> None:
    names = sorted({n for r in records for n in r.nodes})
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("SERVER \\ CLIENT", no_wrap=True)
    for name in names:
        table.add_column(name, no_wrap=True)
    by_pair = {r.nodes: r for r in records}
    for server in names:
        cells: list[Text] = [Text(server)]
        for client in names:
            r = by_pair.get((server, client))
            if r is None:
                cells.append(Text("-", style="dim"))
            elif r.passed:
                cells.append(Text(f"ok {_rate(r.bytes_per_second)}", style="green"))
            else:
                cells.append(Text(r.phase if r.phase != "done" else "failed", style="red"))
        table.add_row(*cells)
    console.print(table)
    passed = sum(r.passed for r in records)
    console.print(
        Text(
            f"{passed}/{len(records)} pairs passed",
            style="green" if passed == len(records) else "red",
        )
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value * 8 / 1e9:.1f} Gb/s"


def _us(r: ValidationRecord) -> str:
    return "-" if r.latency_p50_us is None else f"{r.latency_p50_us:.1f} µs"


def _typed(value: object, type_: Any) -> Any:
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as exc:
        raise ApiError(f"unexpected answer from the aggregator: {exc}") from exc


def _console() -> Console:
    return console_for(sys.stdout, os.environ)
