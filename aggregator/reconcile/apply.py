"""Reconcile, the I/O half: performs a `Plan` and publishes policy statuses.

Desired configs go to the `nicfleet-config` KV bucket (key = node token, value = encoded
`DesiredConfig`), each acknowledged write then announced to its node (`Announce`; the KV
stays the source of truth: an agent also asks for its entry). With a Kubernetes adapter,
policy status, Events for node state changes and `nicfleet.io/*` node labels are written
through it. Decides nothing: `reconcile` and `policystatus` do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

from nats.errors import Error as NatsError
from nats.js.client import JetStreamContext
from nats.js.errors import Error as JetStreamError
from nats.js.kv import KV_DEL, KV_OP, KeyValue

from aggregator.cluster import ClusterView
from aggregator.errors import KubeError
from aggregator.fleet.state import NodeRecord
from aggregator.fleet.store import open_bucket, read_bucket
from aggregator.reconcile.nodelabels import node_labels
from aggregator.reconcile.plan import Action, DeleteDesiredConfig, PutDesiredConfig
from aggregator.reconcile.status import NodeChange, PolicyStatus
from proto import subjects
from proto.codec import CodecError, decode, encode
from proto.messages.config import DesiredConfig

log = logging.getLogger(__name__)

LABEL_PREFIX = "nicfleet.io/"


class KubeWriter(Protocol):
    """What apply needs from `aggregator.kube.client` (the real adapter, or a test double)."""

    async def patch_policy_status(self, name: str, status: Mapping[str, Any]) -> None: ...

    async def create_event(
        self,
        *,
        kind: Literal["Node", "NicFleetPolicy"],
        name: str,
        reason: str,
        message: str,
        type: Literal["Normal", "Warning"] = "Normal",
        uid: str | None = None,
        instance: str = "",
    ) -> None: ...

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> None: ...


async def open_config_bucket(js: JetStreamContext) -> KeyValue:
    """The `nicfleet-config` bucket (created on first use). Agents create no consumers on
    it (they hold no JetStream API: `aggregator.bus.desiredanswer` answers them), so its
    stream keeps the server's default consumer limit."""
    return await open_bucket(js, subjects.KV_CONFIG)


# After a node's key was written: (node, KV revision, the stored value or None for a
# delete). `aggregator.bus.desiredanswer.DesiredFeed.announce` publishes it to the agent.
Announce = Callable[[str, int, bytes | None], Awaitable[None]]


async def _no_announce(_node: str, _revision: int, _value: bytes | None) -> None:
    return None


class ConfigStore:
    """The `nicfleet-config` bucket; `stored` mirrors what it holds after our writes.

    Puts go out `batch` at a time as asynchronous JetStream publishes (one socket write per
    batch, then the batch's acks awaited together): a policy change rewrites every node's
    key, and one awaited put at a time (a request, a timer and a task each) was most of the
    aggregator's CPU in a 10,000-node fan-out."""

    def __init__(
        self,
        kv: KeyValue,
        *,
        concurrency: int = 64,
        batch: int = 256,
        timeout: float = 10.0,
        announce: Announce = _no_announce,
    ) -> None:
        self._kv = kv
        self._announce = announce
        self._limit = asyncio.Semaphore(concurrency)
        self._batch = batch
        self._timeout = timeout  # for one batch's acks
        self.stored: dict[str, DesiredConfig] = {}

    async def load(self) -> dict[str, DesiredConfig]:
        """Read every decodable config in the bucket into `stored` (on start, on leadership):
        one pass over the bucket (`aggregator.fleet.store.read_bucket`), not one get per key."""
        loaded: dict[str, DesiredConfig] = {}
        async for key, value in read_bucket(self._kv, timeout=self._timeout):
            try:
                config = decode(value, DesiredConfig)
            except CodecError as exc:
                log.warning("%s: skipping undecodable key %s: %s", subjects.KV_CONFIG, key, exc)
                continue
            loaded[config.node] = config
        self.stored = loaded
        return loaded

    async def apply(self, actions: Sequence[Action]) -> list[str]:
        """Perform every action (bounded concurrency); errors are returned and logged, and
        a failed action leaves `stored` as it was so that the next plan repeats it."""
        errors: list[str] = []
        puts = [a for a in actions if isinstance(a, PutDesiredConfig)]
        for start in range(0, len(puts), self._batch):
            errors += await self._put_batch(puts[start : start + self._batch])

        async def delete(action: DeleteDesiredConfig) -> None:
            async with self._limit:
                try:
                    revision = await self._delete(subjects.node_token(action.node))
                except (TimeoutError, JetStreamError, OSError) as exc:
                    errors.append(f"{subjects.KV_CONFIG} {action.node}: {exc}")
                else:
                    self.stored.pop(action.node, None)
                    await self._announce(action.node, revision, None)

        async with asyncio.TaskGroup() as tasks:
            for action in actions:
                if isinstance(action, DeleteDesiredConfig):
                    tasks.create_task(delete(action))
        for error in errors:
            log.warning("desired config not written: %s", error)
        return errors

    async def _delete(self, key: str) -> int:
        """`KeyValue.delete`, keeping the marker's revision (nats-py's returns a bool)."""
        js: JetStreamContext = self._kv._js
        ack = await js.publish(f"{self._kv._pre}{key}", headers={KV_OP: KV_DEL})
        return ack.seq

    async def _put_batch(self, puts: Sequence[PutDesiredConfig]) -> list[str]:
        """Publish every put, then wait for their acks; an ack missing after `timeout` is
        an error (its publish is forgotten). `stored` changes only for acknowledged puts."""
        js: JetStreamContext = self._kv._js  # nats-py keeps these two private
        prefix: str = self._kv._pre
        errors: list[str] = []
        sent: dict[asyncio.Future[Any], tuple[PutDesiredConfig, bytes]] = {}
        for put in puts:
            key = subjects.node_token(put.node)
            value = encode(put.config)
            try:
                ack = await js.publish_async(f"{prefix}{key}", value)
            except (TimeoutError, NatsError, JetStreamError, OSError) as exc:
                errors.append(f"{subjects.KV_CONFIG} {put.node}: {exc!r}")
                continue
            sent[ack] = (put, value)
        if sent:
            done, late = await asyncio.wait(sent, timeout=self._timeout)
            for ack in late:
                ack.cancel()  # frees its slot in nats-py's pending publishes
                errors.append(
                    f"{subjects.KV_CONFIG} {sent[ack][0].node}: no ack in {self._timeout:g}s"
                )
            for ack in done:
                put, value = sent[ack]
                if ack.exception() is not None:
                    errors.append(f"{subjects.KV_CONFIG} {put.node}: {ack.exception()!r}")
                else:
                    self.stored[put.node] = put.config
                    await self._announce(put.node, ack.result().seq, value)
        return errors


def status_document(
    status: PolicyStatus,
    previous: Mapping[str, Any] | None,
    now: str,
    observed_generation: int | None = None,
) -> dict[str, Any]:
    """The `status` of a NicFleetPolicy (the CRD's schema: observedGeneration, conditions,
    nodes counts); lastTransitionTime moves only when a condition's status changes."""
    before = {c["type"]: c for c in (previous or {}).get("conditions", [])}
    conditions = []
    for c in status.conditions:
        old = before.get(c.type)
        since = old["lastTransitionTime"] if old and old.get("status") == c.status else now
        conditions.append(
            {
                "type": c.type,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": since,
            }
        )
    s = status.summary
    document: dict[str, Any] = {
        "conditions": conditions,
        "nodes": {
            "selected": s.selected,
            "configured": s.configured,
            "advertising": s.advertising,
            "healthy": s.healthy,
        },
    }
    if observed_generation is not None:
        document["observedGeneration"] = observed_generation
        for condition in conditions:
            condition["observedGeneration"] = observed_generation
    return document


def label_patch(record: NodeRecord, cluster: ClusterView) -> dict[str, str | None] | None:
    """The label changes a node needs (None values remove), or None when it needs none."""
    node = cluster.nodes.get(record.name)
    if node is None or record.snapshot is None:
        return None
    wanted = node_labels(record.snapshot)
    have = {k: v for k, v in node.labels.items() if k.startswith(LABEL_PREFIX)}
    patch: dict[str, str | None] = {k: v for k, v in wanted.items() if have.get(k) != v}
    patch.update({k: None for k in have if k not in wanted})
    return patch or None


class KubeApplier:
    """Writes statuses, Events and labels through a KubeWriter; remembers what it wrote so
    that an unchanged status is not patched again."""

    def __init__(self, kube: KubeWriter) -> None:
        self._kube = kube
        self._documents: dict[str, dict[str, Any]] = {}
        self._labels: dict[str, dict[str, str | None]] = {}

    async def apply(
        self,
        statuses: Sequence[PolicyStatus],
        changes: Sequence[NodeChange],
        fleet: Mapping[str, NodeRecord],
        cluster: ClusterView,
        *,
        now: str,
        observed_generation: Callable[[str], int | None] = lambda _name: None,
    ) -> list[str]:
        errors: list[str] = []
        for status in statuses:
            previous = self._documents.get(status.policy)
            generation = observed_generation(status.policy)
            document = status_document(status, previous, now, generation)
            if document != previous and await self._call(
                errors, self._kube.patch_policy_status(status.policy, document)
            ):
                self._documents[status.policy] = document
        for change in changes:
            type_: Literal["Normal", "Warning"] = "Normal" if change.new == "Ready" else "Warning"
            old, new = change.old or "unselected", change.new or "unselected"
            text = f"{change.node}: {old} -> {new}: {change.message}"
            targets: tuple[tuple[Literal["Node", "NicFleetPolicy"], str], ...] = (
                ("NicFleetPolicy", change.policy),
                ("Node", change.node),
            )
            for kind, name in targets:
                await self._call(
                    errors,
                    self._kube.create_event(
                        kind=kind, name=name, reason=change.reason, message=text, type=type_
                    ),
                )
        for record in fleet.values():
            patch = label_patch(record, cluster)
            if patch is None or self._labels.get(record.name) == patch:
                continue
            if await self._call(errors, self._kube.patch_node_labels(record.name, patch)):
                self._labels[record.name] = patch
        return errors

    @staticmethod
    async def _call(errors: list[str], call: Any) -> bool:
        try:
            await call
        except (KubeError, ValueError, OSError) as exc:  # logged; reconciling goes on
            errors.append(f"kubernetes: {exc}")
            log.warning("kubernetes write failed: %s", exc)
            return False
        return True
