"""The accept-error log: counted every time, logged once per interval, other loop errors
passed on; and the pure report limit behind it."""

from __future__ import annotations

import asyncio
import errno
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from aggregator.api.connections import (
    ACCEPT_FAILED,
    ConnectionGuard,
    ReportLimit,
    log_accept_errors,
)
from aggregator.metrics import HttpMetrics


def test_report_limit_reports_once_per_interval_and_counts_what_it_held() -> None:
    limit = ReportLimit(10.0)
    assert limit.event(0.0) == 1
    assert [limit.event(t) for t in (1.0, 2.0, 9.9)] == [None, None, None]
    assert limit.event(10.0) == 4  # three held back and this one
    assert limit.event(25.0) == 1


def emfile() -> dict[str, Any]:
    return {"message": ACCEPT_FAILED, "exception": OSError(errno.EMFILE, "Too many open files")}


async def test_accept_errors_are_counted_always_and_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    registry = CollectorRegistry()
    metrics = HttpMetrics.create(registry)
    guard = ConnectionGuard(max_connections=96, header_timeout=10, retry_after_s=1, metrics=metrics)
    passed_on: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: passed_on.append(context))
    restore = log_accept_errors(loop, interval=3600.0, metrics=metrics, guard=guard)
    try:
        with caplog.at_level(logging.ERROR, logger="aggregator.api.connections"):
            for _ in range(1280):  # ten ticks of asyncio's 128 accept attempts
                loop.call_exception_handler(emfile())
            loop.call_exception_handler({"message": "something else"})
    finally:
        restore()
    counted = registry.get_sample_value("nicfleet_api_accept_errors_total", {"errno": "EMFILE"})
    assert counted == 1280
    lines = [r for r in caplog.records if r.name == "aggregator.api.connections"]
    assert len(lines) == 1
    assert "Too many open files" in lines[0].getMessage()
    assert "bound 96" in lines[0].getMessage()
    assert passed_on == [{"message": "something else"}]  # to the handler it replaced
    assert loop.get_exception_handler() is not None  # the previous one is back
    loop.set_exception_handler(None)
