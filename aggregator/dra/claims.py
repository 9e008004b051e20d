"""Which rdma.nicfleet.io devices each ResourceClaim was allocated, by node: the index the
aggregator answers DRA kubelet plugins from (aggregator.bus.claimanswer; docs/dra.md,
"Prepare"). Agents hold no API credentials, so this is how a node learns a claim's devices.

Pure: fed ResourceClaim objects (plain dicts, from list/watch) and asked by (node, claim);
no I/O, no clock. A node is told only its own devices: the results whose pool is its name
(one pool per node, pool name = node name) and, where the allocation names nodes in its
nodeSelector, only when it is one of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from proto.dranames import DRIVER
from proto.messages.draclaims import (
    ClaimStatus,
    DraAllocatedDevice,
    DraClaimAnswer,
    DraClaimRequest,
)

MAX_RESULTS: Final = 32  # resource.k8s.io/v1's limit on allocation results per claim


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """A claim with at least one rdma.nicfleet.io allocation result."""

    namespace: str
    name: str
    uid: str
    results: tuple[DraAllocatedDevice, ...]  # this driver's results only
    selector_nodes: frozenset[str] | None  # nodes the nodeSelector names; None: no such term


def record_from_object(obj: Any) -> ClaimRecord | None:
    """The claim's record, or None when it holds no (valid) rdma.nicfleet.io allocation."""
    if not isinstance(obj, dict):
        return None
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return None
    ident = (meta.get("namespace"), meta.get("name"), meta.get("uid"))
    if not all(isinstance(v, str) and v for v in ident):
        return None
    allocation = _get(obj, "status", "allocation")
    raw = _get(allocation, "devices", "results")
    if not isinstance(raw, list) or len(raw) > MAX_RESULTS:
        return None
    results = tuple(r for r in (_result(item) for item in raw) if r is not None)
    if not results:
        return None
    namespace, name, uid = (str(v) for v in ident)
    return ClaimRecord(
        namespace=namespace,
        name=name,
        uid=uid,
        results=results,
        selector_nodes=pinned_nodes(_get(allocation, "nodeSelector")),
    )


def answer_for(record: ClaimRecord | None, request: DraClaimRequest, node: str) -> DraClaimAnswer:
    """What `node`'s agent is told about the claim it asked for."""
    if record is None:
        return _answer(request, ClaimStatus.UNKNOWN, "no rdma.nicfleet.io allocation seen")
    if (record.namespace, record.name) != (request.namespace, request.name):
        # The kubelet names the claim by UID too: never hand one claim's devices out under
        # another's name (a forged or stale request).
        reason = f"claim {request.uid} is {record.namespace}/{record.name}"
        return _answer(request, ClaimStatus.MISMATCH, reason)
    mine = tuple(r for r in record.results if r.pool == node)
    if not mine or (record.selector_nodes is not None and node not in record.selector_nodes):
        return _answer(request, ClaimStatus.OTHER_NODE, f"not allocated on node {node}")
    return _answer(request, ClaimStatus.ALLOCATED, "", mine)


def _answer(
    request: DraClaimRequest,
    status: ClaimStatus,
    reason: str,
    results: tuple[DraAllocatedDevice, ...] = (),
) -> DraClaimAnswer:
    return DraClaimAnswer(
        namespace=request.namespace,
        name=request.name,
        uid=request.uid,
        status=status,
        results=results,
        reason=reason,
    )


class ClaimIndex:
    """The claims with an rdma.nicfleet.io allocation, by UID, kept by list (`replace`) and
    watch events (`apply`)."""

    def __init__(self) -> None:
        self._claims: dict[str, ClaimRecord] = {}
        self.synced = False  # a first list arrived: UNKNOWN then means "not allocated (yet)"

    def __len__(self) -> int:
        return len(self._claims)

    def get(self, uid: str) -> ClaimRecord | None:
        return self._claims.get(uid)

    def replace(self, objects: Iterable[Any]) -> None:
        records = (record_from_object(o) for o in objects)
        self._claims = {r.uid: r for r in records if r is not None}
        self.synced = True

    def apply(self, kind: str, obj: Any) -> bool:
        """One watch event (ADDED, MODIFIED, DELETED); True when the index changed."""
        uid = _get(obj, "metadata", "uid")
        if not isinstance(uid, str) or not uid:
            return False
        record = None if kind == "DELETED" else record_from_object(obj)
        before = self._claims.get(uid)
        if record is None:
            self._claims.pop(uid, None)
        else:
            self._claims[uid] = record
        return before != record

    def answer(self, request: DraClaimRequest, node: str) -> DraClaimAnswer:
        return answer_for(self._claims.get(request.uid), request, node)


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _result(raw: Any) -> DraAllocatedDevice | None:
    if not isinstance(raw, dict) or raw.get("driver") != DRIVER:
        return None
    fields = {k: raw.get(k) for k in ("request", "pool", "device")}
    if not all(isinstance(v, str) and v and len(v) <= 253 for v in fields.values()):
        return None
    share = raw.get("shareID")
    return DraAllocatedDevice(
        request=str(fields["request"]),
        driver=DRIVER,
        pool=str(fields["pool"]),
        device=str(fields["device"]),
        share_id=share if isinstance(share, str) and share else None,
    )


def pinned_nodes(selector: Any) -> frozenset[str] | None:
    """The node names a NodeSelector pins by `metadata.name In [...]` (what the scheduler
    writes for node-local devices); None when no term pins names (any node may match)."""
    terms = _get(selector, "nodeSelectorTerms")
    if not isinstance(terms, list):
        return None
    names: set[str] = set()
    pinned = False
    for term in terms:
        fields = _get(term, "matchFields")
        if not isinstance(fields, list):
            return None  # a term without names matches nodes we cannot tell apart here
        term_pins = False
        for req in fields:
            if (
                isinstance(req, dict)
                and req.get("key") == "metadata.name"
                and req.get("operator") == "In"
                and isinstance(req.get("values"), list)
            ):
                names.update(v for v in req["values"] if isinstance(v, str))
                term_pins = True
        if not term_pins:
            return None
        pinned = True
    return frozenset(names) if pinned else None
