"""ValidationResult and its subject: round trips, the first payload keeps decoding, bad
bytes and bad ids give one typed error naming the field."""

from __future__ import annotations

import msgspec
import pytest

from proto import subjects
from proto.codec import CodecError, decode, encode, from_json, to_json
from proto.inventory import Gid, ReadError
from proto.messages.validation import (
    CharDeviceEvidence,
    DeviceEvidence,
    Evidence,
    GidMatch,
    InjectedEvidence,
    InterfaceEvidence,
    LatencySummary,
    PairTestResult,
    PortEvidence,
    Reason,
    ValidationResult,
    VerbsEvidence,
)
from tests.support.paths import REPO

DATA = REPO / "tests" / "data"


def full_result() -> ValidationResult:
    gid = Gid(index=3, gid="0000:0000:0000:0000:0000:ffff:0a00:0005", type="RoCE v2", ndev="net1")
    return ValidationResult(
        validation_id="0b7e2c1a-5d1f-4c8e-9a57-2f9d6c1e3b40",
        role="server",
        node="gpu-01.example.com",
        pod="nicfleet-validate-0b7e-server",
        verdict="rdma-path",
        evidence=Evidence(
            char_devices=(
                CharDeviceEvidence(path="/dev/infiniband/uverbs0", openable=True),
                CharDeviceEvidence(path="/dev/infiniband/rdma_cm", error="EACCES"),
            ),
            devices=(
                DeviceEvidence(
                    name="mlx5_0",
                    netdevs=("net1",),
                    ports=(
                        PortEvidence(
                            port=1,
                            state="ACTIVE",
                            phys_state="LinkUp",
                            link_layer="Ethernet",
                            rate_gbps=200.0,
                            gids=(gid,),
                        ),
                    ),
                ),
            ),
            interfaces=(
                InterfaceEvidence(
                    name="net1", operstate="up", mtu=9000, addresses=("10.0.0.5/24",)
                ),
            ),
            gid_matches=(
                GidMatch(
                    device="mlx5_0",
                    port=1,
                    index=3,
                    gid=gid.gid,
                    type="RoCE v2",
                    ndev="net1",
                    ip="10.0.0.5",
                    interface="net1",
                ),
            ),
            injected=InjectedEvidence(rdma_devices=("mlx5_0",), netdevs=("net1",), matches=True),
            verbs=VerbsEvidence(available=True, detail="ok: 1 devices", opened=("mlx5_0",)),
            errors=(ReadError(path="/class/infiniband/mlx5_0/hw_rev", error="ENOENT"),),
        ),
        pair_test=PairTestResult(
            method="perftest",
            peer="10.0.0.6:18515",
            message_size=65536,
            iterations=5000,
            bytes_per_second=2.4e10,
            latency=LatencySummary(samples=1000, p50_us=1.9, p99_us=2.6, min_us=1.7, max_us=9.1),
            local_device="mlx5_0",
            local_port=1,
            local_gid=gid.gid,
            remote_device="mlx5_0",
            remote_gid="0000:0000:0000:0000:0000:ffff:0a00:0006",
        ),
        started_at=1764460800.0,
        finished_at=1764460812.5,
    )


@pytest.mark.parametrize(
    "result",
    [
        pytest.param(full_result(), id="full"),
        pytest.param(
            ValidationResult(
                verdict="broken",
                reasons=(Reason(code="port-down", missing="mlx5_0/1 ACTIVE", message="down"),),
                pair_test=PairTestResult(method="pyverbs", error="no RDMA device"),
                started_at=1.0,
                finished_at=2.0,
            ),
            id="broken-no-numbers",
        ),
    ],
)
def test_round_trip(result: ValidationResult) -> None:
    assert decode(encode(result), ValidationResult) == result
    assert from_json(to_json(result), ValidationResult) == result
    raw = msgspec.msgpack.decode(encode(result))
    assert (raw["schema"], raw["version"]) == ("nicfleet.v1.ValidationResult", 1)


def test_first_payload_still_decodes() -> None:
    result = decode((DATA / "validation-v1-minimal.msgpack").read_bytes(), ValidationResult)
    assert result.verdict == "ordinary-interface-only"
    assert result.reasons[0].missing == "/sys/class/infiniband/*"
    assert result.evidence == Evidence()
    assert result.pair_test is None


def _mutated(path: tuple[str | int, ...], value: object) -> bytes:
    raw = msgspec.msgpack.decode(encode(full_result()))
    target = raw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return msgspec.msgpack.encode(raw)


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        pytest.param(_mutated(("verdict",), "maybe"), "$.verdict", id="bad-verdict"),
        pytest.param(_mutated(("role",), "observer"), "$.role", id="bad-role"),
        pytest.param(
            _mutated(("pair_test", "method"), "iperf"), "$.pair_test.method", id="bad-method"
        ),
        pytest.param(
            _mutated(("pair_test", "bytes_per_second"), "fast"),
            "$.pair_test.bytes_per_second",
            id="bad-number",
        ),
        pytest.param(
            _mutated(("evidence", "char_devices", 0, "openable"), "yes"),
            "$.evidence.char_devices[0].openable",
            id="bad-nested",
        ),
        pytest.param(_mutated(("schema",), "nicfleet.v1.Alert"), "$.schema", id="other-schema"),
        pytest.param(encode(full_result())[:-3], "$", id="truncated"),
        pytest.param(b"", "$", id="empty"),
    ],
)
def test_bad_payloads_name_the_field(payload: bytes, path: str) -> None:
    with pytest.raises(CodecError) as info:
        decode(payload, ValidationResult)
    assert (info.value.type_name, info.value.path) == ("ValidationResult", path)


def test_missing_verdict_is_named() -> None:
    raw = msgspec.msgpack.decode(encode(full_result()))
    del raw["verdict"]
    with pytest.raises(CodecError, match="verdict"):
        decode(msgspec.msgpack.encode(raw), ValidationResult)


@pytest.mark.parametrize(
    "validation_id",
    ["abc", "0b7e2c1a-5d1f-4c8e-9a57-2f9d6c1e3b40", "v1", "a" * 40],
)
def test_validation_subject_round_trips(validation_id: str) -> None:
    subject = subjects.validation_subject(validation_id)
    assert subject == f"nicfleet.v1.validation.{validation_id}"
    assert subjects.parse_validation_subject(subject) == validation_id


@pytest.mark.parametrize(
    "validation_id",
    [
        pytest.param("", id="empty"),
        pytest.param("a" * 41, id="too-long"),
        pytest.param("ABC", id="uppercase"),
        pytest.param("a.b", id="dot-would-split-the-subject"),
        pytest.param("*", id="wildcard"),
        pytest.param(">", id="tail-wildcard"),
        pytest.param("a_b", id="underscore"),
        pytest.param("-a", id="leading-dash"),
        pytest.param("a\n", id="newline"),
    ],
)
def test_bad_validation_ids_are_refused(validation_id: str) -> None:
    with pytest.raises(subjects.InvalidValidationId):
        subjects.validation_subject(validation_id)


@pytest.mark.parametrize(
    "subject",
    [
        "nicfleet.v1.validation",
        "nicfleet.v1.validation.a.b",
        "nicfleet.v2.validation.abc",
        "nicfleet.v1.validation.ABC",
    ],
)
def test_parse_validation_subject_rejects_foreign_subjects(subject: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - InvalidValidationId is a ValueError
        subjects.parse_validation_subject(subject)


def test_wildcard_matches_one_token() -> None:
    assert subjects.VALIDATION_WILDCARD == "nicfleet.v1.validation.*"
