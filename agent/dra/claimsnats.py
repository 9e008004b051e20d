"""`ClaimSource` over core NATS: the DRA plugin asks the aggregator, which watches
ResourceClaims, for a claim's allocation on this node (`nicfleet.v1.draclaims.<node>.get`,
docs/wire.md "DRA claims"; answered by aggregator.bus.claimanswer).

One request per Prepare, bounded by `timeout`; no answer (aggregator down, not connected)
is ClaimUnavailable, which the kubelet retries. The connection is the agent's own (the
publisher's, whose inbox prefix is the only one this node may hear); this module opens none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError

from agent.dra.pluginclaims import AllocatedDevice, ClaimRef, ClaimUnavailable, InvalidClaim
from proto import subjects
from proto.codec import CodecError, decode, encode
from proto.messages.draclaims import ClaimStatus, DraClaimAnswer, DraClaimRequest

DEFAULT_TIMEOUT: Final = 2.0  # below the preparer's own bound on one lookup


class NatsClaims:
    """Asks the aggregator; `connection` returns the agent's NATS client (None: none yet)."""

    def __init__(
        self,
        connection: Callable[[], NatsClient | None],
        *,
        node: str,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._connection = connection
        self._subject = subjects.draclaims_get_subject(node)
        self._timeout = timeout

    async def allocation(self, claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
        nc = self._connection()
        if nc is None or not nc.is_connected:
            raise ClaimUnavailable(
                f"claim {claim.namespace}/{claim.name}: not connected to NATS (the aggregator)"
            )
        request = DraClaimRequest(namespace=claim.namespace, name=claim.name, uid=claim.uid)
        try:
            msg = await nc.request(self._subject, encode(request), timeout=self._timeout)
        except (NatsError, OSError, TimeoutError) as exc:  # nats' timeout is a NatsError
            raise ClaimUnavailable(
                f"claim {claim.namespace}/{claim.name}: no answer from the aggregator "
                f"({type(exc).__name__})"
            ) from exc
        try:
            answer = decode(msg.data, DraClaimAnswer)
        except CodecError as exc:
            raise ClaimUnavailable(f"claim {claim.uid}: the aggregator's answer: {exc}") from exc
        return devices_from_answer(answer, claim)


def devices_from_answer(answer: DraClaimAnswer, claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
    """Pure: the devices an answer gives `claim`, or why not (as pluginclaims' errors)."""
    if (answer.namespace, answer.name, answer.uid) != (claim.namespace, claim.name, claim.uid):
        raise InvalidClaim(
            f"claim {claim.namespace}/{claim.name} ({claim.uid}): answered for "
            f"{answer.namespace}/{answer.name} ({answer.uid})"
        )
    what = f"claim {claim.namespace}/{claim.name}"
    if answer.status is ClaimStatus.UNKNOWN:
        raise ClaimUnavailable(f"{what}: not allocated (yet): {answer.reason}")
    if answer.status is not ClaimStatus.ALLOCATED:
        raise InvalidClaim(f"{what}: refused by the aggregator ({answer.status}): {answer.reason}")
    return tuple(
        AllocatedDevice(
            request=r.request, driver=r.driver, pool=r.pool, device=r.device, share_id=r.share_id
        )
        for r in answer.results
    )
