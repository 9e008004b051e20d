"""agent-stale counts silence from `max(last_seen, heard_since)`: a record loaded from KV
keeps its true (earlier process's) receive time, and this process's silence starts when it
could first have heard the node. The incremental engine finds the same as a full run."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from aggregator.cluster import NO_CLUSTER
from aggregator.fleet.state import NodeRecord
from aggregator.rules.descriptor import RuleInput
from aggregator.rules.engine.incremental import IncrementalRules
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.fleetpolicy import agent_stale_from, check_agent_stale
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS

T0 = 1_000_000.0
LIMIT = 30.0  # the default staleAfter


def _stale(last_seen: float, heard: dict[str, float], now: float) -> list[dict[str, object]]:
    fleet = {"n1": NodeRecord(name="n1", first_seen=last_seen, last_seen=last_seen)}
    given = RuleInput(fleet, (), NO_CLUSTER, now, DEFAULT_THRESHOLDS, MappingProxyType(heard))
    return [dict(f.evidence) for f in check_agent_stale(given)]


@pytest.mark.parametrize(
    ("heard", "now", "expected"),
    [
        pytest.param({}, T0 + 31, [{"last_seen": T0, "age_s": 31.0}], id="not-loaded-as-before"),
        pytest.param({"n1": T0 + 300}, T0 + 310, [], id="restart-is-not-silence"),
        pytest.param({"n1": T0 + 300}, T0 + 300 + LIMIT, [], id="heard-since-at-limit"),
        pytest.param(
            {"n1": T0 + 300},
            T0 + 331,
            [{"last_seen": T0, "age_s": 31.0, "heard_since": T0 + 300}],
            id="silent-since-heard",
        ),
        pytest.param(
            {"n1": T0 - 100},
            T0 + 31,
            [{"last_seen": T0, "age_s": 31.0}],
            id="a-message-since-heard",
        ),
        pytest.param(
            {"other": T0 + 300},
            T0 + 31,
            [{"last_seen": T0, "age_s": 31.0}],
            id="another-node-loaded",
        ),
    ],
)
def test_agent_stale_counts_from_the_later_of_last_seen_and_heard_since(
    heard: dict[str, float], now: float, expected: list[dict[str, object]]
) -> None:
    assert _stale(T0, heard, now) == expected


def test_due_time_is_a_lower_bound_of_the_reported_time() -> None:
    record = NodeRecord(name="n1", first_seen=T0, last_seen=T0)
    assert agent_stale_from(record, DEFAULT_THRESHOLDS) == T0 + LIMIT  # heard_since only later


def test_incremental_equals_a_full_run_across_heard_since() -> None:
    """Loaded at T0, heard from T0 + 300: nothing until 30 s later; then stale; a message
    clears it. Each call's findings equal `registry.evaluate`'s."""
    heard = MappingProxyType({"n1": T0 + 300})
    loaded = NodeRecord(name="n1", first_seen=T0, last_seen=T0)
    fresh = NodeRecord(name="n1", first_seen=T0, last_seen=T0 + 335)
    rules = IncrementalRules()
    seen = []
    for record, now in [(loaded, T0 + 301), (loaded, T0 + 329), (loaded, T0 + 331),
                        (fresh, T0 + 336)]:  # fmt: skip
        fleet = {"n1": record}
        found = rules.evaluate(fleet, (), NO_CLUSTER, now, heard_since=heard)
        assert found == evaluate(fleet, (), NO_CLUSTER, now, heard_since=heard)
        seen.append(sorted(f.rule for f in found if f.rule == "agent-stale"))
    assert seen == [[], [], ["agent-stale"], []]
