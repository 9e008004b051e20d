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
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Final, TypeVar

from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError, ServiceUnavailableError
from nats.js.errors import Error as JetStreamError
from nats.js.kv import KV_DEL, KV_MARKER_REASON, KV_OP, KV_PURGE, KeyValue

from aggregator.errors import StoreError
from aggregator.kv import bucket_keys
from aggregator.metrics import Metrics
from proto import subjects
from proto.codec import CodecError, decode, encode
from proto.inventory import Base, NodeSnapshot

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_R = TypeVar("_R")

# KV puts awaited together: each is a JetStream publish waiting for its ack.
WRITES_IN_FLIGHT: Final = 32
# Entries per pull request when loading (~8 MB of 33 KB snapshots).
LOAD_BATCH: Final = 256


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
    """Bind to the bucket, creating it on first use. Timeouts and "JetStream system
    temporarily unavailable" (a JetStream cluster still electing its meta leader or
    without quorum, a client between servers) are retried for `settle_s`."""
    deadline = asyncio.get_running_loop().time() + settle_s
    while True:
        try:
            return await _open_bucket_once(js, name)
        except (TimeoutError, ServiceUnavailableError) as exc:
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


async def in_flight(items: Sequence[_T], write: Callable[[_T], Awaitable[_R]]) -> list[_R]:
    """`write` of every item, WRITES_IN_FLIGHT awaited together, results in order."""
    done: list[_R] = []
    for start in range(0, len(items), WRITES_IN_FLIGHT):
        done += await asyncio.gather(*map(write, items[start : start + WRITES_IN_FLIGHT]))
    return done


async def load_nodes(kv: KeyValue, *, timeout: float = 30.0) -> AsyncIterator[StoredNode]:
    """Every decodable node in the bucket; undecodable entries are logged and skipped."""
    async with contextlib.aclosing(read_bucket(kv, timeout=timeout)) as entries:
        async for key, value in entries:  # closed at once when the caller stops early
            try:
                yield decode(value, StoredNode)
            except CodecError as exc:
                log.warning("skipping undecodable KV entry %s: %s", key, exc)


async def read_bucket(
    kv: KeyValue, *, timeout: float = 30.0
) -> AsyncGenerator[tuple[str, bytes], None]:
    """(key, value) of every key of the bucket, each once; StoreError when it cannot be read.

    One pass over the bucket's stream (last value per key) through a pull consumer,
    LOAD_BATCH entries per request: the reader sets the pace. A push watch of 10,000 nodes
    (333 MB) outran the decoding on a loaded machine, overflowed the client's pending
    limit and stalled (slow consumer); a key listing plus one get per key took 3× the CPU.

    The pass covers the keys the stream names before it begins (`kvread.bucket_keys`, one
    request) and the stream's last sequence read then: a key another writer rewrites
    before the pass reaches it has lost its old entry (history 1) and comes past that
    sequence, so the pass goes on until each listed key was delivered or nothing is
    pending. Past that sequence only listed keys not delivered yet are yielded.
    """
    # nats-py's KeyValue keeps its JetStream context, stream and subject prefix private.
    js: JetStreamContext = kv._js
    stream: str = kv._stream
    prefix: str = kv._pre
    try:
        state = (await kv.status()).stream_info.state
        if not state.messages:
            return
        waiting = await bucket_keys(js, stream.removeprefix("KV_"))
        reader = await js.pull_subscribe(f"{prefix}>", stream=stream, config=_load_consumer())
    except (TimeoutError, JetStreamError, NatsError, OSError) as exc:
        raise StoreError(f"cannot read KV bucket {stream[3:]}: {exc!r}") from exc
    last = state.last_seq
    try:
        while True:
            try:
                batch = await reader.fetch(LOAD_BATCH, timeout=timeout)
            except (TimeoutError, NatsError, JetStreamError, OSError) as exc:
                raise StoreError(
                    f"KV bucket {stream[3:]}: read stalled before sequence {last} "
                    f"with {len(waiting)} keys to go ({timeout:g}s)"
                ) from exc
            for msg in batch:
                meta = msg.metadata
                key = msg.subject.removeprefix(prefix)
                listed = key in waiting
                waiting.discard(key)
                past = meta.sequence.stream > last
                op = msg.headers.get(KV_OP) if msg.headers else None
                live = (
                    bool(msg.data) and op not in (KV_DEL, KV_PURGE) and not _is_marker(msg.headers)
                )
                if live and (listed or not past):
                    yield key, msg.data
                if meta.num_pending == 0 or (meta.sequence.stream >= last and not waiting):
                    return
    finally:
        with contextlib.suppress(TimeoutError, JetStreamError, NatsError, OSError):
            await reader.unsubscribe()
            await js.delete_consumer(stream, reader._consumer)


def _load_consumer() -> ConsumerConfig:
    """A fresh config each time (nats-py fills in the name and filter of the one given)."""
    return ConsumerConfig(
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=AckPolicy.NONE,
        inactive_threshold=60.0,  # removed by the server if we die mid-load
        mem_storage=True,
        num_replicas=1,
    )


def _is_marker(headers: dict[str, str] | None) -> bool:
    """A server-placed delete/expiry marker (nats-server 2.11+)."""
    return bool(headers) and KV_MARKER_REASON in headers  # type: ignore[operator]


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
        await in_flight(list(batch.items()), lambda item: self._write(*item))
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
