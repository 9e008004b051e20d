"""Policy documents: the shipped example loads; every kind of mistake names its field."""

from __future__ import annotations

import pytest

from proto.policy import PolicyError, load_policies
from tests.support.paths import REPO

HEAD = "apiVersion: nicfleet.io/v1alpha1\nkind: NicFleetPolicy\nmetadata: {name: p}\n"


def test_shipped_example_loads() -> None:
    text = (REPO / "deploy" / "examples" / "policy.yaml").read_text()
    (policy,) = load_policies(text, source="policy.yaml")
    assert policy.metadata.name == "h100-compute"
    assert policy.spec.expect.max_gpu_nic_relation == "PXB"
    config = policy.spec.rdma_shared_device_plugin
    assert config is not None
    assert config.config_list[0].selectors is not None
    assert config.config_list[0].selectors.device_ids == ("1021",)


def test_several_documents_and_empty_ones() -> None:
    text = HEAD + "---\n---\n" + HEAD.replace("name: p", "name: q")
    assert [p.metadata.name for p in load_policies(text, source="f")] == ["p", "q"]


@pytest.mark.parametrize(
    ("text", "path"),
    [
        pytest.param("a: [b", "line", id="bad-yaml"),
        pytest.param(HEAD.replace("v1alpha1", "v9"), "document 0: $.apiVersion", id="version"),
        pytest.param(HEAD.replace("NicFleetPolicy", "Pod"), "document 0: $.kind", id="kind"),
        pytest.param(
            HEAD + "spec: {expect: {minRateGbps: fast}}",
            "$.spec.expect.minRateGbps",
            id="wrong-type",
        ),
        pytest.param(HEAD + "spec: {expect: {minRateGbs: 1}}", "$.spec.expect", id="typo"),
        pytest.param(HEAD + "spec: {expect: {mtu: 0}}", "$.spec.expect.mtu", id="zero-mtu"),
        pytest.param(
            HEAD + "spec: {expect: {maxGpuNicRelation: NV18}}",
            "$.spec.expect.maxGpuNicRelation",
            id="bad-relation",
        ),
        pytest.param(
            HEAD + "spec: {rdmaSharedDevicePlugin: {configList: [{resourceName: a},"
            " {resourceName: a}]}}",
            "$.spec.rdmaSharedDevicePlugin.configList[1].resourceName",
            id="duplicate-resource",
        ),
        pytest.param(
            HEAD + "spec: {nodeSelector: {matchExpressions: [{key: k, operator: In}]}}",
            "$.spec.nodeSelector.matchExpressions[0].values",
            id="in-without-values",
        ),
        pytest.param(HEAD + "---\n" + HEAD, "document 1: $.metadata.name", id="duplicate-name"),
        pytest.param(
            "apiVersion: nicfleet.io/v1alpha1\nkind: NicFleetPolicy\n",
            "document 0: $",
            id="missing-metadata",
        ),
        pytest.param("- 1\n- 2\n", "document 0: $", id="not-a-mapping"),
    ],
)
def test_bad_policies_name_the_field(text: str, path: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_policies(text, source="bad.yaml")
    assert path in str(info.value)
    assert str(info.value).startswith("bad.yaml: ")
