"""aggregator.dra.publisher's pure part: which fleet records become pools, when stale, with
which slice settings and owner; and its metrics' exposition (promtool-clean)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from aggregator.dra.publisher import PublishMetrics, PublishSettings, SlicePublisher, pool_sources
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import NodeRecord
from aggregator.kube.objects import node_from_object
from proto.draslices import SliceSettings
from proto.messages.status import DevicePluginStatus, DraPluginStatus, DraSliceConfig
from tests.support.builders import T0, snapshot
from tests.support.livemetrics import families
from tests.support.paths import REPO


def record(
    name: str,
    last_seen: float,
    with_snapshot: bool = True,
    slices: DraSliceConfig | None = None,
) -> NodeRecord:
    snap = snapshot(name) if with_snapshot else None
    status = (
        None
        if slices is None
        else DevicePluginStatus(node=name, observed_at=T0, dra=DraPluginStatus(slices=slices))
    )
    return NodeRecord(
        name=name, snapshot=snap, first_seen=T0, last_seen=last_seen, device_plugin=status
    )


def test_pools_are_the_nodes_with_a_snapshot_stale_past_stale_after() -> None:
    records = {
        "fresh": record("fresh", T0 - 30),
        "stale": record("stale", T0 - 30.5),
        "unknown": record("unknown", T0, with_snapshot=False),
    }
    found = pool_sources(records, T0, 30.0)
    assert {name: source.stale for name, source in found.items()} == {
        "fresh": False,
        "stale": True,
    }
    assert found["fresh"].snapshot.node == "fresh"


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        pytest.param(None, SliceSettings(max_devices=64), id="no-dra-status"),
        pytest.param(
            DraSliceConfig(sharing="copies", share=4, rails={"mlx5_0": 2}),
            SliceSettings(sharing="copies", share=4, rails={"mlx5_0": 2}, max_devices=64),
            id="copies-and-rails",
        ),
        pytest.param(
            DraSliceConfig(sharing="consumable", share=8),
            SliceSettings(sharing="consumable", share=8, max_devices=64),
            id="consumable",
        ),
        pytest.param(
            DraSliceConfig(sharing="shared-somehow", share=4),
            SliceSettings(max_devices=64),
            id="unknown-sharing-is-the-base",
        ),
        pytest.param(
            DraSliceConfig(sharing="copies", share=0),
            SliceSettings(max_devices=64),
            id="bad-share-is-the-base",
        ),
    ],
)
def test_each_pool_gets_its_agents_slice_settings_over_the_base(
    reported: DraSliceConfig | None, expected: SliceSettings
) -> None:
    records = {"n": record("n", T0, slices=reported)}
    (source,) = pool_sources(records, T0, 30.0, base=SliceSettings(max_devices=64)).values()
    assert source.settings == expected


def test_the_owner_uid_comes_from_the_node_objects() -> None:
    records = {n: record(n, T0) for n in ("a", "b", "c")}
    uids: dict[str, str | None] = {"a": "uid-a", "b": None}
    found = pool_sources(records, T0, 30.0, node_uids=uids)
    assert {n: s.node_uid for n, s in found.items()} == {"a": "uid-a", "b": None, "c": None}


def test_only_builds_the_named_pools() -> None:
    records = {n: record(n, T0) for n in ("a", "b")}
    assert set(pool_sources(records, T0, 30.0, only={"b", "gone"})) == {"b"}


def test_the_metrics_are_declared_and_pass_promtool() -> None:
    registry = CollectorRegistry()
    metrics = PublishMetrics(registry)
    metrics.writes.labels("update", "ok").inc()
    metrics.seconds.observe(0.012)
    metrics.pools.set(3)
    text = generate_latest(registry).decode()
    for action in ("create", "update", "delete"):
        for result in ("ok", "conflict", "error"):
            assert f'action="{action}",result="{result}"' in text
    assert "nicfleet_dra_slice_publish_seconds_bucket" in text
    assert "nicfleet_dra_published_pools 3.0" in text
    if shutil.which("promtool") is None:
        pytest.skip("promtool (Debian prometheus) absent")
    lint = subprocess.run(
        ["promtool", "check", "metrics"], input=text.encode(), capture_output=True, check=False
    )
    assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()


def test_docs_metrics_lists_the_publishers_series() -> None:
    """Not in the live scrape (the publisher needs a cluster): docs/metrics.md lists them by
    hand, with the type and labels the code declares."""
    doc = (REPO / "docs" / "metrics.md").read_text()
    section = doc[doc.index("### Aggregator publishing ResourceSlices") :]
    section = section[: section.index("\n### ")]
    registry = CollectorRegistry()
    PublishMetrics(registry)
    shown = {"counter": "{}_total", "histogram": "{}_bucket/_sum/_count", "gauge": "{}"}
    found = families(generate_latest(registry).decode())
    assert set(found) == {
        "nicfleet_dra_slice_writes",
        "nicfleet_dra_slice_publish_seconds",
        "nicfleet_dra_published_pools",
    }
    for name, (kind, _help, labels) in found.items():
        row = f"| `{shown[kind].format(name)}` | {kind} | "
        row += ", ".join(f"`{label}`" for label in labels) or "—"
        assert row in section, row


@pytest.mark.parametrize(
    ("metadata", "uid"),
    [
        pytest.param({"name": "n", "uid": "0c9d-uid"}, "0c9d-uid", id="uid"),
        pytest.param({"name": "n"}, None, id="none"),
        pytest.param({"name": "n", "uid": ""}, None, id="empty"),
        pytest.param({"name": "n", "uid": 7}, None, id="not-a-string"),
    ],
)
def test_the_node_uid_the_owner_reference_names(
    metadata: dict[str, object], uid: str | None
) -> None:
    node = node_from_object({"metadata": metadata})
    assert node is not None and node.uid == uid


class MemoryApi:
    """The SliceApi in memory: what was written, by name."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}

    async def list_resource_slices(self) -> list[dict[str, Any]]:
        return list(self.slices.values())

    async def create_resource_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.slices[body["metadata"]["name"]] = dict(body)
        return dict(body)

    async def replace_resource_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.slices[name] = dict(body)
        return dict(body)

    async def delete_resource_slice(self, name: str, resource_version: str | None) -> bool:
        return self.slices.pop(name, None) is not None


async def test_counter_batches_wake_the_publisher_only_for_a_stale_published_node() -> None:
    """Counters change no slice: ignored for nodes published as heard from; a node
    published stale is woken by them (it is back, its ports are known again)."""
    feed = ChangeFeed()
    changes = feed.subscribe()
    records = {"fresh": record("fresh", T0), "stale": record("stale", T0 - 100)}
    api = MemoryApi()
    publisher = SlicePublisher(
        PublishSettings(stale_after=30.0),
        api=api,
        changes=changes,
        records=lambda: records,
        cluster_nodes=lambda: None,
        is_leader=lambda: True,
        clock=lambda: T0,
    )
    assert await publisher.sync(None) == 2  # both pools created
    for node in ("fresh", "stale"):
        feed.publish(node, "counters")
    assert await changes.wait(0) == ({"stale"}, {"counters"})
    feed.publish("fresh", "event")
    assert await changes.wait(0) == ({"fresh"}, {"event"})
    records["stale"] = record("stale", T0)  # heard again
    assert await publisher.sync({"stale"}) == 1  # its ports are no longer UNKNOWN
    feed.publish("stale", "counters")
    assert await changes.wait(0) == (set(), set())
