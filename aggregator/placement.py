"""Where Kubernetes lets a DaemonSet's pod run: a node's taints, a pod template's
tolerations, nodeSelector and required node affinity, read from API JSON, and the DaemonSet
controller's own verdict (pkg/controller/daemon: the template's `nodeName`, its nodeSelector
AND required node affinity, and no NoSchedule/NoExecute taint left untolerated once the
controller's automatic tolerations are added).

Pure: data in, data out; a malformed field reads as absent, never raises. Below
`aggregator.cluster` (whose Node and DaemonSet models carry these), so it imports neither.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

# The node fields a matchFields requirement may name (metav1.ObjectNameField): only the name.
NODE_NAME_FIELD: Final = "metadata.name"
REPELLING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})  # PreferNoSchedule never


class Taint(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    value: str = ""
    effect: str = ""  # NoSchedule, PreferNoSchedule, NoExecute

    def __str__(self) -> str:
        return (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )


class Toleration(msgspec.Struct, frozen=True, kw_only=True):
    key: str = ""  # "" with Exists: every key
    operator: str = ""  # "" is Equal
    value: str = ""
    effect: str = ""  # "": every effect


class Requirement(msgspec.Struct, frozen=True, kw_only=True):
    """One matchExpressions / matchFields entry of a nodeSelectorTerm."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()


class SelectorTerm(msgspec.Struct, frozen=True, kw_only=True):
    """One of `requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms` (ORed);
    inside it every expression and every field requirement must hold (ANDed)."""

    match_expressions: tuple[Requirement, ...] = ()
    match_fields: tuple[Requirement, ...] = ()


# The tolerations the DaemonSet controller adds to every pod it creates
# (pkg/controller/daemon/util AddOrUpdateDaemonPodTolerations): a node in trouble keeps its
# daemons, and a cordoned one still gets them.
DAEMON_TOLERATIONS: Final = (
    Toleration(key="node.kubernetes.io/not-ready", operator="Exists", effect="NoExecute"),
    Toleration(key="node.kubernetes.io/unreachable", operator="Exists", effect="NoExecute"),
    Toleration(key="node.kubernetes.io/disk-pressure", operator="Exists", effect="NoSchedule"),
    Toleration(key="node.kubernetes.io/memory-pressure", operator="Exists", effect="NoSchedule"),
    Toleration(key="node.kubernetes.io/pid-pressure", operator="Exists", effect="NoSchedule"),
    Toleration(key="node.kubernetes.io/unschedulable", operator="Exists", effect="NoSchedule"),
)
# ... and to host-network pods only (they need no pod network to start).
HOST_NETWORK_TOLERATION: Final = Toleration(
    key="node.kubernetes.io/network-unavailable", operator="Exists", effect="NoSchedule"
)


# --- the semantics ---------------------------------------------------------------------------


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """core/v1 Toleration.ToleratesTaint: an empty effect or key matches any; Exists
    ignores the value; Equal (or no operator) needs the same value; any other operator
    tolerates nothing."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator in ("", "Equal"):
        return toleration.value == taint.value
    return toleration.operator == "Exists"


def daemon_tolerations(
    tolerations: Iterable[Toleration], *, host_network: bool
) -> tuple[Toleration, ...]:
    """The template's tolerations plus those the DaemonSet controller adds to its pods."""
    added = (*DAEMON_TOLERATIONS, *((HOST_NETWORK_TOLERATION,) if host_network else ()))
    own = tuple(tolerations)
    return own + tuple(t for t in added if t not in own)


def untolerated(taints: Iterable[Taint], tolerations: tuple[Toleration, ...]) -> list[Taint]:
    """The NoSchedule/NoExecute taints no toleration tolerates (what keeps a pod off)."""
    return [
        taint
        for taint in taints
        if taint.effect in REPELLING_EFFECTS and not any(tolerates(t, taint) for t in tolerations)
    ]


def requirement_matches(requirement: Requirement, labels: Mapping[str, str]) -> bool | None:
    """A matchExpressions entry against a node's labels (apimachinery's label requirement);
    None when the requirement is invalid (the whole term is then skipped)."""
    op, values, key = requirement.operator, requirement.values, requirement.key
    if op in ("In", "NotIn"):
        if not values:
            return None
        if key not in labels:
            return op == "NotIn"
        return (labels[key] in values) == (op == "In")
    if op in ("Exists", "DoesNotExist"):
        if values:
            return None
        return (key in labels) == (op == "Exists")
    if op in ("Gt", "Lt"):
        if len(values) != 1 or (bound := _int64(values[0])) is None:
            return None
        have = _int64(labels[key]) if key in labels else None
        if have is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return None


def field_matches(requirement: Requirement, node_name: str) -> bool | None:
    """A matchFields entry: only `metadata.name` with In/NotIn and exactly one value is
    valid (component-helpers nodeaffinity); None otherwise."""
    if requirement.key != NODE_NAME_FIELD or len(requirement.values) != 1:
        return None
    if requirement.operator == "In":
        return requirement.values[0] == node_name
    if requirement.operator == "NotIn":
        return requirement.values[0] != node_name
    return None


def term_matches(term: SelectorTerm, node_name: str, labels: Mapping[str, str]) -> bool | None:
    """One nodeSelectorTerm; an empty term matches no node, an invalid one is None."""
    if not term.match_expressions and not term.match_fields:
        return False
    results = [
        *(requirement_matches(r, labels) for r in term.match_expressions),
        *(field_matches(r, node_name) for r in term.match_fields),
    ]
    if None in results:
        return None
    return all(results)


def affinity_matches(
    terms: tuple[SelectorTerm, ...] | None, node_name: str, labels: Mapping[str, str]
) -> bool:
    """Required node affinity: None (not set) matches every node; otherwise some valid term
    must match (the DaemonSet controller ignores the parse errors of invalid ones)."""
    if terms is None:
        return True
    return any(term_matches(t, node_name, labels) is True for t in terms)


class Fit(msgspec.Struct, frozen=True, kw_only=True):
    """Whether the DaemonSet controller puts a pod on the node, and if not, why."""

    runs: bool
    # nodeName, nodeSelector and affinity choose the node (False: not meant to run here);
    # selected but not running: a taint keeps it off.
    selected: bool
    why: str = ""  # empty when it runs
    taints: tuple[str, ...] = ()  # the untolerated taints, "key=value:Effect"


def daemon_fit(
    *,
    node_name: str,
    labels: Mapping[str, str],
    taints: Iterable[Taint],
    template_node: str | None,
    node_selector: Mapping[str, str],
    affinity: tuple[SelectorTerm, ...] | None,
    tolerations: Iterable[Toleration],
    host_network: bool,
) -> Fit:
    """The DaemonSet controller's "should a daemon pod be scheduled here" (its predicates:
    nodeName, nodeSelector AND required affinity, then the repelling taints)."""
    if template_node and template_node != node_name:
        return Fit(runs=False, selected=False, why=f"its template's nodeName is {template_node}")
    if any(labels.get(k) != v for k, v in node_selector.items()):
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(node_selector.items()))
        return Fit(
            runs=False, selected=False,
            why=f"its nodeSelector ({wanted}) does not match the node's labels",
        )  # fmt: skip
    if not affinity_matches(affinity, node_name, labels):
        return Fit(
            runs=False, selected=False, why="its required node affinity does not match the node"
        )
    left = untolerated(taints, daemon_tolerations(tolerations, host_network=host_network))
    if left:
        names = tuple(str(t) for t in left)
        why = f"it does not tolerate the node's taint {', '.join(names)}"
        return Fit(runs=False, selected=True, why=why, taints=names)
    return Fit(runs=True, selected=True)


# --- from API JSON -------------------------------------------------------------------------


def taints_from(raw: object) -> tuple[Taint, ...]:
    """A Node's spec.taints."""
    return tuple(
        Taint(key=key, value=_text(t.get("value")), effect=_text(t.get("effect")))
        for t in map(_mapping, _list(raw))
        if (key := _text(t.get("key")))
    )


def tolerations_from(raw: object) -> tuple[Toleration, ...]:
    """A pod template's spec.tolerations (tolerationSeconds does not decide placement).
    A non-object item is skipped: read as {} it would tolerate every taint with no value."""
    return tuple(
        Toleration(
            key=_text(t.get("key")),
            operator=_text(t.get("operator")),
            value=_text(t.get("value")),
            effect=_text(t.get("effect")),
        )
        for t in _list(raw)
        if isinstance(t, Mapping)
    )


def required_affinity_from(affinity: object) -> tuple[SelectorTerm, ...] | None:
    """spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution's terms;
    None when no required node affinity is set."""
    node_affinity = _mapping(_mapping(affinity).get("nodeAffinity"))
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(required, Mapping):
        return None
    return tuple(
        SelectorTerm(
            match_expressions=_requirements(term.get("matchExpressions")),
            match_fields=_requirements(term.get("matchFields")),
        )
        for term in map(_mapping, _list(required.get("nodeSelectorTerms")))
    )


def _requirements(raw: object) -> tuple[Requirement, ...]:
    return tuple(
        Requirement(
            key=_text(r.get("key")),
            operator=_text(r.get("operator")),
            values=tuple(v for v in _list(r.get("values")) if isinstance(v, str)),
        )
        for r in map(_mapping, _list(raw))
    )


def _int64(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64): an optional sign and decimal digits, in range."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body.isascii() or not body.isdigit():
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
