"""Incremental rule evaluation equals the full `registry.evaluate` after every step of random
sequences of snapshots, counter batches, link events, device-plugin statuses, node
removals, policy/cluster/threshold changes and clock ticks; plus table tests of the
fleet-level rules' summaries (tally/settle) and of the rule classification."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from typing import Any, cast

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from aggregator.alerts.wiring import AllRules
from aggregator.cluster import (
    NO_CLUSTER,
    ClaimHealth,
    ClusterNode,
    ClusterView,
    DraClaim,
    DraDevice,
    DraResult,
    PodClaim,
    PodRequest,
)
from aggregator.fleet.state import Fleet
from aggregator.rules import fleetpolicy, links, versions
from aggregator.rules.catalog import RULE_IDS
from aggregator.rules.engine.duetimes import SLACK_S, DueNodes
from aggregator.rules.engine.incremental import IncrementalRules
from aggregator.rules.engine.registry import (
    FLEET_RULES,
    NODE_RULES,
    PEER_RULES,
    TIME_RULES,
    evaluate,
)
from aggregator.rules.peers import Peer, PeerRule
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS, Thresholds
from proto.inventory import Device, GpuNicRelation, Interface, NodeSnapshot, Platform, Relation
from proto.policy import Policy
from tests.support.builders import port_event, rdma_policy
from tests.support.rules_cases import (
    T0,
    adapter,
    batch,
    gpu,
    node,
    policy_doc,
    port_counters,
    roce,
    status,
)
from tests.unit.aggregator.rules.test_rules_fleet import NONE, SOME

NODES = ("n0", "n1", "n2", "n3", "n4")
FW = ("28.41.1000", "28.39.1002", "bogus-fw")
RATES = (
    "counters/symbol_error",
    "counters/link_downed",
    "hw_counters/local_ack_timeout_err",
    "hw_counters/rp_cnp_ignored",
    "hw_counters/out_of_sequence",
)
POLICIES: tuple[tuple[Policy, ...], ...] = (
    (),
    policy_doc("mtu", expect={"mtu": 4092, "linkLayer": "InfiniBand", "minRateGbps": 200}),
    policy_doc("fw", expect={"minFirmware": {"ConnectX-7": "28.40.0"}, "gpuDirect": True}),
    (rdma_policy("a", "rdma/hca"), *policy_doc("b", expect={"linkLayer": "Ethernet"})),
    (rdma_policy("ib", "rdma/hca", labels={"rack": "1"}),),
    policy_doc(
        "p",
        rdmaSharedDevicePlugin={
            "configList": [
                {"resourceName": "hca", "rdmaHcaMax": 4, "selectors": {"deviceIDs": ["1021"]}},
                {"resourceName": "none", "rdmaHcaMax": 4, "selectors": {"deviceIDs": ["ffff"]}},
            ]
        },
    ),
)
LABELLED = {n: ClusterNode(name=n, labels={"rack": str(i % 2)}) for i, n in enumerate(NODES)}
_OURS, _GPU, _ROOT = "rdma.nicfleet.io", "gpu.nvidia.com", "resource.kubernetes.io/pcieRoot"


def _claim(name: str, node: str, *devices: tuple[str, str]) -> DraClaim:
    results = tuple(DraResult(request=f"r{i}", driver=driver, pool=node, device=device)
                    for i, (driver, device) in enumerate(devices))  # fmt: skip
    return DraClaim(namespace="ml", name=name, uid=name, allocated=True, results=results,
                    node=node, reserved_for=(f"ml/{name}",))  # fmt: skip


# The same labels with DRA claims (the DRA rules): a NIC + GPU under other roots on n0,
# two NICs on n1 (the kubelet says one is Unhealthy), a NIC on a node of no fleet.
DRA = ClusterView(
    present=True,
    nodes=LABELLED,
    dra_present=True,
    claims=(
        _claim("a", "n0", (_OURS, "mlx5-0"), (_GPU, "gpu-0")),
        _claim("b", "n1", (_OURS, "mlx5-1"), (_OURS, "mlx5-2")),
        _claim("c", "n9", (_OURS, "mlx5-0")),
    ),
    dra_devices=(
        DraDevice(
            driver=_GPU,
            pool="n0",
            node="n0",
            name="gpu-0",
            slice="g",
            attributes={_ROOT: "pci0000:17"},
        ),
        DraDevice(
            driver=_OURS,
            pool="n0",
            node="n0",
            name="mlx5-0",
            slice="s",
            attributes={_ROOT: "pci0000:18"},
        ),
    ),
    pods=(
        PodRequest(
            namespace="ml",
            name="b",
            node="n1",
            claims=(PodClaim(name="r0", claim="b"),),
            claim_health=(
                ClaimHealth(
                    container="c", entry="r0", health="Unhealthy", resource_id=f"{_OURS}/n1/mlx5-1"
                ),
            ),
        ),
    ),
)
CLUSTERS = (NO_CLUSTER, ClusterView(present=True, nodes=LABELLED), DRA)
THRESHOLDS = (
    DEFAULT_THRESHOLDS,
    DEFAULT_THRESHOLDS.with_rule("port-down", enabled=False),
    DEFAULT_THRESHOLDS.with_rule("agent-stale", params={"staleAfter": 5.0}),
)


@st.composite
def devices(draw: st.DrawFn) -> tuple[Device, ...]:
    """1-3 adapters whose firmware, rate, layer, MTU, state and subnet vary a little."""
    found: list[Device] = []
    for i in range(draw(st.integers(1, 3))):
        pci = f"0000:{0x19 + i:02x}:00.0"
        mtu = draw(st.sampled_from((4092, 2048, 0)))
        common: dict[str, Any] = {
            "fw": draw(st.sampled_from(FW)),
            "rate": draw(st.sampled_from((400.0, 200.0, None))),
            "state": draw(st.sampled_from(("ACTIVE", "ACTIVE", "DOWN", "UNKNOWN"))),
            "numa": draw(st.sampled_from((0, 1, None))),
        }
        if draw(st.booleans()):
            d = roce(f"mlx5_{i}", pci, f"10.{i}.{draw(st.integers(0, 1))}.5", mtu=mtu, **common)
        else:
            d = adapter(f"mlx5_{i}", pci, mtu=mtu, **common)
        if draw(st.integers(0, 15)) == 0:  # input a rule did not foresee: it raises
            bad = Interface(name="bad0", port=1, mtu="9000")  # type: ignore[arg-type]
            d = msgspec.structs.replace(d, interfaces=(*d.interfaces, bad))
        found.append(d)
    return tuple(found)


@st.composite
def snapshots(draw: st.DrawFn, name: str, seq: int, at: float) -> NodeSnapshot:
    relation = draw(st.sampled_from(("PIX", "SYS", "SYS", "BOGUS")))
    snap = node(
        name,
        *draw(devices()),
        gpus=(gpu("0000:18:00.0"),),
        topo=(
            ("0000:18:00.0", "mlx5_0", cast(Relation, "PIX" if relation == "BOGUS" else relation)),
        ),
        platform=Platform(
            peermem=draw(st.booleans()),
            iommu=draw(st.sampled_from((None, True))),
            acs_enabled_bridges=draw(st.sampled_from(((), ("0000:17:00.0",)))),
        ),
        modules={"mlx5_core": draw(st.sampled_from(("24.04", "23.10", None)))},
        collected_at=at,
        seq=seq,
    )
    if relation == "BOGUS":  # an unknown relation: gpu-nic-affinity raises
        rows = (GpuNicRelation(gpu="0000:18:00.0", nic="mlx5_0", relation="BOGUS"),)  # type: ignore[arg-type]
        snap = msgspec.structs.replace(snap, gpu_nic_topology=rows)
    return snap


class Machine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.fleet = Fleet()
        self.incremental = IncrementalRules()
        self.policies: tuple[Policy, ...] = ()
        self.cluster = NO_CLUSTER
        self.thresholds: Thresholds = DEFAULT_THRESHOLDS
        self.now = T0
        self.seq = 1

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    @rule(data=st.data(), name=st.sampled_from(NODES))
    def snapshot(self, data: st.DataObject, name: str) -> None:
        self.fleet.apply_snapshot(data.draw(snapshots(name, self._next(), self.now)), self.now)

    @rule(
        name=st.sampled_from(NODES),
        key=st.sampled_from(RATES),
        rate=st.sampled_from((0.0, 5.0, 1e6, float("nan"), -1.0)),
    )
    def counters(self, name: str, key: str, rate: float) -> None:
        b = batch(name, port_counters(rates={key: rate}, resets=(key,) if rate < 0 else ()))
        self.fleet.apply_counters(msgspec.structs.replace(b, seq=self._next()), self.now)

    @rule(
        name=st.sampled_from(NODES), device=st.sampled_from(("mlx5_0", "mlx5_1")), up=st.booleans()
    )
    def event(self, name: str, device: str, up: bool) -> None:
        event = port_event(
            name,
            device=device,
            new="ACTIVE" if up else "DOWN",
            phys="LinkUp" if up else "Disabled",
            seq=self._next(),
            observed_at=self.now + 0.5,
        )
        self.fleet.apply_event(event, self.now)

    @rule(name=st.sampled_from(NODES), served=st.sampled_from((NONE, SOME)))
    def plugin(self, name: str, served: object) -> None:
        self.fleet.apply_status(status(name, served, at=self.now + self._next()), self.now)  # type: ignore[arg-type]

    @rule(name=st.sampled_from(NODES))
    def remove(self, name: str) -> None:
        self.fleet = Fleet(r for r in self.fleet.records() if r.name != name)

    @rule(policies=st.sampled_from(POLICIES))
    def set_policies(self, policies: tuple[Policy, ...]) -> None:
        self.policies = policies

    @rule(cluster=st.sampled_from(CLUSTERS))
    def set_cluster(self, cluster: ClusterView) -> None:
        self.cluster = cluster

    @rule(thresholds=st.sampled_from(THRESHOLDS))
    def set_thresholds(self, thresholds: Thresholds) -> None:
        self.thresholds = thresholds

    @rule(
        data=st.data(),
        policies=st.sampled_from(POLICIES),
        name=st.sampled_from(NODES),
        rate=st.sampled_from((0.0, 1e6)),
    )
    def evaluate_a_copy_while_ingesting(
        self, data: st.DataObject, policies: tuple[Policy, ...], name: str, rate: float
    ) -> None:
        """As `AllRules.evaluate_async`: (re)computed over a copy of the records while
        messages keep arriving; the invariant's live evaluation must catch up."""
        self.policies = policies
        copy = dict(self.fleet.view())
        self.fleet.apply_snapshot(data.draw(snapshots(name, self._next(), self.now)), self.now)
        b = batch(name, port_counters(rates={RATES[0]: rate}))
        self.fleet.apply_counters(msgspec.structs.replace(b, seq=self._next()), self.now)
        args = (copy, self.policies, self.cluster, self.now)
        assert self.incremental.evaluate(*args, thresholds=self.thresholds) == evaluate(
            *args, thresholds=self.thresholds
        )

    @rule(step=st.sampled_from((0.0, 0.4, 3.0, 4.9, 20.0, 31.0, -10.0)))
    def tick(self, step: float) -> None:
        self.now += step

    @invariant()
    def same_as_full(self) -> None:
        args = (self.fleet.view(), self.policies, self.cluster, self.now)
        full = evaluate(*args, thresholds=self.thresholds)
        assert self.incremental.evaluate(*args, thresholds=self.thresholds) == full


Machine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestIncrementalEqualsFull = Machine.TestCase


def test_every_rule_is_classified_once() -> None:
    assert sorted((*NODE_RULES, *FLEET_RULES)) == sorted(RULE_IDS)
    assert not set(NODE_RULES) & set(FLEET_RULES)
    assert set(TIME_RULES) == {"agent-stale", "snapshot-missing", "dra-claim-unhealthy-device"}
    assert set(PEER_RULES) == set(FLEET_RULES)


def _peer(snap: NodeSnapshot, policies: tuple[Policy, ...] = ()) -> Peer:
    fleet = Fleet([])
    record = fleet.apply_snapshot(snap, received_at=T0).record
    return Peer(name=snap.node, record=record, selecting=policies, policies=policies)


def _facts(rule: PeerRule, *snaps: NodeSnapshot) -> dict[object, object]:
    counts: dict[object, Counter[object]] = {}
    for snap in snaps:
        for group, value in rule.tally(_peer(snap)):
            counts.setdefault(group, Counter())[value] += 1
    return {group: rule.settle(c) for group, c in counts.items()}


CX7 = "0x1021"


@pytest.mark.parametrize(
    ("rule", "snaps", "facts"),
    [
        # Mode of active rates per model; a tie goes to the highest rate.
        (links.RATE_MISMATCH, [node("a"), node("b", adapter(rate=200.0))], {CX7: 400.0}),
        (links.RATE_MISMATCH, [node("a", adapter(state="DOWN"))], {}),
        # Majority link layer per model and the layers seen (no majority on a tie).
        (
            links.LINK_LAYER_MISMATCH,
            [node("a"), node("b", roce("mlx5_0", "0:0", "10.0.0.1", device_id=CX7))],
            {CX7: (None, frozenset({"InfiniBand", "Ethernet"}))},
        ),
        # Majority MTU per fabric (layer, compute) and whether it has several ports.
        (
            links.MTU_MISMATCH,
            [node("a"), node("b"), node("c", adapter(mtu=2048))],
            {("InfiniBand", True): (4092, True)},
        ),
        (links.MTU_MISMATCH, [node("a", adapter(mtu=0))], {}),
        # Firmware per model and PSID: the majority and whether several versions run (the
        # counts ride along, outside equality: a joining node re-judges nobody).
        (
            versions.FW_SKEW,
            [node("a"), node("b", adapter(fw="28.39.1002"))],
            {("fw", CX7, None): versions.Spread(None, True)},
        ),
        # Driver stacks by kind: versions with versions, inbox builds with builds.
        (
            versions.DRIVER_SKEW,
            [
                node("a", modules={"mlx5_core": "1"}),
                node("b", modules={"mlx5_core": "1"}),
                node("c", modules={"mlx5_core": None}),
            ],
            {
                ("driver", "mlx5_core", "version"): versions.Spread("1", False),
                ("driver", "mlx5_core", "srcversion"): versions.Spread("mlx5_core=none", False),
            },
        ),
        # Rail i of a pool (policy, compute link layer): at least two members, majority
        # subnet/rate/layer among known values.
        (
            fleetpolicy.RAIL_MISMATCH,
            [
                node("a", roce("mlx5_0", "0:0", "10.0.0.1")),
                node("b", roce("mlx5_0", "0:0", "10.0.1.1", rate=None)),
            ],
            {("rail", None, "Ethernet", 0): fleetpolicy.RailFact(True, (None, 100.0, "Ethernet"))},
        ),
        (
            fleetpolicy.RAIL_MISMATCH,
            [node("a")],
            {
                ("rail", None, "InfiniBand", 0): fleetpolicy.RailFact(
                    False, ("fe80:0000:0000:0000", 400.0, "InfiniBand")
                )
            },
        ),
    ],
)
def test_peer_rule_summaries(
    rule: PeerRule, snaps: list[NodeSnapshot], facts: dict[object, object]
) -> None:
    assert _facts(rule, *snaps) == facts


def test_selector_summary_counts_judged_nodes_and_any_match() -> None:
    policies = POLICIES[-1]
    rule = fleetpolicy.SELECTOR_MATCHES_NOTHING
    votes = Counter(rule.tally(_peer(node("a"), policies)))
    assert votes == Counter({((0, 0), True): 1, ((0, 1), False): 1})
    facts: dict[Hashable, Hashable] = {
        (0, 0): rule.settle(Counter({True: 1, False: 2})),
        (0, 1): (3, False),
    }
    assert facts[(0, 0)] == (3, True)
    assert [f.subject for f in rule.conclude(policies, facts)] == ["p/rdma/none"]


def test_unchanged_fleet_is_not_recomputed_and_time_still_counts() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(node("n1"), received_at=T0)
    incremental = IncrementalRules()
    assert incremental.evaluate(fleet.view(), now=T0) == []
    stale = incremental.evaluate(fleet.view(), now=T0 + 100)  # no node changed
    assert [f.rule for f in stale] == ["agent-stale"]
    assert incremental.evaluate(fleet.view(), now=T0 + 100) == stale
    assert incremental.rebuilds == 1
    incremental.evaluate(fleet.view(), policy_doc("p"), now=T0 + 100)
    assert incremental.rebuilds == 2


def test_a_rule_that_raises_is_a_data_quality_finding_until_the_node_is_fixed() -> None:
    fleet = Fleet()
    incremental = IncrementalRules()
    good = node("n1", gpus=(gpu("0000:18:00.0"),), topo=(("0000:18:00.0", "mlx5_0", "PIX"),))
    bad = msgspec.structs.replace(
        good,
        seq=2,
        gpu_nic_topology=(GpuNicRelation(gpu="0000:18:00.0", nic="mlx5_0", relation="BOGUS"),),  # type: ignore[arg-type]
    )
    for snap, raised in ((good, False), (bad, True), (msgspec.structs.replace(good, seq=3), False)):
        fleet.apply_snapshot(snap, received_at=T0)
        found = incremental.evaluate(fleet.view(), now=T0)
        assert found == evaluate(fleet.view(), now=T0)
        subjects = {f.subject for f in found if f.node is None}
        assert ("rule/gpu-nic-affinity" in subjects) is raised


def test_the_alert_engine_rules_are_the_incremental_ones() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(node("n1"), received_at=T0)
    fleet.apply_snapshot(node("n2", adapter(fw="28.39.1002")), received_at=T0)
    rules = AllRules()
    policies = policy_doc("p", expect={"mtu": 2048})
    for step in range(3):
        if step == 1:
            fleet.apply_counters(batch("n1", port_counters(rates={RATES[0]: 5.0})), T0)
        found = rules.evaluate(fleet, policies, NO_CLUSTER, T0 + step)
        assert found == evaluate(fleet.view(), policies, NO_CLUSTER, T0 + step)
    assert rules._incremental.rebuilds == 1


_due_ops = st.lists(
    st.tuples(
        st.sampled_from("abcd"),
        st.none() | st.just(math.nan) | st.just(math.inf) | st.integers(0, 40),
    )
    | st.integers(0, 40),  # a time to advance to (forwards or back)
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_due_ops)
def test_due_nodes_are_active_exactly_when_due(ops: list[tuple[str, float | None] | int]) -> None:
    """Against a model: after `advance(now)` the active nodes are those whose due time
    (less SLACK_S) is reached or NaN; it returns the active ones that no longer are."""
    due, model = DueNodes(), dict[str, float]()
    active: set[str] = set()
    for op in ops:
        if isinstance(op, int):
            now = float(op)
            expected = {n for n, at in model.items() if math.isnan(at) or at - SLACK_S <= now}
            back = {n for n in active if n in model and model[n] - SLACK_S > now}
            assert due.advance(now) == back
            assert due.active == expected
            active = set(expected)
        else:
            name, at = op
            due.reschedule(name, None if at is None else float(at))
            active.discard(name)
            if at is None:
                model.pop(name, None)
            else:
                model[name] = float(at)
                if math.isnan(at):
                    active.add(name)


def test_due_nodes_wake_at_their_due_time_and_sleep_when_the_clock_goes_back() -> None:
    due = DueNodes()
    due.reschedule("a", T0 + 30)
    due.reschedule("b", T0 + 60)
    due.reschedule("c", float("nan"))  # cannot be ordered: always re-run
    assert due.advance(T0) == set() and due.active == {"c"}
    assert due.advance(T0 + 29.5) == set() and due.active == {"a", "c"}  # SLACK_S early
    due.reschedule("a", T0 + 90)  # a message arrived: later due time
    assert due.advance(T0 + 59.5) == set() and due.active == {"b", "c"}
    assert due.advance(T0) == {"b"} and due.active == {"c"}  # the clock went back
    due.reschedule("c", None)  # node removed
    assert due.advance(T0 + 100) == set() and due.active == {"a", "b"}


def test_due_nodes_never_wake_a_node_due_at_infinity() -> None:
    due = DueNodes()
    due.reschedule("a", T0 + 30)
    due.reschedule("a", math.inf)  # e.g. snapshot-missing once the snapshot arrived
    due.reschedule("b", math.inf)
    assert due.advance(T0 + 1e9) == set() and due.active == set()
    due.reschedule("b", T0 + 10)  # e.g. the node came back without a snapshot
    assert due.advance(T0 + 10) == set() and due.active == {"b"}
