"""Where the DRA plugin learns a claim's allocation: the `ClaimSource` seam.

The kubelet sends only (namespace, uid, name); which devices were allocated is in the
ResourceClaim's status.allocation.devices.results. Upstream drivers GET the claim from the
API server; nicfleet agents hold no API credentials, so something that does hands the
claim over. `ClaimDirectory` reads ResourceClaim objects (JSON, as the API returns them)
from a directory, one `<uid>.json` each — written by whatever forwards this node's
allocated claims (the lab kubelet today; see docs/dra.md, "Prepare"). `StaticClaims` is
the in-memory source of tests. `parse_allocation` is pure and bounded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from agent.dra.cdi import valid_uid
from agent.errors import AgentError

# resource.k8s.io/v1 allows at most 32 allocation results per claim; 1 MiB is far above
# any such object.
MAX_RESULTS: Final = 32
MAX_CLAIM_BYTES: Final = 1 << 20


class ClaimUnavailable(AgentError, retryable=True):
    """The claim's allocation is not known (yet): the kubelet retries Prepare."""


class InvalidClaim(AgentError):
    """The claim object cannot be what the kubelet asked for, or is malformed."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None


class ClaimSource(Protocol):
    async def allocation(self, claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
        """Every allocation result of `claim` (all drivers); raises ClaimUnavailable or
        InvalidClaim."""
        ...


class StaticClaims:
    """Allocations held in memory, by claim UID (tests, and any in-process forwarder)."""

    def __init__(self) -> None:
        self._claims: dict[str, tuple[ClaimRef, tuple[AllocatedDevice, ...]]] = {}

    def put(self, claim: ClaimRef, devices: tuple[AllocatedDevice, ...]) -> None:
        self._claims[claim.uid] = (claim, devices)

    def drop(self, uid: str) -> None:
        self._claims.pop(uid, None)

    async def allocation(self, claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
        held = self._claims.get(claim.uid)
        if held is None:
            raise ClaimUnavailable(f"claim {claim.namespace}/{claim.name}: allocation not known")
        if held[0] != claim:
            raise InvalidClaim(f"claim {claim.uid}: is {held[0].namespace}/{held[0].name}")
        return held[1]


class ClaimDirectory:
    """ResourceClaim objects as JSON files `<dir>/<uid>.json`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    async def allocation(self, claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
        if not valid_uid(claim.uid):  # it names a file below
            raise InvalidClaim(f"claim uid {claim.uid[:80]!r} is not a UID")
        # Read on the event loop, not in a thread: a local file of a few KiB (1 MiB at
        # most) reads in microseconds, while a thread hand-off costs prepare a good part
        # of a millisecond on a busy node; the writes that follow are prepare's one hop.
        data = self._read(self.directory / f"{claim.uid}.json")
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise InvalidClaim(f"claim {claim.uid}: not JSON: {exc}") from exc
        return parse_allocation(obj, claim)

    @staticmethod
    def _read(path: Path) -> bytes:
        try:
            with path.open("rb") as f:
                data = f.read(MAX_CLAIM_BYTES + 1)
        except FileNotFoundError as exc:
            raise ClaimUnavailable(f"{path}: no such claim (yet)") from exc
        except OSError as exc:
            raise ClaimUnavailable(f"{path}: {exc.strerror}") from exc
        if len(data) > MAX_CLAIM_BYTES:
            raise InvalidClaim(f"{path}: over {MAX_CLAIM_BYTES} bytes")
        return data


def parse_allocation(obj: Any, claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
    """The allocation results of ResourceClaim `obj`, checked to be `claim` (a claim
    recreated under the same name has another UID: never prepare the old one's devices)."""
    if not isinstance(obj, dict):
        raise InvalidClaim(f"claim {claim.uid}: not an object")
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise InvalidClaim(f"claim {claim.uid}: no metadata")
    got = (meta.get("namespace"), meta.get("uid"), meta.get("name"))
    if got != (claim.namespace, claim.uid, claim.name):
        raise InvalidClaim(
            f"claim {claim.namespace}/{claim.name} ({claim.uid}): the object is "
            f"{got[0]}/{got[2]} ({got[1]})"
        )
    results = _path(obj, "status", "allocation", "devices", "results")
    if results is None:
        raise ClaimUnavailable(f"claim {claim.namespace}/{claim.name}: not allocated")
    if not isinstance(results, list):
        raise InvalidClaim(f"claim {claim.uid}: allocation results are not a list")
    if len(results) > MAX_RESULTS:
        raise InvalidClaim(f"claim {claim.uid}: {len(results)} results (at most {MAX_RESULTS})")
    return tuple(_result(r, claim) for r in results)


def _path(obj: dict[str, Any], *keys: str) -> Any:
    value: Any = obj
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _result(raw: Any, claim: ClaimRef) -> AllocatedDevice:
    if not isinstance(raw, dict):
        raise InvalidClaim(f"claim {claim.uid}: an allocation result is not an object")
    fields: dict[str, str] = {}
    for key in ("request", "driver", "pool", "device"):
        value = raw.get(key)
        if not isinstance(value, str) or not value or len(value) > 253:
            raise InvalidClaim(f"claim {claim.uid}: allocation result without a valid {key}")
        fields[key] = value
    share = raw.get("shareID")
    if share is not None and not (isinstance(share, str) and valid_uid(share)):
        raise InvalidClaim(f"claim {claim.uid}: shareID is not a UID")
    return AllocatedDevice(
        request=fields["request"],
        driver=fields["driver"],
        pool=fields["pool"],
        device=fields["device"],
        share_id=share,
    )
