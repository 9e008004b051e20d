from __future__ import annotations

import pytest

from proto import subjects


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("gpu-01", id="simple"),
        pytest.param("gpu-01.rack3.example.com", id="dotted"),
        pytest.param("a", id="one-char"),
        pytest.param("0node", id="leading-digit"),
    ],
)
def test_valid_node_names_round_trip_through_subjects(name: str) -> None:
    subject = subjects.node_subject(name, subjects.SNAPSHOT)
    assert subject.count(".") == 4  # one token for the node, whatever dots it has
    assert subjects.parse_node_subject(subject) == (name, subjects.SNAPSHOT)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("", id="empty"),
        pytest.param("GPU-01", id="uppercase"),
        pytest.param("gpu_01", id="underscore"),
        pytest.param("-gpu", id="leading-dash"),
        pytest.param("gpu-", id="trailing-dash"),
        pytest.param("gpu*", id="wildcard"),
        pytest.param("gpu.>", id="tail-wildcard"),
        pytest.param("a" * 254, id="too-long"),
        pytest.param("gpu 01", id="space"),
        pytest.param("gpu-001\n", id="trailing-newline"),
        pytest.param("gpu-001\n.x", id="embedded-newline"),
    ],
)
def test_invalid_node_names_are_refused(name: str) -> None:
    with pytest.raises(subjects.InvalidNodeName):
        subjects.node_subject(name, subjects.SNAPSHOT)


@pytest.mark.parametrize(
    "subject",
    [
        pytest.param("nicfleet.v1.node.gpu-01", id="short"),
        pytest.param("nicfleet.v1.node.gpu-01.snapshot.extra", id="long"),
        pytest.param("nicfleet.v2.node.gpu-01.snapshot", id="other-version"),
        pytest.param("nicfleet.v1.node.gpu-01.bogus", id="unknown-kind"),
        pytest.param("nicfleet.v1.node.GPU.snapshot", id="bad-node"),
    ],
)
def test_parse_node_subject_rejects_foreign_subjects(subject: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - InvalidNodeName is a ValueError too
        subjects.parse_node_subject(subject)


def test_alert_subject_uses_node_token() -> None:
    assert (
        subjects.alert_subject("critical", "port-down", "a.b")
        == "nicfleet.v1.alert.critical.port-down.a_b"
    )


def test_desired_subjects_are_one_node_token_and_neither_wildcard_matches_the_other() -> None:
    assert subjects.desired_subject("rack1.gpu-01") == "nicfleet.v1.desired.rack1_gpu-01"
    get = subjects.desired_get_subject("rack1.gpu-01")
    assert get == "nicfleet.v1.desired.rack1_gpu-01.get"
    assert subjects.parse_desired_get_subject(get) == "rack1.gpu-01"
    assert len(subjects.DESIRED_WILDCARD.split(".")) == 4
    assert len(subjects.DESIRED_GET_WILDCARD.split(".")) == len(get.split(".")) == 5


@pytest.mark.parametrize(
    "subject",
    [
        "nicfleet.v1.desired.gpu-01",
        "nicfleet.v1.desired.gpu-01.put",
        "nicfleet.v1.desired.GPU.get",
        "nicfleet.v1.node.gpu-01.get",
        "nicfleet.v1.desired.a.b.get",
    ],
)
def test_parse_desired_get_subject_rejects_others(subject: str) -> None:
    with pytest.raises(ValueError, match=r"desired\.<node>\.get|DNS-1123"):
        subjects.parse_desired_get_subject(subject)
