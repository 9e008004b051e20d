"""Table tests of the pure planner: desired config per node, generations, conflicts."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.cluster import NO_CLUSTER, ClusterNode, ClusterView
from aggregator.fleet.state import NodeRecord
from aggregator.reconcile.plan import (
    EMPTY_PLAN,
    Conflict,
    DeleteDesiredConfig,
    Plan,
    PutDesiredConfig,
    plan,
    plan_from_stored,
)
from proto.messages.config import DesiredConfig
from proto.policy import Policy, PolicySpec
from tests.support.builders import T0, rdma_policy


def fleet(*names: str) -> dict[str, NodeRecord]:
    return {n: NodeRecord(name=n, first_seen=T0, last_seen=T0) for n in names}


def cluster(**labels: dict[str, str]) -> ClusterView:
    return ClusterView(
        present=True, nodes={n: ClusterNode(name=n, labels=lab) for n, lab in labels.items()}
    )


IB = rdma_policy("ib", "rdma/ib")
IB16 = rdma_policy("ib", "rdma/ib", hca_max=16)
ROCE = rdma_policy("roce", "rdma/roce")
GPU_IB = rdma_policy("ib", "rdma/ib", labels={"pool": "gpu"})
GPU_ROCE = rdma_policy("roce", "rdma/roce", labels={"pool": "gpu"})
EXPECT_ONLY = msgspec.structs.replace(IB, spec=PolicySpec())


def config_of(p: Policy, node: str, generation: int) -> DesiredConfig:
    assert p.spec.rdma_shared_device_plugin is not None
    return DesiredConfig(
        node=node, generation=generation, device_plugin=p.spec.rdma_shared_device_plugin
    )


def put(p: Policy, node: str, generation: int) -> PutDesiredConfig:
    return PutDesiredConfig(
        node=node, config=config_of(p, node, generation), policy=p.metadata.name
    )


def stored(*configs: DesiredConfig) -> Plan:
    return plan_from_stored(configs)


@pytest.mark.parametrize(
    ("policies", "nodes", "view", "previous", "actions", "conflicts"),
    [
        pytest.param((), ("a",), NO_CLUSTER, EMPTY_PLAN, (), (), id="no-policy-nothing"),
        pytest.param(
            (IB,), ("a", "b"), NO_CLUSTER, EMPTY_PLAN,
            (put(IB, "a", 1), put(IB, "b", 1)), (), id="no-cluster-selects-every-node",
        ),
        pytest.param(
            (IB,), ("a",), NO_CLUSTER, stored(config_of(IB, "a", 3)),
            (), (), id="unchanged-no-action",
        ),
        pytest.param(
            (IB16,), ("a",), NO_CLUSTER, stored(config_of(IB, "a", 3)),
            (put(IB16, "a", 4),), (), id="changed-content-next-generation",
        ),
        pytest.param(
            (GPU_IB,), ("a", "b"), cluster(a={"pool": "gpu"}, b={"pool": "cpu"}),
            stored(config_of(GPU_IB, "a", 1), config_of(GPU_IB, "b", 2)),
            (DeleteDesiredConfig(node="b"),), (), id="unselected-node-deleted",
        ),
        pytest.param(
            (GPU_IB,), (), cluster(c={"pool": "gpu"}), EMPTY_PLAN,
            (put(GPU_IB, "c", 1),), (), id="cluster-node-without-agent-gets-config",
        ),
        pytest.param(
            (GPU_IB, GPU_ROCE), ("a",), cluster(a={"pool": "gpu"}), stored(config_of(IB, "a", 2)),
            (), (Conflict(node="a", policies=("ib", "roce")),), id="conflict-keeps-previous",
        ),
        pytest.param(
            (IB, ROCE), ("a",), NO_CLUSTER, EMPTY_PLAN,
            (), (Conflict(node="a", policies=("ib", "roce")),), id="conflict-no-new-config",
        ),
        pytest.param(
            (EXPECT_ONLY,), ("a",), NO_CLUSTER, stored(config_of(IB, "a", 1)),
            (DeleteDesiredConfig(node="a"),), (), id="policy-without-plugin-config-deletes",
        ),
        pytest.param(
            (), ("a",), NO_CLUSTER, stored(config_of(IB, "a", 1)),
            (DeleteDesiredConfig(node="a"),), (), id="policy-removed-deletes",
        ),
    ],
)  # fmt: skip
def test_plan_table(
    policies: tuple[Policy, ...],
    nodes: tuple[str, ...],
    view: ClusterView,
    previous: Plan,
    actions: tuple[object, ...],
    conflicts: tuple[Conflict, ...],
) -> None:
    result = plan(policies, fleet(*nodes), view, previous=previous)
    assert result.actions == actions
    assert result.conflicts == conflicts


def test_conflicted_node_keeps_previous_config_in_desired() -> None:
    before = stored(config_of(IB, "a", 2))
    result = plan((IB, ROCE), fleet("a"), NO_CLUSTER, previous=before)
    assert result.desired == before.desired
    assert "a" not in result.assignments


def test_generation_never_reused_after_delete_and_reselect() -> None:
    first = plan((IB,), fleet("a"), NO_CLUSTER, previous=EMPTY_PLAN)
    second = plan((IB16,), fleet("a"), NO_CLUSTER, previous=first)
    gone = plan((), fleet("a"), NO_CLUSTER, previous=second)
    assert gone.actions == (DeleteDesiredConfig(node="a"),)
    back = plan((IB,), fleet("a"), NO_CLUSTER, previous=gone)
    assert back.actions == (put(IB, "a", 3),)


def test_plan_is_stable_when_applied_twice() -> None:
    first = plan((IB, ROCE), fleet("a"), NO_CLUSTER, previous=EMPTY_PLAN)
    only_ib = plan((IB,), fleet("a", "b"), NO_CLUSTER, previous=first)
    again = plan((IB,), fleet("a", "b"), NO_CLUSTER, previous=only_ib)
    assert [a.node for a in only_ib.actions] == ["a", "b"]
    assert again.actions == ()
    assert again.assignments == {"a": "ib", "b": "ib"}
