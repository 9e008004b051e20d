"""Device-plugin config: upstream and NVIDIA samples parse as they are; every invalid
document is rejected with the path of the offending field and the entry it belongs to."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from proto.codec import decode, encode
from proto.dpconfig import (
    ConfigError,
    parse_device_plugin_config,
    resource_full_name,
    validate_device_plugin_config,
)
from proto.messages.config import DesiredConfig, DevicePluginConfig, ResourceConfig, Selectors
from proto.policy import PolicyError, load_policies

# --- samples, reproduced as test data ---------------------------------------------------

# Mellanox/k8s-rdma-shared-dev-plugin README.md, "RDMA Shared Device Plugin Configurations".
UPSTREAM_README = """
{
  "configList": [{
    "resourceName": "hca_shared_devices_a",
    "rdmaHcaMax": 1000,
    "devices": ["ib0", "ib1"]
  },
    {
      "resourceName": "hca_shared_devices_b",
      "rdmaHcaMax": 500,
      "selectors": {
        "vendors": ["15b3"],
        "deviceIDs": ["1017"],
        "ifNames": ["ib3", "ib4"]
      }
    }
  ]
}
"""

# Mellanox/k8s-rdma-shared-dev-plugin deployment/k8s/base/configmap.yaml (newest version).
UPSTREAM_CONFIGMAP = """
apiVersion: v1
kind: ConfigMap
metadata:
  name: rdma-devices
  namespace: kube-system
data:
  config.json: |
    {
        "kubeletRootDir": "/var/lib/kubelet",
        "periodicUpdateInterval": 300,
        "configList": [{
             "resourceName": "hca_shared_devices_a",
             "rdmaHcaMax": 1000,
             "devices": ["ib0", "ib1"]
           },
           {
             "resourceName": "hca_shared_devices_b",
             "rdmaHcaMax": 500,
             "selectors": {
               "vendors": ["15b3"],
               "deviceIDs": ["1017"],
               "ifNames": ["ib3", "ib4"]
             }
           }
        ]
    }
"""

# Mellanox/network-operator example/crs/mellanox.com_v1alpha1_nicclusterpolicy_cr.yaml
# (the rdmaSharedDevicePlugin part).
NICCLUSTERPOLICY = """
apiVersion: mellanox.com/v1alpha1
kind: NicClusterPolicy
metadata:
  name: nic-cluster-policy
spec:
  rdmaSharedDevicePlugin:
    image: k8s-rdma-shared-dev-plugin
    repository: ghcr.io/mellanox
    version: sha-4f3eb2224b8b5f97be3f17441ddee8d41753b7d5
    # The config below directly propagates to k8s-rdma-shared-device-plugin configuration.
    # Replace 'devices' with your (RDMA capable) netdevice name.
    config: |
      {
        "configList": [
          {
            "resourceName": "rdma_shared_device_a",
            "rdmaHcaMax": 63,
            "selectors": {
              "vendors": ["15b3"],
              "deviceIDs": ["101b"]
            }
          }
        ]
      }
"""

# NVIDIA Network Operator docs v25.7.0, quick start "IP over InfiniBand with RDMA Shared
# Device" (3 pools), as fixed by Mellanox/network-operator-docs PR #266.
NETWORK_OPERATOR_IPOIB = """
{
  "configList": [
    {
      "resourceName": "rdma_shared_device_a",
      "rdmaHcaMax": 63,
      "selectors": {
        "ifNames": ["ibs1f0"]
      }
    },
    {
      "resourceName": "rdma_shared_device_b",
      "rdmaHcaMax": 63,
      "selectors": {
        "ifNames": ["ibs1f1"]
      }
    },
    {
      "resourceName": "rdma_shared_device_c",
      "rdmaHcaMax": 63,
      "selectors": {
        "ifNames": ["ibs2f0"]
      }
    }
  ]
}
"""

# The same sample as published before that fix: the last entry's braces are missing.
NETWORK_OPERATOR_IPOIB_BROKEN = NETWORK_OPERATOR_IPOIB.replace(
    '"ifNames": ["ibs2f0"]\n      }\n    }\n', '"ifNames": ["ibs2f0"]\n'
)

# An early NVIDIA Network Operator NicClusterPolicy sample (plugin v1.2.1): no selectors.
NICCLUSTERPOLICY_V121_CONFIG = """
{
  "configList": [{
    "resourceName": "rdma_shared_device_a",
    "rdmaHcaMax": 63
  }]
}
"""


def config_json_of_configmap(text: str) -> str:
    data: Any = yaml.safe_load(text)
    return str(data["data"]["config.json"])


def config_of_nicclusterpolicy(text: str) -> str:
    data: Any = yaml.safe_load(text)
    return str(data["spec"]["rdmaSharedDevicePlugin"]["config"])


# --- samples parse ------------------------------------------------------------------------


def test_upstream_readme_sample() -> None:
    config = parse_device_plugin_config(UPSTREAM_README, source="config.json")
    a, b = config.config_list
    assert config.periodic_update_interval == 60  # upstream's default when absent
    assert (resource_full_name(a), a.rdma_hca_max, a.devices, a.selectors) == (
        "rdma/hca_shared_devices_a",
        1000,
        ("ib0", "ib1"),
        None,
    )
    assert b.selectors == Selectors(
        vendors=("15b3",), device_ids=("1017",), if_names=("ib3", "ib4")
    )
    assert resource_full_name(b) == "rdma/hca_shared_devices_b"


def test_upstream_configmap_with_kubelet_root_dir() -> None:
    text = config_json_of_configmap(UPSTREAM_CONFIGMAP)
    config = parse_device_plugin_config(text.encode(), source="configmap/rdma-devices")
    assert config.periodic_update_interval == 300
    assert [r.resource_name for r in config.config_list] == [
        "hca_shared_devices_a",
        "hca_shared_devices_b",
    ]
    assert config.kubelet_root_dir == "/var/lib/kubelet"


def test_nicclusterpolicy_sample() -> None:
    config = parse_device_plugin_config(
        config_of_nicclusterpolicy(NICCLUSTERPOLICY), source="nic-cluster-policy"
    )
    (resource,) = config.config_list
    assert resource_full_name(resource) == "rdma/rdma_shared_device_a"
    assert resource.rdma_hca_max == 63
    assert resource.selectors == Selectors(vendors=("15b3",), device_ids=("101b",))


def test_network_operator_ipoib_sample() -> None:
    config = parse_device_plugin_config(NETWORK_OPERATOR_IPOIB, source="ipoib")
    assert [
        (r.resource_name, r.selectors and r.selectors.if_names) for r in config.config_list
    ] == [
        ("rdma_shared_device_a", ("ibs1f0",)),
        ("rdma_shared_device_b", ("ibs1f1",)),
        ("rdma_shared_device_c", ("ibs2f0",)),
    ]


def test_published_broken_sample_names_line_and_column() -> None:
    with pytest.raises(ConfigError) as info:
        parse_device_plugin_config(NETWORK_OPERATOR_IPOIB_BROKEN, source="ipoib")
    assert info.value.path == "line 23, column 3"
    assert "not valid JSON" in info.value.reason


def test_sample_without_selectors_is_rejected_as_upstream_does() -> None:
    with pytest.raises(ConfigError) as info:
        parse_device_plugin_config(NICCLUSTERPOLICY_V121_CONFIG, source="old")
    assert info.value.path == "configList[0].selectors"
    assert info.value.resource_name == "rdma_shared_device_a"


def test_yaml_and_json_forms_are_the_same_config() -> None:
    as_yaml = yaml.safe_dump(json.loads(UPSTREAM_README))
    assert parse_device_plugin_config(as_yaml, source="y") == parse_device_plugin_config(
        UPSTREAM_README, source="j"
    )


def test_mapping_input() -> None:
    config = parse_device_plugin_config(json.loads(NETWORK_OPERATOR_IPOIB), source="kv")
    assert len(config.config_list) == 3


# --- what is accepted, and its normal form --------------------------------------------------


def one(**entry: Any) -> dict[str, Any]:
    return {"configList": [{"resourceName": "r", "rdmaHcaMax": 8, **entry}]}


def sel(**selectors: Any) -> dict[str, Any]:
    return one(selectors=selectors)


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        pytest.param(
            sel(vendors=["0x15B3"], deviceIDs=["101D", "0X1021"]),
            Selectors(vendors=("15b3",), device_ids=("101d", "1021")),
            id="pci-ids-normalized",
        ),
        pytest.param(
            {
                "configList": [
                    {"ResourceName": "r", "RDMAHCAMAX": 8, "Selectors": {"deviceIds": ["1021"]}}
                ]
            },
            Selectors(device_ids=("1021",)),
            id="keys-case-insensitive-like-go",
        ),
        pytest.param(
            sel(pciAddresses=["0000:3B:00.0", "10000:01:00.1"]),
            Selectors(pci_addresses=("0000:3b:00.0", "10000:01:00.1")),
            id="pci-addresses-lowercased-vmd-domain",
        ),
        pytest.param(
            sel(linkTypes=["Ether", "infiniband"], linkLayers=["infiniband", "Ethernet"]),
            Selectors(link_types=("ether", "infiniband"), link_layers=("InfiniBand", "Ethernet")),
            id="link-types-and-layers",
        ),
        pytest.param(
            sel(rdmaDevices=["mlx5_0"], numaNodes=[0, 1], drivers=["mlx5_core"]),
            Selectors(rdma_devices=("mlx5_0",), numa_nodes=(0, 1), drivers=("mlx5_core",)),
            id="nicfleet-selectors",
        ),
        pytest.param(
            sel(vendors=["15b3"], deviceIDs=None, ifNames=[]),
            Selectors(vendors=("15b3",)),
            id="null-and-empty-lists",
        ),
    ],
)
def test_selectors_accepted_and_normalized(document: dict[str, Any], expected: Selectors) -> None:
    (resource,) = parse_device_plugin_config(document, source="t").config_list
    assert resource.selectors == expected


@pytest.mark.parametrize(
    ("document", "check"),
    [
        pytest.param(
            one(devices=["ib0"], rdmaHcaMax=0),
            lambda r: r.rdma_hca_max == 0,
            id="explicit-zero-advertises-nothing",
        ),
        pytest.param(
            {"configList": [{"resourceName": "r", "exclusive": True, "devices": ["ib0"]}]},
            lambda r: r.exclusive and r.rdma_hca_max == 0,
            id="exclusive-needs-no-rdmaHcaMax",
        ),
        pytest.param(
            one(devices=["ib0"], resourcePrefix="nvidia.com"),
            lambda r: resource_full_name(r) == "nvidia.com/r",
            id="own-prefix",
        ),
        pytest.param(
            one(devices=["ib0"], resourcePrefix=""),
            lambda r: r.resource_prefix == "rdma",
            id="empty-prefix-is-default-as-upstream",
        ),
        pytest.param(
            one(devices=["ib0"], resourceName="a" * 63),
            lambda r: len(r.resource_name) == 63,
            id="63-character-name",
        ),
        pytest.param(
            one(devices=["ib0"], resourceName="hca-shared.devices_A1"),
            lambda r: r.resource_name == "hca-shared.devices_A1",
            id="qualified-name-characters",
        ),
        pytest.param(
            one(selectors={"vendors": ["15b3"]}, devices=[]),
            lambda r: r.devices == (),
            id="empty-devices-beside-selectors",
        ),
    ],
)
def test_resources_accepted(document: dict[str, Any], check: Any) -> None:
    (resource,) = parse_device_plugin_config(document, source="t").config_list
    assert check(resource)


@pytest.mark.parametrize(
    "document",
    [
        pytest.param({"configList": []}, id="empty-config-list"),
        pytest.param({"periodicUpdateInterval": 0, "configList": []}, id="no-periodic-update"),
        pytest.param(
            {
                "configList": [
                    {"resourceName": "r", "rdmaHcaMax": 1, "devices": ["ib0"]},
                    {
                        "resourceName": "r",
                        "rdmaHcaMax": 1,
                        "devices": ["ib1"],
                        "resourcePrefix": "example.com",
                    },
                ]
            },
            id="same-name-other-prefix",
        ),
    ],
)
def test_documents_accepted(document: dict[str, Any]) -> None:
    parse_device_plugin_config(document, source="t")


# --- what is rejected, and where -------------------------------------------------------------


def entry(index: int = 0, **fields: Any) -> dict[str, Any]:
    return {"resourceName": f"r{index}", "rdmaHcaMax": 8, "devices": ["ib0"], **fields}


def doc(*entries: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"configList": list(entries), **top}


def selectors(**values: Any) -> dict[str, Any]:
    without_devices = entry()
    del without_devices["devices"]
    return doc(dict(without_devices, selectors=values))


INVALID = [
    # document shape and keys
    pytest.param(
        doc(entry(), configLists=[]), "configLists", "did you mean 'configList'", id="typo-top"
    ),
    pytest.param({}, "configList", "required", id="no-config-list"),
    pytest.param(
        {"configList": {"resourceName": "a"}}, "configList", "must be a list", id="list-not-mapping"
    ),
    pytest.param(doc("hca_a"), "configList[0]", "must be a mapping", id="entry-not-mapping"),  # type: ignore[arg-type]
    pytest.param(
        doc(entry(rdmaHcaMx=1)),
        "configList[0].rdmaHcaMx",
        "did you mean 'rdmaHcaMax'",
        id="typo-entry",
    ),
    pytest.param(
        selectors(vendors=["15b3"], isRdma=True),
        "configList[0].selectors.isRdma",
        "unknown key",
        id="sriov-selector",
    ),
    pytest.param(
        {"image": "k8s-rdma-shared-dev-plugin", "config": "{}"},
        "image",
        "NicClusterPolicy",
        id="nicclusterpolicy-block",
    ),
    pytest.param(
        selectors(deviceIDs=["1021"], deviceIds=["1017"]),
        "configList[0].selectors.deviceIds",
        "given twice",
        id="same-key-twice",
    ),
    pytest.param(
        doc(entry(exclusive="yes")), "configList[0].exclusive", "true or false", id="exclusive-type"
    ),
    pytest.param(
        doc(entry(), kubeletRootDir=5),
        "kubeletRootDir",
        "must be a string",
        id="kubelet-root-dir-type",
    ),
    pytest.param(
        doc(entry(), periodicUpdateInterval=-1),
        "periodicUpdateInterval",
        ">= 0",
        id="negative-interval",
    ),
    pytest.param(
        doc(entry(), periodicUpdateInterval="60s"),
        "periodicUpdateInterval",
        "integer",
        id="interval-type",
    ),
    # names
    pytest.param(
        doc({"rdmaHcaMax": 1, "devices": ["ib0"]}),
        "configList[0].resourceName",
        "required",
        id="no-name",
    ),
    pytest.param(
        doc(entry(resourceName="")), "configList[0].resourceName", "empty", id="empty-name"
    ),
    pytest.param(
        doc(entry(resourceName="hca shared")),
        "configList[0].resourceName",
        "not a Kubernetes",
        id="space-in-name",
    ),
    pytest.param(
        doc(entry(resourceName="_hca")),
        "configList[0].resourceName",
        "not a Kubernetes",
        id="leading-underscore",
    ),
    pytest.param(
        doc(entry(resourceName="a" * 64)), "configList[0].resourceName", "63", id="64-characters"
    ),
    pytest.param(
        doc(entry(resourceName="rdma/a")),
        "configList[0].resourceName",
        "not a Kubernetes",
        id="slash-in-name",
    ),
    pytest.param(
        doc(entry(resourcePrefix="Nvidia.com")),
        "configList[0].resourcePrefix",
        "DNS subdomain",
        id="prefix-case",
    ),
    pytest.param(
        doc(entry(resourcePrefix="kubernetes.io")),
        "configList[0].resourcePrefix",
        "reserved",
        id="kubernetes-io",
    ),
    pytest.param(
        doc(entry(resourcePrefix="rdma.kubernetes.io")),
        "configList[0].resourcePrefix",
        "reserved",
        id="sub-kubernetes-io",
    ),
    pytest.param(
        doc(entry(resourcePrefix="requests.example.com")),
        "configList[0].resourcePrefix",
        "quota",
        id="requests-prefix",
    ),
    pytest.param(
        doc(entry(resourcePrefix="a." * 122 + "b")),
        "configList[0].resourcePrefix",
        "244",
        id="prefix-too-long",
    ),
    pytest.param(
        doc(entry(1), entry(2), entry(1)),
        "configList[2].resourceName",
        "configList[0]",
        id="duplicate",
    ),
    pytest.param(
        doc(entry(1), entry(1, resourcePrefix="rdma")),
        "configList[1].resourceName",
        "rdma/r1",
        id="duplicate-default-prefix",
    ),
    pytest.param(
        doc({"resourceName": "a"}, {"resourceName": "a"}),
        "configList[1].resourceName",
        "duplicate",
        id="duplicate-before-contents",
    ),
    # rdmaHcaMax
    pytest.param(
        doc({"resourceName": "a", "devices": ["ib0"]}),
        "configList[0].rdmaHcaMax",
        "required",
        id="hca-max-missing",
    ),
    pytest.param(
        doc(entry(rdmaHcaMax=None)), "configList[0].rdmaHcaMax", "required", id="hca-max-null"
    ),
    pytest.param(
        doc(entry(rdmaHcaMax=-1)), "configList[0].rdmaHcaMax", "between 0", id="hca-max-negative"
    ),
    pytest.param(
        doc(entry(rdmaHcaMax=10**6)), "configList[0].rdmaHcaMax", "100000", id="hca-max-absurd"
    ),
    pytest.param(
        doc(entry(rdmaHcaMax=10**30)), "configList[0].rdmaHcaMax", "out of range", id="hca-max-huge"
    ),
    pytest.param(
        doc(entry(rdmaHcaMax="63")),
        "configList[0].rdmaHcaMax",
        "integer, got the string",
        id="hca-max-string",
    ),
    pytest.param(
        doc(entry(rdmaHcaMax=1.5)), "configList[0].rdmaHcaMax", "integer", id="hca-max-float"
    ),
    pytest.param(
        doc(entry(rdmaHcaMax=True)), "configList[0].rdmaHcaMax", "integer", id="hca-max-bool"
    ),
    # selectors xor devices
    pytest.param(
        doc(entry(selectors={"vendors": ["15b3"]})),
        "configList[0].devices",
        "cannot be combined",
        id="both",
    ),
    pytest.param(selectors(), "configList[0].selectors", "select nothing", id="empty-selectors"),
    pytest.param(
        selectors(vendors=[], ifNames=[]),
        "configList[0].selectors",
        "select nothing",
        id="all-lists-empty",
    ),
    pytest.param(
        doc(entry(devices=[])), "configList[0].selectors", "select nothing", id="empty-devices"
    ),
    # selector values
    pytest.param(
        selectors(vendors="15b3"),
        "configList[0].selectors.vendors",
        "must be a list",
        id="vendors-not-list",
    ),
    pytest.param(
        selectors(vendors=["15b"]),
        "configList[0].selectors.vendors[0]",
        "4 hex digits",
        id="short-vendor",
    ),
    pytest.param(
        selectors(vendors=["mellanox"]),
        "configList[0].selectors.vendors[0]",
        "PCI ID",
        id="vendor-name",
    ),
    pytest.param(
        selectors(deviceIDs=[1017]),
        "configList[0].selectors.deviceIDs[0]",
        "quote it",
        id="yaml-number-id",
    ),
    pytest.param(
        selectors(deviceIDs=["101b", "0x10zz"]),
        "configList[0].selectors.deviceIDs[1]",
        "PCI ID",
        id="bad-device-id",
    ),
    pytest.param(
        selectors(linkTypes=["Ethernet"]),
        "configList[0].selectors.linkTypes[0]",
        "linkLayers",
        id="link-type-ethernet",
    ),
    pytest.param(
        selectors(linkTypes=["IB"]),
        "configList[0].selectors.linkTypes[0]",
        "ether, infiniband",
        id="link-type-ib",
    ),
    pytest.param(
        selectors(linkLayers=["RoCE"]),
        "configList[0].selectors.linkLayers[0]",
        "InfiniBand, Ethernet",
        id="link-layer",
    ),
    pytest.param(
        selectors(numaNodes=[0, -1]),
        "configList[0].selectors.numaNodes[1]",
        ">= 0",
        id="negative-numa",
    ),
    pytest.param(
        selectors(numaNodes=["0"]),
        "configList[0].selectors.numaNodes[0]",
        "integer",
        id="numa-string",
    ),
    pytest.param(
        selectors(pciAddresses=["3b:00.0"]),
        "configList[0].selectors.pciAddresses[0]",
        "full PCI",
        id="short-pci",
    ),
    pytest.param(
        selectors(pciAddresses=["0000:3b:00.8"]),
        "configList[0].selectors.pciAddresses[0]",
        "full PCI",
        id="bad-function",
    ),
    pytest.param(
        selectors(ifNames=["ib 0"]),
        "configList[0].selectors.ifNames[0]",
        "interface name",
        id="space-ifname",
    ),
    pytest.param(
        selectors(ifNames=["a" * 16]),
        "configList[0].selectors.ifNames[0]",
        "1-15",
        id="long-ifname",
    ),
    pytest.param(
        selectors(ifNames=[True]),
        "configList[0].selectors.ifNames[0]",
        "quote it",
        id="yaml-on-ifname",
    ),
    pytest.param(
        doc(entry(devices=["ib0", "ib/1"])),
        "configList[0].devices[1]",
        "interface name",
        id="bad-device",
    ),
    pytest.param(
        selectors(rdmaDevices=["mlx5/0"]),
        "configList[0].selectors.rdmaDevices[0]",
        "rdmaDevice name",
        id="bad-rdma-dev",
    ),
    pytest.param(
        selectors(drivers=[""]),
        "configList[0].selectors.drivers[0]",
        "driver name",
        id="empty-driver",
    ),
]


@pytest.mark.parametrize(("document", "path", "reason"), INVALID)
def test_invalid_documents_name_the_field(document: Any, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_device_plugin_config(document, source="config.json")
    assert info.value.path == path
    assert reason in info.value.reason
    assert str(info.value).startswith(f"config.json: {path}")


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        pytest.param("", "$", "empty document", id="empty"),
        pytest.param("  \n# only a comment\n", "$", "empty document", id="comment-only"),
        pytest.param("- a\n- b\n", "$", "must be a mapping", id="list"),
        pytest.param('"{\\"configList\\": []}"', "$", "not a JSON string", id="json-in-a-string"),
        pytest.param('{"configList": [}', "line 1, column 17", "not valid JSON", id="bad-json"),
        pytest.param("configList: [a\n", "line 2, column 1", "not valid YAML", id="bad-yaml"),
        pytest.param("a: 1\n---\nb: 2\n", "line 2, column 1", "not valid YAML", id="two-documents"),
        pytest.param(b"\xff\xfe", "$", "not UTF-8", id="not-utf8"),
    ],
)
def test_unreadable_text(text: str | bytes, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_device_plugin_config(text, source="config.json")
    assert (info.value.path, info.value.resource_name) == (path, None)
    assert reason in info.value.reason


def test_message_names_entry_index_and_resource_name() -> None:
    with pytest.raises(ConfigError) as info:
        parse_device_plugin_config(
            doc(entry(1), entry(2, selectors={"deviceIDs": ["xyz"]}, devices=[])),
            source="/k8s-rdma-shared-dev-plugin/config.json",
        )
    assert info.value.resource_name == "r2"
    assert str(info.value) == (
        "/k8s-rdma-shared-dev-plugin/config.json: configList[1].selectors.deviceIDs[0]"
        " (resourceName 'r2'): 'xyz' is not a PCI ID (4 hex digits: '15b3')"
    )


# --- the same validator on Structs (wire, code) -------------------------------------------


def test_wire_round_trip_keeps_a_valid_config_valid() -> None:
    config = parse_device_plugin_config(UPSTREAM_README, source="file")
    desired = DesiredConfig(node="gpu-001", generation=3, device_plugin=config)
    received = decode(encode(desired), DesiredConfig)
    assert received.device_plugin == config
    validate_device_plugin_config(received.device_plugin, source="kv nicfleet-config/gpu-001")


@pytest.mark.parametrize(
    ("config", "path"),
    [
        pytest.param(
            DevicePluginConfig(
                config_list=(ResourceConfig(resource_name="a b", devices=("ib0",)),)
            ),
            "configList[0].resourceName",
            id="name",
        ),
        pytest.param(
            DevicePluginConfig(config_list=(ResourceConfig(resource_name="a"),)),
            "configList[0].selectors",
            id="nothing-selected",
        ),
        pytest.param(
            DevicePluginConfig(
                config_list=(
                    ResourceConfig(resource_name="a", selectors=Selectors(link_layers=("RoCE",))),
                )
            ),
            "configList[0].selectors.linkLayers[0]",
            id="value",
        ),
        pytest.param(
            DevicePluginConfig(periodic_update_interval=-5), "periodicUpdateInterval", id="interval"
        ),
    ],
)
def test_validate_structs(config: DevicePluginConfig, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_device_plugin_config(config, source="code")
    assert info.value.path == path


def test_validate_accepts_unnormalized_values() -> None:
    selectors = Selectors(vendors=("0x15B3",), link_types=("Ether",), link_layers=("ethernet",))
    config = DevicePluginConfig(
        config_list=(ResourceConfig(resource_name="a", rdma_hca_max=1, selectors=selectors),)
    )
    validate_device_plugin_config(config, source="code")


# --- inside a NicFleetPolicy ------------------------------------------------------------------

POLICY = "apiVersion: nicfleet.io/v1alpha1\nkind: NicFleetPolicy\nmetadata: {name: p}\nspec:\n"


@pytest.mark.parametrize(
    ("spec", "path", "reason"),
    [
        pytest.param(
            "  rdmaSharedDevicePlugin:\n    configList:\n      - {resourceName: a, rdmaHcaMax: 1,"
            " selectors: {vendor: ['15b3']}}\n",
            "document 0: $.spec.rdmaSharedDevicePlugin.configList[0].selectors.vendor",
            "did you mean 'vendors'? (resourceName 'a')",
            id="typo",
        ),
        pytest.param(
            "  rdmaSharedDevicePlugin:\n    configList:\n      - {resourceName: a, rdmaHcaMax: 1,"
            " selectors: {deviceIDs: [1017]}}\n",
            "document 0: $.spec.rdmaSharedDevicePlugin.configList[0].selectors.deviceIDs[0]",
            "quote it",
            id="unquoted-id",
        ),
        pytest.param(
            "  rdmaSharedDevicePlugin: {configList: []}\n  expect: {mtu: 0}\n",
            "document 0: $.spec.expect.mtu",
            "must be > 0",
            id="policy-errors-first",
        ),
        pytest.param(
            "  rdmaSharedDevicePlugin: '{\"configList\": []}'\n",
            "document 0: $.spec.rdmaSharedDevicePlugin",
            "must be a mapping",
            id="json-string",
        ),
        pytest.param(
            "  rdmaSharedDevicePlugin: {configLst: []}\n",
            "document 0: $.spec.rdmaSharedDevicePlugin.configLst",
            "unknown key",
            id="top-level-typo",
        ),
    ],
)
def test_policy_uses_the_same_validator(spec: str, path: str, reason: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_policies(POLICY + spec, source="policy.yaml")
    assert info.value.path == path
    assert reason in info.value.reason


def test_policy_holds_the_normalized_config() -> None:
    spec = (
        "  rdmaSharedDevicePlugin:\n    configList:\n      - resourceName: ib\n"
        "        rdmaHcaMax: 16\n"
        "        selectors: {vendors: ['0x15B3'], linkLayers: [infiniband]}\n"
    )
    (policy,) = load_policies(POLICY + spec, source="policy.yaml")
    config = policy.spec.rdma_shared_device_plugin
    assert config is not None
    assert config.config_list[0].selectors == Selectors(
        vendors=("15b3",), link_layers=("InfiniBand",)
    )


def test_policy_takes_the_nicclusterpolicy_json_pasted_as_is() -> None:
    pasted = "\n".join(
        "    " + line for line in config_of_nicclusterpolicy(NICCLUSTERPOLICY).splitlines()
    )
    (policy,) = load_policies(POLICY + "  rdmaSharedDevicePlugin:\n" + pasted, source="p")
    config = policy.spec.rdma_shared_device_plugin
    assert config == parse_device_plugin_config(
        config_of_nicclusterpolicy(NICCLUSTERPOLICY), source="nic-cluster-policy"
    )
