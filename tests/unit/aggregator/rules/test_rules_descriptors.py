"""The rule descriptors are the single source: the catalogue is the families' tuples in
order, every engine table and default setting is read off the descriptors, a descriptor
that contradicts itself is refused, and every check takes one frozen `RuleInput`."""

from __future__ import annotations

import dataclasses
import inspect
from typing import get_args

import pytest

from aggregator.cluster import NO_CLUSTER
from aggregator.rules import (
    adapterloss,
    attachments,
    clockskew,
    counters,
    dataquality,
    dra,
    fleetpolicy,
    links,
    pluginconfig,
    topology,
    versions,
)
from aggregator.rules.catalog import ALL_RULES, RULE_IDS, RULES, SEVERITY_ORDER
from aggregator.rules.descriptor import COUNTERS, SNAPSHOT, Family, Rule, RuleInput
from aggregator.rules.engine.registry import (
    CHECKS,
    COUNTER_KEYS,
    FLEET_RULES,
    NODE_RULES,
    PEER_RULES,
    READS,
    TIME_RULES,
    evaluate,
)
from aggregator.rules.finding import Finding
from aggregator.rules.peers import run
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS
from tests.support.rules_cases import T0, adapter, fleet_of, node

FAMILIES = (
    (topology, "topology"),
    (links, "links"),
    (counters, "counters"),
    (versions, "versions"),
    (fleetpolicy, "fleet"),
    (adapterloss, "fleet"),
    (pluginconfig, "fleet"),
    (attachments, "fleet"),
    (dra, "fleet"),
    (dataquality, "data"),
    (clockskew, "data"),
)
BY_ID = [pytest.param(rule, id=rule.id) for rule in ALL_RULES]


def _nothing(given: RuleInput) -> list[Finding]:
    return []


def test_the_catalogue_is_the_family_tuples_in_order_with_unique_ids() -> None:
    assert tuple(rule for module, _ in FAMILIES for rule in module.RULES) == ALL_RULES
    assert len(set(RULE_IDS)) == len(RULE_IDS) == len(ALL_RULES)
    assert tuple(RULES) == RULE_IDS and all(RULES[r.id] is r for r in ALL_RULES)
    assert {family for _, family in FAMILIES} == set(get_args(Family))
    for module, family in FAMILIES:
        assert {r.family for r in module.RULES} == {family}, module.__name__
    assert all(r.severity in SEVERITY_ORDER for r in ALL_RULES)


@pytest.mark.parametrize("rule", BY_ID)
def test_every_engine_table_is_read_off_the_descriptor(rule: Rule) -> None:
    assert (rule.id in NODE_RULES, rule.id in FLEET_RULES) == (
        (True, False) if rule.kind == "node" else (False, True)
    )
    assert PEER_RULES.get(rule.id) is rule.peer
    assert TIME_RULES.get(rule.id) is rule.due
    assert READS[rule.id] is rule.reads
    assert COUNTER_KEYS.get(rule.id) is rule.counter_keys
    assert CHECKS[rule.id] is rule.check
    assert DEFAULT_THRESHOLDS.of(rule.id) == rule.defaults


def test_counter_errors_has_a_default_limit_per_counter_family() -> None:
    assert RULES["counter-errors"].params.keys() == counters.COUNTER_FAMILIES.keys()


def test_the_engine_tables_keep_the_catalogue_order() -> None:
    assert tuple(r.id for r in ALL_RULES if r.peer is None) == NODE_RULES
    assert tuple(r.id for r in ALL_RULES if r.peer is not None) == FLEET_RULES


def test_the_kind_comes_from_the_descriptor() -> None:
    node_rule = Rule(id="x", family="links", severity="info", check=_nothing, reads=SNAPSHOT)
    assert node_rule.kind == "node" and node_rule.defaults == DEFAULT_THRESHOLDS.of("x")
    peer_rule = Rule.of_peers(links.RATE_MISMATCH, family="links", severity="warning",
                              reads=SNAPSHOT, for_s=5.0)  # fmt: skip
    assert (peer_rule.id, peer_rule.kind, peer_rule.peer) == (
        "rate-mismatch",
        "fleet",
        links.RATE_MISMATCH,
    )
    assert peer_rule.defaults.for_s == 5.0


def test_a_peer_rules_check_runs_its_steps_over_the_whole_fleet() -> None:
    fleet = fleet_of(node("a"), node("b"), node("c", adapter(rate=200.0))).fleet()
    given = RuleInput(fleet, (), NO_CLUSTER, T0, DEFAULT_THRESHOLDS)
    found = RULES["rate-mismatch"].check(given)
    assert found == run(links.RATE_MISMATCH, fleet, (), NO_CLUSTER)
    assert [(f.node, f.subject) for f in found] == [("c", "mlx5_0/1")]


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"reads": frozenset({"no_such_field"})}, id="unknown-field"),
        pytest.param({"counter_keys": frozenset({"counters/x"})}, id="counter-keys-on-snapshot"),
        pytest.param({"peer": links.MTU_MISMATCH}, id="peer-of-another-id"),
        pytest.param(
            {"peer": links.RATE_MISMATCH, "due": lambda record, thresholds: 0.0},
            id="due-fleet-rule",
        ),
    ],
)
def test_a_descriptor_that_contradicts_itself_is_refused(changes: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "id": "rate-mismatch", "family": "links", "severity": "warning", "check": _nothing,
        "reads": SNAPSHOT, **changes,
    }  # fmt: skip
    with pytest.raises(ValueError, match="rate-mismatch"):
        Rule(**fields)  # type: ignore[arg-type]


def test_counter_keys_belong_to_rules_reading_counters_alone() -> None:
    rule = Rule(id="x", family="counters", severity="warning", check=_nothing,
                reads=COUNTERS, counter_keys=frozenset({"counters/x"}))  # fmt: skip
    assert rule.counter_keys == frozenset({"counters/x"})


def test_rule_input_is_one_frozen_struct_of_six_fields() -> None:
    assert [f.name for f in dataclasses.fields(RuleInput)] == [
        "fleet", "policies", "cluster", "now", "thresholds", "heard_since",
    ]  # fmt: skip
    given = RuleInput({}, (), NO_CLUSTER, T0, DEFAULT_THRESHOLDS)
    assert given.heard_since == {}  # no record loaded from KV: receive times are this process's
    with pytest.raises(dataclasses.FrozenInstanceError):
        given.now = T0 + 1  # type: ignore[misc]


@pytest.mark.parametrize("rule", BY_ID)
def test_every_check_takes_one_rule_input(rule: Rule) -> None:
    (parameter,) = inspect.signature(rule.check).parameters.values()
    assert parameter.annotation in (RuleInput, "RuleInput")


def test_a_check_given_the_input_finds_what_evaluate_reports_for_it() -> None:
    scenario = fleet_of(node("n1", adapter(state="DOWN")), node("n2"))
    given = RuleInput(scenario.fleet(), (), NO_CLUSTER, T0, DEFAULT_THRESHOLDS)
    found = evaluate(given.fleet, now=T0)
    assert RULES["port-down"].check(given) == [f for f in found if f.rule == "port-down"]
