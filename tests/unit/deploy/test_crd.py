"""The NicFleetPolicy CRD: a valid, structural CustomResourceDefinition that says exactly
what proto.policy says (one source of truth, checked both ways), and the shipped example
passes both the CRD schema and the policy loader."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any

import jsonschema
import kubernetes_validate
import msgspec
import pytest
import yaml

from proto.policy import Expect, PolicySpec, load_policies
from tests.support.paths import REPO

CRD_PATH = REPO / "deploy" / "crds" / "nicfleetpolicy.yaml"
EXAMPLE = REPO / "deploy" / "examples" / "policy.yaml"
KUBERNETES_VERSION = "1.37"  # the schemas kubernetes-validate 1.37.0 ships


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return document


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    result: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return result


def test_is_a_valid_custom_resource_definition(crd: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(crd, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION


def test_names_group_version_scope(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}"
    assert (spec["group"], spec["scope"], spec["names"]["kind"]) == (
        "nicfleet.io",
        "Cluster",
        "NicFleetPolicy",
    )
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Ready", "Selected", "Advertising", "Age"]


def _walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    for path, node in _walk(schema, "$"):
        assert "type" in node, f"{path}: every node needs a type"
        if node["type"] == "object" and path != "$.metadata":
            assert (
                "properties" in node
                or "additionalProperties" in node
                or node.get("x-kubernetes-preserve-unknown-fields") is True
            ), f"{path}: an object needs properties, additionalProperties or preserve-unknown"
        if node["type"] == "array":
            assert "items" in node, f"{path}: an array needs items"
            assert "maxItems" in node, f"{path}: CEL cost estimation needs maxItems"


def _struct_of(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct inside `X`, `X | None` or `tuple[X, ...]`, if any."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType, tuple):
        for arg in typing.get_args(tp):
            found = _struct_of(arg)
            if found is not None:
                return found
    return None


def _model_paths(cls: type[msgspec.Struct], path: str) -> Iterator[str]:
    for field in msgspec.structs.fields(cls):
        here = f"{path}.{field.encode_name}"
        yield here
        inner = _struct_of(field.type)
        if inner is not None:
            list_like = typing.get_origin(field.type) is tuple
            yield from _model_paths(inner, f"{here}[]" if list_like else here)


def _schema_paths(node: dict[str, Any], path: str) -> Iterator[str]:
    for name, child in node.get("properties", {}).items():
        here = f"{path}.{name}"
        yield here
        if child.get("type") == "array":
            yield from _schema_paths(child["items"], f"{here}[]")
        else:
            yield from _schema_paths(child, here)


def test_spec_schema_and_policy_model_have_the_same_fields(schema: dict[str, Any]) -> None:
    model = set(_model_paths(PolicySpec, "spec"))
    crd = set(_schema_paths(schema["properties"]["spec"], "spec"))
    assert sorted(model - crd) == [], "in proto/policy.py but missing from the CRD"
    assert sorted(crd - model) == [], "in the CRD but unknown to proto/policy.py"


def test_expect_enums_match_the_model(schema: dict[str, Any]) -> None:
    expect = schema["properties"]["spec"]["properties"]["expect"]["properties"]
    hints = typing.get_type_hints(Expect)
    for name, attr in (("linkLayer", "link_layer"), ("maxGpuNicRelation", "max_gpu_nic_relation")):
        literal = next(a for a in typing.get_args(hints[attr]) if a is not type(None))
        assert expect[name]["enum"] == list(typing.get_args(literal))


def test_example_validates_against_the_crd_schema(schema: dict[str, Any]) -> None:
    for document in yaml.safe_load_all(EXAMPLE.read_text()):
        # The API server's schema dialect is OpenAPI v3.0: draft-4 semantics (boolean
        # exclusiveMinimum); the x-kubernetes-* extensions are ignored here.
        jsonschema.Draft4Validator(schema).validate(document)


def test_example_loads_as_a_policy() -> None:
    (policy,) = load_policies(EXAMPLE.read_text(), source=str(EXAMPLE))
    assert policy.spec.rdma_shared_device_plugin is not None


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        pytest.param({"expect": {"maxGpuNicRelation": "X"}}, "maxGpuNicRelation", id="relation"),
        pytest.param({"expect": {"mtu": 0}}, "mtu", id="mtu-zero"),
        pytest.param({"expect": {"minRateGbps": 0}}, "minRateGbps", id="rate-zero"),
        pytest.param({"expect": {"linkLayer": "RoCE"}}, "linkLayer", id="link-layer"),
        pytest.param(
            {"rdmaSharedDevicePlugin": {"configList": [{"resourceName": "a b", "rdmaHcaMax": 1}]}},
            "resourceName",
            id="resource-name",
        ),
        pytest.param(
            {"rdmaSharedDevicePlugin": {"configList": [{"resourceName": "a", "rdmaHcaMax": -1}]}},
            "rdmaHcaMax",
            id="hca-max-negative",
        ),
    ],
)
def test_schema_rejects_bad_fields(
    schema: dict[str, Any], patch: dict[str, Any], where: str
) -> None:
    document = {
        "apiVersion": "nicfleet.io/v1alpha1",
        "kind": "NicFleetPolicy",
        "metadata": {"name": "bad"},
        "spec": patch,
    }
    with pytest.raises(jsonschema.ValidationError) as caught:
        jsonschema.Draft4Validator(schema).validate(document)
    assert where in "/".join(map(str, caught.value.absolute_path))
