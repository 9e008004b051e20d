"""`nicfleetctl claim explain`: why a ResourceClaim is pending — which node could allocate
it and, for every other node, which request fails and why.

Owns reading the files (claim, DeviceClasses, ResourceSlices as kubectl prints them), the
time limit and the exit codes; the decision is aggregator.dra.explain (pure). Selectors
run in a child process that is killed at --timeout: the CEL library has no cost limit and
holds the GIL, so nothing else could stop an expensive expression.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final, Literal

import click
import yaml

from aggregator.ctl.client import AggregatorClient, ApiError, BadInput
from aggregator.dra import builtin, celenv
from aggregator.dra.explain import Explanation, explain
from aggregator.dra.objects import (
    Claim,
    Device,
    DeviceClass,
    InvalidObject,
    parse_claim,
    parse_class,
    parse_slice,
    slice_documents,
)
from proto.runtime.cliopts import output_option

MAX_FILE: Final = 16 * 1024 * 1024
MAX_DOCUMENTS: Final = 10_000
MAX_DEPTH: Final = 64  # a ResourceSlice is about 8 deep
SLICES_PATH: Final = "/api/v1/dra/slices"
DEFAULT_TIMEOUT: Final = 10.0
EPILOG: Final = """\b
Exit codes:
  0  some node can allocate the claim
  1  no node can (or no slice bound to a node was found)
  2  bad input: unreadable file, invalid object (file and field named), a CEL selector
     that does not compile, a DeviceClass not given, or evaluation past --timeout
  3  the aggregator could not be reached (without --slices)

\b
The classes nicfleet ships (deploy/dra) are known; give other drivers' classes with
--class (kubectl get deviceclass gpu.nvidia.com -o yaml > gpu.yaml). Devices already
allocated to other claims are not known here."""

# The C loader when PyYAML has it: a 16 MiB file in a second, not ten.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_documents(path: Path) -> list[tuple[object, str]]:
    """The YAML/JSON documents of a file, each with where it came from; empty ones dropped."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE:
            raise BadInput(f"{path}: {size} bytes exceeds {MAX_FILE}")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise BadInput(f"{path}: cannot read: {reason}") from exc
    try:
        _check_depth(text, path)
        docs = []
        for i, doc in enumerate(yaml.load_all(text, Loader=_Loader)):
            if i >= MAX_DOCUMENTS:
                raise BadInput(f"{path}: more than {MAX_DOCUMENTS} documents")
            if doc is not None:
                docs.append((doc, f"{path}: document {i + 1}"))
        return docs
    except yaml.YAMLError as exc:
        raise BadInput(f"{path}: not YAML: {exc}") from exc


def _check_depth(text: str, path: Path) -> None:
    """Refuse nesting deeper than MAX_DEPTH before building anything: libyaml's composer
    recurses in C, and a deeply nested file crashes the process instead of raising."""
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise BadInput(f"{path}: nested deeper than {MAX_DEPTH} levels")
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            depth -= 1


def load_claim(path: Path) -> Claim:
    docs = read_documents(path)
    if len(docs) != 1:
        raise BadInput(
            f"{path}: expected one ResourceClaim or ResourceClaimTemplate, "
            f"got {len(docs)} documents"
        )
    try:
        return parse_claim(*docs[0])
    except InvalidObject as exc:
        raise BadInput(str(exc)) from exc


def load_classes(paths: Sequence[Path]) -> dict[str, DeviceClass]:
    """The shipped classes, then the files' (a file's class of the same name wins)."""
    classes = {c.name: c for c in builtin.CLASSES}
    for path in paths:
        for doc, where in read_documents(path):
            try:
                cls = parse_class(doc, where)
            except InvalidObject as exc:
                raise BadInput(str(exc)) from exc
            classes[cls.name] = cls
    return classes


def parse_slices(docs: Sequence[tuple[object, str]]) -> list[Device]:
    devices: list[Device] = []
    try:
        for doc, where in docs:
            for item, at in slice_documents(doc, where):
                devices.extend(parse_slice(item, at))
    except InvalidObject as exc:
        raise BadInput(str(exc)) from exc
    return devices


def fetch_slices(server: str) -> list[Device]:
    with AggregatorClient(server) as client:
        try:
            body = client.get_all(SLICES_PATH, {})
        except ApiError as exc:
            raise BadInput(
                f"{exc.format_message()}\nThis aggregator does not serve {SLICES_PATH}: give the "
                "slices with --slices FILE (kubectl get resourceslices -o yaml > slices.yaml)"
            ) from exc
    items = body.get("items")
    return parse_slices([({"kind": "List", "items": items}, f"{server}{SLICES_PATH}")])


def _child(
    conn: Connection, claim: Claim, classes: dict[str, DeviceClass], devices: list[Device]
) -> None:
    last = ""

    def progress(what: str) -> None:
        nonlocal last
        if what != last:
            last = what
            conn.send(("progress", what))

    try:
        conn.send(("done", explain(claim, classes, devices, progress=progress)))
    except (InvalidObject, celenv.CelCompileError) as exc:
        conn.send(("bad", str(exc)))
    finally:
        conn.close()


def explain_within(
    claim: Claim, classes: dict[str, DeviceClass], devices: list[Device], timeout: float
) -> Explanation:
    """`explain` in a child process, killed after `timeout` seconds (BadInput naming the
    selector that was running)."""
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(theirs, claim, classes, devices), daemon=True)
    child.start()
    theirs.close()
    deadline = time.monotonic() + timeout
    running = ""
    try:
        while (left := deadline - time.monotonic()) > 0 and ours.poll(left):
            try:
                kind, value = ours.recv()
            except EOFError:
                raise BadInput(f"the explanation stopped (exit {child.exitcode})") from None
            if kind == "progress":
                running = value
            elif kind == "bad":
                raise BadInput(value)
            else:
                assert isinstance(value, Explanation)
                return value
        raise BadInput(
            f"evaluation took longer than --timeout {timeout:g}s, "
            f"running {running or 'nothing yet'}"
            " (too expensive: the API server would refuse it by CEL cost)"
        )
    finally:
        ours.close()
        if child.is_alive():
            child.kill()
        child.join()


def render_table(explanation: Explanation) -> str:
    rows = [("NODE", "REQUEST", "RESULT", "WHY")]
    for node in explanation.nodes:
        for r in node.requests:
            result = "ok" if r.ok and node.ok else ("ok alone" if r.ok else "fails")
            rows.append((node.node, r.request, result, r.why))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)]
        lines.append("  ".join([*cells, row[3]]).rstrip())
    return "\n".join(lines)


def to_json(explanation: Explanation) -> dict[str, Any]:
    return {**asdict(explanation), "allocatable": explanation.allocatable}


@click.group()
def claim() -> None:
    """Dynamic Resource Allocation claims: why one is pending."""


@claim.command(epilog=EPILOG)
@click.option(
    "-f",
    "--filename",
    "claim_file",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="A ResourceClaim or ResourceClaimTemplate (YAML or JSON).",
)
@click.option(
    "--class",
    "class_files",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="DeviceClass YAML (one or more documents; repeatable) for classes nicfleet does not ship.",
)
@click.option(
    "--slices",
    "slice_files",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="ResourceSlices as `kubectl get resourceslices -o yaml` prints them (a List or "
    f"multi-document YAML; repeatable). Without it, the aggregator's {SLICES_PATH}.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1, max=600),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds the CEL selectors may take in all.",
)
@output_option("table", "json", help="Table per node and request, or JSON.")
@click.pass_obj
def explain_command(
    server: str,
    claim_file: Path,
    class_files: tuple[Path, ...],
    slice_files: tuple[Path, ...],
    timeout: float,
    output: Literal["table", "json"],
) -> None:
    """Evaluate a claim's device requests (DeviceClass and CEL selectors, counts,
    firstAvailable, matchAttribute) against ResourceSlices and say per node what fails;
    exit 0 when some node can allocate it, 1 when none can."""
    parsed = load_claim(claim_file)
    classes = load_classes(class_files)
    if slice_files:
        devices = parse_slices([d for path in slice_files for d in read_documents(path)])
    else:
        devices = fetch_slices(server)
    explanation = explain_within(parsed, classes, devices, timeout)
    if output == "json":
        click.echo(json.dumps(to_json(explanation), indent=2, sort_keys=True))
    elif explanation.nodes:
        click.echo(render_table(explanation))
        for note in explanation.notes:
            click.echo(f"Note: {note}.", err=True)
    if not explanation.nodes:
        click.echo("No ResourceSlice bound to a node: no device to allocate.", err=True)
    elif not explanation.allocatable:
        click.echo(f"No node can allocate claim {explanation.claim or claim_file}.", err=True)
    if not explanation.allocatable:
        raise SystemExit(1)


explain_command.name = "explain"
