"""aggregator.dra.publishplan: desired pools diffed against the slices the API holds."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from aggregator.dra.publishplan import (
    Create,
    Delete,
    PoolSource,
    Update,
    owned,
    plan,
    plan_pool,
)
from proto.draslices import SliceSettings, build_slices
from proto.inventory import NodeSnapshot
from tests.support.builders import nic, snapshot

SETTINGS = SliceSettings()


def node(name: str = "gpu-001", *, down: bool = False, devices: int = 2) -> NodeSnapshot:
    return snapshot(
        name,
        devices=tuple(
            nic(f"mlx5_{i}", index=i, state="DOWN" if down and i == 0 else "ACTIVE")
            for i in range(devices)
        ),
    )


def stored(body: dict[str, Any], version: str = "100", generation: int = 1) -> dict[str, Any]:
    """`body` as the API server returns it: server-set metadata added."""
    obj = copy.deepcopy(body)
    obj["metadata"].update(
        uid=f"uid-{obj['metadata']['name']}",
        resourceVersion=version,
        generation=1,
        creationTimestamp="2026-12-02T04:00:00Z",
        managedFields=[{"manager": "nicfleet-aggregator", "operation": "Update"}],
    )
    obj["spec"]["pool"]["generation"] = generation
    return obj


def published(snap: NodeSnapshot, settings: SliceSettings = SETTINGS) -> list[dict[str, Any]]:
    return [stored(s) for s in build_slices(snap, {}, settings)]


def state_of(body: dict[str, Any], device: str) -> Any:
    (entry,) = [d for d in body["spec"]["devices"] if d["name"] == device]
    return entry["attributes"]["portState"]["string"]


def test_a_new_node_gets_its_slice_at_generation_1() -> None:
    (action,) = plan(
        {"gpu-001": PoolSource(snapshot=node())}, [], cluster_nodes=None, settings=SETTINGS
    )
    assert isinstance(action, Create)
    assert action.name == "gpu-001-rdma-nicfleet-io-0"
    assert action.body["spec"]["pool"] == {
        "name": "gpu-001",
        "generation": 1,
        "resourceSliceCount": 1,
    }


def test_unchanged_pool_plans_nothing() -> None:
    sources = {"gpu-001": PoolSource(snapshot=node())}
    assert plan(sources, published(node()), cluster_nodes={"gpu-001"}, settings=SETTINGS) == []


def test_port_down_updates_the_slice_with_its_resource_version_and_keeps_the_generation() -> None:
    sources = {"gpu-001": PoolSource(snapshot=node(down=True))}
    (action,) = plan(sources, published(node()), cluster_nodes=None, settings=SETTINGS)
    assert isinstance(action, Update)
    assert action.resource_version == "100"
    assert action.body["metadata"]["resourceVersion"] == "100"
    assert "managedFields" not in action.body["metadata"]
    assert action.body["metadata"]["uid"] == "uid-gpu-001-rdma-nicfleet-io-0"
    assert state_of(action.body, "mlx5-0") == "DOWN"
    assert state_of(action.body, "mlx5-1") == "ACTIVE"
    # One slice replaced in one call is never seen half-written: no bump (upstream's rule).
    assert action.body["spec"]["pool"]["generation"] == 1


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(2, 1, id="adapter-lost"),
        pytest.param(1, 2, id="adapter-added"),
    ],
)
def test_a_changed_device_set_bumps_the_generation(before: int, after: int) -> None:
    sources = {"gpu-001": PoolSource(snapshot=node(devices=after))}
    observed = [stored(s, generation=4) for s in build_slices(node(devices=before), {}, SETTINGS)]
    (action,) = plan(sources, observed, cluster_nodes=None, settings=SETTINGS)
    assert isinstance(action, Update)
    assert action.body["spec"]["pool"]["generation"] == 5
    assert len(action.body["spec"]["devices"]) == after


def test_a_pool_split_over_slices_bumps_and_rewrites_every_slice() -> None:
    small = SliceSettings(max_devices=2)
    observed = published(node(devices=3), small)  # two slices
    assert len(observed) == 2
    sources = {"gpu-001": PoolSource(snapshot=node(devices=1))}
    actions = plan(sources, observed, cluster_nodes=None, settings=small)
    assert [type(a) for a in actions] == [Delete, Update]  # obsolete slices leave first
    assert actions[0] == Delete("gpu-001-rdma-nicfleet-io-1", "100")
    update = actions[1]
    assert isinstance(update, Update)
    assert update.body["spec"]["pool"]["generation"] == 2
    assert update.body["spec"]["pool"]["resourceSliceCount"] == 1


def test_a_slice_left_at_an_older_generation_is_rewritten() -> None:
    small = SliceSettings(max_devices=1)
    observed = published(node(devices=2), small)
    observed[1]["spec"]["pool"]["generation"] = 3  # a half-finished earlier bump
    actions = plan(
        {"gpu-001": PoolSource(snapshot=node(devices=2))},
        observed,
        cluster_nodes=None,
        settings=small,
    )
    assert [(type(a), a.name) for a in actions] == [(Update, "gpu-001-rdma-nicfleet-io-0")]
    assert isinstance(actions[0], Update)
    assert actions[0].body["spec"]["pool"]["generation"] == 3


def test_a_stale_node_keeps_its_pool_with_every_port_unknown() -> None:
    sources = {"gpu-001": PoolSource(snapshot=node(), stale=True)}
    (action,) = plan(sources, published(node()), cluster_nodes={"gpu-001"}, settings=SETTINGS)
    assert isinstance(action, Update)
    assert {state_of(action.body, d) for d in ("mlx5-0", "mlx5-1")} == {"UNKNOWN"}


@pytest.mark.parametrize(
    ("cluster_nodes", "deleted"),
    [
        pytest.param(None, False, id="nodes-not-known"),
        pytest.param({"gpu-001"}, False, id="node-object-present"),
        pytest.param(set(), True, id="node-object-gone"),
    ],
)
def test_a_node_without_a_record_loses_its_slices_only_with_its_node_object(
    cluster_nodes: set[str] | None, deleted: bool
) -> None:
    actions = plan({}, published(node()), cluster_nodes=cluster_nodes, settings=SETTINGS)
    assert actions == ([Delete("gpu-001-rdma-nicfleet-io-0", "100")] if deleted else [])


def test_a_node_object_gone_deletes_even_with_a_record() -> None:
    sources = {"gpu-001": PoolSource(snapshot=node())}
    actions = plan(sources, published(node()), cluster_nodes={"other"}, settings=SETTINGS)
    assert actions == [Delete("gpu-001-rdma-nicfleet-io-0", "100")]


def other_driver(pool: str = "gpu-001", name: str = "gpu-001-gpu-nvidia-com-0") -> dict[str, Any]:
    return stored(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": pool,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0"}],
            },
        }
    )


def test_other_drivers_slices_are_never_touched() -> None:
    foreign = [other_driver(), other_driver("gone-node", "gone-node-gpu-nvidia-com-0")]
    assert not any(owned(o) for o in foreign)
    sources = {"gpu-001": PoolSource(snapshot=node())}
    observed = [*foreign, *published(node())]
    assert plan(sources, observed, cluster_nodes=set(), settings=SETTINGS) == [
        Delete("gpu-001-rdma-nicfleet-io-0", "100")
    ]
    assert plan(sources, observed, cluster_nodes={"gpu-001"}, settings=SETTINGS) == []


def test_our_driver_in_a_pool_not_named_after_its_node_is_not_ours() -> None:
    odd = published(node())[0]
    odd["spec"]["pool"]["name"] = "shared-pool"
    assert not owned(odd)
    assert plan({}, [odd], cluster_nodes=set(), settings=SETTINGS) == []


def test_only_plans_the_named_pools() -> None:
    sources = {n: PoolSource(snapshot=node(n)) for n in ("a", "b")}
    actions = plan(sources, [], cluster_nodes=None, settings=SETTINGS, only={"b"})
    assert [a.name for a in actions] == ["b-rdma-nicfleet-io-0"]


def test_plan_pool_with_nothing_observed_and_no_source_is_empty() -> None:
    assert plan_pool("x", None, [], gone=True, settings=SETTINGS) == []


def test_every_written_body_is_a_valid_1_37_resource_slice() -> None:
    small = SliceSettings(max_devices=1)
    observed = published(node(devices=2), small)
    sources = {"gpu-001": PoolSource(snapshot=node(down=True, devices=3), stale=True)}
    actions = plan(sources, observed, cluster_nodes=None, settings=small)
    bodies = [a.body for a in actions if isinstance(a, Create | Update)]
    assert len(bodies) == 3
    for body in bodies:
        assert kubernetes_validate.validate(body, "1.37", strict=True) == "1.37"
