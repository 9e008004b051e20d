"""aggregator.fleet.summaries: cached summaries equal `summarize` whatever changed."""

from __future__ import annotations

from aggregator.fleet.state import Fleet
from aggregator.fleet.summaries import SummaryCache
from aggregator.fleet.views import summarize
from tests.support.builders import T0, counters, device, port_event, snapshot

STALE = 30.0


def test_cached_summaries_equal_summarize_through_every_kind_of_change() -> None:
    fleet, cache = Fleet(), SummaryCache()
    devices = (device("mlx5_0"), device("mlx5_1"))

    def same(name: str, now: float) -> None:
        record = fleet.get(name)
        assert record is not None
        assert cache.summary(record, now, STALE) == summarize(record, now, STALE)

    fleet.apply_counters(counters("gpu-001"), T0)  # no snapshot yet
    same("gpu-001", T0)
    fleet.apply_snapshot(snapshot("gpu-001", devices=devices), T0 + 1)
    same("gpu-001", T0 + 1)
    first = fleet.get("gpu-001")
    fleet.apply_counters(counters("gpu-001", seq=2, collected_at=T0 + 2, rx=5), T0 + 2)
    assert fleet.get("gpu-001") is not first  # a new record, the same snapshot object
    same("gpu-001", T0 + 2)
    same("gpu-001", T0 + 2 + STALE + 1)  # stale by the clock alone
    fleet.apply_event(port_event("gpu-001", device="mlx5_1", observed_at=T0 + 40), T0 + 40)
    same("gpu-001", T0 + 41)  # the event patched the snapshot: ports_down changed
    summary = cache.summary(fleet.get("gpu-001"), T0 + 41, STALE)  # type: ignore[arg-type]
    assert summary.ports_down == ("mlx5_1/1",)
    fleet.apply_snapshot(snapshot("gpu-001", seq=2, collected_at=T0 + 50, gpus=4), T0 + 50)
    same("gpu-001", T0 + 50)


def test_retain_forgets_nodes_gone_from_the_fleet() -> None:
    fleet, cache = Fleet(), SummaryCache()
    for i in range(300):
        fleet.apply_snapshot(snapshot(f"n-{i:03}"), T0)
        cache.summary(fleet.get(f"n-{i:03}"), T0, STALE)  # type: ignore[arg-type]
    cache.retain(fleet.view())
    assert len(cache) == 300
    for i in range(250):
        fleet.forget(f"n-{i:03}")
    cache.retain(fleet.view())
    assert len(cache) == 50
