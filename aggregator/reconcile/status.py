"""Policy status, the pure half: per selected node whether its config is applied, its
resources really advertised and healthy, and the policy's conditions built from that.

"Advertised" is read from node allocatable when a cluster is present (what the scheduler
sees), from the agent's device-plugin status otherwise. No I/O, no clock: `now` is passed
in; `aggregator.reconcile.apply` writes the results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

import msgspec

from aggregator.cluster import ClusterView
from aggregator.fleet.state import NodeRecord
from aggregator.fleet.views import node_state
from aggregator.reconcile.nodelabels import DEFAULT_MAX_RELATION, relation_rank, worst_gpu_relation
from aggregator.reconcile.plan import Plan
from proto.dpconfig import resource_full_name
from proto.ibta import ACTIVE_STATES
from proto.policy import Policy

CONDITION_TYPES: Final = ("Ready", "Degraded", "ConfigApplied", "ResourcesAdvertised", "TopologyOK")
# A node's state, and the reason code an Event carries when a node enters it.
NodeStateName = Literal["Ready", "Stale", "Conflict", "ConfigPending", "NotAdvertised", "Unhealthy"]
REASONS: Final[dict[str, str]] = {
    "Ready": "NodeReady",
    "Stale": "NodeStale",
    "Conflict": "PolicyConflict",
    "ConfigPending": "ConfigPending",
    "NotAdvertised": "ResourceNotAdvertised",
    "Unhealthy": "NoHealthyDevice",
}
ConditionStatus = Literal["True", "False", "Unknown"]


class NodeStatus(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    state: NodeStateName
    reason: str  # the code of `state` (REASONS), or AllocatableZero
    message: str
    stale: bool
    configured: bool
    advertising: bool
    healthy: bool
    topology_ok: bool
    desired_generation: int | None = None
    applied_generation: int | None = None
    resources: dict[str, int] = msgspec.field(default_factory=dict)  # resource -> capacity


class Condition(msgspec.Struct, frozen=True, kw_only=True):
    type: str
    status: ConditionStatus
    reason: str
    message: str = ""


class Summary(msgspec.Struct, frozen=True, kw_only=True):
    selected: int = 0
    configured: int = 0
    advertising: int = 0
    healthy: int = 0
    ready: int = 0
    stale: int = 0
    conflicts: int = 0


class PolicyStatus(msgspec.Struct, frozen=True, kw_only=True):
    policy: str
    conditions: tuple[Condition, ...]
    summary: Summary
    nodes: tuple[NodeStatus, ...]
    errors: tuple[str, ...] = ()  # policy-document errors (the last good version is in force)


class NodeChange(msgspec.Struct, frozen=True, kw_only=True):
    """One node of one policy changed state: becomes a Kubernetes Event."""

    policy: str
    node: str
    old: str | None  # None: newly selected
    new: str | None  # None: no longer selected
    reason: str
    message: str


def _capacity(value: str | None) -> int:
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def node_status(
    policy: Policy,
    node: str,
    record: NodeRecord | None,
    plan: Plan,
    cluster: ClusterView,
    *,
    now: float,
    stale_after: float,
    wanted: list[str] | None = None,  # _wanted(policy), computed once per policy
    conflicted: frozenset[str] | None = None,  # nodes of plan.conflicts, likewise
) -> NodeStatus:
    desired = plan.desired.get(node)
    if wanted is None:
        wanted = _wanted(policy)
    if conflicted is None:
        conflicted = frozenset(c.node for c in plan.conflicts)
    dp = record.device_plugin if record is not None else None
    applied = dp.config_generation if dp is not None else None
    agent = {r.name: r for r in dp.resources} if dp is not None else {}
    stale = record is None or node_state(record, now, stale_after) == "stale"
    configured = desired is None or (applied is not None and applied >= desired.generation)
    capacities: dict[str, int] = {}
    zero_alloc: list[str] = []
    for name in wanted:
        said = agent[name].advertised if name in agent else 0
        if cluster.present:
            cnode = cluster.nodes.get(node)
            capacities[name] = _capacity(cnode.allocatable.get(name) if cnode else None)
            if capacities[name] == 0 and said > 0:
                zero_alloc.append(f"{name} allocatable 0 while the agent advertises {said}")
        else:
            capacities[name] = said
    advertising = configured and all(c > 0 for c in capacities.values())
    if wanted:
        healthy = all(name in agent and agent[name].healthy > 0 for name in wanted)
    else:
        snap = record.snapshot if record else None
        healthy = snap is not None and any(
            p.state in ACTIVE_STATES for d in snap.devices for p in d.ports
        )
    topology_ok, topology_msg = _topology(policy, record)
    state: NodeStateName
    if node in conflicted:
        state, message = "Conflict", "selected by more than one policy; previous config kept"
    elif stale:
        state, message = "Stale", "no message from the agent" if record is None else "agent silent"
    elif not configured:
        state = "ConfigPending"
        message = (
            f"agent applied generation {applied}, desired {desired.generation if desired else 0}"
        )
    elif not advertising:
        state = "NotAdvertised"
        message = "; ".join(zero_alloc) or ", ".join(
            f"{n} capacity 0" for n, c in capacities.items() if c == 0
        )
    elif not healthy:
        state, message = "Unhealthy", "no healthy device"
    else:
        state, message = "Ready", "resources advertised and healthy"
    reason = "AllocatableZero" if state == "NotAdvertised" and zero_alloc else REASONS[state]
    if not topology_ok:
        message = f"{message}; {topology_msg}"
    return NodeStatus(
        node=node,
        state=state,
        reason=reason,
        message=message,
        stale=stale,
        configured=configured,
        advertising=advertising,
        healthy=healthy,
        topology_ok=topology_ok,
        desired_generation=desired.generation if desired else None,
        applied_generation=applied,
        resources=capacities,
    )


def _wanted(policy: Policy) -> list[str]:
    config = policy.spec.rdma_shared_device_plugin
    return [resource_full_name(rc) for rc in config.config_list] if config else []


def _topology(policy: Policy, record: NodeRecord | None) -> tuple[bool, str]:
    snap = record.snapshot if record else None
    if snap is None:
        return True, ""
    limit = policy.spec.expect.max_gpu_nic_relation or DEFAULT_MAX_RELATION
    worst = worst_gpu_relation(snap)
    if worst is None or relation_rank(worst[1]) <= relation_rank(limit):
        return True, ""
    return False, f"GPU {worst[0]} best NIC relation {worst[1]} exceeds {limit}"


def policy_status(
    policy: Policy,
    plan: Plan,
    fleet: Mapping[str, NodeRecord],
    cluster: ClusterView,
    *,
    now: float,
    stale_after: float,
    errors: tuple[str, ...] = (),
) -> PolicyStatus:
    name = policy.metadata.name
    selected = sorted(
        {n for n, p in plan.assignments.items() if p == name}
        | {c.node for c in plan.conflicts if name in c.policies}
    )
    wanted, conflicted = _wanted(policy), frozenset(c.node for c in plan.conflicts)
    nodes = tuple(
        node_status(
            policy,
            n,
            fleet.get(n),
            plan,
            cluster,
            now=now,
            stale_after=stale_after,
            wanted=wanted,
            conflicted=conflicted,
        )
        for n in selected
    )
    live = [s for s in nodes if not s.stale and s.state != "Conflict"]
    summary = Summary(
        selected=len(nodes),
        configured=sum(s.configured for s in live),
        advertising=sum(s.advertising for s in live),
        healthy=sum(s.healthy for s in live),
        ready=sum(s.state == "Ready" for s in live),
        stale=sum(s.stale for s in nodes),
        conflicts=sum(s.state == "Conflict" for s in nodes),
    )
    return PolicyStatus(
        policy=name,
        conditions=_conditions(nodes, live, errors),
        summary=summary,
        nodes=nodes,
        errors=errors,
    )


def _names(statuses: list[NodeStatus], limit: int = 5) -> str:
    shown = ", ".join(s.node for s in statuses[:limit])
    return shown + (f" and {len(statuses) - limit} more" if len(statuses) > limit else "")


def _last(message: str) -> str:
    return message.rpartition("; ")[2]


def _cond(type_: str, ok: bool, good: str, bad: str, message: str) -> Condition:
    return Condition(
        type=type_,
        status="True" if ok else "False",
        reason=good if ok else bad,
        message="" if ok else message,
    )


def _conditions(
    nodes: tuple[NodeStatus, ...], live: list[NodeStatus], errors: tuple[str, ...]
) -> tuple[Condition, ...]:
    pending = [s for s in live if not s.configured]
    dark = [s for s in live if s.configured and not s.advertising]
    zero = [s for s in dark if s.reason == "AllocatableZero"]
    topo = [s for s in live if not s.topology_ok]
    not_ready = [s for s in nodes if s.state != "Ready"]
    applied = _cond(
        "ConfigApplied",
        not pending,
        "AllApplied",
        "ConfigPending",
        f"waiting for {_names(pending)}",
    )
    advertised = _cond(
        "ResourcesAdvertised",
        not dark,
        "AllAdvertised",
        "AllocatableZero" if zero else "NotAdvertised",
        "; ".join(f"{s.node}: {s.message}" for s in (zero or dark)[:5]),
    )
    topology = _cond(
        "TopologyOK",
        not topo,
        "WithinLimit",
        "RelationTooFar",
        "; ".join(f"{s.node}: {_last(s.message)}" for s in topo[:5]),
    )
    live_ready = [s for s in live if s.state == "Ready"]
    if not nodes:
        ready = Condition(
            type="Ready",
            status="False",
            reason="NoNodesSelected",
            message="the node selector matches no node",
        )
    else:
        ok = len(live_ready) == len(live) and not any(s.state == "Conflict" for s in nodes)
        ready = _cond(
            "Ready",
            ok and bool(live),
            "AllNodesReady",
            not_ready[0].reason if not_ready else "NoLiveNodes",
            f"not ready: {_names(not_ready)}",
        )
    problems = [*(f"invalid policy: {e}" for e in errors)]
    problems += [f"{s.node}: {s.state}" for s in not_ready[:5]]
    degraded_reason = (
        "InvalidPolicy" if errors else not_ready[0].reason if not_ready else "AsExpected"
    )
    degraded = Condition(
        type="Degraded",
        status="True" if problems or topo else "False",
        reason=degraded_reason if problems or not topo else "RelationTooFar",
        message="; ".join(problems or [c.message for c in (topology,) if topo]),
    )
    return (ready, degraded, applied, advertised, topology)


def status_changes(old: PolicyStatus | None, new: PolicyStatus) -> tuple[NodeChange, ...]:
    """Node state transitions between two statuses of one policy (old None: all new)."""
    before = {s.node: s for s in old.nodes} if old is not None else {}
    after = {s.node: s for s in new.nodes}
    changes: list[NodeChange] = []
    for node in sorted(before.keys() | after.keys()):
        b, a = before.get(node), after.get(node)
        if a is not None and (b is None or b.state != a.state):
            changes.append(
                NodeChange(
                    policy=new.policy,
                    node=node,
                    old=b.state if b else None,
                    new=a.state,
                    reason=a.reason,
                    message=a.message,
                )
            )
        elif a is None and b is not None:
            changes.append(
                NodeChange(
                    policy=new.policy,
                    node=node,
                    old=b.state,
                    new=None,
                    reason="NodeUnselected",
                    message="no longer selected",
                )
            )
    return tuple(changes)


def invalid_status(name: str, error: str) -> PolicyStatus:
    """The status of a policy object that never had a valid version: nothing is applied."""
    unknown = [
        Condition(type=t, status="Unknown", reason="InvalidPolicy", message=error)
        for t in ("ConfigApplied", "ResourcesAdvertised", "TopologyOK")
    ]
    return PolicyStatus(
        policy=name,
        conditions=(
            Condition(type="Ready", status="False", reason="InvalidPolicy", message=error),
            Condition(type="Degraded", status="True", reason="InvalidPolicy", message=error),
            *unknown,
        ),
        summary=Summary(),
        nodes=(),
        errors=(error,),
    )
