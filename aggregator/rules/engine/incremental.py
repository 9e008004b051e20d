"""Incremental rule evaluation: exactly `registry.evaluate`'s findings, recomputed only for
nodes whose record changed (records are immutable: changed = another object) and by the
rules reading a changed field (`READS`; counter rules only when a delta changed a key
they read, `COUNTER_KEYS`), for peers whose group facts moved
(aggregator.rules.peers), and for time rules' due nodes.

Pure: `now` is passed in. New policies, cluster labels or thresholds start over
(`starts_over` tells beforehand, so a caller can run that call off its event loop).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from itertools import compress
from operator import is_not
from typing import Final, cast

import msgspec
from msgspec.structs import astuple

from aggregator.cluster import NO_CLUSTER, ClusterView, policies_by_node
from aggregator.errors import AggregatorError
from aggregator.fleet.state import NodeRecord
from aggregator.rules.catalog import RULE_IDS
from aggregator.rules.counterbase import same_counter_inputs
from aggregator.rules.descriptor import NOT_LOADED, RuleInput
from aggregator.rules.engine.duetimes import DueNodes
from aggregator.rules.engine.peertally import PeerTally
from aggregator.rules.engine.registry import (
    BEFORE_DUE,
    CHECKS,
    CLUSTER_RULES,
    COUNTER_KEYS,
    NODE_RULES,
    PEER_RULES,
    READS,
    TIME_RULES,
    run_rule,
)
from aggregator.rules.engine.sortedfindings import SortedFindings
from aggregator.rules.finding import Finding
from aggregator.rules.peers import Peer, PeerRule
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS, Thresholds
from proto.policy import Policy

_FIELDS: Final = NodeRecord.__struct_fields__
_ALL_FIELDS: Final = frozenset(_FIELDS)  # this very object: the node came or went
UnitKey = tuple[str | None, str, bool]  # (node, or None for the fleet), rule, fallback


class Abandoned(AggregatorError):
    """`evaluate` gave up because its `abandon` callback said so; the next call starts over."""


def _dedup(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    seen: dict[tuple[str, str | None, str], Finding] = {}
    for f in findings:
        seen.setdefault(f.fingerprint, f)
    return tuple(seen.values())


def _same_labels(old: ClusterView, new: ClusterView) -> bool:
    """Rules read only the cluster's node labels (through policy selection)."""
    if old.present != new.present:
        return False
    if old.nodes is new.nodes:
        return True
    if old.nodes.keys() != new.nodes.keys():
        return False
    return all(node.labels == old.nodes[name].labels for name, node in new.nodes.items())


def _same_objects(old: ClusterView, new: ClusterView) -> bool:
    """The pods, NADs, IP pools, held addresses, DRA claims and devices the
    `CLUSTER_RULES` read (the watcher replaces each tuple only when it changed, so identity
    is the usual answer)."""
    return all(
        a is b or a == b
        for a, b in (
            (old.pods, new.pods),
            (old.attachments, new.attachments),
            (old.ip_pools, new.ip_pools),
            (old.held_addresses, new.held_addresses),
            (old.claims, new.claims),
            (old.dra_devices, new.dra_devices),
        )
    )


class IncrementalRules:
    """Call `evaluate` repeatedly with the same live fleet mapping; keeps what it needs."""

    def __init__(self) -> None:
        self._context: tuple[object, ...] | None = None
        self._records: dict[str, NodeRecord] = {}  # as last evaluated, in the fleet's order
        self._misaligned = False
        self._selecting: dict[str, tuple[Policy, ...]] = {}
        self._units: dict[UnitKey, tuple[Finding, ...]] = {}
        self._broken: dict[str, set[Hashable]] = {}  # rule -> nodes/groups it raised on
        self._failing: frozenset[str] = frozenset()
        self._enabled: frozenset[str] = frozenset()  # rules enabled by the thresholds
        self._peers: dict[str, PeerTally] = {}
        self._due: dict[str, DueNodes] = {}
        self._out = SortedFindings()
        self.rebuilds = 0  # full recomputations (first call, policies/cluster/thresholds)
        self._abandon: Callable[[], bool] = lambda: False
        self._heard_since: Mapping[str, float] = NOT_LOADED

    def evaluate(
        self,
        fleet: Mapping[str, NodeRecord],
        policies: tuple[Policy, ...] = (),
        cluster: ClusterView = NO_CLUSTER,
        now: float = 0.0,
        *,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
        heard_since: Mapping[str, float] = NOT_LOADED,
        abandon: Callable[[], bool] = lambda: False,
    ) -> list[Finding]:
        """What `registry.evaluate(fleet, policies, cluster, now, thresholds=...,
        heard_since=...)` returns.

        `heard_since` (RuleInput) is read only by time rules, which re-run for every due
        node on each call (their due times are lower bounds), so it is not context: a new
        mapping starts nothing over. `abandon` is asked between rules; when it answers
        True, raises `Abandoned`."""
        self._abandon = abandon
        self._heard_since = heard_since
        try:
            return self._evaluate(fleet, policies, cluster, now, thresholds)
        except BaseException:
            self._context = None  # half updated: start over next time
            raise

    def starts_over(
        self, policies: tuple[Policy, ...], cluster: ClusterView, thresholds: Thresholds
    ) -> bool:
        """Whether `evaluate` with these would recompute everything (first call, or new
        policies, cluster labels or thresholds) — or re-run the `CLUSTER_RULES` for every
        node (new pods, NADs or IP pools): either is worth a worker thread."""
        context = self._context
        if context is None or not self._same(context, policies, cluster, thresholds):
            return True
        return bool(CLUSTER_RULES) and not _same_objects(cast(ClusterView, context[1]), cluster)

    def pending(self, fleet: Mapping[str, NodeRecord]) -> int:
        """How many nodes changed (or came or went) since the last call: its cost."""
        records = self._records
        if len(records) == len(fleet) and not self._misaligned:
            # Pairwise, in C (see `_changed_fields`); one node came and another went: more.
            return sum(map(is_not, fleet.values(), records.values()))
        changed = sum(1 for name, record in fleet.items() if records.get(name) is not record)
        return changed + sum(1 for name in records if name not in fleet)

    def _check_abandon(self) -> None:
        if self._abandon():
            raise Abandoned("rule evaluation abandoned")

    def _evaluate(
        self,
        fleet: Mapping[str, NodeRecord],
        policies: tuple[Policy, ...],
        cluster: ClusterView,
        now: float,
        thresholds: Thresholds,
    ) -> list[Finding]:
        self._fleet, self._policies, self._cluster = fleet, policies, cluster
        self._now, self._thresholds = now, thresholds
        self._changed_units: dict[UnitKey, tuple[Finding, ...]] = {}
        before = self._context
        fresh = not self._same_context(policies, cluster, thresholds)
        # Pods, NADs or IP pools moved (labels did not): the rules reading them, everywhere.
        objects_moved = (
            not fresh
            and before is not None
            and not _same_objects(cast(ClusterView, before[1]), cluster)
        )
        if fresh:
            self._start_over()
            self._enabled = frozenset(r for r in RULE_IDS if thresholds.enabled(r))
            fields = dict.fromkeys(fleet, _ALL_FIELDS)
        else:
            fields = self._changed_fields(fleet)
        previous: dict[str, NodeRecord] = {}  # of nodes whose counters alone moved
        for name, moved in fields.items():
            record = fleet.get(name)
            if record is None:
                self._selecting.pop(name, None)
                continue
            if moved is not _ALL_FIELDS and "counters_held" in moved and name in self._records:
                previous[name] = self._records[name]
            self._records[name] = record
        if len(self._records) != len(fleet) or self._misaligned:
            self._records = dict(fleet)  # same nodes in the same order again

        groups: dict[frozenset[str], list[str]] = {}  # nodes by the fields that moved
        for name, moved in fields.items():
            groups.setdefault(moved, []).append(name)

        def touching(rule: str) -> set[str]:  # the changed nodes whose input to `rule` moved
            if objects_moved and rule in CLUSTER_RULES:
                return set(fleet)
            reads = READS[rule]
            names = {n for moved, of in groups.items() if moved == _ALL_FIELDS or moved & reads
                     for n in of}  # fmt: skip
            keys = COUNTER_KEYS.get(rule)
            if keys is not None and previous:  # a counter delta that left `keys` as they were
                names -= {n for n, old in previous.items()
                          if same_counter_inputs(old, fleet[n], keys)}  # fmt: skip
            return names

        enabled = self._enabled
        for rule in NODE_RULES:
            if rule in enabled and rule not in TIME_RULES:
                self._check_abandon()
                self._run_local(rule, touching(rule))
        for rule in TIME_RULES:
            if rule in enabled:
                self._check_abandon()
                self._run_timed(rule, touching(rule))
        for rule, peer_rule in PEER_RULES.items():
            if rule in enabled:
                self._check_abandon()
                self._run_peer(peer_rule, touching(rule), fresh)
        self._publish(enabled)
        return self._out.items()

    # -- what changed --------------------------------------------------------------------

    def _same_context(
        self, policies: tuple[Policy, ...], cluster: ClusterView, thresholds: Thresholds
    ) -> bool:
        old, self._context = self._context, (policies, cluster, thresholds)
        return self._same(old, policies, cluster, thresholds)

    @staticmethod
    def _same(
        old: tuple[object, ...] | None,
        policies: tuple[Policy, ...],
        cluster: ClusterView,
        thresholds: Thresholds,
    ) -> bool:
        if old is None:
            return False
        old_policies, old_cluster, old_thresholds = old
        return (
            (old_policies is policies or old_policies == policies)
            and (old_thresholds is thresholds or old_thresholds == thresholds)
            and _same_labels(cast(ClusterView, old_cluster), cluster)
        )

    def _start_over(self) -> None:
        self.rebuilds += 1
        self._records = dict(self._fleet)
        self._misaligned = False
        self._selecting.clear()
        for key in list(self._units):
            self._set_unit(key, ())
        self._broken = {}
        self._peers = {name: PeerTally(rule) for name, rule in PEER_RULES.items()}
        self._due = {rule: DueNodes() for rule in TIME_RULES}

    def _changed_fields(self, fleet: Mapping[str, NodeRecord]) -> dict[str, frozenset[str]]:
        """Changed node -> the record fields that changed (all: added or removed)."""
        records = self._records
        if len(records) == len(fleet):
            # Both dicts hold the same nodes in the same order, unless one came and another
            # went: a pairwise identity check is then exact and needs no lookups (one record
            # object is never stored under two names).
            candidates = list(compress(fleet, map(is_not, fleet.values(), records.values())))
        else:
            candidates = list(fleet)
        changed = {name for name in candidates if records.get(name) is not fleet[name]}
        self._misaligned = len(changed) != len(candidates)
        if len(records) != len(fleet) or any(name not in records for name in changed):
            changed |= records.keys() - fleet.keys()  # removed nodes
        fields: dict[str, frozenset[str]] = {}
        for name in changed:
            old, new = records.get(name), fleet.get(name)
            if old is None or new is None:
                fields[name] = _ALL_FIELDS
            else:
                fields[name] = frozenset(compress(_FIELDS, map(is_not, astuple(old), astuple(new))))
        return fields

    def _sub(self, names: Iterable[str]) -> tuple[dict[str, NodeRecord], ClusterView]:
        """The records of `names` and a cluster view holding only their labels, so that
        policy selection costs O(names), not O(cluster)."""
        fleet = {name: self._fleet[name] for name in names}
        cluster = self._cluster
        if cluster.present and len(fleet) < len(self._fleet):
            nodes = {name: cluster.nodes[name] for name in fleet if name in cluster.nodes}
            cluster = msgspec.structs.replace(cluster, nodes=nodes)
        return fleet, cluster

    # -- node-local rules ----------------------------------------------------------------

    def _run_local(self, rule: str, names: set[str]) -> None:
        """Re-run a node-local rule for `names` (all at once; node by node if it raises)."""
        broken = self._broken.setdefault(rule, set())
        for name in names:
            broken.discard(name)
            self._set_unit((name, rule, False), ())
        present = [name for name in names if name in self._fleet]
        if not present:
            return
        try:
            by_node = self._check_local(rule, present)
        except Exception:
            by_node = {}
            for name in present:  # find the nodes it fails on; keep the others
                try:
                    by_node |= self._check_local(rule, [name])
                except Exception:
                    broken.add(name)
        for name, found in by_node.items():
            self._set_unit((name, rule, False), _dedup(found))

    def _check_local(self, rule: str, names: list[str]) -> dict[str, list[Finding]]:
        fleet, cluster = self._sub(names)
        given = RuleInput(
            fleet, self._policies, cluster, self._now, self._thresholds, self._heard_since
        )
        by_node: dict[str, list[Finding]] = {}
        for f in CHECKS[rule](given):
            if f.node not in fleet:
                raise LookupError(f"{rule} reported {f.node!r}, not a node evaluated")
            by_node.setdefault(f.node, []).append(f)
        return by_node

    def _clear_local(self, rule: str, name: str) -> None:
        self._broken.setdefault(rule, set()).discard(name)
        self._set_unit((name, rule, False), ())

    def _run_timed(self, rule: str, changed: set[str]) -> None:
        due, when = self._due[rule], TIME_RULES[rule]
        for name in changed:
            self._clear_local(rule, name)
            record = self._fleet.get(name)
            due.reschedule(name, None if record is None else when(record, self._thresholds))
        waiting = due.advance(self._now)
        if rule in BEFORE_DUE:
            # Its findings before the due time stand until the record changes: re-run what
            # changed, what is due, and what the clock took back before its due time.
            self._run_local(rule, due.active | changed | waiting)
            return
        for name in waiting:
            self._clear_local(rule, name)
        self._run_local(rule, due.active)

    # -- peer rules ----------------------------------------------------------------------

    def _peer(self, name: str) -> Peer:
        selecting = self._selecting.get(name)
        if selecting is None:
            fleet, cluster = self._sub([name])
            selecting = policies_by_node(self._policies, fleet, cluster).get(name, ())
            self._selecting[name] = selecting
        return Peer(
            name=name, record=self._fleet[name], selecting=selecting, policies=self._policies
        )

    def _run_peer(self, rule: PeerRule, changed: set[str], fresh: bool) -> None:
        if not changed and not fresh:
            return  # no vote moved: its facts, judgements and conclusion stand
        tally, broken = self._peers[rule.rule], self._broken.setdefault(rule.rule, set())
        touched: set[Hashable] = set()
        for name in changed:
            broken.discard(name)
            touched |= tally.retract(name)
            self._set_unit((name, rule.rule, False), ())
            if name not in self._fleet:
                continue
            try:
                votes = list(rule.tally(self._peer(name)))
            except Exception:
                broken.add(name)
                continue
            touched |= tally.cast(name, votes)
        judge = {name for name in changed if name in tally.votes}
        for group in tally.settle(touched, broken):
            judge |= tally.members.get(group, set())
        for name in judge:
            broken.discard(name)
            try:
                found = rule.judge(self._peer(name), tally.votes[name], tally.facts)
            except Exception:
                broken.add(name)
                self._set_unit((name, rule.rule, False), ())
            else:
                self._set_unit((name, rule.rule, False), _dedup(found))
        broken.discard(("conclude",))
        try:
            found = rule.conclude(self._policies, tally.facts)
        except Exception:
            broken.add(("conclude",))
        else:
            self._set_unit((None, rule.rule, False), _dedup(found))

    # -- output --------------------------------------------------------------------------

    def _set_unit(self, key: UnitKey, found: tuple[Finding, ...]) -> None:
        old = self._units.get(key, ())
        if old == found:
            return
        self._changed_units.setdefault(key, old)
        if found:
            self._units[key] = found
        else:
            self._units.pop(key, None)

    def _publish(self, enabled: frozenset[str]) -> None:
        failing = frozenset(rule for rule, keys in self._broken.items() if keys and rule in enabled)
        given = RuleInput(self._fleet, self._policies, self._cluster, self._now,
                          self._thresholds, self._heard_since)  # fmt: skip
        for rule in failing:  # a rule that raised: its data-quality finding, as `evaluate`'s
            self._set_unit((None, rule, True), _dedup(run_rule(rule, given)))
        for rule in self._failing - failing:
            self._set_unit((None, rule, True), ())
        changed, self._changed_units = self._changed_units, {}

        def visible(key: UnitKey) -> bool:  # a failing rule shows only its fallback
            return key[2] == (key[1] in failing)

        moved = sum(len(old) + len(self._units.get(key, ())) for key, old in changed.items())
        if failing != self._failing or moved > len(self._out) / 4:
            self._failing = failing
            self._out.reset(f for key, found in self._units.items() if visible(key) for f in found)
            return
        for key, old in changed.items():
            if visible(key):
                for f in old:
                    self._out.remove(f)
                for f in self._units.get(key, ()):
                    self._out.add(f)
