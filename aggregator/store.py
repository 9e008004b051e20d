"""Persist the latest snapshot of every node in the `nicfleet-nodes` KV bucket.

Writes are coalesced per node (only the newest pending snapshot of a node is written)
and done by one writer task, up to 32 in flight, so ingest never waits on storage and a
burst of snapshots is not written one round trip at a time. A failed write is
counted, keeps the node pending and is retried; nothing already stored is overwritten
by a message the fleet rejected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from typing import Final

from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.errors import Error as JetStreamError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from aggregator.errors import StoreError
from aggregator.metrics import Metrics
from proto import subjects
from proto.codec import CodecError, decode, encode
from proto.inventory import Base, NodeSnapshot

log = logging.getLogger(__name__)

# KV puts awaited together: each is a JetStream publish waiting for its ack.
WRITES_IN_FLIGHT: Final = 32


class StoredNode(Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.stored-node"):
    """What the aggregator keeps per node in KV: the snapshot and when it arrived."""

    version: int = 1
    snapshot: NodeSnapshot
    received_at: float


async def ensure_buckets(
    js: JetStreamContext, names: Iterable[str], *, replicas: int, settle_s: float = 30.0
) -> None:
    """Create each KV bucket with `replicas` copies (a JetStream cluster keeps it when a
    server dies), or raise the replica count of an existing one. Run before the openers,
    which then bind to what exists. Errors name the bucket and the `--kv-replicas` asked."""
    for name in names:
        await _ensure_bucket(js, name, replicas=replicas, settle_s=settle_s)


async def _ensure_bucket(
    js: JetStreamContext, name: str, *, replicas: int, settle_s: float
) -> None:
    # A JetStream cluster answers nothing (timeouts) until its meta leader is elected, and
    # a client may be between servers at start: transient, so retried for `settle_s`.
    deadline = asyncio.get_running_loop().time() + settle_s
    while True:
        try:
            await _ensure_bucket_once(js, name, replicas=replicas)
            return
        except StoreError as exc:
            transient = isinstance(exc.__cause__, TimeoutError | NatsTimeoutError)
            if not transient or asyncio.get_running_loop().time() >= deadline:
                raise
            log.info("KV bucket %s: %s; retrying", name, exc)
            await asyncio.sleep(0.5)  # a retry pause, not a wait for a condition


async def _ensure_bucket_once(js: JetStreamContext, name: str, *, replicas: int) -> None:
    try:
        info = await js.stream_info(f"KV_{name}")
    except NotFoundError:
        try:
            await js.create_key_value(
                bucket=name, history=1, description="nicfleet", replicas=replicas
            )
        except (TimeoutError, NatsError, JetStreamError) as exc:
            raise StoreError(
                f"cannot create KV bucket {name} with --kv-replicas {replicas}: {exc}"
            ) from exc
        return
    except (TimeoutError, NatsError, JetStreamError) as exc:
        raise StoreError(f"cannot look up KV bucket {name}: {exc}") from exc
    if (info.config.num_replicas or 1) < replicas:
        try:
            await js.update_stream(replace(info.config, num_replicas=replicas))
        except (TimeoutError, NatsError, JetStreamError) as exc:
            raise StoreError(
                f"cannot raise KV bucket {name} to --kv-replicas {replicas}: {exc}"
            ) from exc
        log.info("KV bucket %s now has %d replicas", name, replicas)


async def open_bucket(
    js: JetStreamContext, name: str = subjects.KV_NODES, *, settle_s: float = 30.0
) -> KeyValue:
    """Bind to the bucket, creating it on first use. Timeouts (a JetStream cluster still
    electing its meta leader, a client between servers) are retried for `settle_s`."""
    deadline = asyncio.get_running_loop().time() + settle_s
    while True:
        try:
            return await _open_bucket_once(js, name)
        except TimeoutError as exc:
            if asyncio.get_running_loop().time() >= deadline:
                raise StoreError(f"cannot open KV bucket {name}: {exc!r}") from exc
            log.info("KV bucket %s: %r; retrying", name, exc)
            await asyncio.sleep(0.5)  # a retry pause, not a wait for a condition


async def _open_bucket_once(js: JetStreamContext, name: str) -> KeyValue:
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        pass
    try:
        return await js.create_key_value(bucket=name, history=1, description="nicfleet")
    except JetStreamError as exc:
        raise StoreError(f"cannot create KV bucket {name}: {exc}") from exc


async def load_nodes(kv: KeyValue, *, timeout: float = 30.0) -> AsyncIterator[StoredNode]:
    """Every decodable node in the bucket; undecodable entries are logged and skipped.

    One pass over the bucket's stream (an ordered consumer, last value per key), not a
    key listing plus one request per key, which took 3× the CPU at 10,000 nodes
    (bench/aggregator_restart.py). The pass ends at the stream's last sequence as read
    before it began, not at nats-py's end-of-initial-values marker alone: under load that
    marker came first, before any entry, and a restart would have loaded nothing.
    """
    try:
        state = (await kv.status()).stream_info.state
        watcher = await kv.watchall()
    except (TimeoutError, JetStreamError, NatsError) as exc:
        raise StoreError(f"cannot read KV bucket: {exc}") from exc
    if not state.messages:
        with contextlib.suppress(TimeoutError, JetStreamError, NatsError, OSError):
            await watcher.stop()  # type: ignore[no-untyped-call]
        return
    last = state.last_seq
    try:
        while True:
            try:
                entry = await watcher.updates(timeout=timeout)  # type: ignore[no-untyped-call]
            except (TimeoutError, NatsError) as exc:
                raise StoreError(
                    f"KV bucket read stalled before sequence {last} ({timeout:g}s)"
                ) from exc
            if entry is None:
                continue  # the end-of-initial-values marker: trust the sequence instead
            if entry.value and entry.operation not in (KV_DEL, KV_PURGE):
                try:
                    yield decode(entry.value, StoredNode)
                except CodecError as exc:
                    log.warning("skipping undecodable KV entry %s: %s", entry.key, exc)
            if entry.revision is not None and entry.revision >= last:
                return
    finally:
        with contextlib.suppress(TimeoutError, JetStreamError, NatsError, OSError):
            await watcher.stop()  # type: ignore[no-untyped-call]


class SnapshotWriter:
    """Coalescing writer: `submit` is synchronous and cheap; `run` does the I/O."""

    def __init__(self, kv: KeyValue, metrics: Metrics, *, retry_wait: float = 1.0) -> None:
        self._kv = kv
        self._metrics = metrics
        self._pending: dict[str, StoredNode] = {}
        self._wake = asyncio.Event()
        self._retry_wait = retry_wait
        self.healthy = True
        self.last_error: str | None = None

    def submit(self, snapshot: NodeSnapshot, received_at: float) -> None:
        self._pending[snapshot.node] = StoredNode(snapshot=snapshot, received_at=received_at)
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            stop_wait = asyncio.ensure_future(stop.wait())
            wake_wait = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({stop_wait, wake_wait}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop_wait.cancel()
                wake_wait.cancel()
            self._wake.clear()
            await self.flush()
            if self._pending and not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self._retry_wait)
                except TimeoutError:
                    self._wake.set()
        await self.flush()

    async def flush(self) -> None:
        batch, self._pending = self._pending, {}
        items = list(batch.items())
        for start in range(0, len(items), WRITES_IN_FLIGHT):
            chunk = items[start : start + WRITES_IN_FLIGHT]
            await asyncio.gather(*(self._write(node, stored) for node, stored in chunk))
        if not self._pending:
            if not self.healthy:
                log.info("KV writes to %s work again", subjects.KV_NODES)
            self.healthy = True
            self.last_error = None

    async def _write(self, node: str, stored: StoredNode) -> None:
        try:
            await self._kv.put(subjects.node_token(node), encode(stored))
        except (TimeoutError, JetStreamError, OSError) as exc:
            self._metrics.kv_write_errors.labels(subjects.KV_NODES).inc()
            # A full or missing bucket fails every node on every retry: warn once
            # per episode, the rest is in the metric and at debug level.
            level = logging.WARNING if self.healthy else logging.DEBUG
            log.log(level, "KV write for node %s failed: %s", node, exc)
            self.healthy = False
            self.last_error = f"KV write for node {node} failed: {exc}"
            # Keep it pending unless a newer snapshot arrived meanwhile.
            self._pending.setdefault(node, stored)
            return
        self._metrics.kv_writes.labels(subjects.KV_NODES).inc()
