"""Turn raw node messages (subject + bytes) into fleet updates.

Validates the subject, decodes with the codec, checks that the message speaks for the
node its subject names, and applies it — one `Route` per message kind. Every message is
counted once: applied (`nicfleet_ingest_messages`), ignored by the fleet with its reason
(`nicfleet_ingest_ignored`), or rejected before it (`nicfleet_ingest_rejected`, logged
once per (subject, reason)) — never raised into the subscription loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Generic, Protocol, TypeVar

from aggregator.fleet.state import Fleet, Outcome
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


class NodeMessage(Protocol):
    @property
    def node(self) -> str: ...


M = TypeVar("M", bound=NodeMessage)


@dataclass(frozen=True, slots=True)
class Route(Generic[M]):
    """How one message kind reaches the fleet: `decode` raises CodecError on bad bytes;
    `apply(fleet, message, received_at, wire)`; `persist`: an applied one goes to KV."""

    decode: Callable[[bytes], M]
    apply: Callable[[Fleet, M, float, bytes], Outcome]
    persist: bool = False


ROUTES: Final[Mapping[str, Route[Any]]] = MappingProxyType(
    {
        subjects.SNAPSHOT: Route(
            lambda data: decode(data, NodeSnapshot),
            lambda fleet, snap, now, _wire: fleet.apply_snapshot(snap, now),
            persist=True,
        ),
        # The wire bytes are held instead of the decoded batch (aggregator.fleet.heldcounters).
        subjects.COUNTERS: Route(decode_counters, Fleet.apply_counters),
        subjects.EVENT: Route(
            lambda data: decode(data, LinkEvent),
            lambda fleet, event, now, _wire: fleet.apply_event(event, now),
        ),
        subjects.STATUS: Route(
            lambda data: decode(data, DevicePluginStatus),
            lambda fleet, status, now, _wire: fleet.apply_status(status, now),
        ),
    }
)
assert tuple(ROUTES) == subjects.NODE_KINDS, "a node message kind without its route"


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
        self._applied = metrics.messages.by_kind

    def handle(self, subject: str, data: bytes) -> bool:
        """Offer one message to the fleet; False (after counting it) when it was rejected
        before that. Only an applied one is persisted (snapshots) and fires `on_change`."""
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
        route = ROUTES[kind]
        now = self._clock()
        try:
            message = route.decode(data)
            if message.node != node:
                return self._mismatch(kind, subject, message.node)
            outcome = route.apply(self._fleet, message, now, data)
        except CodecError as exc:
            return self._reject(kind, "decode", subject, str(exc))
        if outcome.ignored is not None:
            self._metrics.messages.ignore(kind, outcome.ignored)
            return True
        self._applied[kind] += 1
        if route.persist and outcome.record.snapshot is not None:
            self._on_snapshot(outcome.record.snapshot, now)
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
