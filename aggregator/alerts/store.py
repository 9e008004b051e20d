"""Alert state persistence in the JetStream KV bucket `nicfleet-alerts`.

Key = the alert fingerprint (hex), value = the msgpack `Tracked` state. Loading skips
undecodable entries (logged); writes that fail are kept and retried by the caller, so a
restart finds every firing alert and does not notify it again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from nats.js.client import JetStreamContext
from nats.js.errors import Error as JetStreamError
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from aggregator.alerts.lifecycle import Tracked
from aggregator.errors import StoreError
from aggregator.fleet.store import in_flight
from aggregator.kv import bucket_keys
from proto.codec import CodecError, decode, encode

log = logging.getLogger(__name__)


async def load_states(kv: KeyValue) -> dict[str, Tracked]:
    # The stream's subject list, not `kv.keys()`: nats-py's listing misses keys that are
    # written meanwhile (aggregator.kv), and a missed firing alert would fire again.
    js: JetStreamContext = kv._js
    bucket: str = kv._name
    try:
        keys = sorted(await bucket_keys(js, bucket))
    except StoreError as exc:
        raise StoreError(f"cannot list keys of the alerts bucket: {exc}") from exc
    states: dict[str, Tracked] = {}
    for key in keys:
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            continue  # deleted (a marker) or purged meanwhile
        except (TimeoutError, JetStreamError) as exc:
            raise StoreError(f"cannot read alert state {key}: {exc}") from exc
        if entry.value is None:
            continue
        try:
            state = decode(entry.value, Tracked)
        except CodecError as exc:
            log.warning("skipping undecodable alert state %s: %s", key, exc)
            continue
        if state.alert.fingerprint != key:
            log.warning(
                "skipping alert state %s: it holds fingerprint %s", key, state.alert.fingerprint
            )
            continue
        states[key] = state
    return states


class AlertStore:
    """Writes changed states and deletes forgotten ones; failed keys stay dirty."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self._dirty: set[str] = set()
        self._gone: set[str] = set()
        self.last_error: str | None = None

    @property
    def pending(self) -> int:
        return len(self._dirty) + len(self._gone)

    async def load(self) -> dict[str, Tracked]:
        """What the (previous) leader persisted."""
        return await load_states(self._kv)

    async def save(
        self,
        states: Mapping[str, Tracked],
        changed: Iterable[str],
        removed: Iterable[str],
    ) -> tuple[int, int]:
        """Persist; return (writes, failures). Several in flight (`in_flight`): a
        fleet-wide episode (10,000 stale agents resolving) is not written one round trip
        after the other while new alerts wait for the next cycle."""
        changed, removed = set(changed), set(removed)
        self._gone = (self._gone - changed) | removed
        self._dirty = {key for key in (self._dirty | changed) - removed if key in states}

        async def put(key: str) -> bool:
            try:
                await self._kv.put(key, encode(states[key]))
            except (TimeoutError, JetStreamError, OSError) as exc:
                self.last_error = f"alert state write {key} failed: {exc}"
                return False
            self._dirty.discard(key)
            return True

        async def delete(key: str) -> bool:
            try:
                await self._kv.delete(key)
            except KeyNotFoundError:
                pass
            except (TimeoutError, JetStreamError, OSError) as exc:
                self.last_error = f"alert state delete {key} failed: {exc}"
                return False
            self._gone.discard(key)
            return True

        done = await in_flight(sorted(self._dirty), put)
        done += await in_flight(sorted(self._gone), delete)
        writes, failures = done.count(True), done.count(False)
        if failures:
            log.warning("%s (%d failures, will retry)", self.last_error, failures)
        else:
            self.last_error = None
        return writes, failures
