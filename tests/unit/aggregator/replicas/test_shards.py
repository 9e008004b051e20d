"""Sharded aggregation, pure parts: the partition function matches nats-server's
(checked against a real server in tests/integration/replicas/test_shards.py), rendezvous plans are
stable, and replicas judging their own nodes against merged per-shard vote counts find
exactly what one process over the whole fleet finds (property test)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from aggregator.cluster import NO_CLUSTER
from aggregator.fleet.state import Fleet
from aggregator.replicas.owner import node_subject_of, replica_id
from aggregator.replicas.partitions import ShardSettings, live_replicas, owner, partition_of, plan
from aggregator.replicas.summaries import ShardRules, hashable, merge_remote
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.finding import Finding
from proto import subjects
from proto.codec import decode, encode
from proto.messages.shards import ShardSummary, ShardVote
from proto.policy import Policy
from tests.support.rules_cases import T0, adapter, batch, node, policy_doc, port_counters
from tests.unit.aggregator.rules.test_rules_incremental import POLICIES, snapshots

NODES = tuple(f"gpu-{i:03d}" for i in range(12))
REPLICAS = ("r-a", "r-b", "r-c")
PARTS = 8


def test_partition_of_is_fnv1a_mod_partitions() -> None:
    # FNV-1a 32 of "a" is 0xe40c292c; of "" the offset basis.
    assert partition_of("a", 1 << 32 - 1) == 0xE40C292C % (1 << 31)
    assert partition_of("", 7) == 2166136261 % 7
    assert {partition_of(n, 5) for n in NODES} <= set(range(5))


def test_plan_covers_every_partition_once_and_moves_only_the_dead_share() -> None:
    full = plan(30, REPLICAS)
    assert sorted(p for parts in full.values() for p in parts) == list(range(30))
    assert all(full[r] for r in REPLICAS)  # 30 partitions: everybody gets some
    survivors = plan(30, REPLICAS[:2])
    for replica in REPLICAS[:2]:
        assert full[replica] <= survivors[replica]  # kept everything it had
    assert survivors["r-a"] | survivors["r-b"] == frozenset(range(30))
    assert owner(3, ()) is None
    assert plan(4, ()) == {}


def test_live_replicas_by_heartbeat_age() -> None:
    assert live_replicas({"a": 10.0, "b": 3.0}, now=12.0, ttl_s=6.0) == {"a"}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"partitions": -1}, "partitions"), ({"heartbeat_s": 2.0, "ttl_s": 1.0}, "ttl_s")],
)
def test_shard_settings_bad_input_names_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ShardSettings(**kwargs)  # type: ignore[arg-type]


def test_summary_survives_the_wire_and_foreign_partitions_are_dropped() -> None:
    summary = ShardSummary(
        replica="r-b",
        partitions=(1, 2),
        votes=(
            ShardVote(1, "fw-skew", "0x1021", "28.41.1000", 3),
            ShardVote(2, "rail-mismatch", 0, ("x", None, 1), 2),
            ShardVote(5, "fw-skew", "0x1021", "28.39.1002", 9),  # p5 belongs to r-c now
        ),
        sent_at=T0,
    )
    back = decode(encode(summary), ShardSummary)
    merged = merge_remote([back], owners={1: "r-b", 2: "r-b", 5: "r-c"}, me="r-a")
    assert merged == {
        "fw-skew": {"0x1021": Counter({"28.41.1000": 3})},
        "rail-mismatch": {0: Counter({("x", None, 1): 2})},
    }
    assert merge_remote([back], owners={1: "r-a"}, me="r-b") == {}  # own summary: skipped
    assert hashable(["a", [1, None]]) == ("a", (1, None))


Found = dict[tuple[str, str | None, str], Finding]


def _by_fingerprint(findings: list[Finding]) -> Found:
    return {f.fingerprint: f for f in findings}


def _sharded(fleet: Fleet, policies: tuple[Policy, ...], replicas: tuple[str, ...]) -> Found:
    """Each replica evaluates its own nodes, the summaries go round, it evaluates again."""
    owners = {p: r for r, parts in plan(PARTS, replicas).items() for p in parts}
    shards: dict[str, Fleet] = {r: Fleet() for r in replicas}
    for record in fleet.records():
        shards[owners[partition_of(subjects.node_token(record.name), PARTS)]].load(record)
    rules = {r: ShardRules(PARTS) for r in replicas}
    for r in replicas:
        rules[r].evaluate(shards[r].view(), policies, NO_CLUSTER, T0)
    wire = [
        decode(encode(rules[r].summary(r, plan(PARTS, replicas)[r], T0)), ShardSummary)
        for r in replicas
    ]
    found: Found = {}
    for r in replicas:
        rules[r].remote = merge_remote(wire, owners, r)
        for f in rules[r].evaluate(shards[r].view(), policies, NO_CLUSTER, T0):
            assert found.setdefault(f.fingerprint, f) == f  # fleet findings: the same everywhere
    return found


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    data=st.data(),
    policies=st.sampled_from(POLICIES),
    replicas=st.sampled_from((REPLICAS, REPLICAS[:2], REPLICAS[:1])),
)
def test_merged_summaries_find_what_one_process_finds(
    data: st.DataObject, policies: tuple[Policy, ...], replicas: tuple[str, ...]
) -> None:
    fleet = Fleet()
    for seq, name in enumerate(data.draw(st.lists(st.sampled_from(NODES), unique=True))):
        snap = data.draw(snapshots(name, seq + 1, T0))
        # Input a rule raises on: one process shows the rule's data-quality finding instead
        # of all its findings; a replica only instead of its own (docs/scaling.md, limits).
        assume(not any(i.name == "bad0" for d in snap.devices for i in d.interfaces))
        assume(all(r.relation != "BOGUS" for r in snap.gpu_nic_topology))  # type: ignore[comparison-overlap]
        fleet.apply_snapshot(snap, T0)
    whole = _by_fingerprint(evaluate(fleet.view(), policies, NO_CLUSTER, T0))
    assert _sharded(fleet, policies, replicas) == whole


def test_fw_skew_across_shards_is_raised_by_the_odd_nodes_owner_only() -> None:
    fleet = Fleet()
    for i, name in enumerate(NODES):
        fw = "28.39.1002" if i == 5 else "28.41.1000"
        fleet.apply_snapshot(node(name, adapter(fw=fw), seq=1), T0)
    found = _sharded(fleet, policy_doc("p"), REPLICAS)
    # The odd node's own finding, and the fleet-wide one (the same on every replica).
    assert {f.node for f in found.values() if f.rule == "fw-skew"} == {NODES[5], None}
    assert found == _by_fingerprint(evaluate(fleet.view(), policy_doc("p"), NO_CLUSTER, T0))


def test_partition_subjects_map_back_to_node_subjects() -> None:
    mapped = subjects.partition_subject(7, "gpu-001", "snapshot")
    assert mapped == "nicfleet.v1.part.7.node.gpu-001.snapshot"
    assert node_subject_of(mapped) == subjects.node_subject("gpu-001", "snapshot")
    assert node_subject_of("nicfleet.v1.node.x.status") == "nicfleet.v1.node.x.status"
    assert replica_id("host.a:1") == "host_a_1"
    assert subjects.shard_summary_subject("r1") == "nicfleet.v1.shard.r1.summary"
    with pytest.raises(ValueError, match="replica id"):
        subjects.shard_summary_subject("a.b")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), policies=st.sampled_from(POLICIES))
def test_one_replica_tracks_changes_like_one_process(
    data: st.DataObject, policies: tuple[Policy, ...]
) -> None:
    """Re-evaluated after every snapshot, counter batch or removal (only the peer rules
    reading a changed field re-tally a node), a lone replica finds what one process finds."""
    fleet, rules = Fleet(), ShardRules(PARTS)
    for seq in range(1, data.draw(st.integers(1, 12)) + 1):
        name = data.draw(st.sampled_from(NODES[:5]))
        step = data.draw(st.sampled_from(("snapshot", "counters", "remove")))
        if step == "snapshot":
            snap = data.draw(snapshots(name, seq, T0))
            assume(not any(i.name == "bad0" for d in snap.devices for i in d.interfaces))
            assume(all(r.relation != "BOGUS" for r in snap.gpu_nic_topology))  # type: ignore[comparison-overlap]
            fleet.apply_snapshot(snap, T0)
        elif step == "counters":
            fleet.apply_counters(replace(batch(name, port_counters()), seq=seq), T0)
        else:
            fleet = Fleet(r for r in fleet.records() if r.name != name)
        found = _by_fingerprint(rules.evaluate(fleet.view(), policies, NO_CLUSTER, T0))
        assert found == _by_fingerprint(evaluate(fleet.view(), policies, NO_CLUSTER, T0))
