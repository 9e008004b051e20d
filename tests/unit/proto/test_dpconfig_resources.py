"""The device-plugin config checked resource by resource: one bad entry among good ones is
left out and reported with its field path; what upstream's ValidateConfigs exits on
(pkg/resources/resources_manager.go) still fails the whole document."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from proto.dpconfig import (
    ConfigError,
    InvalidResource,
    check_device_plugin_resources,
    parse_device_plugin_config,
    parse_device_plugin_resources,
)
from proto.messages.config import DevicePluginConfig, ResourceConfig, Selectors


def entry(name: str, **fields: Any) -> dict[str, Any]:
    return {"resourceName": name, "rdmaHcaMax": 4, "selectors": {"vendors": ["15b3"]}, **fields}


def document(bad: dict[str, Any]) -> dict[str, Any]:
    """Three good entries around `bad`, which is configList[1]."""
    return {"configList": [entry("a"), bad, entry("c"), entry("d")]}


ONE_BAD = [
    pytest.param(entry("b", resourcePrefix="nvidia.kubernetes.io"), "configList[1].resourcePrefix",
                 "reserved for Kubernetes", "nvidia.kubernetes.io/b", id="kubelet-reserved-prefix"),
    pytest.param(entry("b", resourcePrefix="requests.example.com"), "configList[1].resourcePrefix",
                 "quota syntax", "requests.example.com/b", id="quota-prefix"),
    pytest.param(entry("b", resourcePrefix="Example.COM"), "configList[1].resourcePrefix",
                 "not a DNS subdomain", "Example.COM/b", id="prefix-not-subdomain"),
    # Names upstream accepts ([A-Za-z0-9_]+) but the kubelet refuses: that registration only.
    pytest.param(entry("b" * 64), "configList[1].resourceName", "not a Kubernetes resource name",
                 f"rdma/{'b' * 64}", id="name-too-long"),
    pytest.param(entry("_b"), "configList[1].resourceName", "not a Kubernetes resource name",
                 "rdma/_b", id="name-leading-underscore"),
    pytest.param(entry("b", selectors={"vendors": ["zz15"]}), "configList[1].selectors.vendors[0]",
                 "not a PCI ID", "rdma/b", id="bad-vendor-selector"),
    pytest.param(entry("b", selectors={"linkTypes": ["Ethernet"]}),
                 "configList[1].selectors.linkTypes[0]", "use linkLayers", "rdma/b",
                 id="bad-link-type-selector"),
    pytest.param(entry("b", selectors={"vendors": ["15b3"], "pciAddresses": ["3b:00.0"]}),
                 "configList[1].selectors.pciAddresses[0]", "not a full PCI address", "rdma/b",
                 id="bad-pci-address-selector"),
    pytest.param({"resourceName": "b", "rdmaHcaMax": 4, "devices": ["ib/0"]},
                 "configList[1].devices[0]", "not a network interface name", "rdma/b",
                 id="bad-devices-name"),
    pytest.param({"resourceName": "b", "selectors": {"vendors": ["15b3"]}},
                 "configList[1].rdmaHcaMax", "required", "rdma/b", id="rdma-hca-max-missing"),
    pytest.param(entry("b", rdmaHcaMax=100_001), "configList[1].rdmaHcaMax", "between 0 and",
                 "rdma/b", id="rdma-hca-max-too-big"),
]  # fmt: skip


@pytest.mark.parametrize(("bad", "path", "reason", "name"), ONE_BAD)
def test_one_bad_entry_among_three_good_is_left_out_and_named(
    bad: dict[str, Any], path: str, reason: str, name: str
) -> None:
    checked = parse_device_plugin_resources(json.dumps(document(bad)), source="config.json")
    assert [r.resource_name for r in checked.config.config_list] == ["a", "c", "d"]
    (invalid,) = checked.invalid
    assert (invalid.index, invalid.name, invalid.path) == (1, name, path)
    assert reason in invalid.reason
    assert invalid.message.startswith(f"{path} (resource {name!r}): ")
    # The strict check (policies, the aggregator's writes) still refuses the document.
    with pytest.raises(ConfigError) as raised:
        parse_device_plugin_config(json.dumps(document(bad)), source="config.json")
    assert raised.value.path == path


WHOLE = [
    pytest.param(document(entry("a")), "configList[1].resourceName", "duplicate resource 'rdma/a'",
                 id="duplicate-names"),
    pytest.param(document(entry("b c")), "configList[1].resourceName",
                 "not a Kubernetes resource name", id="name-with-space"),
    pytest.param(document(entry("b/c")), "configList[1].resourceName",
                 "not a Kubernetes resource name", id="name-with-slash"),
    pytest.param(document(entry("")), "configList[1].resourceName", "must not be empty",
                 id="empty-name"),
    pytest.param(document(entry("b", rdmaHcaMax=-1)), "configList[1].rdmaHcaMax",
                 "between 0 and", id="rdma-hca-max-negative"),
    pytest.param(document(entry("b", devices=["ib0"])), "configList[1].devices",
                 "cannot be combined with selectors", id="devices-and-selectors"),
    pytest.param(document({"resourceName": "b", "rdmaHcaMax": 4}), "configList[1].selectors",
                 "would select nothing", id="nothing-selected"),
    pytest.param(document(entry("b", vendor=["15b3"])), "configList[1].vendor", "unknown key",
                 id="unknown-key"),
    pytest.param(document(entry("b", rdmaHcaMax="4")), "configList[1].rdmaHcaMax",
                 "must be an integer", id="wrong-type"),
    pytest.param({**document(entry("b")), "periodicUpdateInterval": -1}, "periodicUpdateInterval",
                 "must be >= 0", id="negative-interval"),
    pytest.param({"periodicUpdateInterval": 60}, "configList", "required", id="no-config-list"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "path", "reason"), WHOLE)
def test_what_upstream_exits_on_fails_the_whole_document(
    doc: dict[str, Any], path: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_device_plugin_resources(json.dumps(doc), source="config.json")
    assert raised.value.path == path
    assert reason in raised.value.reason


def test_unreadable_text_fails_whole() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_device_plugin_resources('{"configList": [', source="config.json")
    assert "not valid JSON" in raised.value.reason


def test_a_whole_document_error_wins_over_an_earlier_entry_error() -> None:
    doc = {"configList": [entry("a", resourcePrefix="k8s.kubernetes.io"), entry("b"), entry("b")]}
    with pytest.raises(ConfigError) as raised:
        parse_device_plugin_resources(json.dumps(doc), source="config.json")
    assert raised.value.path == "configList[2].resourceName"


def test_several_bad_entries_one_error_each_the_first_of_each() -> None:
    doc = {
        "configList": [
            entry("a", selectors={"vendors": ["zz"], "deviceIDs": ["yy"]}),
            entry("b"),
            entry("c", resourcePrefix="Bad_Prefix", selectors={"vendors": ["zz"]}),
        ]
    }
    checked = parse_device_plugin_resources(json.dumps(doc), source="config.json")
    assert [r.resource_name for r in checked.config.config_list] == ["b"]
    assert [(i.index, i.path) for i in checked.invalid] == [
        (0, "configList[0].selectors.vendors[0]"),
        (2, "configList[2].resourcePrefix"),
    ]


def test_every_entry_invalid_serves_nothing_and_reports_all() -> None:
    doc = {"configList": [entry("a", resourcePrefix="kubernetes.io"), entry("_b")]}
    checked = parse_device_plugin_resources(json.dumps(doc), source="config.json")
    assert checked.config.config_list == ()
    assert [i.index for i in checked.invalid] == [0, 1]


def test_a_valid_document_splits_into_the_strict_result() -> None:
    first = entry("a", selectors={"vendors": ["0x15B3"], "linkTypes": ["Ether"]})
    doc = {"periodicUpdateInterval": 30, "configList": [first, entry("b", rdmaHcaMax=0)]}
    checked = parse_device_plugin_resources(copy.deepcopy(doc), source="config.json")
    assert checked.invalid == ()
    assert checked.config == parse_device_plugin_config(doc, source="config.json")
    assert checked.config.config_list[0].selectors == Selectors(
        vendors=("15b3",), link_types=("ether",)
    )


def test_structs_are_split_too_without_the_document_only_checks() -> None:
    good = ResourceConfig(resource_name="a", selectors=Selectors(vendors=("15b3",)))
    bad = ResourceConfig(
        resource_name="b", resource_prefix="example.kubernetes.io", selectors=good.selectors
    )
    config = DevicePluginConfig(config_list=(good, bad))
    checked = check_device_plugin_resources(config, source="nicfleet-config/n1")
    assert [r.resource_name for r in checked.config.config_list] == ["a"]
    assert checked.invalid == (
        InvalidResource(
            index=1,
            name="example.kubernetes.io/b",
            path="configList[1].resourcePrefix",
            reason="'example.kubernetes.io' is reserved for Kubernetes",
        ),
    )
    twice = DevicePluginConfig(config_list=(good, good))
    with pytest.raises(ConfigError, match="duplicate resource"):
        check_device_plugin_resources(twice, source="nicfleet-config/n1")
