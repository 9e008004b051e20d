"""The single-replica or sharded strategy is chosen once, from settings (aggregator.runtime)."""

from __future__ import annotations

import pytest

from aggregator.replicas.partitions import ShardSettings
from aggregator.runtime.strategy import (
    ShardedReplica,
    SingleReplica,
    advertised_api_url,
    choose_replica,
)


@pytest.mark.parametrize(
    ("shards", "expected"),
    [
        pytest.param(ShardSettings(), SingleReplica, id="default-one-process"),
        pytest.param(ShardSettings(partitions=0, replicas=3), SingleReplica, id="kv-copies-only"),
        pytest.param(ShardSettings(partitions=1), ShardedReplica, id="one-partition"),
        pytest.param(ShardSettings(partitions=12, replicas=3), ShardedReplica, id="twelve"),
        pytest.param(
            ShardSettings(partitions=4, advertise_url="http://agg-0.agg:8080"),
            ShardedReplica,
            id="advertised",
        ),
    ],
)
def test_the_strategy_follows_the_partition_count(
    shards: ShardSettings, expected: type[SingleReplica] | type[ShardedReplica]
) -> None:
    assert choose_replica(shards) is expected


def _here() -> str:
    return "10.0.0.7"


@pytest.mark.parametrize(
    ("listen", "advertise", "bound", "expected"),
    [
        pytest.param("127.0.0.1", None, None, None, id="not-bound-yet"),
        pytest.param("127.0.0.1", "http://a:1", None, "http://a:1", id="advertised-before-bind"),
        pytest.param("127.0.0.1", None, "http://127.0.0.1:81", "http://127.0.0.1:81", id="bound"),
        pytest.param("0.0.0.0", None, "http://0.0.0.0:80", "http://10.0.0.7:80", id="wildcard"),
        pytest.param("::", None, "http://[::]:80", "http://10.0.0.7:80", id="v6-wildcard"),
    ],
)
def test_the_advertised_api_url(
    listen: str, advertise: str | None, bound: str | None, expected: str | None
) -> None:
    shards = ShardSettings(partitions=4, advertise_url=advertise)
    assert advertised_api_url(shards, listen, bound, _here) == expected


def test_a_v6_host_address_is_bracketed() -> None:
    url = advertised_api_url(ShardSettings(partitions=2), "", "http://[::]:80", lambda: "fd00::7")
    assert url == "http://[fd00::7]:80"
