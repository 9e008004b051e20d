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


# --- the node's own settings ------------------------------------------------------------


def names_of(action: Create | Update) -> list[str]:
    return [d["name"] for d in action.body["spec"]["devices"]]


def test_copies_publish_share_devices_per_rdma_device() -> None:
    copies = SliceSettings(sharing="copies", share=3)
    (action,) = plan(
        {"gpu-001": PoolSource(snapshot=node(), settings=copies)},
        [],
        cluster_nodes=None,
        settings=SETTINGS,
    )
    assert isinstance(action, Create)
    assert names_of(action) == [f"mlx5-{i}-s{c}" for i in range(2) for c in range(3)]
    assert kubernetes_validate.validate(action.body, "1.37", strict=True) == "1.37"


def test_consumable_publishes_one_device_with_the_share_capacity() -> None:
    consumable = SliceSettings(sharing="consumable", share=4)
    (action,) = plan(
        {"gpu-001": PoolSource(snapshot=node(), settings=consumable)},
        [],
        cluster_nodes=None,
        settings=SETTINGS,
    )
    assert isinstance(action, Create)
    assert names_of(action) == ["mlx5-0", "mlx5-1"]
    for device in action.body["spec"]["devices"]:
        assert device["allowMultipleAllocations"] is True
        (capacity,) = device["capacity"].values()
        assert capacity["value"] == "4"
    assert kubernetes_validate.validate(action.body, "1.37", strict=True) == "1.37"


def test_rails_given_are_attributes_and_absent_otherwise() -> None:
    railed = SliceSettings(rails={"mlx5_0": 3})
    (action,) = plan(
        {"gpu-001": PoolSource(snapshot=node(), settings=railed)},
        [],
        cluster_nodes=None,
        settings=SETTINGS,
    )
    assert isinstance(action, Create)
    first, second = action.body["spec"]["devices"]
    assert first["attributes"]["rail"] == {"int": 3}
    assert "rail" not in second["attributes"]


def test_switching_a_node_to_copies_replaces_its_devices_with_a_bump() -> None:
    copies = SliceSettings(sharing="copies", share=2)
    (action,) = plan(
        {"gpu-001": PoolSource(snapshot=node(), settings=copies)},
        published(node()),
        cluster_nodes=None,
        settings=SETTINGS,
    )
    assert isinstance(action, Update)
    assert names_of(action) == ["mlx5-0-s0", "mlx5-0-s1", "mlx5-1-s0", "mlx5-1-s1"]
    assert action.body["spec"]["pool"]["generation"] == 2


def test_each_pool_keeps_its_own_settings() -> None:
    sources = {
        "a": PoolSource(snapshot=node("a"), settings=SliceSettings(sharing="copies", share=2)),
        "b": PoolSource(snapshot=node("b")),
    }
    actions = plan(sources, [], cluster_nodes=None, settings=SETTINGS)
    counts = {a.name: len(a.body["spec"]["devices"]) for a in actions if isinstance(a, Create)}
    assert counts == {"a-rdma-nicfleet-io-0": 4, "b-rdma-nicfleet-io-0": 2}


# --- owner references -------------------------------------------------------------------

UID = "6f1c7e2a-0b8d-4a51-9a8e-1f2b3c4d5e6f"
OWNER = {"apiVersion": "v1", "kind": "Node", "name": "gpu-001", "uid": UID, "controller": True}


def owned_by(slices: list[dict[str, Any]], *refs: dict[str, Any]) -> list[dict[str, Any]]:
    for s in slices:
        s["metadata"]["ownerReferences"] = [dict(r) for r in refs]
    return slices


def test_a_created_slice_is_owned_by_its_node() -> None:
    (action,) = plan(
        {"gpu-001": PoolSource(snapshot=node(), node_uid=UID)},
        [],
        cluster_nodes={"gpu-001": UID},
        settings=SETTINGS,
    )
    assert isinstance(action, Create)
    assert action.body["metadata"]["ownerReferences"] == [OWNER]
    assert kubernetes_validate.validate(action.body, "1.37", strict=True) == "1.37"


def test_without_a_uid_no_owner_reference_is_written() -> None:
    (action,) = plan(
        {"gpu-001": PoolSource(snapshot=node())}, [], cluster_nodes=None, settings=SETTINGS
    )
    assert isinstance(action, Create)
    assert "ownerReferences" not in action.body["metadata"]


def test_an_owned_unchanged_pool_plans_nothing() -> None:
    sources = {"gpu-001": PoolSource(snapshot=node(), node_uid=UID)}
    observed = owned_by(published(node()), OWNER)
    assert plan(sources, observed, cluster_nodes={"gpu-001": UID}, settings=SETTINGS) == []


@pytest.mark.parametrize(
    "refs",
    [
        pytest.param((), id="missing"),
        pytest.param(({**OWNER, "uid": "old-node-uid"},), id="another-uid"),
        pytest.param(({**OWNER, "controller": False},), id="not-controller"),
    ],
)
def test_a_missing_or_changed_owner_reference_is_an_update_without_a_bump(
    refs: tuple[dict[str, Any], ...],
) -> None:
    small = SliceSettings(max_devices=1)
    observed = owned_by(published(node(), small), *refs)
    sources = {"gpu-001": PoolSource(snapshot=node(), node_uid=UID)}
    actions = plan(sources, observed, cluster_nodes={"gpu-001": UID}, settings=small)
    assert [type(a) for a in actions] == [Update, Update]  # both slices, devices unchanged
    for action in actions:
        assert isinstance(action, Update)
        assert action.body["metadata"]["ownerReferences"] == [OWNER]
        assert action.body["spec"]["pool"]["generation"] == 1
        assert action.resource_version == "100"


def test_other_owners_are_kept_in_place() -> None:
    other = {"apiVersion": "example.com/v1", "kind": "Thing", "name": "t", "uid": "t-uid"}
    observed = owned_by(published(node()), other, {**OWNER, "uid": "stale"})
    sources = {"gpu-001": PoolSource(snapshot=node(), node_uid=UID)}
    (action,) = plan(sources, observed, cluster_nodes={"gpu-001": UID}, settings=SETTINGS)
    assert isinstance(action, Update)
    assert action.body["metadata"]["ownerReferences"] == [other, OWNER]
    unchanged = owned_by(published(node()), other, OWNER)
    assert plan(sources, unchanged, cluster_nodes={"gpu-001": UID}, settings=SETTINGS) == []


def test_with_the_uid_unknown_the_references_found_are_left_alone() -> None:
    observed = owned_by(published(node()), {**OWNER, "uid": "whatever-was-there"})
    sources = {"gpu-001": PoolSource(snapshot=node(down=True))}
    (action,) = plan(sources, observed, cluster_nodes=None, settings=SETTINGS)
    assert isinstance(action, Update)  # the port change only
    assert action.body["metadata"]["ownerReferences"] == [{**OWNER, "uid": "whatever-was-there"}]
    assert plan({"gpu-001": PoolSource(snapshot=node())}, observed, cluster_nodes=None,
                settings=SETTINGS) == []  # fmt: skip


def test_a_port_change_and_a_new_owner_are_one_update() -> None:
    sources = {"gpu-001": PoolSource(snapshot=node(down=True), node_uid=UID)}
    (action,) = plan(sources, published(node()), cluster_nodes={"gpu-001": UID}, settings=SETTINGS)
    assert isinstance(action, Update)
    assert action.body["metadata"]["ownerReferences"] == [OWNER]
    assert state_of(action.body, "mlx5-0") == "DOWN"
