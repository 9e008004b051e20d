"""The upstream k8s-rdma-shared-dev-plugin's behaviour, table by table: ValidateConfigs (what
makes it exit), each selector's exact comparison, which adapters it drops, what a resource
advertises, and what the network-operator's webhook refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proto import rsdpupstream as upstream
from proto.inventory import Device, Interface, NodeSnapshot
from tests.support.builders import nic, snapshot


def config(*entries: dict[str, Any], **top: Any) -> str:
    return json.dumps({**top, "configList": list(entries)})


def entry(name: str = "a", hca: int | None = 5, **selectors: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"resourceName": name, "selectors": selectors or {"vendors": ["15b3"]}}
    if hca is not None:
        out["rdmaHcaMax"] = hca
    return out


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        pytest.param("{not json", "", "not valid JSON", id="not-json"),
        pytest.param(config(), "configList", "no resources configuration found", id="empty"),
        pytest.param('{"configLst": []}', "configList", "no resources", id="typo-ignored"),
        pytest.param(config(entry(), periodicUpdateInterval=-1), "periodicUpdateInterval",
                     '"-1000000000"', id="negative-interval-in-ns"),
        pytest.param(config(entry("rdma-a")), "configList[0].resourceName", "invalid characters",
                     id="dash-in-name"),
        pytest.param(config(entry("a.b")), "configList[0].resourceName", "invalid characters",
                     id="dot-in-name"),
        pytest.param(config(entry("a\n")), "configList[0].resourceName", "invalid characters",
                     id="newline-go-dollar"),
        pytest.param(config(entry("")), "configList[0].resourceName", "invalid characters",
                     id="empty-name"),
        pytest.param(config(entry("a"), {**entry("a"), "resourcePrefix": "other.io"}),
                     "configList[1].resourceName", "already exists", id="duplicate-ignores-prefix"),
        pytest.param(config(entry(hca=-1)), "configList[0].rdmaHcaMax", "rdmaHcaMax < 0",
                     id="negative-hca"),
        pytest.param(config({"resourceName": "a", "rdmaHcaMax": 1}), "configList[0].selectors",
                     "neither", id="no-selectors"),
        pytest.param(config({"resourceName": "a", "rdmaHcaMax": 1, "selectors": {"vendors": []}}),
                     "configList[0].selectors", "neither", id="empty-selector-lists"),
        pytest.param(config(entry(numaNodes=[0])), "configList[0].selectors", "neither",
                     id="only-nicfleet-selectors"),
        pytest.param(config({**entry(), "devices": ["ib0"]}), "configList[0].devices",
                     "Cannot specify both", id="selectors-and-devices"),
        pytest.param(config({"resourceName": "a", "rdmaHcaMax": 1.5, "devices": ["ib0"]}),
                     "configList[0].rdmaHcaMax", "number 1.5", id="float-hca"),
    ],
)  # fmt: skip
def test_would_not_start(text: str, path: str, words: str) -> None:
    failure = upstream.read_config(text)
    assert isinstance(failure, upstream.StartFailure)
    assert failure.path == path
    assert words in failure.reason


def test_first_error_only_as_the_plugin_exits_on_it() -> None:
    failure = upstream.read_config(config(entry("bad-1"), entry("bad-2")))
    assert isinstance(failure, upstream.StartFailure)
    assert "bad-1" in failure.reason


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(config(entry()), upstream.Resource(name="a", rdma_hca_max=5,
                     selectors={"vendors": ("15b3",)}), id="plain"),
        pytest.param(config(entry(hca=None)), upstream.Resource(name="a", rdma_hca_max=0,
                     selectors={"vendors": ("15b3",)}), id="hca-max-defaults-to-0"),
        pytest.param(config({"resourceName": "a", "rdmaHcaMax": 2, "devices": ["ib0"]}),
                     upstream.Resource(name="a", rdma_hca_max=2, selectors={"ifNames": ("ib0",)},
                                       from_devices=True), id="devices-become-ifnames"),
        pytest.param(config({**entry(), "resourcePrefix": ""}), upstream.Resource(
                     name="a", rdma_hca_max=5, selectors={"vendors": ("15b3",)}),
                     id="empty-prefix-defaults"),
        pytest.param(config({**entry(), "resourcePrefix": "nvidia.com"}), upstream.Resource(
                     name="a", prefix="nvidia.com", rdma_hca_max=5,
                     selectors={"vendors": ("15b3",)}), id="prefix"),
    ],
)  # fmt: skip
def test_config_as_the_plugin_holds_it(text: str, expected: upstream.Resource) -> None:
    result = upstream.read_config(text)
    assert isinstance(result, upstream.Config)
    assert result.resources == (expected,)


def test_interval_default_and_zero() -> None:
    absent = upstream.read_config(config(entry()))
    zero = upstream.read_config(config(entry(), periodicUpdateInterval=0))
    assert isinstance(absent, upstream.Config) and isinstance(zero, upstream.Config)
    assert (absent.periodic_update_interval, zero.periodic_update_interval) == (60, 0)


ROCE = nic(
    "mlx5_2",
    index=2,
    netdevs=("eth3", "eth2"),
    link_layer="Ethernet",
    device_id="0x101D",
    vendor="0x15B3",
)
IB = nic("mlx5_0", netdevs=("ib0",))
NO_NETDEV = nic("mlx5_4", index=4, netdevs=())


def selected(selectors: dict[str, Any], device: Device) -> str | None:
    """None when upstream selects `device`, else the reason."""
    resource = upstream.Resource(name="r", rdma_hca_max=1, selectors=selectors)
    adapter = upstream.adapter_of(device, node_has_rdma_cm=True)
    miss = upstream.first_mismatch(resource, adapter)
    return None if miss is None else miss.reason


@pytest.mark.parametrize(
    ("selectors", "device", "words"),
    [
        pytest.param({"vendors": ["15b3"]}, ROCE, None, id="vendor-lowercase-no-0x"),
        pytest.param({"vendors": ["0x15b3"]}, ROCE, "write '15b3', not '0x15b3'", id="vendor-0x"),
        pytest.param({"vendors": ["15B3"]}, ROCE, "write '15b3'", id="vendor-uppercase"),
        pytest.param({"deviceIDs": ["101d"]}, ROCE, None, id="device-id"),
        pytest.param({"deviceIDs": ["0x101d"]}, ROCE, "not '0x101d'", id="device-id-0x"),
        pytest.param({"deviceIDs": ["101D"]}, ROCE, "write '101d'", id="device-id-case"),
        pytest.param({"drivers": ["mlx5_core"]}, ROCE, None, id="driver"),
        pytest.param({"drivers": ["MLX5_CORE"]}, ROCE, "write 'mlx5_core'", id="driver-case"),
        pytest.param({"ifNames": ["eth2"]}, ROCE, None, id="ifname-first-sorted"),
        pytest.param({"ifNames": ["eth3"]}, ROCE, "first netdev ('eth2')", id="ifname-not-first"),
        pytest.param({"ifNames": ["ib0"]}, NO_NETDEV, "no netdev", id="ifname-no-netdev"),
        pytest.param({"linkTypes": ["ether"]}, ROCE, None, id="link-type-ether"),
        pytest.param({"linkTypes": ["infiniband"]}, IB, None, id="link-type-infiniband"),
        pytest.param({"linkTypes": ["Ether"]}, ROCE, "write 'ether'", id="link-type-case"),
        pytest.param({"linkTypes": ["ethernet"]}, ROCE, "does not contain 'ether'", id="ethernet"),
        pytest.param({"linkTypes": ["infiniband"]}, NO_NETDEV, "link type is empty",
                     id="link-type-without-netdev"),
        pytest.param({"vendors": ["15b3"], "deviceIDs": ["1021"]}, ROCE, "deviceIDs",
                     id="anded-names-first-failing"),
    ],
)  # fmt: skip
def test_selector_compares_as_upstream(
    selectors: dict[str, Any], device: Device, words: str | None
) -> None:
    reason = selected(selectors, device)
    if words is None:
        assert reason is None
    else:
        assert reason is not None and words in reason


@pytest.mark.parametrize(
    ("device", "words"),
    [
        pytest.param(nic(char_devices=("/dev/infiniband/uverbs0",)), "umad", id="no-umad"),
        pytest.param(nic(char_devices=("/dev/infiniband/umad0",)), "uverbs", id="no-uverbs"),
        pytest.param(
            nic(char_devices=("/dev/infiniband/umad0", "/dev/infiniband/uverbs0"), rdma_cm=False),
            "rdma_cm",
            id="no-rdma-cm",
        ),
        pytest.param(nic(driver=None), "no driver", id="unbound"),
        pytest.param(
            Device(name="x", pci_address="0000:01:00.0", class_code="0x120000", driver="d"),
            "not a network controller",
            id="class-not-02",
        ),
    ],
)
def test_adapters_the_plugin_drops(device: Device, words: str) -> None:
    adapter = upstream.adapter_of(device, node_has_rdma_cm=False)
    assert adapter.dropped is not None and words in adapter.dropped


def test_issm_is_not_required() -> None:
    chars = ("/dev/infiniband/umad0", "/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm")
    assert (
        upstream.adapter_of(nic(char_devices=chars, rdma_cm=False), node_has_rdma_cm=True).dropped
        is None
    )


def test_unknown_netdev_type_guesses_from_the_port() -> None:
    device = Device(
        name="mlx5_0",
        pci_address="0000:19:00.0",
        driver="mlx5_core",
        netdevs=("ib0",),
        interfaces=(Interface(name="ib0"),),
    )
    adapter = upstream.adapter_of(device, node_has_rdma_cm=True)
    assert (adapter.link_type, adapter.link_type_known) == ("", False)


@pytest.mark.parametrize(
    ("hca", "devices", "advertised"),
    [
        pytest.param(63, (IB,), 63, id="shared-count-is-rdma-hca-max"),
        pytest.param(63, (IB, nic("mlx5_1", index=1)), 63, id="not-multiplied-by-adapters"),
        pytest.param(0, (IB,), 0, id="hca-max-0-advertises-0"),
        pytest.param(63, (ROCE,), 0, id="nothing-selected"),
        pytest.param(63, (), 0, id="no-adapter"),
    ],
)
def test_advertised(hca: int, devices: tuple[Device, ...], advertised: int) -> None:
    resource = upstream.Resource(
        name="r", rdma_hca_max=hca, selectors={"linkTypes": ("infiniband",)}
    )
    snap: NodeSnapshot = snapshot(devices=devices)
    assert upstream.predict(resource, upstream.adapters(snap)).advertised == advertised


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param(config(entry()), None, id="admitted"),
        pytest.param(config(entry("rdma-a.b")), None, id="dash-and-dot-admitted"),
        pytest.param(config(entry(hca=None)), "rdmaHcaMax is required", id="hca-required"),
        pytest.param(
            config({"resourceName": "a", "rdmaHcaMax": 1.0, "devices": ["x"]}), None, id="1.0-int"
        ),
        pytest.param(config(entry("-a")), "Invalid Resource name", id="name-start"),
        pytest.param(config(entry(pciAddresses=["x"])), "Additional property pciAddresses",
                     id="nicfleet-selector-refused"),
        pytest.param(config({"resourceName": "a", "rdmaHcaMax": 1}), "anyOf", id="no-selectors"),
        pytest.param(config(entry(vendors=[""])), "greater than or equal to 1", id="empty-string"),
        pytest.param(config(entry(vendors=[4099])), "Expected: string", id="number-selector"),
        pytest.param(config({**entry(), "resourcePrefix": "nvidia"}), "FQDN", id="prefix-fqdn"),
        pytest.param(config(), "at least 1 items", id="empty-list"),
        pytest.param('{"configLst": []}', "configList is required", id="typo"),
        pytest.param('{"configList": [{"ResourceName": "a", "rdmaHcaMax": 1, "devices": ["x"]}]}',
                     "resourceName is required", id="schema-is-case-sensitive"),
        pytest.param("{not json", "Invalid json", id="not-json"),
    ],
)  # fmt: skip
def test_webhook(text: str, words: str | None) -> None:
    errors = upstream.webhook_errors(text)
    if words is None:
        assert errors == ()
    else:
        assert any(words in e for e in errors), errors


def test_webhook_admits_what_the_plugin_refuses() -> None:
    # The webhook allows '-' and '.', and 1.0 for an integer; the plugin exits on both.
    for text in (
        config(entry("rdma-a")),
        config({"resourceName": "a", "rdmaHcaMax": 1.0, "devices": ["x"]}),
    ):
        assert upstream.webhook_errors(text) == ()
        assert isinstance(upstream.read_config(text), upstream.StartFailure)
