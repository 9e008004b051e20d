"""The DRA kubelet plugin's services: `ClaimPreparer` (prepare/unprepare, checkpointed),
the gRPC servicer of `v1.DRAPlugin`, and `add_dra_services` (with the health stream's).

Every claim gets its own answer: a malformed, unknown or foreign claim is an error string
in that claim's entry, never an aborted call, and never a crashed plugin. Only a request
that is too large as a whole is refused (RESOURCE_EXHAUSTED) before any work. Prepare is
idempotent: a claim in the checkpoint is answered from it, not re-derived from today's
inventory. Each claim's last failure is kept (claimstatus) until it is prepared or
unprepared. The health stream: healthstream.py; sockets and registration: pluginrunner.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
from msgspec.structs import replace

from agent.dra.cdi import (
    cdi_id,
    claim_spec,
    remove_claim_spec,
    spec_file_name,
    valid_uid,
    write_claim_spec,
)
from agent.dra.checkpoint import (
    Checkpoint,
    PreparedClaim,
    PreparedDevice,
    load_checkpoint,
    save_checkpoint,
)
from agent.dra.claimstatus import FailedPrepares
from agent.dra.healthstream import DraHealthServicer, DraHealthV1alpha1Servicer
from agent.dra.pluginclaims import AllocatedDevice, ClaimRef, ClaimSource
from agent.errors import AgentError
from proto.dra import (
    api_pb2,
    api_pb2_grpc,
    health_pb2_grpc,
    healthv1alpha1_pb2_grpc,
)
from proto.dranames import DRIVER, InvalidDeviceName, rdma_device_of
from proto.inventory import Device

log = logging.getLogger(__name__)

# The kubelet sends the claims of one pod; far fewer than this. Past it the whole call is
# refused before any claim is looked at.
MAX_CLAIMS: Final = 128
MAX_NAME: Final = 253  # namespace and name: DNS subdomains at most
SOURCE_TIMEOUT: Final = 5.0


@dataclass(frozen=True, slots=True)
class Prepared:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimPreparer:
    """Prepares claims of driver rdma.nicfleet.io on `node`; see the module docstring.

    `devices()` is the agent's current inventory by RDMA device name. A checkpoint that
    cannot be read is moved aside (`.corrupt`) and the plugin starts empty, so it keeps
    serving; the claims in it are then prepared again on the kubelet's next call.
    `on_change` is called whenever the prepared set or the failures change.
    """

    def __init__(
        self,
        *,
        node: str,
        source: ClaimSource,
        cdi_dir: Path,
        checkpoint_path: Path,
        devices: Callable[[], Mapping[str, Device]],
        source_timeout: float = SOURCE_TIMEOUT,
        clock: Callable[[], float] = time.time,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._node = node
        self._source = source
        self._cdi_dir = cdi_dir
        self._path = checkpoint_path
        self._devices = devices
        self._timeout = source_timeout
        self._clock = clock
        self._on_change = on_change
        self.failures = FailedPrepares()
        self._lock = asyncio.Lock()  # one claim at a time: the checkpoint is one file
        try:
            self._checkpoint = load_checkpoint(checkpoint_path)
        except AgentError as exc:
            log.error("DRA checkpoint unreadable, starting empty: %s", exc)
            with contextlib.suppress(OSError):  # unwritable: the first save reports it
                checkpoint_path.replace(
                    checkpoint_path.with_name(checkpoint_path.name + ".corrupt")
                )
            self._checkpoint = Checkpoint()

    @property
    def prepared(self) -> Mapping[str, PreparedClaim]:
        return self._checkpoint.claims

    async def prepare(self, claim: ClaimRef) -> Prepared:
        before = self._checkpoint  # replaced, never mutated: a new one is a new claim
        try:
            prepared = await self._prepare(claim)
        except Exception as exc:
            self._failed(claim, f"internal error: {type(exc).__name__}: {exc}")
            raise
        if prepared.error:
            self._failed(claim, prepared.error)
        elif self.failures.clear(claim.uid) or self._checkpoint is not before:
            self._on_change()
        return prepared

    def _failed(self, claim: ClaimRef, error: str) -> None:
        if valid_uid(claim.uid):  # anything else names no claim: not worth reporting
            self.failures.record(claim, error, at=self._clock())
            self._on_change()

    async def _prepare(self, claim: ClaimRef) -> Prepared:
        problem = _claim_problem(claim)
        if problem is not None:
            return Prepared(error=problem)
        held = self._held(claim)
        if held is not None:
            return held
        # The lookup runs outside the lock: one slow claim must not hold up the others.
        try:
            async with asyncio.timeout(self._timeout):
                results = await self._source.allocation(claim)
            planned = self._plan(claim, results)
        except (AgentError, TimeoutError) as exc:
            error = str(exc) or f"allocation lookup timed out after {self._timeout} s"
            log.warning("prepare %s/%s: %s", claim.namespace, claim.name, error)
            return Prepared(error=error)
        async with self._lock:
            held = self._held(claim)  # prepared meanwhile by a concurrent call
            return held if held is not None else await self._record(claim, planned)

    def _held(self, claim: ClaimRef) -> Prepared | None:
        held = self._checkpoint.claims.get(claim.uid)
        if held is None:
            return None
        if (held.namespace, held.name) != (claim.namespace, claim.name):
            return Prepared(error=f"claim {claim.uid} is {held.namespace}/{held.name}")
        if not (self._cdi_dir / held.cdi_spec).exists():
            # /var/run/cdi is a tmpfs on most nodes: after a reboot the checkpoint survives
            # but the spec does not, and the runtime could not resolve the ids: prepare anew.
            log.warning("prepare %s/%s: CDI spec %s is gone, writing it again",
                        claim.namespace, claim.name, held.cdi_spec)  # fmt: skip
            return None
        return Prepared(devices=held.devices)

    def _plan(
        self, claim: ClaimRef, results: tuple[AllocatedDevice, ...]
    ) -> list[tuple[PreparedDevice, Device]]:
        ours = [r for r in results if r.driver == DRIVER]
        if not ours:
            raise PrepareError(f"claim {claim.namespace}/{claim.name}: no device of {DRIVER}")
        inventory = self._devices()
        # One entry per (device, share): consumable capacity allocates shares of a device.
        by_device: dict[tuple[str, str | None], tuple[list[str], Device]] = {}
        for result in ours:
            if result.pool != self._node:
                raise PrepareError(f"device {result.pool}/{result.device}: not this node's pool")
            try:
                rdma, _share = rdma_device_of(result.device)
            except InvalidDeviceName as exc:
                raise PrepareError(f"device {result.device[:80]!r}: {exc}") from exc
            device = inventory.get(rdma)
            if device is None:
                raise PrepareError(f"device {result.device}: no RDMA device {rdma} on this node")
            key = (result.device, result.share_id)
            requests, _ = by_device.setdefault(key, ([], device))
            requests.append(result.request)
        return [
            (
                PreparedDevice(
                    request_names=tuple(requests),
                    pool=self._node,
                    device=name,
                    cdi_ids=(cdi_id(claim.uid, _cdi_name(name, share)),),
                    share_id=share,
                ),
                device,
            )
            for (name, share), (requests, device) in by_device.items()
        ]

    async def _record(
        self, claim: ClaimRef, planned: list[tuple[PreparedDevice, Device]]
    ) -> Prepared:
        spec = claim_spec(claim.uid, [(_cdi_name(p.device, p.share_id), d) for p, d in planned])
        record = PreparedClaim(
            uid=claim.uid,
            namespace=claim.namespace,
            name=claim.name,
            devices=tuple(p for p, _ in planned),
            cdi_spec=spec_file_name(claim.uid),
            prepared_at=self._clock(),
        )
        claims = {**self._checkpoint.claims, claim.uid: record}
        try:
            # The spec first: a crash before the checkpoint leaves a file named after the
            # UID, which the kubelet's unprepare (it always follows) removes.
            # Prepare's only thread hand-off: both files in one. Not on the event loop:
            # four fsyncs (file and directory, twice) can take milliseconds on a busy
            # disk, and the loop meanwhile serves the health stream and the port poll.
            await asyncio.to_thread(self._write, claim.uid, spec, claims)
        except OSError as exc:
            return Prepared(error=f"claim {claim.uid}: cannot write: {exc}")
        self._checkpoint = replace(self._checkpoint, claims=claims)
        log.info("prepared %s/%s: %s", claim.namespace, claim.name, [p.device for p, _ in planned])
        return Prepared(devices=record.devices)

    def _write(self, uid: str, spec: dict[str, Any], claims: dict[str, PreparedClaim]) -> None:
        write_claim_spec(self._cdi_dir, uid, spec)  # one thread hop for both files
        save_checkpoint(self._path, replace(self._checkpoint, claims=claims))

    async def unprepare(self, claim: ClaimRef) -> str:
        """Remove what prepare wrote for `claim` ("" on success; unknown claims succeed)."""
        if not valid_uid(claim.uid):
            return f"claim uid {claim.uid[:80]!r} is not a UID"
        async with self._lock:
            held = self._checkpoint.claims.get(claim.uid)
            file_name = held.cdi_spec if held is not None else spec_file_name(claim.uid)
            claims = {u: c for u, c in self._checkpoint.claims.items() if u != claim.uid}
            saved = replace(self._checkpoint, claims=claims) if held is not None else None
            try:
                await asyncio.to_thread(self._remove, file_name, saved)  # one hop, as prepare
            except OSError as exc:
                return f"claim {claim.uid}: cannot remove: {exc}"
            self._checkpoint = replace(self._checkpoint, claims=claims)
        if self.failures.clear(claim.uid) or held is not None:
            self._on_change()
        if held is not None:
            log.info("unprepared %s/%s", claim.namespace, claim.name)
        return ""

    def _remove(self, file_name: str, checkpoint: Checkpoint | None) -> None:
        remove_claim_spec(self._cdi_dir, file_name)
        if checkpoint is not None:
            save_checkpoint(self._path, checkpoint)


def _cdi_name(device: str, share_id: str | None) -> str:
    # A share ID is a UID-like string; with it the CDI device names stay distinct.
    return device if share_id is None else f"{device}-{share_id}"


class PrepareError(AgentError):
    """This claim cannot be prepared here (the message says why); other claims can."""


def _claim_problem(claim: ClaimRef) -> str | None:
    if not valid_uid(claim.uid):
        return f"claim uid {claim.uid[:80]!r} is not a UID"
    for what, value in (("namespace", claim.namespace), ("name", claim.name)):
        if not value or len(value) > MAX_NAME:
            return f"claim {claim.uid}: {what} is empty or longer than {MAX_NAME}"
    return None


def _ref(claim: api_pb2.Claim) -> ClaimRef:
    return ClaimRef(namespace=claim.namespace, uid=claim.uid, name=claim.name)


class DraPluginServicer:
    """k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin over a ClaimPreparer."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._preparer = preparer

    async def NodePrepareResources(
        self, request: api_pb2.NodePrepareResourcesRequest, context: Any
    ) -> api_pb2.NodePrepareResourcesResponse:
        await _check_size(context, len(request.claims), "NodePrepareResources")
        response = api_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            try:
                prepared = await self._preparer.prepare(_ref(claim))
            except Exception as exc:  # a bug answers this claim, the plugin keeps serving
                log.exception("prepare %s: failed", claim.uid[:80])
                prepared = Prepared(error=f"internal error: {type(exc).__name__}: {exc}")
            entry = response.claims[claim.uid]
            entry.error = prepared.error
            entry.devices.extend(
                api_pb2.Device(
                    request_names=d.request_names,
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=d.cdi_ids,
                    share_id=d.share_id,
                )
                for d in prepared.devices
            )
        return response

    async def NodeUnprepareResources(
        self, request: api_pb2.NodeUnprepareResourcesRequest, context: Any
    ) -> api_pb2.NodeUnprepareResourcesResponse:
        await _check_size(context, len(request.claims), "NodeUnprepareResources")
        response = api_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            try:
                error = await self._preparer.unprepare(_ref(claim))
            except Exception as exc:  # as in prepare
                log.exception("unprepare %s: failed", claim.uid[:80])
                error = f"internal error: {type(exc).__name__}: {exc}"
            response.claims[claim.uid].error = error
        return response


async def _check_size(context: Any, count: int, what: str) -> None:
    if count > MAX_CLAIMS:
        log.warning("%s: refused %d claims (at most %d)", what, count, MAX_CLAIMS)
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED, f"{what}: {count} claims (at most {MAX_CLAIMS})"
        )


def add_dra_services(plugin: DraPluginServicer, health: DraHealthServicer) -> Callable[[Any], None]:
    def add(server: Any) -> None:
        api_pb2_grpc.add_DRAPluginServicer_to_server(plugin, server)
        health_pb2_grpc.add_DRAResourceHealthServicer_to_server(health, server)
        healthv1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            DraHealthV1alpha1Servicer(health), server
        )

    return add
