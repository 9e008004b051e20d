"""A pair validation as data and decisions: the stored record, the two Pods built from the
deploy/validation template, the state machine pending → pods-created → running →
collecting → done | failed | timed-out, and the trace's tested-data-path link.

Pure: no I/O, no clock, no logging; `now`, the template and observed pod states are passed
in. `aggregator.validations.runner` does the Kubernetes, NATS and KV calls these decisions name.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from aggregator.errors import AggregatorError
from aggregator.validations.request import ValidationRequest
from proto.http import FINAL_PHASES, Phase, ValidationRecord
from proto.messages.validation import ValidationResult, ValidationRole

ROLES: Final[tuple[ValidationRole, ValidationRole]] = ("server", "client")
POD_PREFIX: Final = "nicfleet-validate-"
NETWORKS_ANNOTATION: Final = "k8s.v1.cni.cncf.io/networks"
ID_LABEL: Final = "nicfleet.io/validation-id"
ROLE_LABEL: Final = "nicfleet.io/validation-role"
ENDED_POD_PHASES: Final = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, kw_only=True)
class ValidationSettings:
    """Where the pods run, what they reach, and how long each phase may take."""

    nats_url: str = "nats://nicfleet-nats.nicfleet-system.svc:4222"  # as the pods reach it
    image: str | None = None  # None: the template's image
    start_timeout_s: float = 180.0  # pods-created → server pod has an IP (pull, schedule)
    run_timeout_s: float = 300.0  # running → a first result
    collect_timeout_s: float = 60.0  # first result → the other side's
    result_grace_s: float = 5.0  # a pod ended: how long its result may still be in flight
    poll_interval_s: float = 1.0  # how often pod phases are read
    max_running: int = 4  # validations with pods at the same time
    max_queued: int = 16  # accepted, waiting for a slot; more → 429
    keep: int = 500  # records kept in memory (list, trace); KV keeps them longer

    @property
    def active_deadline_s(self) -> int:
        """The pods' own deadline: they end even if the aggregator that made them died."""
        total = self.start_timeout_s + self.run_timeout_s + self.collect_timeout_s
        return math.ceil(total + 2 * self.result_grace_s + 30)


class PodView(msgspec.Struct, frozen=True, kw_only=True):
    """What the runner read of one validation pod."""

    phase: str | None = None  # Pending | Running | Succeeded | Failed | None: not found
    ip: str | None = None
    detail: str = ""  # a scheduling / termination reason when the API gives one
    ended_at: float | None = None  # when the runner first saw it Succeeded/Failed


Action = Literal["create-server", "create-client", "wait", "finish"]


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    action: Action
    phase: Phase
    reason: str | None = None


class RejectedResult(AggregatorError, ValueError):
    """A result message that does not belong to this validation (counted, ignored)."""


def new_record(
    request: ValidationRequest, *, id: str, namespace: str, runner: str, now: float
) -> ValidationRecord:
    return ValidationRecord(
        id=id, nodes=request.nodes, resource=request.resource, network=request.network,
        namespace=namespace, runner=runner, phase="pending", created_at=now, updated_at=now,
        phase_since=now,
    )  # fmt: skip


def pod_name(validation_id: str, role: ValidationRole) -> str:
    return f"{POD_PREFIX}{validation_id}-{role}"


def build_pod(
    template: Mapping[str, Any],
    record: ValidationRecord,
    role: ValidationRole,
    settings: ValidationSettings,
) -> dict[str, Any]:
    """The Pod for one side: the template pinned to its node, requesting `resource: 1`,
    attached to the network, told its id, role and peer. Raises ValueError for a template
    without a container."""
    pod: dict[str, Any] = copy.deepcopy(dict(template))
    node = record.nodes[0] if role == "server" else record.nodes[1]
    meta = pod.setdefault("metadata", {})
    meta.pop("generateName", None)
    meta["name"] = pod_name(record.id, role)
    meta["namespace"] = record.namespace
    meta["labels"] = {**(meta.get("labels") or {}), ID_LABEL: record.id, ROLE_LABEL: role}
    if record.network is not None:
        meta["annotations"] = {
            **(meta.get("annotations") or {}),
            NETWORKS_ANNOTATION: record.network,
        }
    spec = pod.setdefault("spec", {})
    spec["restartPolicy"] = "Never"
    spec["activeDeadlineSeconds"] = settings.active_deadline_s
    spec.pop("nodeName", None)  # the scheduler places it: resources and taints are checked
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    required = {"nodeSelectorTerms": [term]}
    spec["affinity"] = {
        **(spec.get("affinity") or {}),
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required},
    }
    containers = spec.get("containers") or []
    if not containers or not isinstance(containers[0], dict):
        raise ValueError("the validation pod template has no container")
    main = containers[0]
    if settings.image is not None:
        main["image"] = settings.image
    resources = main.setdefault("resources", {})
    resources["limits"] = {**(resources.get("limits") or {}), record.resource: "1"}
    resources["requests"] = {**(resources.get("requests") or {}), record.resource: "1"}
    if role == "server":
        role_args = ["--serve"]
    else:
        if record.server_ip is None:
            raise ValueError("the client pod needs the server pod's IP")
        ip = record.server_ip
        role_args = ["--peer", f"[{ip}]" if ":" in ip else ip]
    main["args"] = [*(main.get("args") or []), *role_args]
    ours = {
        "NICFLEET_VALIDATION_ID": record.id,
        "NICFLEET_VALIDATION_ROLE": role,
        "NICFLEET_NATS_URL": settings.nats_url,
    }
    env = [e for e in main.get("env") or [] if e.get("name") not in ours]
    main["env"] = env + [{"name": k, "value": v} for k, v in ours.items()]
    return pod


def accept_result(
    record: ValidationRecord, result: ValidationResult, now: float
) -> ValidationRecord:
    """The record with one side's result; RejectedResult when it is not this validation's,
    names the wrong node, or that side already answered."""
    if result.validation_id != record.id:
        raise RejectedResult(f"result for validation {result.validation_id!r}, not {record.id!r}")
    if result.role not in ROLES:
        raise RejectedResult(f"result without a role (got {result.role!r})")
    expected = record.nodes[0] if result.role == "server" else record.nodes[1]
    if result.node is not None and result.node != expected:
        raise RejectedResult(f"{result.role} result from node {result.node!r}, not {expected!r}")
    if getattr(record, result.role) is not None:
        raise RejectedResult(f"a second {result.role} result")
    updated = msgspec.structs.replace(record, updated_at=now, **{result.role: result})
    return _summarized(updated)


def decide(
    record: ValidationRecord,
    *,
    server: PodView | None,
    client: PodView | None,
    now: float,
    settings: ValidationSettings,
) -> Decision:
    """The next step from the record and the pods as last read (None: not created yet)."""
    if record.phase in FINAL_PHASES:
        return Decision(action="finish", phase=record.phase, reason=record.reason)
    if record.server is not None and record.client is not None:
        return Decision(action="finish", phase="done", reason=_verdict(record))
    elapsed = now - record.phase_since
    a, b = record.nodes
    if record.phase == "pending":
        return Decision(action="create-server", phase="pods-created")
    ended = _ended_without_result(record, server, client, now, settings)
    if ended is not None:
        return Decision(action="finish", phase="failed", reason=ended)
    if record.phase == "pods-created":
        if server is not None and server.ip:
            return Decision(action="create-client", phase="running")
        if elapsed >= settings.start_timeout_s:
            detail = _pod_detail(server)
            return Decision(
                action="finish", phase="timed-out",
                reason=f"server pod on {a} got no IP within {settings.start_timeout_s:g}s"
                f"{detail}",
            )  # fmt: skip
        return Decision(action="wait", phase=record.phase)
    first = record.server or record.client
    if record.phase == "running" and first is not None:
        return Decision(action="wait", phase="collecting")
    if record.phase == "running" and elapsed >= settings.run_timeout_s:
        return Decision(
            action="finish", phase="timed-out",
            reason=f"neither the server on {a} nor the client on {b} reported within "
            f"{settings.run_timeout_s:g}s{_pod_detail(client)}",
        )  # fmt: skip
    if record.phase == "collecting" and elapsed >= settings.collect_timeout_s:
        role, node = ("client", b) if record.client is None else ("server", a)
        return Decision(
            action="finish", phase="timed-out",
            reason=f"the {role} on {node} never answered within "
            f"{settings.collect_timeout_s:g}s after its peer reported",
        )  # fmt: skip
    return Decision(action="wait", phase=record.phase)


def advance(record: ValidationRecord, decision: Decision, now: float) -> ValidationRecord:
    """The record after `decision` (phase, reason, timestamps); unchanged when nothing moved."""
    if decision.phase == record.phase and decision.reason == record.reason:
        return record
    final = decision.phase in FINAL_PHASES
    return _summarized(
        msgspec.structs.replace(
            record,
            phase=decision.phase,
            reason=decision.reason,
            phase_since=now if decision.phase != record.phase else record.phase_since,
            updated_at=now,
            finished_at=now if final else None,
        )
    )


def abandoned(record: ValidationRecord, reason: str, now: float) -> ValidationRecord:
    """A record whose runner stopped (shutdown, error) before it finished."""
    if record.phase in FINAL_PHASES:
        return record
    return advance(record, Decision(action="finish", phase="failed", reason=reason), now)


def side_passed(result: ValidationResult | None) -> bool:
    return (
        result is not None
        and result.verdict == "rdma-path"
        and result.pair_test is not None
        and result.pair_test.error is None
    )


def _summarized(record: ValidationRecord) -> ValidationRecord:
    tests = [r.pair_test for r in (record.server, record.client) if r and r.pair_test]
    rates = [t.bytes_per_second for t in tests if t.bytes_per_second is not None]
    p50 = [t.latency.p50_us for t in tests if t.latency is not None]
    return msgspec.structs.replace(
        record,
        passed=record.phase == "done" and side_passed(record.server) and side_passed(record.client),
        bytes_per_second=max(rates) if rates else None,
        latency_p50_us=min(p50) if p50 else None,
    )


def _verdict(record: ValidationRecord) -> str:
    parts = []
    for role, result in (("server", record.server), ("client", record.client)):
        assert result is not None
        why = "; ".join(r.message for r in result.reasons[:2])
        test = result.pair_test
        if test is None:
            pair = "no pair test"
        elif test.error is not None:
            pair = f"pair test failed: {test.error}"
        else:
            pair = "pair test ok"
        parts.append(f"{role}: {result.verdict}, {pair}" + (f" ({why})" if why else ""))
    return "; ".join(parts)


def _ended_without_result(
    record: ValidationRecord,
    server: PodView | None,
    client: PodView | None,
    now: float,
    settings: ValidationSettings,
) -> str | None:
    for role, node, pod, result in (
        ("server", record.nodes[0], server, record.server),
        ("client", record.nodes[1], client, record.client),
    ):
        if pod is None or result is not None or pod.ended_at is None:
            continue
        if now - pod.ended_at >= settings.result_grace_s:
            how = f"{pod.phase}{_colon(pod.detail)}"
            return f"the {role} pod on {node} ended ({how}) without a result"
    return None


def _pod_detail(pod: PodView | None) -> str:
    if pod is None or pod.phase is None:
        return ""
    return f" (pod {pod.phase}{_colon(pod.detail)})"


def _colon(detail: str) -> str:
    return f": {detail}" if detail else ""
