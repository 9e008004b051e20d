"""The pair-validation planner (pure): request parsing and checks, the Pods built from the
deploy/validation template, the state machine, results and the trace's last link."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import msgspec
import pytest
import yaml
from click.testing import CliRunner

from aggregator.cli.main import main as aggregator_cli
from aggregator.cli.validationflags import ValidationFlags, with_validation_flags
from aggregator.cluster import ClusterNode, ClusterView, NetworkAttachment
from aggregator.fleet.state import NodeRecord
from aggregator.kube.client import KubeSettings
from aggregator.service import AggregatorSettings
from aggregator.trace.tested import RECENT_S, data_path_link
from aggregator.validations.record import (
    Decision,
    PodView,
    RejectedResult,
    ValidationSettings,
    accept_result,
    advance,
    build_pod,
    decide,
    new_record,
)
from aggregator.validations.request import (
    InvalidValidationRequest,
    ResourceNotAdvertised,
    UnknownValidationNode,
    ValidationRequest,
    check_request,
    parse_request,
)
from aggregator.validations.runner import TEMPLATE
from proto.http import ValidationRecord
from proto.messages.validation import LatencySummary, PairTestResult, Reason, ValidationResult
from tests.support.builders import T0, plugin_status, resource_status

RES = "rdma/ib"
A, B = "gpu-001", "gpu-002"
SETTINGS = ValidationSettings(
    start_timeout_s=10, run_timeout_s=20, collect_timeout_s=5, result_grace_s=2
)
TEMPLATE_DOC: dict[str, Any] = yaml.safe_load(TEMPLATE.read_text())


def record(**changes: Any) -> ValidationRecord:
    base = new_record(
        ValidationRequest(nodes=(A, B), resource=RES),
        id="abc123",
        namespace="nicfleet-system",
        runner="r1",
        now=T0,
    )
    return msgspec.structs.replace(base, **changes)


def result(
    role: str | None = "server", *, verdict: str = "rdma-path", pair: bool = True, **changes: Any
) -> ValidationResult:
    test = (
        PairTestResult(
            method="pyverbs",
            bytes_per_second=24e9 if role == "client" else 23e9,
            latency=LatencySummary(samples=1000, p50_us=2.5, p99_us=4.0),
        )
        if pair
        else None
    )
    fields: dict[str, Any] = {
        "validation_id": "abc123",
        "role": role,
        "node": A if role == "server" else B,
        "verdict": verdict,
        "pair_test": test,
        "started_at": T0,
        "finished_at": T0 + 1,
    }
    return ValidationResult(**(fields | changes))


# --- request --------------------------------------------------------------------------------


def test_a_good_request() -> None:
    body = {"nodes": [A, B], "resource": RES, "network": "ml/ib-net"}
    assert parse_request(body) == ValidationRequest(nodes=(A, B), resource=RES, network="ml/ib-net")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param([A, B], "body", id="not-an-object"),
        pytest.param({"nodes": [A, B], "resource": RES, "extra": 1}, "extra", id="unknown-field"),
        pytest.param({"resource": RES}, "nodes", id="no-nodes"),
        pytest.param({"nodes": [A], "resource": RES}, "nodes", id="one-node"),
        pytest.param({"nodes": [A, B, "c"], "resource": RES}, "nodes", id="three-nodes"),
        pytest.param({"nodes": [A, 7], "resource": RES}, "nodes[1]", id="not-a-string"),
        pytest.param({"nodes": ["Bad_Node", B], "resource": RES}, "nodes[0]", id="bad-name"),
        pytest.param({"nodes": [A, A], "resource": RES}, "nodes", id="same-node-twice"),
        pytest.param({"nodes": [A, B]}, "resource", id="no-resource"),
        pytest.param({"nodes": [A, B], "resource": "ib"}, "resource", id="short-resource"),
        pytest.param({"nodes": [A, B], "resource": RES, "network": 3}, "network", id="net-type"),
        pytest.param({"nodes": [A, B], "resource": RES, "network": "a/b/c"}, "network", id="net"),
    ],
)
def test_bad_requests_name_the_field(body: object, field: str) -> None:
    with pytest.raises(InvalidValidationRequest) as caught:
        parse_request(body)
    assert caught.value.field == field
    assert field.split("[")[0] in caught.value.message or field == "body"


def fleet(*advertising: str, other: str = "gpu-003") -> dict[str, NodeRecord]:
    records = {}
    for name in (A, B, other):
        served = resource_status(RES) if name in advertising else resource_status("rdma/other")
        records[name] = NodeRecord(
            name=name, first_seen=T0, last_seen=T0, device_plugin=plugin_status(name, served)
        )
    return records


def test_check_passes_when_both_nodes_advertise() -> None:
    check_request(
        ValidationRequest(nodes=(A, B), resource=RES), fleet=fleet(A, B), cluster=ClusterView()
    )


def test_unknown_node_with_suggestions() -> None:
    with pytest.raises(UnknownValidationNode) as caught:
        check_request(
            ValidationRequest(nodes=(A, "gpu-00"), resource=RES),
            fleet=fleet(A, B),
            cluster=ClusterView(),
        )
    assert caught.value.field == "nodes[1]"
    assert A in caught.value.suggestions


def test_resource_not_advertised_names_node_and_where_it_is() -> None:
    with pytest.raises(ResourceNotAdvertised) as caught:
        check_request(
            ValidationRequest(nodes=(A, B), resource=RES),
            fleet=fleet(A, "gpu-003"),
            cluster=ClusterView(),
        )
    assert caught.value.nodes == (B,)
    assert caught.value.suggestions == (A, "gpu-003")
    assert str(caught.value) == f"{RES} is not advertised on {B}; advertised on: {A}, gpu-003"


def test_cluster_allocatable_counts_as_advertised() -> None:
    cluster = ClusterView(
        present=True,
        nodes={B: ClusterNode(name=B, allocatable={RES: "4"})},
        attachments=(NetworkAttachment(namespace="ml", name="ib-net"),),
    )
    check_request(ValidationRequest(nodes=(A, B), resource=RES), fleet=fleet(A), cluster=cluster)
    with pytest.raises(InvalidValidationRequest) as caught:
        check_request(
            ValidationRequest(nodes=(A, B), resource=RES, network="ml/other"),
            fleet=fleet(A),
            cluster=cluster,
        )
    assert caught.value.field == "network"


# --- pods -----------------------------------------------------------------------------------


def test_server_pod_pinned_requesting_the_resource_on_the_network() -> None:
    rec = record(network="ml/ib-net")
    pod = build_pod(TEMPLATE_DOC, rec, "server", SETTINGS)
    assert pod["metadata"]["name"] == "nicfleet-validate-abc123-server"
    assert pod["metadata"]["namespace"] == "nicfleet-system"
    assert pod["metadata"]["labels"]["nicfleet.io/validation-id"] == "abc123"
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "nicfleet-validation"
    assert pod["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "ml/ib-net"}
    spec = pod["spec"]
    assert (spec["restartPolicy"], spec["activeDeadlineSeconds"]) == ("Never", 69)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [A]}]}
    ]
    (container,) = spec["containers"]
    assert container["resources"]["limits"][RES] == "1"
    assert container["resources"]["requests"][RES] == "1"
    assert container["args"][-1] == "--serve"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NICFLEET_VALIDATION_ID"] == "abc123"
    assert env["NICFLEET_VALIDATION_ROLE"] == "server"
    assert env["NICFLEET_NATS_URL"] == SETTINGS.nats_url
    assert "NODE_NAME" in env
    assert "k8s.v1.cni.cncf.io/networks" not in TEMPLATE_DOC["metadata"].get("annotations", {})
    assert kubernetes_validate.validate(pod, "1.37", strict=True) == "1.37"


@pytest.mark.parametrize(
    ("ip", "peer"), [("10.1.2.3", "10.1.2.3"), ("fd00::5", "[fd00::5]")], ids=["v4", "v6"]
)
def test_client_pod_points_at_the_server_ip(ip: str, peer: str) -> None:
    pod = build_pod(TEMPLATE_DOC, record(server_ip=ip), "client", SETTINGS)
    assert pod["metadata"]["name"] == "nicfleet-validate-abc123-client"
    assert "annotations" not in pod["metadata"]
    assert pod["spec"]["containers"][0]["args"][-2:] == ["--peer", peer]
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [B]
    assert kubernetes_validate.validate(pod, "1.37", strict=True) == "1.37"


def test_client_pod_needs_the_server_ip_and_a_template_a_container() -> None:
    with pytest.raises(ValueError, match="IP"):
        build_pod(TEMPLATE_DOC, record(), "client", SETTINGS)
    with pytest.raises(ValueError, match="container"):
        build_pod({"kind": "Pod", "spec": {}}, record(), "server", SETTINGS)


# --- state machine --------------------------------------------------------------------------

RUNNING = PodView(phase="Running", ip="10.0.0.9")
PENDING = PodView(phase="Pending", detail="Unschedulable: 0/3 nodes are available")
ENDED = PodView(phase="Failed", detail="Error, exit code 1", ended_at=T0 + 10)


def wait(phase: str) -> Decision:
    return Decision(action="wait", phase=phase)  # type: ignore[arg-type]


def finish(phase: str, reason: str) -> Decision:
    return Decision(action="finish", phase=phase, reason=reason)  # type: ignore[arg-type]


BOTH = {"server": result(), "client": result("client")}
NO_IP = (
    "server pod on gpu-001 got no IP within 10s "
    "(pod Pending: Unschedulable: 0/3 nodes are available)"
)
NOBODY = "neither the server on gpu-001 nor the client on gpu-002 reported within 20s (pod Running)"
SILENT_PEER = "the client on gpu-002 never answered within 5s after its peer reported"
DIED = "the client pod on gpu-002 ended (Failed: Error, exit code 1) without a result"
PASSED = "server: rdma-path, pair test ok; client: rdma-path, pair test ok"
CASES = [
    ("pending", record(), None, None, 0, Decision(action="create-server", phase="pods-created")),
    ("no-ip-yet", record(phase="pods-created"), PENDING, None, 9, wait("pods-created")),
    ("server-ip", record(phase="pods-created"), RUNNING, None, 1,
     Decision(action="create-client", phase="running")),
    ("start-timeout", record(phase="pods-created"), PENDING, None, 10, finish("timed-out", NO_IP)),
    ("running", record(phase="running"), RUNNING, RUNNING, 19, wait("running")),
    ("first-result", record(phase="running", server=result()), RUNNING, RUNNING, 1,
     wait("collecting")),
    ("run-timeout", record(phase="running"), RUNNING, RUNNING, 20, finish("timed-out", NOBODY)),
    ("peer-never-answers", record(phase="collecting", server=result()), RUNNING, RUNNING, 5,
     finish("timed-out", SILENT_PEER)),
    ("ended-grace", record(phase="running"), RUNNING, ENDED, 11, wait("running")),
    ("ended-without-result", record(phase="running"), RUNNING, ENDED, 12, finish("failed", DIED)),
    ("ended-with-result", record(phase="running", client=result("client")), RUNNING, ENDED, 30,
     wait("collecting")),
    ("both-results", record(phase="collecting", **BOTH), None, None, 0, finish("done", PASSED)),
    ("final", record(phase="failed", reason="x"), None, None, 0, finish("failed", "x")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("rec", "server", "client", "after", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_decide(
    rec: ValidationRecord,
    server: PodView | None,
    client: PodView | None,
    after: float,
    expected: Decision,
) -> None:
    now = T0 + after
    assert decide(rec, server=server, client=client, now=now, settings=SETTINGS) == expected


def test_advance_moves_phase_and_stamps_the_end() -> None:
    rec = record()
    same = advance(rec, Decision(action="wait", phase="pending"), T0 + 1)
    assert same is rec
    moved = advance(rec, Decision(action="create-server", phase="pods-created"), T0 + 1)
    assert (moved.phase, moved.phase_since, moved.finished_at) == ("pods-created", T0 + 1, None)
    done = advance(moved, Decision(action="finish", phase="timed-out", reason="r"), T0 + 5)
    assert (done.phase, done.reason, done.finished_at, done.passed) == (
        "timed-out",
        "r",
        T0 + 5,
        False,
    )


def test_both_sides_rdma_path_with_a_pair_test_pass() -> None:
    rec = accept_result(record(phase="running"), result(), T0 + 1)
    rec = accept_result(rec, result("client"), T0 + 2)
    final = advance(
        rec, decide(rec, server=None, client=None, now=T0 + 2, settings=SETTINGS), T0 + 2
    )
    assert (final.phase, final.passed) == ("done", True)
    assert (final.bytes_per_second, final.latency_p50_us) == (24e9, 2.5)


@pytest.mark.parametrize(
    "client",
    [
        pytest.param(
            result("client", verdict="ordinary-interface-only", pair=False), id="ordinary"
        ),
        pytest.param(
            result(
                "client", pair_test=PairTestResult(method="pyverbs", error="handshake timed out")
            ),
            id="pair-test-error",
        ),
    ],
)
def test_done_but_not_passed(client: ValidationResult) -> None:
    rec = accept_result(accept_result(record(phase="running"), result(), T0), client, T0)
    final = advance(rec, decide(rec, server=None, client=None, now=T0, settings=SETTINGS), T0)
    assert (final.phase, final.passed) == ("done", False)
    assert "client: " in (final.reason or "")


@pytest.mark.parametrize(
    ("message", "match"),
    [
        pytest.param(result(validation_id="other"), "not 'abc123'", id="other-validation"),
        pytest.param(result(role=None), "without a role", id="no-role"),
        pytest.param(result(node="gpu-009"), "from node 'gpu-009'", id="wrong-node"),
    ],
)
def test_results_that_do_not_belong_are_rejected(message: ValidationResult, match: str) -> None:
    with pytest.raises(RejectedResult, match=match):
        accept_result(record(phase="running"), message, T0)


def test_a_second_result_of_one_side_is_rejected() -> None:
    rec = accept_result(record(phase="running"), result(), T0)
    with pytest.raises(RejectedResult, match="second server"):
        accept_result(rec, result(reasons=(Reason(code="x", missing="y", message="z"),)), T0)


# --- trace link -----------------------------------------------------------------------------


def test_data_path_link() -> None:
    never = data_path_link(None, A, RES, T0)
    assert (never.name, never.status) == ("tested-data-path", "unknown")
    assert never.evidence["command"] == f"nicfleetctl validate {A} <other-node> --resource {RES}"
    passed = record(phase="done", passed=True, finished_at=T0, bytes_per_second=24e9)
    ok = data_path_link(passed, A, RES, T0 + 60)
    assert (ok.status, ok.evidence["age_s"], ok.evidence["bytes_per_second"]) == ("ok", 60, 24e9)
    assert data_path_link(passed, A, RES, T0 + RECENT_S + 1).status == "unknown"
    failed = record(
        phase="timed-out", reason="the client on gpu-002 never answered", finished_at=T0
    )
    broken = data_path_link(failed, B, RES, T0 + 1)
    assert broken.status == "broken"
    assert broken.cause == (
        "validation abc123 (gpu-001 ↔ gpu-002) timed-out: the client on gpu-002 never answered"
    )


# --- nicfleet-aggregator run --validation-* -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--validation-namespace", "Bad_NS"], "--validation-namespace", id="ns"),
        pytest.param(["--validation-nats-url", "http://x"], "--validation-nats-url", id="url"),
        pytest.param(["--validation-template", "/nonexistent"], "does not exist", id="template"),
    ],
)
def test_bad_validation_flags_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(aggregator_cli, ["run", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_validation_flags_reach_the_settings() -> None:
    settings = AggregatorSettings(kube=KubeSettings(host="http://127.0.0.1:1"))
    flags = ValidationFlags(template=TEMPLATE, namespace="validate", nats_url="tls://n:4222")
    applied = with_validation_flags(settings, flags)
    assert applied.validation_template == TEMPLATE
    assert applied.validation.nats_url == "tls://n:4222"
    assert applied.kube is not None and applied.kube.validation_namespace == "validate"
    assert with_validation_flags(settings, ValidationFlags()) == settings
