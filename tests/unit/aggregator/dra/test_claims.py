"""aggregator.dra.claims: which rdma.nicfleet.io devices of a claim a node is told."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.dra.claims import ClaimIndex, answer_for, record_from_object
from proto.messages.draclaims import ClaimStatus, DraAllocatedDevice, DraClaimRequest

UID = "0b5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
DRIVER = "rdma.nicfleet.io"


def claim(
    *results: tuple[str, str, str],
    uid: str = UID,
    name: str = "nic",
    selector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim allocated to `results`: (driver, pool, device) each."""
    allocation: dict[str, Any] = {
        "devices": {
            "results": [
                {"request": f"r{i}", "driver": d, "pool": p, "device": dev}
                for i, (d, p, dev) in enumerate(results)
            ]
        }
    }
    if selector is not None:
        allocation["nodeSelector"] = selector
    return {
        "metadata": {"namespace": "ml", "name": name, "uid": uid},
        "status": {"allocation": allocation},
    }


def pinned(*nodes: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(nodes)}]}
        ]
    }


def ask(name: str = "nic", uid: str = UID) -> DraClaimRequest:
    return DraClaimRequest(namespace="ml", name=name, uid=uid)


@pytest.mark.parametrize(
    ("obj", "node", "status", "devices"),
    [
        pytest.param(
            claim((DRIVER, "n1", "mlx5-0"), (DRIVER, "n1", "mlx5-1")),
            "n1", ClaimStatus.ALLOCATED, ["mlx5-0", "mlx5-1"], id="allocated-here",
        ),
        pytest.param(
            claim((DRIVER, "n1", "mlx5-0"), ("gpu.nvidia.com", "n1", "gpu-0")),
            "n1", ClaimStatus.ALLOCATED, ["mlx5-0"], id="other-drivers-left-out",
        ),
        pytest.param(
            claim((DRIVER, "n1", "mlx5-0"), (DRIVER, "n2", "mlx5-0")),
            "n2", ClaimStatus.ALLOCATED, ["mlx5-0"], id="only-the-asking-nodes-pool",
        ),
        pytest.param(
            claim((DRIVER, "n1", "mlx5-0")), "n2", ClaimStatus.OTHER_NODE, [],
            id="another-nodes-claim-refused",
        ),
        pytest.param(
            claim((DRIVER, "n1", "mlx5-0"), selector=pinned("n1")),
            "n1", ClaimStatus.ALLOCATED, ["mlx5-0"], id="selector-names-the-node",
        ),
        pytest.param(
            claim((DRIVER, "n1", "mlx5-0"), selector=pinned("n2")),
            "n1", ClaimStatus.OTHER_NODE, [], id="selector-names-another-node",
        ),
        pytest.param(
            claim(("gpu.nvidia.com", "n1", "gpu-0")), "n1", ClaimStatus.UNKNOWN, [],
            id="no-device-of-ours",
        ),
        pytest.param(
            {"metadata": {"namespace": "ml", "name": "nic", "uid": UID}}, "n1",
            ClaimStatus.UNKNOWN, [], id="not-allocated-yet",
        ),
        pytest.param(
            claim((DRIVER, "n1", "mlx5-0"), name="other"), "n1", ClaimStatus.MISMATCH, [],
            id="uid-of-another-claim",
        ),
    ],
)  # fmt: skip
def test_answer_for_node(
    obj: dict[str, Any], node: str, status: ClaimStatus, devices: list[str]
) -> None:
    answer = answer_for(record_from_object(obj), ask(), node)
    assert answer.status is status
    assert [r.device for r in answer.results] == devices
    assert all(r.pool == node and r.driver == DRIVER for r in answer.results)
    assert (answer.namespace, answer.name, answer.uid) == ("ml", "nic", UID)
    assert (answer.reason == "") == (status is ClaimStatus.ALLOCATED)


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(None, id="not-an-object"),
        pytest.param({"metadata": {"name": "x"}}, id="no-uid"),
        pytest.param(
            {"metadata": {"namespace": "ml", "name": "nic", "uid": UID},
             "status": {"allocation": {"devices": {"results": "x"}}}},
            id="results-not-a-list",
        ),
        pytest.param(claim(*[(DRIVER, "n1", f"d{i}") for i in range(33)]), id="over-32"),
        pytest.param(claim((DRIVER, "", "mlx5-0")), id="empty-pool"),
    ],
)  # fmt: skip
def test_malformed_claims_are_no_record(obj: Any) -> None:
    assert record_from_object(obj) is None


def test_share_id_is_kept() -> None:
    obj = claim((DRIVER, "n1", "mlx5-0"))
    obj["status"]["allocation"]["devices"]["results"][0]["shareID"] = UID
    record = record_from_object(obj)
    assert record is not None
    assert record.results == (
        DraAllocatedDevice(request="r0", driver=DRIVER, pool="n1", device="mlx5-0", share_id=UID),
    )


def test_index_follows_list_and_watch() -> None:
    index = ClaimIndex()
    assert not index.synced
    other = "1c5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
    index.replace([claim((DRIVER, "n1", "mlx5-0")), claim(("x.io", "n1", "a"), uid=other)])
    assert index.synced and len(index) == 1
    assert index.answer(ask(), "n1").status is ClaimStatus.ALLOCATED
    assert index.apply("ADDED", claim((DRIVER, "n1", "mlx5-1"), uid=other, name="b"))
    assert [r.device for r in index.answer(ask("b", other), "n1").results] == ["mlx5-1"]
    assert not index.apply("MODIFIED", claim((DRIVER, "n1", "mlx5-1"), uid=other, name="b"))
    # Deallocated (status cleared) and deleted both forget the claim.
    assert index.apply("MODIFIED", {"metadata": {"namespace": "ml", "name": "b", "uid": other}})
    assert index.apply("DELETED", claim((DRIVER, "n1", "mlx5-0")))
    assert len(index) == 0
    assert index.answer(ask(), "n1").status is ClaimStatus.UNKNOWN
    assert not index.apply("ADDED", {"metadata": {}})
