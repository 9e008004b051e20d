"""What the DRA plugin reports (DevicePluginStatus.dra): the status shape from the
checkpoint, the failures (bounded, newest first, dropped once prepared or unprepared),
the health feed and the slice settings; and when it says that something changed."""

from __future__ import annotations

from pathlib import Path

import msgspec

from agent.dra.checkpoint import Checkpoint, load_checkpoint, write_atomic
from agent.dra.claimstatus import MAX_FAILED, FailedPrepares
from agent.dra.plugin import ClaimPreparer
from agent.dra.pluginclaims import AllocatedDevice, ClaimRef, StaticClaims
from agent.dra.pluginrunner import DraPlugin, DraSettings
from proto.draslices import SliceSettings
from proto.messages.status import DraClaimState, DraPluginStatus, DraSliceConfig
from tests.support.builders import nic, snapshot

NODE = "node-1"
DRIVER = "rdma.nicfleet.io"
UID = "0b5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
REF = ClaimRef(namespace="ml", uid=UID, name="nic")


def uid(i: int) -> str:
    return f"{i:08x}-2a3d-4e5f-8a9b-0c1d2e3f4a5b"


def alloc(device: str, request: str = "nic") -> AllocatedDevice:
    return AllocatedDevice(request=request, driver=DRIVER, pool=NODE, device=device)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Changes:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def settings(tmp: Path, **kw: object) -> DraSettings:
    return DraSettings(
        plugins_dir=tmp / "plugins",
        plugins_registry_dir=tmp / "registry",
        cdi_dir=tmp / "cdi",
        state_dir=tmp / "state",
        claims_dir=tmp / "claims",
        **kw,  # type: ignore[arg-type]
    )


def test_failures_are_bounded_newest_first_and_a_repeat_moves_to_the_front() -> None:
    failures = FailedPrepares()
    for i in range(MAX_FAILED + 5):
        failures.record(ClaimRef("ml", uid(i), f"c{i}"), f"error {i}", at=float(i))
    assert len(failures) == MAX_FAILED
    listed = failures.newest_first()
    assert [f.name for f in listed[:2]] == [f"c{MAX_FAILED + 4}", f"c{MAX_FAILED + 3}"]
    assert listed[-1].name == "c5"  # the five oldest were dropped
    failures.record(ClaimRef("ml", uid(7), "c7"), "again", at=99.0)
    assert failures.newest_first()[0] == DraClaimState(
        uid=uid(7), namespace="ml", name="c7", error="again", at=99.0
    )
    assert len(failures) == MAX_FAILED
    assert failures.clear(uid(7)) and not failures.clear(uid(7))


async def test_a_failure_is_reported_until_the_claim_is_prepared(tmp_path: Path) -> None:
    clock, changes = Clock(), Changes()
    source = StaticClaims()
    preparer = ClaimPreparer(
        node=NODE,
        source=source,
        cdi_dir=tmp_path / "cdi",
        checkpoint_path=tmp_path / "state" / "checkpoint.json",
        devices=lambda: {"mlx5_0": nic("mlx5_0")},
        clock=clock,
        on_change=changes,
    )
    assert (await preparer.prepare(REF)).error  # not forwarded yet
    assert changes.count == 1
    (failed,) = preparer.failures.newest_first()
    assert (failed.uid, failed.namespace, failed.name, failed.at) == (UID, "ml", "nic", 1000.0)
    assert failed.error is not None and "allocation not known" in failed.error

    clock.now = 1005.0
    source.put(REF, (alloc("mlx5-0"),))
    assert (await preparer.prepare(REF)).error == ""
    assert preparer.failures.newest_first() == ()
    assert changes.count == 2  # the prepared set and the failures changed together
    assert preparer.prepared[UID].prepared_at == 1005.0
    assert (await preparer.prepare(REF)).error == ""  # the kubelet repeats: nothing new
    assert changes.count == 2

    assert await preparer.unprepare(REF) == ""
    assert changes.count == 3
    assert await preparer.unprepare(REF) == ""  # nothing was held: no change
    assert changes.count == 3


async def test_unprepare_drops_a_failure_and_bad_uids_are_not_reported(tmp_path: Path) -> None:
    changes = Changes()
    preparer = ClaimPreparer(
        node=NODE,
        source=StaticClaims(),
        cdi_dir=tmp_path / "cdi",
        checkpoint_path=tmp_path / "state" / "checkpoint.json",
        devices=dict,
        on_change=changes,
    )
    assert (await preparer.prepare(ClaimRef("ml", "\x00" * 5000, "x"))).error
    assert preparer.failures.newest_first() == () and changes.count == 0
    assert (await preparer.prepare(REF)).error
    assert len(preparer.failures) == 1
    assert await preparer.unprepare(REF) == ""
    assert preparer.failures.newest_first() == ()
    assert changes.count == 2


async def test_the_plugin_status(tmp_path: Path) -> None:
    clock, changes = Clock(), Changes()
    source = StaticClaims()
    slices = SliceSettings(sharing="copies", share=2, rails={"mlx5_0": 3})
    plugin = DraPlugin(
        settings(tmp_path, slices=slices),
        node=NODE,
        source=source,
        clock=clock,
        on_change=changes,
    )
    snap = snapshot(node=NODE, devices=(nic("mlx5_0"), nic("mlx5_1", index=1)))
    plugin.update(snap, {("mlx5_0", 1): ("ACTIVE", "LinkUp"), ("mlx5_1", 1): ("DOWN", "Disabled")})
    assert changes.count == 1
    plugin.update(snap, {("mlx5_0", 1): ("ACTIVE", "LinkUp"), ("mlx5_1", 1): ("DOWN", "Disabled")})
    assert changes.count == 1  # same health: nothing to publish

    source.put(REF, (alloc("mlx5-0-s1"), alloc("mlx5-1-s0", request="second")))
    assert (await plugin.preparer.prepare(REF)).error == ""
    other = ClaimRef("ml", uid(1), "broken")
    assert (await plugin.preparer.prepare(other)).error

    status = plugin.status()
    assert status == DraPluginStatus(
        state="starting",
        endpoint=str(tmp_path / "plugins" / DRIVER / "dra.sock"),
        slices=DraSliceConfig(sharing="copies", share=2, rails={"mlx5_0": 3}),
        prepared=(
            DraClaimState(
                uid=UID,
                namespace="ml",
                name="nic",
                devices=("mlx5-0-s1", "mlx5-1-s0"),
                cdi_ids=(
                    f"{DRIVER}/claim={UID}-mlx5-0-s1",
                    f"{DRIVER}/claim={UID}-mlx5-1-s0",
                ),
                at=1000.0,
            ),
        ),
        failed=(status.failed[0],),
        unhealthy={
            "mlx5-1-s0": "no port ACTIVE/LinkUp (1:DOWN/Disabled)",
            "mlx5-1-s1": "no port ACTIVE/LinkUp (1:DOWN/Disabled)",
        },
    )
    assert status.failed[0].uid == uid(1) and status.failed[0].error
    # It travels: the wire form decodes to the same status.
    assert msgspec.json.decode(msgspec.json.encode(status), type=DraPluginStatus) == status


def test_a_checkpoint_from_before_prepared_at_loads(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    old = {
        "version": 1,
        "claims": {
            UID: {
                "uid": UID,
                "namespace": "ml",
                "name": "nic",
                "devices": [],
                "cdi_spec": "f.json",
            }
        },
    }
    write_atomic(path, msgspec.json.encode(old))
    loaded = load_checkpoint(path)
    assert loaded != Checkpoint() and loaded.claims[UID].prepared_at == 0.0
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]  # no temp file left
