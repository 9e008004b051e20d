"""Kubernetes API objects -> cluster model (pure): tolerant of malformed objects."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aggregator.errors import KubeError, KubeNotFoundError, KubeUnavailableError
from aggregator.kube.objects import (
    attachment_from_object,
    error_from_status,
    node_from_object,
    parse_networks,
    pod_request_from_object,
    policy_from_object,
)


def policy(spec: Any, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nicfleet.io/v1alpha1",
        "kind": "NicFleetPolicy",
        "metadata": {"name": "p", **metadata},
        "spec": spec,
        "status": {"observedGeneration": 1, "anything": ["the server", "keeps"]},
    }


def test_server_metadata_and_status_are_not_the_document() -> None:
    obj = policy(
        {"expect": {"mtu": 4096}},
        generation=4,
        uid="u",
        resourceVersion="9",
        creationTimestamp="2026-11-30T11:00:00Z",
        managedFields=[{"manager": "kubectl"}],
        labels={"team": "ml"},
    )
    parsed = policy_from_object(obj)
    assert parsed.error is None
    assert parsed.policy is not None
    assert (parsed.name, parsed.generation, parsed.uid) == ("p", 4, "u")
    assert parsed.policy.metadata.labels == {"team": "ml"}
    assert parsed.policy.spec.expect.mtu == 4096


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        pytest.param(policy({"expect": {"mtu": "x"}}), "$.spec.expect.mtu", id="type"),
        pytest.param(policy({"expect": {"mtu": -1}}), "$.spec.expect.mtu", id="range"),
        pytest.param(policy("text"), "$.spec", id="spec-not-a-mapping"),
        pytest.param(
            policy({"rdmaSharedDevicePlugin": '{"configList": []}'}),
            "$.spec.rdmaSharedDevicePlugin",
            id="plugin-config-as-string",
        ),
        pytest.param({**policy({}), "kind": "Other"}, "$.kind", id="kind"),
        pytest.param({**policy({}), "metadata": "x"}, "$.metadata", id="metadata"),
    ],
)
def test_invalid_policy_names_the_field(obj: dict[str, Any], path: str) -> None:
    parsed = policy_from_object(obj)
    assert parsed.policy is None
    assert parsed.error is not None
    assert parsed.error.path == path, parsed.error


def test_node() -> None:
    node = node_from_object(
        {
            "metadata": {"name": "gpu-1", "labels": {"a": "b"}},
            "status": {"allocatable": {"rdma/ib": "8"}, "capacity": {"rdma/ib": "8"}},
        }
    )
    assert node is not None
    assert (node.labels, node.allocatable) == ({"a": "b"}, {"rdma/ib": "8"})
    assert node_from_object({"metadata": {}}) is None
    assert node_from_object({"metadata": {"name": "n"}, "status": "junk"}) is not None


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        pytest.param({"rdma/a": "2"}, {"rdma/a": 2}, id="string"),
        pytest.param({"rdma/a": 2}, {"rdma/a": 2}, id="int"),
        pytest.param({"rdma/a": "1k"}, None, id="not-a-count"),
        pytest.param({"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": 8}, id="other-device-plugin"),
        pytest.param({"cpu": "8", "example.kubernetes.io/x": "1"}, None, id="native-only"),
    ],
)
def test_pod_requests(limits: dict[str, Any], expected: dict[str, int] | None) -> None:
    pod = pod_request_from_object(
        {
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"resources": {"limits": limits}}, "junk"]},
        },
        ("rdma/",),
    )
    assert (pod.requests if pod else None) == expected


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        pytest.param("", (), id="empty"),
        pytest.param("a, other/b@net1", ("ml/a", "other/b"), id="short-form"),
        pytest.param(
            json.dumps([{"name": "a"}, {"name": "b", "namespace": "x"}, {"no": "name"}]),
            ("ml/a", "x/b"),
            id="json",
        ),
        pytest.param("[not json", (), id="bad-json"),
    ],
)
def test_parse_networks(annotation: str, expected: tuple[str, ...]) -> None:
    assert parse_networks(annotation, "ml") == expected


@pytest.mark.parametrize(
    ("config", "master"),
    [
        pytest.param({"type": "macvlan", "master": "eth2"}, "eth2", id="plain"),
        pytest.param({"plugins": [{"type": "x"}, {"master": "ib0"}]}, "ib0", id="conflist"),
        pytest.param({"type": "ipoib"}, None, id="none"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_attachment_master(config: dict[str, Any] | None, master: str | None) -> None:
    spec = {"config": json.dumps(config)} if config is not None else {}
    nad = attachment_from_object({"metadata": {"name": "n", "namespace": "ml"}, "spec": spec})
    assert nad is not None
    assert nad.master == master


@pytest.mark.parametrize(
    ("status", "body", "kind", "text"),
    [
        pytest.param(404, b'{"message": "nope"}', KubeNotFoundError, "nope", id="not-found"),
        pytest.param(409, b"{}", KubeError, "409", id="conflict"),
        pytest.param(503, b"<html>", KubeUnavailableError, "Service Unavailable", id="5xx"),
        pytest.param(429, None, KubeUnavailableError, "429", id="throttled"),
        pytest.param(None, None, KubeUnavailableError, "x", id="no-response"),
    ],
)
def test_error_from_status(
    status: int | None, body: bytes | None, kind: type[KubeError], text: str
) -> None:
    error = error_from_status("x", status, "Service Unavailable", body)
    assert type(error) is kind
    assert error.status == status
    assert text in str(error)
