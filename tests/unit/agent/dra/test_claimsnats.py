"""agent.dra.claimsnats: the aggregator's answer turned into the plugin's devices or its
retryable/permanent errors; no connection is retryable."""

from __future__ import annotations

import pytest

from agent.dra.claimsnats import NatsClaims, devices_from_answer
from agent.dra.pluginclaims import AllocatedDevice, ClaimRef, ClaimUnavailable, InvalidClaim
from agent.errors import AgentError
from proto import subjects
from proto.codec import decode, encode
from proto.messages.draclaims import ClaimStatus, DraAllocatedDevice, DraClaimAnswer

UID = "0b5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
CLAIM = ClaimRef(namespace="ml", uid=UID, name="nic")
DEVICE = DraAllocatedDevice(request="r0", driver="rdma.nicfleet.io", pool="n1", device="mlx5-0")


def answer(status: ClaimStatus, *, name: str = "nic", reason: str = "x") -> DraClaimAnswer:
    results = (DEVICE,) if status is ClaimStatus.ALLOCATED else ()
    return DraClaimAnswer(
        namespace="ml", name=name, uid=UID, status=status, results=results, reason=reason
    )


def test_allocated_answer_gives_the_devices() -> None:
    assert devices_from_answer(answer(ClaimStatus.ALLOCATED), CLAIM) == (
        AllocatedDevice(request="r0", driver="rdma.nicfleet.io", pool="n1", device="mlx5-0"),
    )


@pytest.mark.parametrize(
    ("given", "error", "retryable"),
    [
        pytest.param(answer(ClaimStatus.UNKNOWN), ClaimUnavailable, True, id="unknown"),
        pytest.param(answer(ClaimStatus.OTHER_NODE), InvalidClaim, False, id="other-node"),
        pytest.param(answer(ClaimStatus.MISMATCH), InvalidClaim, False, id="mismatch"),
        pytest.param(
            answer(ClaimStatus.ALLOCATED, name="else"), InvalidClaim, False, id="another-claim"
        ),
    ],
)
def test_refusals_are_errors(
    given: DraClaimAnswer, error: type[AgentError], retryable: bool
) -> None:
    with pytest.raises(error) as caught:
        devices_from_answer(given, CLAIM)
    assert caught.value.retryable is retryable


async def test_no_connection_is_retryable() -> None:
    source = NatsClaims(lambda: None, node="n1")
    with pytest.raises(ClaimUnavailable, match="not connected"):
        await source.allocation(CLAIM)


def test_wire_round_trip_and_subject() -> None:
    message = answer(ClaimStatus.ALLOCATED)
    assert decode(encode(message), DraClaimAnswer) == message
    assert subjects.draclaims_get_subject("rack1.n1") == "nicfleet.v1.draclaims.rack1_n1.get"
    assert subjects.parse_draclaims_get_subject("nicfleet.v1.draclaims.rack1_n1.get") == "rack1.n1"
    with pytest.raises(ValueError, match=r"is not nicfleet\.v1\.draclaims"):
        subjects.parse_draclaims_get_subject("nicfleet.v1.desired.n1.get")
