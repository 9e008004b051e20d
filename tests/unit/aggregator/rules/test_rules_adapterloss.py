"""adapter-lost: an RDMA device the followed agent process reported goes away (and comes
back), the advertised count drops below its peak, fewer adapters than adaptersPerNode —
through the fleet's real ingest (aggregator.fleet.state) and the rule engine; never for
state this process did not observe."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.fleet.state import Fleet, NodeRecord
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.finding import Finding
from proto.inventory import Device, NodeSnapshot, ReadError
from proto.messages.status import DevicePluginStatus
from proto.policy import Expect, Policy
from tests.support.builders import T0, nic, plugin_status, rdma_policy, resource_status, snapshot

NODE = "gpu-001"
EPOCH = round(T0 * 1e9)
RES = "rdma/roce"


def adapter(i: int) -> Device:
    return msgspec.structs.replace(
        nic(f"mlx5_{i}", index=i, netdevs=(f"ens{i}",), link_layer="Ethernet"),
        board_id="MT_0000000838",
        hca_type="MT4129",
    )


FOUR = tuple(adapter(i) for i in range(4))
THREE = (FOUR[0], *FOUR[2:])  # mlx5_1 (0000:1a:00.0) gone


def snap(devices: tuple[Device, ...], seq: int, *, epoch: int = EPOCH) -> NodeSnapshot:
    return msgspec.structs.replace(
        snapshot(NODE, devices=devices, seq=seq, collected_at=T0 + seq, gpus=0), epoch=epoch
    )


def status(
    devices: tuple[Device, ...], *, generation: int = 1, at: float = T0, epoch: int = EPOCH
) -> DevicePluginStatus:
    names = tuple(d.name for d in devices)
    # Shared mode as the lab's roce node: two device IDs per adapter here.
    served = resource_status(RES, devices=names, advertised=2 * len(names))
    return msgspec.structs.replace(
        plugin_status(NODE, served, generation=generation, observed_at=at), epoch=epoch
    )


def lost(fleet: Fleet, policies: tuple[Policy, ...] = ()) -> list[Finding]:
    found = evaluate(fleet.view(), policies, now=T0 + 100)
    return [f for f in found if f.rule == "adapter-lost"]


def test_a_device_that_goes_is_critical_naming_it_and_resolves_when_it_returns() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(snap(FOUR, 1), T0 + 1)
    assert lost(fleet) == []
    fleet.apply_snapshot(snap(THREE, 2), T0 + 2)
    (finding,) = lost(fleet)
    assert (finding.severity, finding.node, finding.subject) == ("critical", NODE, "mlx5_1")
    assert finding.evidence == {
        "rdma_device": "mlx5_1",
        "pci_address": "0000:1a:00.0",
        "board_id": "MT_0000000838",
        "hca_type": "MT4129",
        "device_id": "0x1021",
        "netdevs": "ens1",
        "pci_function": "unknown",  # these snapshots do not report the bus
        "last_seen": T0 + 1,
        "heard_since": T0 + 1,
    }
    assert finding.message.startswith(
        "RDMA device mlx5_1 (0000:1a:00.0, MT4129 MT_0000000838) is gone from gpu-001"
    )
    fleet.apply_snapshot(snap(FOUR, 3), T0 + 3)
    assert lost(fleet) == []


@pytest.mark.parametrize(
    ("functions", "state", "said"),
    [
        pytest.param(("0000:19:00.0", "0000:1a:00.0"), "present", "is still on the bus",
                     id="unregistered"),
        pytest.param(("0000:19:00.0",), "gone", "gone from the bus too", id="off-the-bus"),
    ],
)  # fmt: skip
def test_it_says_whether_the_pci_function_is_still_there(
    functions: tuple[str, ...], state: str, said: str
) -> None:
    fleet = Fleet()
    fleet.apply_snapshot(snap(FOUR, 1), T0 + 1)
    later = msgspec.structs.replace(snap(THREE, 2), nic_functions=functions)
    fleet.apply_snapshot(later, T0 + 2)
    (finding,) = lost(fleet)
    assert finding.evidence["pci_function"] == state
    assert said in finding.message


def test_a_device_back_under_another_name_at_the_same_pci_address_resolves() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(snap(FOUR, 1), T0 + 1)
    fleet.apply_snapshot(snap(THREE, 2), T0 + 2)
    renamed = msgspec.structs.replace(FOUR[1], name="mlx5_4")
    fleet.apply_snapshot(snap((*THREE, renamed), 3), T0 + 3)
    assert lost(fleet) == []


def test_nothing_fires_for_state_this_process_never_observed() -> None:
    # A start: the record comes from KV with four adapters; the first live snapshot has three.
    fleet = Fleet([NodeRecord(name=NODE, snapshot=snap(FOUR, 1), first_seen=T0, last_seen=T0)])
    assert lost(fleet) == []
    fleet.apply_snapshot(snap(THREE, 2), T0 + 2)
    assert lost(fleet) == []
    fleet.apply_status(status(THREE, at=T0 + 2), T0 + 2)
    assert lost(fleet) == []


def test_a_new_agent_process_starts_the_history_afresh() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(snap(FOUR, 1), T0 + 1)
    fleet.apply_snapshot(snap(THREE, 2), T0 + 2)
    assert [f.subject for f in lost(fleet)] == ["mlx5_1"]
    fleet.apply_snapshot(snap(THREE, 1, epoch=EPOCH + 10**9), T0 + 3)  # the agent restarted
    assert lost(fleet) == []


def test_a_snapshot_that_could_not_list_the_devices_judges_nothing_and_forgets_nothing() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(snap(FOUR, 1), T0 + 1)
    failed = msgspec.structs.replace(
        snap((), 2), errors=(ReadError(path="/class/infiniband", error="EIO"),)
    )
    fleet.apply_snapshot(failed, T0 + 2)
    assert lost(fleet) == []
    fleet.apply_snapshot(snap(THREE, 3), T0 + 3)
    assert [f.subject for f in lost(fleet)] == ["mlx5_1"]


def test_advertised_below_its_peak_names_the_adapters_it_lost() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(snap(FOUR, 1), T0 + 1)
    fleet.apply_status(status(FOUR, at=T0 + 1), T0 + 1)
    fleet.apply_snapshot(snap(THREE, 2), T0 + 2)
    fleet.apply_status(status(THREE, at=T0 + 2), T0 + 2)
    by_subject = {f.subject: f for f in lost(fleet)}
    assert sorted(by_subject) == ["mlx5_1", RES]
    capacity = by_subject[RES]
    assert capacity.message.startswith(
        "rdma/roce on gpu-001 offers 6 devices over 3 adapters, down from 8 over 4 adapters (the "
        "most since this agent started, same config): "
        "lost mlx5_1 (0000:1a:00.0, MT4129 MT_0000000838)"
    )
    assert capacity.evidence == {
        "advertised": 6,
        "highest": 8,
        "adapters_serving": 3,
        "most_adapters": 4,
        "highest_at": T0 + 1,
        "config_generation": 1,
        "adapters": "mlx5_1",
        "gone_from_inventory": "mlx5_1",
        "adapter:mlx5_1": "0000:1a:00.0, MT4129 MT_0000000838",
    }


def test_a_shared_resource_over_fewer_adapters_is_a_loss_at_the_same_count() -> None:
    # Shared mode advertises rdmaHcaMax IDs however many adapters serve them.
    def shared(devices: tuple[Device, ...], at: float) -> DevicePluginStatus:
        served = resource_status(RES, devices=tuple(d.name for d in devices), advertised=64)
        return msgspec.structs.replace(plugin_status(NODE, served, observed_at=at), epoch=EPOCH)

    fleet = Fleet()
    fleet.apply_status(shared(FOUR, T0 + 1), T0 + 1)
    fleet.apply_snapshot(snap(FOUR, 1), T0 + 1)
    fleet.apply_status(shared(THREE, T0 + 2), T0 + 2)  # the plugin dropped mlx5_1 first
    (finding,) = lost(fleet)
    assert (finding.subject, finding.evidence["advertised"], finding.evidence["highest"]) == (
        RES, 64, 64,
    )  # fmt: skip
    assert finding.evidence["adapters"] == "mlx5_1"
    assert finding.evidence["gone_from_inventory"] == ""  # the snapshot still lists it


def test_a_new_config_generation_is_not_a_loss() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(snap(FOUR, 1), T0 + 1)
    fleet.apply_status(status(FOUR, at=T0 + 1), T0 + 1)
    fleet.apply_status(status(THREE, generation=2, at=T0 + 2), T0 + 2)  # narrower selectors
    assert lost(fleet) == []


@pytest.mark.parametrize(
    ("devices", "subjects"),
    [
        pytest.param(FOUR, [], id="as-expected"),
        pytest.param(THREE, ["adapters"], id="one-short"),
    ],
)
def test_fewer_adapters_than_the_policy_expects_fires_without_any_history(
    devices: tuple[Device, ...], subjects: list[str]
) -> None:
    policy = rdma_policy("roce", RES)
    policy = msgspec.structs.replace(
        policy, spec=msgspec.structs.replace(policy.spec, expect=Expect(adapters_per_node=4))
    )
    # Loaded, never heard live: the policy alone is the expectation (also offline).
    fleet = Fleet([NodeRecord(name=NODE, snapshot=snap(devices, 1), first_seen=T0, last_seen=T0)])
    found = lost(fleet, (policy,))
    assert [f.subject for f in found] == subjects
    if found:
        assert found[0].evidence["expected"] == 4
        assert found[0].evidence["found"] == 3
        assert "mlx5_0@0000:19:00.0" in str(found[0].evidence["adapters"])
        assert "expects 4 (expect.adaptersPerNode)" in found[0].message
