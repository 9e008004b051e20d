"""Alertmanager v2 client: posts firing/resolved alerts, re-sends firing ones periodically.

`submit` is synchronous and never blocks the engine; `run` owns the HTTP I/O with bounded
retries. Alertmanager resolves an alert by itself when it stops hearing about it for
`resolve_timeout`, so every firing alert is re-posted every `resend_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import httpx

from aggregator.alerts.metrics import AlertMetrics
from proto.messages.alerts import Alert

log = logging.getLogger(__name__)
ALERTS_PATH: Final = "/api/v2/alerts"
DEFAULT_RUNBOOK: Final = "https://github.com/nicfleet/nicfleet/blob/main/docs/rules.md"


@dataclass(frozen=True, kw_only=True)
class AlertmanagerSettings:
    url: str
    resend_s: float = 60.0
    attempts: int = 3
    backoff_s: float = 0.5  # doubled per attempt
    timeout_s: float = 5.0
    runbook_base: str = DEFAULT_RUNBOOK
    max_resolved_rounds: int = 10  # give up re-posting a resolve after this many failures


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def to_postable(alert: Alert, runbook_base: str, now: float) -> dict[str, Any]:
    """An Alertmanager v2 `postableAlert`."""
    body: dict[str, Any] = {
        "labels": {
            "alertname": alert.rule,
            "rule": alert.rule,
            "severity": alert.severity,
            "node": alert.node,
            "subject": alert.subject,
        },
        "annotations": {"summary": alert.message, "runbook": f"{runbook_base}#{alert.rule}"},
        "startsAt": _iso(alert.starts_at),
    }
    if alert.state == "resolved":
        body["endsAt"] = _iso(alert.ends_at if alert.ends_at is not None else now)
    return body


class AlertmanagerSink:
    def __init__(
        self,
        settings: AlertmanagerSettings,
        *,
        firing: Callable[[], list[Alert]],
        metrics: AlertMetrics,
        clock: Callable[[], float],
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self._firing = firing
        self._metrics = metrics
        self._clock = clock
        self._transport = transport
        self._pending: dict[str, tuple[Alert, int]] = {}  # fingerprint -> (alert, failed rounds)
        self._wake = asyncio.Event()

    def submit(self, alerts: list[Alert]) -> None:
        for alert in alerts:
            self._pending[alert.fingerprint] = (alert, 0)
        if alerts:
            self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        url = self.settings.url.rstrip("/") + ALERTS_PATH
        async with httpx.AsyncClient(
            timeout=self.settings.timeout_s, transport=self._transport
        ) as http:
            next_resend = self._clock() + self.settings.resend_s
            while not stop.is_set():
                await _wake_or_stop(self._wake, stop, max(0.0, next_resend - self._clock()))
                self._wake.clear()
                if stop.is_set():
                    break
                batch = dict(self._pending)
                self._pending.clear()
                if self._clock() >= next_resend:
                    for alert in self._firing():
                        batch.setdefault(alert.fingerprint, (alert, 0))
                    next_resend = self._clock() + self.settings.resend_s
                if batch:
                    await self._post(http, url, batch, stop)

    async def _post(
        self,
        http: httpx.AsyncClient,
        url: str,
        batch: dict[str, tuple[Alert, int]],
        stop: asyncio.Event,
    ) -> None:
        now = self._clock()
        body = [to_postable(a, self.settings.runbook_base, now) for a, _ in batch.values()]
        error = ""
        for attempt in range(self.settings.attempts):
            try:
                response = await http.post(url, json=body)
                if response.is_success:
                    self._metrics.alertmanager_posts.labels("ok").inc()
                    return
                error = f"HTTP {response.status_code}: {response.text[:200]}"
                if 400 <= response.status_code < 500:
                    break  # Alertmanager rejected the payload; retrying will not help
            except httpx.HTTPError as exc:
                error = str(exc) or type(exc).__name__
            self._metrics.alertmanager_posts.labels("retry").inc()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.backoff_s * 2**attempt)
            if stop.is_set():
                break
        self._metrics.alertmanager_posts.labels("failed").inc()
        log.warning("posting %d alerts to Alertmanager %s failed: %s", len(body), url, error)
        # Firing alerts come back with the next resend; resolves are kept a few rounds.
        for key, (alert, rounds) in batch.items():
            if alert.state == "resolved" and rounds + 1 < self.settings.max_resolved_rounds:
                self._pending.setdefault(key, (alert, rounds + 1))


async def _wake_or_stop(wake: asyncio.Event, stop: asyncio.Event, timeout: float) -> None:
    waiters = {asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stop.wait())}
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
