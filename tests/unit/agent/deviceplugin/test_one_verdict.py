"""One definition of "which resources are valid": for the same document, the agent's own
check (proto.dpconfig.parse_device_plugin_resources, what it serves), `device-plugin
check-config` and the NicClusterPolicy audit give the same served / left-out split, and
refuse the same documents whole."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.deviceplugin.checkconfig import check
from proto.dpconfig import ConfigError, parse_device_plugin_resources
from proto.nicclusterpolicy import audit_policy
from tests.support.builders import nic, snapshot

SNAP = snapshot("n1", devices=(nic("mlx5_0", netdevs=("ib0",)), nic("mlx5_1", index=1)))
GOOD_A = {"resourceName": "ib_a", "rdmaHcaMax": 8, "selectors": {"vendors": ["15b3"]}}
GOOD_B = {"resourceName": "ib_b", "rdmaHcaMax": 4, "selectors": {"ifNames": ["ib0"]}}
RESERVED = {**GOOD_A, "resourceName": "ib_c", "resourcePrefix": "kubernetes.io"}
NO_MAX = {"resourceName": "ib_d", "selectors": {"vendors": ["15b3"]}}
BAD_ID = {**GOOD_A, "resourceName": "ib_e", "selectors": {"deviceIDs": ["10x1"]}}
# Alone, each of these entries is valid; together the agent refuses the document.
DUPLICATE = {**GOOD_B, "resourceName": "ib_a"}
BOTH = {**GOOD_B, "resourceName": "ib_f", "devices": ["ib0"]}


def agents_split(text: str) -> tuple[list[str], dict[int, str]] | str:
    """What the agent serves (names) and leaves out (index -> path), or why it refuses all."""
    try:
        checked = parse_device_plugin_resources(text, source="spec.rdmaSharedDevicePlugin.config")
    except ConfigError as exc:
        return exc.path
    served = [f"{r.resource_prefix}/{r.resource_name}" for r in checked.config.config_list]
    return served, {bad.index: bad.path for bad in checked.invalid}


def check_configs_split(text: str) -> tuple[list[str], dict[int, str]] | str:
    report = check(text.encode(), SNAP, source="config.json")
    if report.errors:
        (error,) = report.errors
        assert not any(r.served for r in report.resources)
        return error.split(" ", 1)[0].removesuffix(":")
    served = [r.resource for r in report.resources if r.served]
    left_out = {r.index: r.errors[0].split(" ", 1)[0] for r in report.resources if r.errors}
    assert all(bool(r.errors) != r.served for r in report.resources)
    return served, left_out


def audits_split(text: str) -> tuple[list[str], dict[int, str]] | str:
    obj = {"kind": "NicClusterPolicy", "spec": {"rdmaSharedDevicePlugin": {"config": text}}}
    report = audit_policy(obj, {"n1": SNAP})
    if report.nicfleet_refuses is not None:
        assert report.nicfleet_invalid == ()
        return report.nicfleet_refuses.split(" ", 1)[0].removesuffix(":")
    left_out = {int(m.split("]", 1)[0].split("[", 1)[1]): m.split(" ", 1)[0]
                for m in report.nicfleet_invalid}  # fmt: skip
    (node,) = report.nodes
    # Where nicfleet's count differs from upstream's, a left-out entry says so.
    for r in node.resources:
        if (
            r.nicfleet is not None
            and r.nicfleet_why
            and "leaves this resource out" in r.nicfleet_why
        ):
            assert r.nicfleet == 0
    document = json.loads(text)["configList"]
    served = [
        f"{e.get('resourcePrefix') or 'rdma'}/{e['resourceName']}"
        for i, e in enumerate(document)
        if i not in left_out
    ]
    return served, left_out


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        pytest.param([GOOD_A, RESERVED, GOOD_B],
                     (["rdma/ib_a", "rdma/ib_b"], {1: "configList[1].resourcePrefix"}),
                     id="reserved-prefix-among-good"),
        pytest.param([NO_MAX, GOOD_A, BAD_ID],
                     (["rdma/ib_a"], {0: "configList[0].rdmaHcaMax",
                                      2: "configList[2].selectors.deviceIDs[0]"}),
                     id="two-bad-one-good"),
        pytest.param([GOOD_A, GOOD_B], (["rdma/ib_a", "rdma/ib_b"], {}), id="all-good"),
        pytest.param([GOOD_A, DUPLICATE], "configList[1].resourceName", id="duplicate-whole"),
        pytest.param([GOOD_A, BOTH], "configList[1].devices", id="devices-and-selectors-whole"),
    ],
)  # fmt: skip
def test_the_agent_check_config_and_the_audit_agree(entries: list[Any], expected: object) -> None:
    text = json.dumps({"configList": entries})
    assert agents_split(text) == expected
    assert check_configs_split(text) == expected
    assert audits_split(text) == expected


def test_audit_counts_the_served_entries_and_zero_for_the_left_out() -> None:
    text = json.dumps({"configList": [GOOD_A, RESERVED]})
    obj = {"kind": "NicClusterPolicy", "spec": {"rdmaSharedDevicePlugin": {"config": text}}}
    (node,) = audit_policy(obj, {"n1": SNAP}).nodes
    by_name = {r.resource: r for r in node.resources}
    # Upstream registers kubernetes.io/ib_c and the kubelet refuses it; nicfleet never serves it.
    reserved = by_name["kubernetes.io/ib_c"]
    assert (reserved.advertised, reserved.nicfleet) == (8, 0)
    assert reserved.nicfleet_why is not None
    assert "leaves this resource out: configList[1].resourcePrefix" in reserved.nicfleet_why
    assert by_name["rdma/ib_a"].nicfleet is None  # both advertise 8


def test_a_document_refused_whole_advertises_nothing_in_the_audit() -> None:
    text = json.dumps({"configList": [GOOD_A, DUPLICATE]})
    obj = {"kind": "NicClusterPolicy", "spec": {"rdmaSharedDevicePlugin": {"config": text}}}
    report = audit_policy(obj, {"n1": SNAP})
    assert report.nicfleet_refuses is not None
    assert report.nicfleet_refuses.startswith("configList[1].resourceName")
    assert report.nicfleet_invalid == ()
    # Whole-document errors are the ones upstream exits on too (proto.dpconfig).
    assert [v.verdict for v in report.nodes] == ["would-not-start"]


def test_a_key_only_nicfleet_refuses_shows_as_a_difference_on_every_resource() -> None:
    # Go's json.Unmarshal drops the unknown key; nicfleet's decoder refuses the document.
    text = json.dumps({"configList": [{**GOOD_A, "rdmaHcaMaxx": 2}]})
    assert agents_split(text) == "configList[0].rdmaHcaMaxx"
    obj = {"kind": "NicClusterPolicy", "spec": {"rdmaSharedDevicePlugin": {"config": text}}}
    report = audit_policy(obj, {"n1": SNAP})
    ((resource,),) = [v.resources for v in report.nodes]
    assert (resource.advertised, resource.nicfleet) == (8, 0)
    assert resource.nicfleet_why is not None
    assert "refuses the whole config: configList[0].rdmaHcaMaxx" in resource.nicfleet_why
