"""The pure halves of the Kubernetes calls (aggregator.kube.payloads): request bodies built
and checked without a server, answers decoded into models or KubeErrors."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from aggregator.errors import KubeError, KubeNotFoundError, KubeUnavailableError
from aggregator.kube.objects import LeaseRecord, WatchEvent
from aggregator.kube.payloads import (
    check_node_labels,
    decode_answer,
    event_body,
    lease_body,
    lease_from,
    token_review_body,
    translated,
    watch_event,
    watch_params,
)

NOW = dt.datetime(2026, 11, 30, 11, 0, tzinfo=dt.UTC)


def event(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "api_version": "v1",
        "kind": "Node",
        "name": "gpu-1",
        "reason": "PortDown",
        "message": "mlx5_0 port 1 is DOWN",
        "type": "Warning",
        "uid": None,
        "instance": "agg-0",
        "namespace": "default",
        "now": NOW,
        "suffix": "0123456789abcdef",
    }
    return event_body(**(args | overrides))


def test_event_body_names_the_object_and_the_reporter() -> None:
    body = event(uid="u-1", message="x" * 2000)
    assert body["metadata"] == {"name": "gpu-1.0123456789abcdef", "namespace": "default"}
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-1",
        "uid": "u-1",
    }
    assert len(body["message"]) == 1024
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-11-30T11:00:00+00:00"
    assert body["source"] == {"component": "nicfleet-aggregator"}
    assert (body["reportingInstance"], body["type"], body["count"]) == ("agg-0", "Warning", 1)
    assert "uid" not in event()["involvedObject"]


@pytest.mark.parametrize(
    "reason",
    [
        pytest.param("port down", id="spaces"),
        pytest.param("portDown", id="lower-camel"),
        pytest.param("P" * 129, id="too-long"),
    ],
)
def test_event_reason_must_be_an_upper_camel_code(reason: str) -> None:
    with pytest.raises(ValueError, match="UpperCamelCase"):
        event(reason=reason)


@pytest.mark.parametrize(
    ("labels", "error"),
    [
        pytest.param({"nicfleet.io/rdma": "ok", "nicfleet.io/gone": None}, None, id="ours"),
        pytest.param({"team": "b"}, "only nicfleet.io/", id="not-ours"),
        pytest.param({"nicfleet.io/" + "k" * 64: "v"}, "only nicfleet.io/", id="key-too-long"),
        pytest.param({"nicfleet.io/rdma": "not ok"}, "valid label value", id="bad-value"),
    ],
)
def test_only_our_labels_with_valid_values(
    labels: dict[str, str | None], error: str | None
) -> None:
    if error is None:
        check_node_labels(labels)
        return
    with pytest.raises(ValueError, match=error):
        check_node_labels(labels)


def test_lease_body_carries_the_precondition_only_on_replace() -> None:
    record = LeaseRecord(holder="a", duration_s=10, renew_time="t", resource_version="7")
    created = lease_body("l", "ns", record, create=True)
    assert created == {
        "metadata": {"name": "l", "namespace": "ns"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 10, "renewTime": "t"},
    }
    patched = lease_body("l", "ns", record, create=False)
    assert patched["metadata"]["resourceVersion"] == "7"
    assert lease_body("l", "ns", LeaseRecord(holder=None), create=False)["spec"] == {
        "holderIdentity": ""
    }


def test_lease_read_back() -> None:
    raw = {
        "metadata": {"resourceVersion": "9"},
        "spec": {"holderIdentity": "b", "leaseDurationSeconds": 10, "leaseTransitions": 2},
    }
    assert lease_from("l", raw) == LeaseRecord(
        holder="b", duration_s=10, transitions=2, resource_version="9"
    )
    assert lease_from("l", {"spec": {"holderIdentity": ""}}) == LeaseRecord(holder=None)
    with pytest.raises(KubeError, match="not an object"):
        lease_from("l", ["not", "a", "lease"])


def test_token_review_body() -> None:
    assert token_review_body("t") == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": "t"},
    }
    assert token_review_body("t", ("a", "b"))["spec"] == {"token": "t", "audiences": ["a", "b"]}


def test_answers_decode_or_raise() -> None:
    assert decode_answer("w", 200, "OK", b'{"a": 1}') == {"a": 1}
    assert decode_answer("w", 204, None, b"") is None
    with pytest.raises(KubeUnavailableError, match="not JSON"):
        decode_answer("w", 200, "OK", b"<html>")
    with pytest.raises(KubeNotFoundError):
        decode_answer("w", 404, "Not Found", b"")


class _ApiException(Exception):
    def __init__(self, status: object, reason: str, body: str) -> None:
        self.status, self.reason, self.body = status, reason, body


def test_client_exceptions_become_kube_errors() -> None:
    assert isinstance(translated("w", _ApiException(404, "Not Found", "")), KubeNotFoundError)
    error = translated("w", _ApiException(409, "Conflict", ""))
    assert error.status == 409
    assert translated("w", _ApiException("?", "odd", "")).status is None


def test_watch_params_resume_only_at_a_real_version() -> None:
    assert watch_params(300, None) == {"timeout_seconds": 300}
    assert watch_params(300, "...") == {"timeout_seconds": 300}  # kmock's placeholder
    assert watch_params(5, "42") == {
        "timeout_seconds": 5,
        "resource_version": "42",
        "allow_watch_bookmarks": True,
    }


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        pytest.param(
            {"type": "ADDED", "raw_object": {"a": 1}},
            WatchEvent(type="ADDED", object={"a": 1}),
            id="added",
        ),
        pytest.param({"type": "BOOKMARK", "raw_object": {"a": 1}}, None, id="bookmark"),
        pytest.param({"type": "MODIFIED", "raw_object": "x"}, None, id="not-an-object"),
        pytest.param({"type": "ERROR"}, None, id="error"),
    ],
)
def test_watch_events_are_object_changes(
    event: dict[str, Any], expected: WatchEvent | None
) -> None:
    assert watch_event(event) == expected
