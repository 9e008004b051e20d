"""Turn raw node messages (subject + bytes) into fleet updates.

Validates the subject, decodes with the codec, checks that the message speaks for the
node its subject names, and applies it. A bad message is counted and logged once per
(node, reason) — never raised into the subscription loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from aggregator.fleet.state import Fleet
from aggregator.metrics import Metrics
from proto import subjects
from proto.codec import CodecError, decode, decode_counters
from proto.inventory import NodeSnapshot
from proto.messages.events import LinkEvent
from proto.messages.status import DevicePluginStatus

log = logging.getLogger(__name__)

_MAX_LOGGED: Final = 1024
# Parsed node subjects kept (4 kinds per node); cleared when full, so never unbounded.
_MAX_SUBJECTS: Final = 200_000


class Ingest:
    def __init__(
        self,
        *,
        fleet: Fleet,
        metrics: Metrics,
        clock: Callable[[], float],
        on_snapshot: Callable[[NodeSnapshot, float], None],
        on_change: Callable[[str, str], None] | None = None,
    ) -> None:
        self._fleet = fleet
        self._metrics = metrics
        self._clock = clock
        self._on_snapshot = on_snapshot
        self._on_change = on_change
        self._logged: set[tuple[str, str]] = set()
        self._subjects: dict[str, tuple[str, str]] = {}
        self._accepted = metrics.messages.by_kind

    def handle(self, subject: str, data: bytes) -> bool:
        """Apply one message; return False (after counting it) when it was rejected."""
        parsed = self._subjects.get(subject)
        if parsed is None:
            try:
                parsed = subjects.parse_node_subject(subject)
            except ValueError as exc:
                return self._reject("unknown", "subject", subject, str(exc))
            if len(self._subjects) >= _MAX_SUBJECTS:
                self._subjects.clear()
            self._subjects[subject] = parsed
        node, kind = parsed
        now = self._clock()
        try:
            if kind == subjects.SNAPSHOT:
                snap = decode(data, NodeSnapshot)
                if snap.node != node:
                    return self._mismatch(kind, subject, snap.node)
                before = self._fleet.get(node)
                previous = before.snapshot if before is not None else None
                stored = self._fleet.apply_snapshot(snap, now).snapshot
                if stored is not None and stored is not previous:
                    self._on_snapshot(stored, now)  # persist only what the fleet accepted
            elif kind == subjects.COUNTERS:
                batch = decode_counters(data)
                if batch.node != node:
                    return self._mismatch(kind, subject, batch.node)
                self._fleet.apply_counters(batch, now, data)
            elif kind == subjects.EVENT:
                event = decode(data, LinkEvent)
                if event.node != node:
                    return self._mismatch(kind, subject, event.node)
                self._fleet.apply_event(event, now)
            else:
                status = decode(data, DevicePluginStatus)
                if status.node != node:
                    return self._mismatch(kind, subject, status.node)
                self._fleet.apply_status(status, now)
        except CodecError as exc:
            return self._reject(kind, "decode", subject, str(exc))
        self._accepted[kind] += 1
        if self._on_change is not None:
            self._on_change(node, kind)
        return True

    def _mismatch(self, kind: str, subject: str, claimed: str) -> bool:
        return self._reject(kind, "node-mismatch", subject, f"message claims node {claimed!r}")

    def _reject(self, kind: str, reason: str, subject: str, detail: str) -> bool:
        self._metrics.rejected.labels(kind, reason).inc()
        key = (subject, reason)
        if key not in self._logged and len(self._logged) < _MAX_LOGGED:
            self._logged.add(key)
            log.warning(
                "dropped message on %s (%s): %s", subject, reason, detail, extra={"kind": kind}
            )
        return False
