"""Reconcile, the pure half: which device-plugin config each node should serve.

`plan(policies, fleet, cluster, previous=...)` compares what the policies want with what
the previous plan put in force and returns the actions that close the gap. A node selected
by two policies is a conflict: it gets no new config (the previous one stays). No I/O, no
clock: `aggregator.reconcile.apply` performs the actions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from aggregator.cluster import ClusterView, policies_by_node
from aggregator.fleet.state import NodeRecord
from proto.messages.config import DesiredConfig, DevicePluginConfig
from proto.policy import Policy


class PutDesiredConfig(msgspec.Struct, frozen=True, kw_only=True, tag="put"):
    node: str
    config: DesiredConfig
    policy: str


class DeleteDesiredConfig(msgspec.Struct, frozen=True, kw_only=True, tag="delete"):
    node: str


Action = PutDesiredConfig | DeleteDesiredConfig


class Conflict(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    policies: tuple[str, ...]  # sorted names of every policy selecting the node


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """The desired state after the actions are applied, and the actions themselves."""

    desired: dict[str, DesiredConfig] = msgspec.field(default_factory=dict)  # node -> in force
    # Highest generation ever handed to a node, kept after a delete so that a node selected
    # again never sees a generation it already reported as applied.
    generations: dict[str, int] = msgspec.field(default_factory=dict)
    assignments: dict[str, str] = msgspec.field(default_factory=dict)  # node -> policy name
    actions: tuple[Action, ...] = ()
    conflicts: tuple[Conflict, ...] = ()


EMPTY_PLAN = Plan()


def plan_from_stored(configs: Iterable[DesiredConfig]) -> Plan:
    """The plan that is in force when `configs` are what the config bucket holds."""
    desired = {c.node: c for c in configs}
    return Plan(desired=desired, generations={n: c.generation for n, c in desired.items()})


def plan(
    policies: tuple[Policy, ...],
    fleet: Mapping[str, NodeRecord],
    cluster: ClusterView,
    *,
    previous: Plan = EMPTY_PLAN,
) -> Plan:
    """Desired config per selected node; actions against `previous.desired`."""
    by_node = policies_by_node(policies, fleet.keys(), cluster)
    desired: dict[str, DesiredConfig] = {}
    generations = dict(previous.generations)
    assignments: dict[str, str] = {}
    conflicts: list[Conflict] = []
    actions: list[Action] = []
    for node in sorted(by_node):
        selecting = by_node[node]
        old = previous.desired.get(node)
        if len(selecting) > 1:
            names = tuple(sorted(p.metadata.name for p in selecting))
            conflicts.append(Conflict(node=node, policies=names))
            if old is not None:
                desired[node] = old  # never merged: the previous config stays in force
            continue
        policy = selecting[0]
        assignments[node] = policy.metadata.name
        wanted = policy.spec.rdma_shared_device_plugin
        if wanted is None:
            continue  # selected for its expectations only; any old config is deleted below
        config = _desired(node, wanted, old, generations)
        desired[node] = config
        generations[node] = config.generation
        if config is not old:
            actions.append(PutDesiredConfig(node=node, config=config, policy=policy.metadata.name))
    for node in sorted(previous.desired):
        if node not in desired:
            actions.append(DeleteDesiredConfig(node=node))
    return Plan(
        desired=desired,
        generations=generations,
        assignments=assignments,
        actions=tuple(actions),
        conflicts=tuple(conflicts),
    )


def _desired(
    node: str, wanted: DevicePluginConfig, old: DesiredConfig | None, generations: Mapping[str, int]
) -> DesiredConfig:
    if old is not None and old.device_plugin == wanted:
        return old
    generation = max(generations.get(node, 0), old.generation if old else 0) + 1
    return DesiredConfig(node=node, generation=generation, device_plugin=wanted)
