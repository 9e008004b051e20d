"""Runs pair validations: the Pods (via `aggregator.kube.client`), the results on
`nicfleet.v1.validation.<id>` (NATS), the records in KV `nicfleet-validations`.

The replica that accepted the POST runs the validation and writes its record; every
replica watches the bucket, so GET, the list and the trace answer the same everywhere.
Decisions come from the pure `aggregator.validations.record`; the Pods are deleted whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import yaml
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import Error as JetStreamError
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry, Counter

from aggregator.errors import AggregatorError, KubeError, StoreError
from aggregator.fleet.store import open_bucket
from aggregator.kube.client import KubeClient
from aggregator.validations.record import (
    ENDED_POD_PHASES,
    PodView,
    RejectedResult,
    ValidationSettings,
    abandoned,
    accept_result,
    advance,
    build_pod,
    decide,
    new_record,
    pod_name,
)
from aggregator.validations.request import ValidationRequest
from proto import subjects
from proto.codec import CodecError, decode, encode
from proto.http import FINAL_PHASES, ValidationRecord
from proto.messages.validation import ValidationResult
from proto.runtime.natsflush import flush_in_order

log = logging.getLogger(__name__)

KV_VALIDATIONS: Final = "nicfleet-validations"
# In a source tree; in a cluster the template comes from a ConfigMap (docs/validation.md).
TEMPLATE: Final = Path(__file__).resolve().parents[2] / "deploy/validation/pod-template.yaml"
REWATCH_S: Final = 60.0
STOPPED: Final = "the aggregator stopped before the validation finished"
MAX_INBOX: Final = 16  # result messages buffered per validation; two are expected


class ValidationBusy(AggregatorError, retryable=True):
    """Too many validations queued; retry later (HTTP 429)."""


class ValidationUnavailable(AggregatorError):
    """No Kubernetes API to create pods in (HTTP 503)."""


def load_template(path: Path = TEMPLATE) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise StoreError(f"cannot read the validation pod template {path}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("kind") != "Pod":
        raise StoreError(f"{path}: the validation pod template must be one Pod")
    return doc


class ValidationStore:
    """The bucket and an in-memory copy of its newest `keep` records, fed by a KV watch."""

    def __init__(self, kv: KeyValue | None, *, keep: int) -> None:
        self._kv = kv
        self._keep = keep
        self._records: dict[str, ValidationRecord] = {}

    @classmethod
    async def open(cls, nc: NatsClient, *, keep: int) -> ValidationStore:
        return cls(await open_bucket(nc.jetstream(), KV_VALIDATIONS), keep=keep)

    def get(self, validation_id: str) -> ValidationRecord | None:
        return self._records.get(validation_id)

    def recent(self, limit: int) -> list[ValidationRecord]:
        """Newest first."""
        ordered = sorted(self._records.values(), key=lambda r: (r.created_at, r.id), reverse=True)
        return ordered[:limit]

    def latest_for(self, node: str, resource: str) -> ValidationRecord | None:
        """The newest finished validation of `resource` with `node` on either side."""
        done = [
            r
            for r in self._records.values()
            if r.phase in FINAL_PHASES and node in r.nodes and r.resource == resource
        ]
        return max(done, key=lambda r: (r.finished_at or 0.0, r.id), default=None)

    async def put(self, record: ValidationRecord) -> None:
        self._remember(record)
        if self._kv is None:
            return
        try:
            await self._kv.put(record.id, encode(record))
        except (TimeoutError, JetStreamError, NatsError, OSError) as exc:
            log.warning("KV write of validation %s failed: %s", record.id, exc)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the bucket (other replicas' validations) until `stop`."""
        if self._kv is None:
            return
        while not stop.is_set():
            try:
                watcher = await self._kv.watchall()
            except (TimeoutError, JetStreamError, NatsError, OSError) as exc:
                log.warning("cannot watch KV %s: %s", KV_VALIDATIONS, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
                continue
            # A watch is an ephemeral consumer that a NATS restart can lose without a word;
            # a fresh one every REWATCH_S re-delivers every key's latest value.
            renew_at = time.monotonic() + REWATCH_S
            try:
                while not stop.is_set() and time.monotonic() < renew_at:
                    try:
                        entry = await watcher.updates(timeout=0.5)  # type: ignore[no-untyped-call]
                    except (TimeoutError, NatsError):
                        continue
                    if entry is None or entry.value is None or not entry.value:
                        continue
                    try:
                        self._remember(decode(entry.value, ValidationRecord), newer_only=True)
                    except CodecError as exc:
                        log.warning("skipping undecodable validation %s: %s", entry.key, exc)
            finally:
                with contextlib.suppress(Exception):
                    await watcher.stop()  # type: ignore[no-untyped-call]

    def _remember(self, record: ValidationRecord, *, newer_only: bool = False) -> None:
        known = self._records.get(record.id)
        if newer_only and known is not None and known.updated_at > record.updated_at:
            return
        self._records[record.id] = record
        if len(self._records) > self._keep:
            oldest = min(self._records.values(), key=lambda r: (r.created_at, r.id))
            del self._records[oldest.id]


class ValidationRunner:
    """Accepts requests (`submit`) and runs at most `max_running` of them (`run`)."""

    def __init__(
        self,
        *,
        kube: KubeClient | None,
        namespace: str,
        nc: NatsClient,
        store: ValidationStore,
        settings: ValidationSettings,
        template: Mapping[str, Any] | None,  # None: no template, POST answers 503
        identity: str,
        clock: Callable[[], float],
        registry: CollectorRegistry,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._nc = nc
        self.store = store
        self.settings = settings
        self._template = template
        self._identity = identity
        self._clock = clock
        self._queue: asyncio.Queue[ValidationRecord] = asyncio.Queue(settings.max_queued)
        self.messages = Counter(
            "nicfleet_validation_messages",
            "Messages on nicfleet.v1.validation.<id>, by outcome (accepted, malformed, "
            "rejected, overflow).",
            ["outcome"],
            registry=registry,
        )
        self.finished = Counter(
            "nicfleet_validations_finished",
            "Validations run by this replica, by final phase.",
            ["phase"],
            registry=registry,
        )
        for outcome in ("accepted", "malformed", "rejected", "overflow"):
            self.messages.labels(outcome)  # exported as 0 before the first message
        for phase in sorted(FINAL_PHASES):
            self.finished.labels(phase)

    async def submit(self, request: ValidationRequest) -> ValidationRecord:
        """Store a pending record and queue it; the caller checked the request first."""
        if self._kube is None:
            raise ValidationUnavailable("validations need a Kubernetes API (--kubeconfig, "
                                        "--in-cluster or --kube-api)")  # fmt: skip
        if self._template is None:
            raise ValidationUnavailable("no validation pod template (--validation-template)")
        if self._queue.full():
            raise ValidationBusy(f"{self._queue.qsize()} validations are already waiting")
        record = new_record(
            request,
            id=uuid.uuid4().hex[:12],
            namespace=self._namespace,
            runner=self._identity,
            now=self._clock(),
        )
        await self.store.put(record)
        self._queue.put_nowait(record)
        return record

    async def run(self, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.store.run(stop))
            running = range(self.settings.max_running)
            workers = [tasks.create_task(self._work(stop)) for _ in running]
            await stop.wait()
            for worker in workers:
                worker.cancel()
        while not self._queue.empty():  # accepted, never started
            record = self._queue.get_nowait()
            reason = "the aggregator stopped before the validation started"
            await self.store.put(abandoned(record, reason, self._clock()))

    async def _work(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            record = await self._queue.get()
            await self.validate(record, stop)

    async def validate(
        self, record: ValidationRecord, stop: asyncio.Event | None = None
    ) -> ValidationRecord:
        """Run one validation to a final phase; the pods are deleted on every way out."""
        assert self._kube is not None and self._template is not None
        kube, template = self._kube, self._template
        inbox: asyncio.Queue[bytes] = asyncio.Queue(MAX_INBOX)

        async def on_message(msg: Msg) -> None:
            try:
                inbox.put_nowait(msg.data)
            except asyncio.QueueFull:
                self.messages.labels("overflow").inc()

        sub = await self._nc.subscribe(subjects.validation_subject(record.id), cb=on_message)
        # The server has the subscription before any pod exists (a result published first
        # would find no subscriber); best effort: NATS down, the pods' deadline decides.
        with contextlib.suppress(TimeoutError, NatsError):
            await flush_in_order(self._nc, timeout=5.0)
        views: dict[str, PodView | None] = {"server": None, "client": None}
        warned = False
        try:
            while True:
                now = self._clock()
                # Cancellation alone is not enough: Python 3.11's wait_for can swallow it.
                if stop is not None and stop.is_set():
                    record = abandoned(record, STOPPED, now)
                    break
                while not inbox.empty():
                    record, problem = self._take(record, inbox.get_nowait(), now)
                    if problem and not warned:
                        log.warning("validation %s: ignored a message: %s", record.id, problem)
                        warned = True
                decision = decide(
                    record,
                    server=views["server"],
                    client=views["client"],
                    now=now,
                    settings=self.settings,
                )
                moved = advance(record, decision, now)
                if decision.action == "create-server":
                    await kube.create_pod(build_pod(template, moved, "server", self.settings))
                elif decision.action == "create-client":
                    server = views["server"]
                    moved = msgspec.structs.replace(moved, server_ip=server.ip if server else None)
                    await kube.create_pod(build_pod(template, moved, "client", self.settings))
                if decision.action == "finish":
                    record = moved  # stored by _cleanup, once the pods are gone
                    break
                if moved != record:
                    record = moved
                    await self.store.put(record)
                with contextlib.suppress(TimeoutError):
                    data = await asyncio.wait_for(inbox.get(), self.settings.poll_interval_s)
                    record, _ = self._take(record, data, self._clock())
                for role in ("server", "client") if record.phase != "pods-created" else ("server",):
                    views[role] = await self._observe(pod_name(record.id, role), views[role])
        except KubeError as exc:
            record = abandoned(record, f"Kubernetes API: {exc}", self._clock())
        except asyncio.CancelledError:
            record = abandoned(record, STOPPED, self._clock())
            raise
        finally:
            with contextlib.suppress(NatsError, OSError):
                await sub.unsubscribe()
            record = await self._cleanup(record)
            self.finished.labels(record.phase).inc()
            log.info("validation %s %s: %s", record.id, record.phase, record.reason)
        return record

    def _take(
        self, record: ValidationRecord, data: bytes, now: float
    ) -> tuple[ValidationRecord, str | None]:
        try:
            result = decode(data, ValidationResult)
        except CodecError as exc:
            self.messages.labels("malformed").inc()
            return record, str(exc)
        try:
            updated = accept_result(record, result, now)
        except RejectedResult as exc:
            self.messages.labels("rejected").inc()
            return record, str(exc)
        self.messages.labels("accepted").inc()
        return updated, None

    async def _observe(self, name: str, before: PodView | None) -> PodView:
        assert self._kube is not None
        raw = await self._kube.read_pod(name)
        now = self._clock()
        if raw is None:
            ended = before.ended_at if before and before.ended_at else now
            return PodView(phase="Gone", detail="the pod was deleted", ended_at=ended)
        status = raw.get("status") or {}
        phase = status.get("phase")
        ended_at = None
        if phase in ENDED_POD_PHASES:
            ended_at = before.ended_at if before and before.ended_at else now
        return PodView(
            phase=phase if isinstance(phase, str) else None,
            ip=status.get("podIP") or None,
            detail=_pod_detail(status),
            ended_at=ended_at,
        )

    async def _cleanup(self, record: ValidationRecord) -> ValidationRecord:
        """Delete both pods (a missing one is fine) and store the final record."""
        assert self._kube is not None
        deleted = True
        for role in ("server", "client"):
            try:
                await self._kube.delete_pod(pod_name(record.id, role))
            except KubeError as exc:
                deleted = False
                log.warning("validation %s: cannot delete its %s pod: %s", record.id, role, exc)
        now = self._clock()
        if record.phase not in FINAL_PHASES:
            record = abandoned(record, "the validation stopped unexpectedly", now)
        record = msgspec.structs.replace(record, pods_deleted=deleted, updated_at=now)
        await self.store.put(record)
        return record


def _pod_detail(status: Mapping[str, Any]) -> str:
    """The most telling reason the API gives: unschedulable, waiting, terminated."""
    for condition in status.get("conditions") or ():
        if isinstance(condition, dict) and condition.get("reason") == "Unschedulable":
            return f"Unschedulable: {condition.get('message') or ''}".rstrip(": ")
    for container in status.get("containerStatuses") or ():
        state = container.get("state") if isinstance(container, dict) else None
        for key in ("waiting", "terminated"):
            found = state.get(key) if isinstance(state, dict) else None
            if isinstance(found, dict) and found.get("reason"):
                code = found.get("exitCode")
                extra = f", exit code {code}" if code is not None else ""
                message = found.get("message") or ""
                return f"{found['reason']}{extra}" + (f": {message}" if message else "")
    reason = status.get("reason")
    message = status.get("message")
    return ": ".join(str(x) for x in (reason, message) if x)
