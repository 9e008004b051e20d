"""A DRA kubelet plugin's question about one ResourceClaim and the aggregator's answer
(docs/wire.md, "DRA claims"): agents hold no API credentials, so the aggregator, which
watches ResourceClaims, tells a node's agent the claim's allocation on that node only.
"""

from __future__ import annotations

from enum import StrEnum

from proto.inventory import Base
from proto.messages import MESSAGES_VERSION


class ClaimStatus(StrEnum):
    ALLOCATED = "allocated"  # `results` hold the claim's rdma.nicfleet.io devices on the node
    UNKNOWN = "unknown"  # not seen (yet) with an rdma.nicfleet.io allocation: ask again
    OTHER_NODE = "other-node"  # allocated, but not to the asking node: refused
    MISMATCH = "mismatch"  # that UID is another namespace/name: refused


class DraClaimRequest(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.DraClaimRequest"
):
    """Sent on `nicfleet.v1.draclaims.<node>.get`: the claim the kubelet asks to prepare."""

    version: int = MESSAGES_VERSION
    namespace: str
    name: str
    uid: str


class DraAllocatedDevice(Base, frozen=True, kw_only=True):
    """One allocation result, field names as status.allocation.devices.results."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None


class DraClaimAnswer(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.DraClaimAnswer"
):
    """The answer into the asking agent's inbox. `results` are only the claim's
    rdma.nicfleet.io results whose pool is the asking node; empty unless ALLOCATED."""

    version: int = MESSAGES_VERSION
    namespace: str
    name: str
    uid: str
    status: ClaimStatus = ClaimStatus.UNKNOWN
    results: tuple[DraAllocatedDevice, ...] = ()
    reason: str = ""
