"""A start that fails halfway closes what it had opened, in reverse order (the run's
AsyncExitStack in aggregator.service), and publishes no runtime."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggregator.api.tokenreview import ReviewSettings
from aggregator.errors import SettingsError
from aggregator.runtime.parts import ServiceNotStarted
from aggregator.service import AggregatorService, AggregatorSettings


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def closed(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("closed ")]


@pytest.mark.parametrize(
    ("review", "error", "expected"),
    [
        pytest.param(
            None,
            OSError,
            [
                "closed API",
                "closed desired-config answers",
                "closed NATS connection",
                "closed embedded nats-server",
            ],
            id="api-address-taken",
        ),
        pytest.param(
            ReviewSettings(read_groups=("viewers",)),
            SettingsError,
            [
                "closed desired-config answers",
                "closed NATS connection",
                "closed embedded nats-server",
            ],
            id="token-review-without-cluster",
        ),
    ],
)
async def test_a_failed_start_closes_in_reverse_order(
    tmp_path: Path,
    taken_port: int,
    caplog: pytest.LogCaptureFixture,
    review: ReviewSettings | None,
    error: type[Exception],
    expected: list[str],
) -> None:
    caplog.set_level(logging.DEBUG, logger="aggregator.runtime.parts")
    ready_file = tmp_path / "ready.json"
    ready_file.write_text("{}")  # left by an earlier run
    service = AggregatorService(
        AggregatorSettings(
            listen_port=taken_port,
            nats_store_dir=tmp_path / "js",
            ready_file=ready_file,
            api_token_review=review,
        )
    )
    with pytest.raises(error):
        await service.run(asyncio.Event())
    assert closed(caplog) == expected
    assert not ready_file.exists()
    assert not service.ready.is_set()
    assert service.readiness()[0] is False
    with pytest.raises(ServiceNotStarted, match="not started"):
        service.api_url  # noqa: B018


def test_the_runtime_is_unreadable_before_start() -> None:
    service = AggregatorService(AggregatorSettings())
    assert service.readiness() == (False, "not connected to NATS")
    for read in (lambda: service.leader, lambda: service.alerts, lambda: service.reconciler):
        with pytest.raises(ServiceNotStarted):
            read()
