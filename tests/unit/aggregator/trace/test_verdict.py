"""A chain's verdict (pure): broken > degraded > unknown > ok, and the reason it gives."""

from __future__ import annotations

import pytest

from aggregator.trace.host import link_broken, link_degraded, link_ok, link_unknown
from aggregator.trace.verdict import verdict_of
from proto.http import Link, Verdict

OK = link_ok("agent")
UNKNOWN = link_unknown("allocatable", cluster="no cluster")
DOWN = link_degraded("rdma-device", "7 of 8 selected adapters up", "check the cable", ["mlx5_3"])
UNHEALTHY = link_degraded("advertised", "7 of 8 devices healthy", "fix it", ["mlx5_3", "mlx5_5"])
BROKEN = link_broken("driver", "mlx5_ib not loaded", "modprobe mlx5_ib")


@pytest.mark.parametrize(
    ("links", "components", "verdict", "reason"),
    [
        pytest.param((OK, OK), OK, "ok", "every link holds", id="all-ok"),
        pytest.param((OK,), None, "ok", "every link holds", id="no-components-section"),
        pytest.param(
            (OK, UNKNOWN), OK, "unknown",
            "1 link not judged (allocatable); nothing broken", id="one-unknown",
        ),
        pytest.param(
            (OK, UNKNOWN), link_unknown("components"), "unknown",
            "2 links not judged (components, allocatable); nothing broken", id="components-unknown",
        ),
        pytest.param(
            (OK, DOWN, UNKNOWN), OK, "degraded",
            "capacity reduced on mlx5_3 (rdma-device)", id="degraded-beats-unknown",
        ),
        pytest.param(
            (DOWN, UNHEALTHY), OK, "degraded",
            "capacity reduced on mlx5_3, mlx5_5 (rdma-device, advertised)", id="adapters-merged",
        ),
        pytest.param(
            (OK, DOWN, BROKEN), OK, "broken",
            "link 2 (driver): mlx5_ib not loaded", id="broken-beats-degraded",
        ),
        pytest.param(
            (BROKEN,), link_broken("components", "node not Ready", "check the kubelet"), "broken",
            "components: node not Ready", id="components-first",
        ),
        pytest.param(
            (Link(name="x", status="degraded"),), None, "degraded",
            "capacity reduced (x)", id="degraded-without-adapters",
        ),
    ],
)  # fmt: skip
def test_verdict(
    links: tuple[Link, ...], components: Link | None, verdict: Verdict, reason: str
) -> None:
    assert verdict_of(links, components) == (verdict, reason)
