"""Typo-proof name filters: `findings --node/--rule`, `alerts --node/--rule`, `resources
--node/--name`. A filter naming something the aggregator does not know exits 1 with close
matches, instead of an empty list that reads as all-clear.

`unknown_name` (pure) decides and words the error; `add_name_checks` wraps a command so the
check runs once before it (also before `--watch` and `--follow`). Known names are what the
server lists — nodes, and the names in the command's own unfiltered answer — plus, for
rules, this nicfleetctl's rule catalog: a name in none of them matches nothing.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

import click

from aggregator.ctl.client import AggregatorClient, ApiError, AuthRefused, CtlError, Unreachable
from aggregator.rules.catalog import RULE_IDS
from proto.subjects import InvalidNodeName, validate_node_name

Kind = Literal["node", "rule", "resource"]
RESOURCES_PATH: Final = "/api/v1/resources"
# What the API accepts (aggregator/api/alerts.py, chain.py); anything else it refuses itself.
_RULE: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_RESOURCE: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
FLEET_NODE: Final = "_fleet"  # findings/alerts: the fleet-wide ones
MAX_SUGGESTIONS: Final = 3
CUTOFF: Final = 0.5  # difflib ratio; what node suggestions use everywhere in nicfleetctl
# Findings of the NicClusterPolicy audit carry these ids; they are not in the rule registry
# (aggregator.reconcile.nvidia.AUDIT_RULES, which nicfleetctl may not import; a test keeps
# the two equal).
AUDIT_RULE_IDS: Final = (
    "nvidia-policy-invalid",
    "nvidia-policy-nicfleet-differs",
    "nvidia-policy-section",
    "nvidia-rdma-netns-exclusive",
    "selector-matches-nothing",
)
_WHERE: Final[dict[Kind, str]] = {
    "node": "`nicfleetctl nodes` lists them",
    "rule": "docs/rules.md lists every rule",
    "resource": "`nicfleetctl resources` lists them",
}


class UnknownName(ApiError):
    """A filter names no node, rule or resource the aggregator knows (exit 1). Not retried
    by `--watch`: a typo does not heal."""

    def __init__(self, kind: Kind, name: str, suggestions: tuple[str, ...], known: int) -> None:
        self.kind, self.name, self.suggestions = kind, name, suggestions
        message = f"unknown {kind} {name!r}"
        if suggestions:
            message += f"; did you mean: {', '.join(suggestions)}?"
        elif known == 0:
            message += f"; the aggregator knows no {kind} yet ({_WHERE[kind]})"
        else:
            message += f"; none of the {known} known {kind}s is close ({_WHERE[kind]})"
        super().__init__(message)


def unknown_name(kind: Kind, name: str, known: Collection[str]) -> UnknownName | None:
    """None when `name` is known; else the error, with up to 3 close matches."""
    if name in known:
        return None
    names = sorted(k for k in known if k != FLEET_NODE)  # `_fleet` is a filter, no name
    close = difflib.get_close_matches(name, names, n=MAX_SUGGESTIONS, cutoff=CUTOFF)
    return UnknownName(kind, name, tuple(close), len(names))


@dataclass(frozen=True)
class Filter:
    """One name option of a command: its parameter, what it names, and the list path whose
    unfiltered answer's items carry such names in `field`."""

    param: str
    kind: Kind
    path: str
    field: str


FINDINGS: Final = (
    Filter("node", "node", "/api/v1/findings", "node"),
    Filter("rule", "rule", "/api/v1/findings", "rule"),
)
ALERTS: Final = (
    Filter("node", "node", "/api/v1/alerts", "node"),
    Filter("rule", "rule", "/api/v1/alerts", "rule"),
)
RESOURCES: Final = (
    Filter("node", "node", RESOURCES_PATH, "nodes"),
    Filter("name", "resource", RESOURCES_PATH, "name"),
)


def check_filters(
    client: AggregatorClient, filters: Iterable[Filter], given: dict[str, Any]
) -> None:
    """Raise `UnknownName` for the first given filter value the server does not know. Asks
    the server only when a value is not known locally (`_fleet`, a catalogued rule, a
    listed node), and each list at most once."""
    listed: dict[str, list[dict[str, Any]]] = {}

    def items(path: str) -> list[dict[str, Any]]:
        if path not in listed:
            body = client.get_fleet(path, {}, key=_identity)
            listed[path] = [i for i in body.get("items") or () if isinstance(i, dict)]
        return listed[path]

    for f in filters:
        value = given.get(f.param)
        if not isinstance(value, str) or not _well_formed(f.kind, value):
            continue  # a malformed name is the server's 400 (exit 2), with its own message
        known: set[str] = set()
        if f.kind == "node":
            if f.path != RESOURCES_PATH:
                known.add(FLEET_NODE)
            if value not in known:
                known.update(_node_names(client))
        elif f.kind == "rule":
            known.update(RULE_IDS, AUDIT_RULE_IDS)
        if value not in known:
            known.update(_names(items(f.path), f.field))
        error = unknown_name(f.kind, value, known)
        if error is not None:
            raise error


def _well_formed(kind: Kind, value: str) -> bool:
    if kind == "node":
        try:
            validate_node_name(value)
        except InvalidNodeName:
            return value == FLEET_NODE
        return True
    return bool((_RULE if kind == "rule" else _RESOURCE).fullmatch(value))


def _node_names(client: AggregatorClient) -> list[str]:
    """The node list; empty when the server does not serve one (a partial API): the
    unfiltered answer's names still count."""
    try:
        return client.node_names()
    except (Unreachable, AuthRefused):
        raise
    except CtlError:
        return []


def _names(items: Iterable[dict[str, Any]], field: str) -> set[str]:
    """The names in a list's items: `field` as a string, or the `node` of each entry of a
    list under `field` (a resource's per-node rows)."""
    names: set[str] = set()
    for item in items:
        value = item.get(field)
        if isinstance(value, str):
            names.add(value)
        elif isinstance(value, list):
            names.update(str(v["node"]) for v in value if isinstance(v, dict) and "node" in v)
    return names


def _identity(item: dict[str, Any]) -> str:
    return repr(sorted(item.items()))


def add_name_checks(command: click.Command, filters: tuple[Filter, ...]) -> click.Command:
    """Run `check_filters` on the command's name options before the command itself."""
    callback = command.callback
    assert callback is not None

    @functools.wraps(callback)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if any(isinstance(kwargs.get(f.param), str) for f in filters):
            _check(click.get_current_context().obj, filters, kwargs)
        return callback(*args, **kwargs)

    command.callback = wrapped
    return command


def _check(server: str, filters: tuple[Filter, ...], given: dict[str, Any]) -> None:
    with AggregatorClient(server) as client:
        try:
            check_filters(client, filters, given)
        except (Unreachable, AuthRefused):
            return  # the command's own request says so, with its own advice
