"""What the DRA plugin reports about itself on the wire (`DevicePluginStatus.dra`):
`FailedPrepares`, the bounded record of each claim's last failed prepare, and
`plugin_status`, which assembles `DraPluginStatus` from the plugin's state, checkpoint,
failures and device health.

Pure: no I/O and no clock (the times come in with the failures and the checkpoint).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Final

from agent.dra.checkpoint import PreparedClaim
from agent.dra.health import DeviceHealth
from agent.dra.pluginclaims import ClaimRef
from proto.draslices import SliceSettings
from proto.messages.status import DraClaimState, DraPluginStatus, DraSliceConfig

# The status is one NATS message: a kubelet retrying many broken claims must not grow it.
MAX_FAILED: Final = 32
MAX_NAME: Final = 253  # namespace and name are DNS subdomains at most: longer is cut
MAX_ERROR: Final = 1024  # an error string quoting a hostile claim stays bounded


class FailedPrepares:
    """The last failed prepare of each claim not prepared (or unprepared) since, newest
    last internally; at most `limit` claims, the oldest failure dropped first."""

    def __init__(self, *, limit: int = MAX_FAILED) -> None:
        self._limit = limit
        self._by_uid: OrderedDict[str, DraClaimState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_uid)

    def record(self, claim: ClaimRef, error: str, *, at: float) -> None:
        self._by_uid.pop(claim.uid, None)  # re-inserted: now the newest
        self._by_uid[claim.uid] = DraClaimState(
            uid=claim.uid,
            namespace=claim.namespace[:MAX_NAME],
            name=claim.name[:MAX_NAME],
            error=error[:MAX_ERROR],
            at=at,
        )
        while len(self._by_uid) > self._limit:
            self._by_uid.popitem(last=False)

    def clear(self, uid: str) -> bool:
        """Forget `uid`'s failure (prepared or unprepared since); whether there was one."""
        return self._by_uid.pop(uid, None) is not None

    def newest_first(self) -> tuple[DraClaimState, ...]:
        return tuple(reversed(self._by_uid.values()))


def claim_state(claim: PreparedClaim) -> DraClaimState:
    return DraClaimState(
        uid=claim.uid,
        namespace=claim.namespace,
        name=claim.name,
        devices=tuple(d.device for d in claim.devices),
        cdi_ids=tuple(i for d in claim.devices for i in d.cdi_ids),
        at=claim.prepared_at,
    )


def slice_config(settings: SliceSettings) -> DraSliceConfig:
    rails = dict(settings.rails)
    return DraSliceConfig(sharing=settings.sharing, share=settings.share, rails=rails)


def plugin_status(
    *,
    state: str,
    error: str | None,
    endpoint: str,
    slices: SliceSettings,
    prepared: Mapping[str, PreparedClaim],
    failed: tuple[DraClaimState, ...],
    health: tuple[DeviceHealth, ...],
) -> DraPluginStatus:
    """The plugin's status: prepared claims by UID, failures newest first, and every
    DRA device the health stream reports unhealthy (share copies included) with why."""
    return DraPluginStatus(
        state=state,
        error=error,
        endpoint=endpoint,
        slices=slice_config(slices),
        prepared=tuple(claim_state(prepared[uid]) for uid in sorted(prepared)),
        failed=failed,
        unhealthy={h.device: h.reason or "unhealthy" for h in health if not h.healthy},
    )
