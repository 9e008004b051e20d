"""ClaimPreparer without gRPC: idempotence, checkpoint across restarts, per-claim errors,
unprepare removing exactly what prepare wrote."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.dra.cdi import spec_file_name
from agent.dra.plugin import ClaimPreparer, DraPluginServicer
from agent.dra.pluginclaims import AllocatedDevice, ClaimRef, StaticClaims
from proto.dra import api_pb2
from proto.inventory import Device
from tests.support.builders import nic

NODE = "node-1"
DRIVER = "rdma.nicfleet.io"
UID = "0b5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
UID2 = "1b5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
REF = ClaimRef(namespace="ml", uid=UID, name="nic")


def alloc(device: str, *, driver: str = "rdma.nicfleet.io", pool: str = NODE, request: str = "nic"):
    return AllocatedDevice(request=request, driver=driver, pool=pool, device=device)


class Node:
    def __init__(self, tmp: Path) -> None:
        self.cdi = tmp / "cdi"
        self.checkpoint = tmp / "state" / "checkpoint.json"
        self.source = StaticClaims()
        self.inventory: dict[str, Device] = {
            d.name: d for d in (nic("mlx5_0"), nic("mlx5_1", index=1))
        }

    def preparer(self) -> ClaimPreparer:
        return ClaimPreparer(
            node=NODE,
            source=self.source,
            cdi_dir=self.cdi,
            checkpoint_path=self.checkpoint,
            devices=lambda: self.inventory,
        )


async def test_prepare_is_idempotent_and_survives_a_restart(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.source.put(REF, (alloc("mlx5-0"), alloc("mlx5-1", request="second")))
    first = await node.preparer().prepare(REF)
    assert first.error == ""
    assert [(d.device, d.request_names) for d in first.devices] == [
        ("mlx5-0", ("nic",)),
        ("mlx5-1", ("second",)),
    ]
    assert first.devices[0].cdi_ids == (f"rdma.nicfleet.io/claim={UID}-mlx5-0",)
    again = node.preparer()  # a restarted agent: the allocation is gone, the inventory too
    node.source.drop(UID)
    node.inventory.clear()
    assert (await again.prepare(REF)).devices == first.devices
    assert (await again.prepare(REF)).devices == first.devices
    assert [p.name for p in node.cdi.iterdir()] == [spec_file_name(UID)]

    assert await again.unprepare(REF) == ""
    assert await again.unprepare(REF) == ""  # repeated: still fine
    assert list(node.cdi.iterdir()) == []
    assert node.preparer().prepared == {}


async def test_a_reboot_that_wiped_the_cdi_dir_writes_the_spec_again(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.source.put(REF, (alloc("mlx5-0"),))
    first = await node.preparer().prepare(REF)
    spec = node.cdi / spec_file_name(UID)
    written = spec.read_text()
    spec.unlink()  # /var/run/cdi is a tmpfs; the checkpoint under /var/lib survived
    again = await node.preparer().prepare(REF)
    assert again.error == "" and again.devices == first.devices
    assert spec.read_text() == written
    # Without the allocation any more, the claim cannot be prepared again: an error, not
    # ids the runtime could not resolve.
    spec.unlink()
    node.source.drop(UID)
    assert (await node.preparer().prepare(REF)).error != ""


async def test_one_device_in_two_requests_is_one_cdi_device(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.source.put(REF, (alloc("mlx5-0"), alloc("mlx5-0", request="other")))
    prepared = await node.preparer().prepare(REF)
    assert [(d.device, d.request_names) for d in prepared.devices] == [("mlx5-0", ("nic", "other"))]


@pytest.mark.parametrize(
    ("results", "message"),
    [
        pytest.param((alloc("mlx5-9"),), "no RDMA device mlx5_9", id="unknown-device"),
        pytest.param(
            (alloc("mlx5-0", driver="gpu.nvidia.com"),), "no device of", id="other-driver"
        ),
        pytest.param((alloc("mlx5-0", pool="node-2"),), "not this node's pool", id="other-pool"),
        pytest.param((alloc("MLX_0"),), "not a DNS label", id="bad-device-name"),
        pytest.param(None, "allocation not known", id="not-forwarded"),
    ],
)
async def test_bad_claims_answer_an_error_and_write_nothing(tmp_path, results, message) -> None:
    node = Node(tmp_path)
    if results is not None:
        node.source.put(REF, results)
    prepared = await node.preparer().prepare(REF)
    assert message in prepared.error
    assert prepared.devices == ()
    assert not node.cdi.exists()
    assert not node.checkpoint.exists()


@pytest.mark.parametrize(
    "claim",
    [
        pytest.param(ClaimRef(namespace="ml", uid="../../x", name="nic"), id="bad-uid"),
        pytest.param(ClaimRef(namespace="", uid=UID2, name="nic"), id="no-namespace"),
        pytest.param(ClaimRef(namespace="ml", uid=UID2, name="n" * 300), id="long-name"),
    ],
)
async def test_malformed_claims(tmp_path: Path, claim: ClaimRef) -> None:
    assert (await Node(tmp_path).preparer().prepare(claim)).error


async def test_a_uid_reused_under_another_name_is_refused(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.source.put(REF, (alloc("mlx5-0"),))
    preparer = node.preparer()
    assert (await preparer.prepare(REF)).error == ""
    other = ClaimRef(namespace="ml", uid=UID, name="someone-else")
    assert "is ml/nic" in (await preparer.prepare(other)).error


async def test_a_corrupt_checkpoint_is_kept_aside(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.checkpoint.parent.mkdir(parents=True)
    node.checkpoint.write_text("{garbage")
    preparer = node.preparer()
    assert preparer.prepared == {}
    assert (node.checkpoint.parent / "checkpoint.json.corrupt").read_text() == "{garbage"


class BrokenSource:
    async def allocation(self, claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
        raise RuntimeError("a bug")


class HungSource:
    async def allocation(self, claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
        await asyncio.Event().wait()
        raise AssertionError("never")


async def test_a_failing_source_answers_the_claim_not_the_call(tmp_path: Path) -> None:
    node = Node(tmp_path)
    broken = ClaimPreparer(
        node=NODE,
        source=BrokenSource(),
        cdi_dir=node.cdi,
        checkpoint_path=node.checkpoint,
        devices=lambda: node.inventory,
    )
    servicer = DraPluginServicer(broken)
    request = api_pb2.NodePrepareResourcesRequest(
        claims=[api_pb2.Claim(namespace="ml", uid=UID, name="nic")]
    )
    response = await servicer.NodePrepareResources(request, None)
    assert response.claims[UID].error == "internal error: RuntimeError: a bug"


async def test_a_hung_source_times_out(tmp_path: Path) -> None:
    node = Node(tmp_path)
    hung = ClaimPreparer(
        node=NODE,
        source=HungSource(),
        cdi_dir=node.cdi,
        checkpoint_path=node.checkpoint,
        devices=lambda: node.inventory,
        source_timeout=0.01,
    )
    assert "timed out" in (await hung.prepare(REF)).error


async def test_shares_of_one_device_are_distinct_cdi_devices(tmp_path: Path) -> None:
    node = Node(tmp_path)
    share_a, share_b = UID2, UID2.replace("1b", "2b", 1)
    node.source.put(
        REF,
        (
            AllocatedDevice(
                request="a", driver=DRIVER, pool=NODE, device="mlx5-0", share_id=share_a
            ),
            AllocatedDevice(
                request="b", driver=DRIVER, pool=NODE, device="mlx5-0", share_id=share_b
            ),
        ),
    )
    prepared = await node.preparer().prepare(REF)
    assert [(d.device, d.share_id) for d in prepared.devices] == [
        ("mlx5-0", share_a),
        ("mlx5-0", share_b),
    ]
    assert prepared.devices[0].cdi_ids == (f"rdma.nicfleet.io/claim={UID}-mlx5-0-{share_a}",)
    servicer = DraPluginServicer(node.preparer())
    request = api_pb2.NodePrepareResourcesRequest(
        claims=[api_pb2.Claim(namespace="ml", uid=UID, name="nic")]
    )
    answer = (await servicer.NodePrepareResources(request, None)).claims[UID]
    assert [d.share_id for d in answer.devices] == [share_a, share_b]
