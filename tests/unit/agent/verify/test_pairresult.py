"""Pair-test result math: bandwidth from bytes and seconds, nearest-rank percentiles."""

from __future__ import annotations

import math

import pytest

from agent.verify.pair.results import bytes_per_second, latency_summary, one_way_us, percentile


@pytest.mark.parametrize(
    ("transferred", "seconds", "rate"),
    [(65536 * 5000, 0.25, 1_310_720_000.0), (0, 1.0, 0.0), (1, 1e-9, 1e9)],
)
def test_bytes_per_second(transferred: int, seconds: float, rate: float) -> None:
    assert bytes_per_second(transferred, seconds) == pytest.approx(rate)


@pytest.mark.parametrize(
    ("transferred", "seconds", "needle"),
    [(1, 0.0, "positive"), (1, -1.0, "positive"), (1, math.nan, "positive"),
     (1, math.inf, "positive"), (-1, 1.0, "negative")],
)  # fmt: skip
def test_bytes_per_second_refuses_non_measurements(
    transferred: int, seconds: float, needle: str
) -> None:
    with pytest.raises(ValueError, match=needle):
        bytes_per_second(transferred, seconds)


@pytest.mark.parametrize(
    ("p", "expected"),
    [(0, 1.0), (1, 1.0), (50, 50.0), (99, 99.0), (99.5, 100.0), (100, 100.0)],
)
def test_nearest_rank_percentile_is_a_real_sample(p: float, expected: float) -> None:
    assert percentile([float(i) for i in range(1, 101)], p) == expected


def test_percentile_of_one_sample() -> None:
    assert percentile([7.0], 50) == percentile([7.0], 99) == 7.0


@pytest.mark.parametrize(("samples", "p"), [([], 50), ([1.0], -1), ([1.0], 101)])
def test_percentile_refuses(samples: list[float], p: float) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message is covered above
        percentile(samples, p)


def test_latency_summary_from_round_trips() -> None:
    samples = one_way_us([4e-6] * 98 + [6e-6, 40e-6])
    assert samples[0] == pytest.approx(2.0)
    summary = latency_summary(samples)
    assert summary.samples == 100
    assert summary.p50_us == pytest.approx(2.0)
    assert summary.p99_us == pytest.approx(3.0)
    assert (summary.min_us, summary.max_us) == pytest.approx((2.0, 20.0))


@pytest.mark.parametrize("bad", [[-1.0], [math.nan], [math.inf]])
def test_latency_summary_refuses_impossible_samples(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="finite"):
        latency_summary(bad)


def test_latency_summary_needs_samples() -> None:
    with pytest.raises(ValueError, match="no samples"):
        latency_summary([])
