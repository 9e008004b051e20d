"""Parsing claims, classes and slices: the shapes accepted, and every refusal names the
field (with the API's size limits, so hostile documents stay small)."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.dra.objects import (
    InvalidObject,
    parse_claim,
    parse_class,
    parse_slice,
    slice_documents,
)
from tests.unit.aggregator.dra.builders import NIC, nic, slice_doc


def claim_doc(devices: Any, kind: str = "ResourceClaim") -> dict[str, Any]:
    return {"kind": kind, "spec": {"devices": devices}}


def test_template_spec_is_the_claim() -> None:
    doc = {
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "a", "exactly": {"deviceClassName": "c", "count": 2}}]
                }
            }
        },
    }
    got = parse_claim(doc)
    assert got.name == "t"
    assert got.requests[0].choices[0].count == 2


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        pytest.param([], "claim: expected a mapping", id="not-a-mapping"),
        pytest.param({"kind": "Pod", "spec": {}}, "claim.kind", id="pod"),
        pytest.param(
            claim_doc({"requests": []}), "claim.spec.devices.requests: no device", id="empty"
        ),
        pytest.param(
            claim_doc({"requests": [{"name": "a"}]}),
            "claim.spec.devices.requests[0]: needs exactly one",
            id="no-exactly",
        ),
        pytest.param(
            claim_doc(
                {"requests": [{"name": "a", "exactly": {"deviceClassName": "c", "count": 0}}]}
            ),
            "claim.spec.devices.requests[0].exactly.count",
            id="count-zero",
        ),
        pytest.param(
            claim_doc(
                {"requests": [{"name": "a", "exactly": {"deviceClassName": "c", "count": 10**9}}]}
            ),
            "claim.spec.devices.requests[0].exactly.count",
            id="count-huge",
        ),
        pytest.param(
            claim_doc(
                {
                    "requests": [
                        {
                            "name": "a",
                            "exactly": {
                                "deviceClassName": "c",
                                "selectors": [{"cel": {"expression": "x" * 20000}}],
                            },
                        }
                    ]
                }
            ),
            "selectors[0].cel.expression: 20000 characters",
            id="long-cel",
        ),
        pytest.param(
            claim_doc(
                {
                    "requests": [
                        {"name": f"r{i}", "exactly": {"deviceClassName": "c"}} for i in range(33)
                    ]
                }
            ),
            "at most 32",
            id="many-requests",
        ),
        pytest.param(
            claim_doc(
                {
                    "requests": [{"name": "a", "exactly": {"deviceClassName": "c"}}],
                    "constraints": [{"requests": ["b"], "matchAttribute": "x.io/y"}],
                }
            ),
            "'b' is not a request",
            id="constraint-unknown-request",
        ),
    ],
)
def test_bad_claims_name_the_field(doc: Any, where: str) -> None:
    with pytest.raises(InvalidObject, match=None) as info:
        parse_claim(doc)
    assert where in str(info.value)


def test_class_needs_kind_and_name() -> None:
    with pytest.raises(InvalidObject, match=r"class\.kind"):
        parse_class({"kind": "ResourceSlice"})
    with pytest.raises(InvalidObject, match=r"class\.metadata\.name"):
        parse_class({"kind": "DeviceClass", "spec": {}})


def test_slice_attributes_are_qualified_with_the_driver() -> None:
    (device,) = parse_slice(slice_doc("n1", NIC, nic("mlx5-0", "pci0000:3a")))
    assert device.attributes[f"{NIC}/linkLayer"] == "InfiniBand"
    assert device.attributes["resource.kubernetes.io/pcieRoot"] == "pci0000:3a"


def test_slices_without_a_node_have_no_devices_here() -> None:
    doc = slice_doc("n1", NIC, nic("mlx5-0", "r"))
    del doc["spec"]["nodeName"]
    doc["spec"]["allNodes"] = True
    assert parse_slice(doc) == []


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        pytest.param(
            lambda d: d["spec"].update(devices=[nic(f"d{i}", "r") for i in range(129)]),
            "at most 128",
            id="too-many-devices",
        ),
        pytest.param(
            lambda d: d["spec"]["devices"][0]["attributes"].update(
                {f"a{i}": {"int": i} for i in range(40)}
            ),
            "limit 32",
            id="too-many-attributes",
        ),
        pytest.param(
            lambda d: d["spec"]["devices"][0]["attributes"].update(x={"int": "1"}),
            "attributes.x.int",
            id="int-not-int",
        ),
        pytest.param(
            lambda d: d["spec"]["devices"][0]["attributes"].update(x={}),
            "needs one of bool",
            id="empty-attribute",
        ),
        pytest.param(
            lambda d: d["spec"].update(devices=["mlx5_0"]),
            "devices[0]: expected a mapping",
            id="device-not-a-mapping",
        ),
    ],
)
def test_bad_slices_name_the_field(mutate: Any, where: str) -> None:
    doc = slice_doc("n1", NIC, nic("mlx5-0", "r"))
    mutate(doc)
    with pytest.raises(InvalidObject) as info:
        parse_slice(doc)
    assert where in str(info.value)


def test_a_list_is_its_items() -> None:
    docs = slice_documents({"kind": "List", "items": [1, 2]}, "f")
    assert [w for _, w in docs] == ["f.items[0]", "f.items[1]"]
