"""Findings from the audit of an NVIDIA `NicClusterPolicy` against the fleet: would the
upstream RDMA shared device plugin start, what it advertises, where nicfleet would differ,
and the policy's other sections. Pure and read-only: the object dict and the fleet in,
Findings out; the audit itself is proto.nicclusterpolicy's (nicfleetctl runs it too).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, Literal

from aggregator.fleet.state import NodeRecord
from aggregator.rules.finding import Finding, Severity
from proto.nicclusterpolicy import PolicyAudit, audit_policy
from proto.nicpolicysections import Note

AuditRule = Literal[
    "nvidia-policy-invalid",  # upstream would not start / the webhook refuses
    "selector-matches-nothing",  # advertises 0 on every node (a registry rule's id too)
    "nvidia-policy-nicfleet-differs",  # nicfleet would advertise otherwise
    "nvidia-policy-section",  # ofedDriver, secondaryNetwork, sriov, status
    "nvidia-rdma-netns-exclusive",  # upstream exits on a node in exclusive netns mode
]
RULE_INVALID: Final = "nvidia-policy-invalid"
RULE_MATCHES_NOTHING: Final = "selector-matches-nothing"
RULE_DIFFERS: Final = "nvidia-policy-nicfleet-differs"
RULE_SECTION: Final = "nvidia-policy-section"
RULE_NETNS: Final = "nvidia-rdma-netns-exclusive"
# Every rule id the audit's findings carry, with the severities each can have: they are not
# in the rule registry (the audit is not a rule over the fleet), docs/rules.md lists them.
AUDIT_RULES: Final[Mapping[str, tuple[Severity, ...]]] = MappingProxyType(
    {
        RULE_INVALID: ("critical",),
        RULE_MATCHES_NOTHING: ("warning",),
        RULE_DIFFERS: ("warning",),
        RULE_SECTION: ("critical", "warning"),  # a Note's severity; info notes are not findings
        RULE_NETNS: ("critical",),
    }
)


def audit_nic_cluster_policy(
    obj: Mapping[str, Any], fleet: Mapping[str, NodeRecord]
) -> tuple[Finding, ...]:
    """Findings about the NicClusterPolicy `obj`; () when all is as written."""
    snapshots = {n: r.snapshot for n, r in fleet.items() if r.snapshot is not None}
    return findings_of(audit_policy(obj, snapshots))


def findings_of(report: PolicyAudit) -> tuple[Finding, ...]:
    subject = f"{report.kind}/{report.name or 'nic-cluster-policy'}"
    found: list[Finding] = []
    if report.start_failure is not None:
        failure = report.start_failure
        path = "spec.rdmaSharedDevicePlugin.config" + (f".{failure.path}" if failure.path else "")
        reason = (
            "not valid for Go's json.Unmarshal: " if failure.stage == "decode" else ""
        ) + failure.reason
        message = f"{path}: upstream would not start: {reason}"
        found.append(
            _finding(RULE_INVALID, "critical", subject, message, None, path=path, reason=reason)
        )
    for note in report.notes:
        found.extend(_note(note, subject))
    found.extend(_netns_exclusive(report, subject))
    found.extend(_zero_everywhere(report, subject))
    found.extend(_differs(report, subject))
    return tuple(found)


def _note(note: Note, subject: str) -> list[Finding]:
    if note.severity == "info":
        return []
    rule: AuditRule = RULE_INVALID if note.section == "webhook" else RULE_SECTION
    message = f"{note.path}: {note.message}"
    return [
        _finding(
            rule, note.severity, subject, message, note.node, path=note.path, reason=note.message
        )
    ]


def _netns_exclusive(report: PolicyAudit, subject: str) -> list[Finding]:
    """One per node where upstream would exit for the RDMA netns mode (a config that fails
    on every node is the one nvidia-policy-invalid finding instead)."""
    if report.start_failure is not None:
        return []
    return [
        _finding(
            RULE_NETNS,
            "critical",
            subject,
            f"{v.node}: upstream would not start: {v.reason}",
            v.node,
            path="spec.rdmaSharedDevicePlugin",
            reason=f"{v.reason}; {v.nicfleet_instead}",
        )
        for v in report.nodes
        if v.verdict == "would-not-start"
    ]


def _zero_everywhere(report: PolicyAudit, subject: str) -> list[Finding]:
    nodes = [v for v in report.nodes if v.verdict == "advertises"]
    if not nodes:
        return []  # no inventory yet, or upstream would not start: nothing more to say
    out = []
    for i, resource in enumerate(nodes[0].resources):
        verdicts = [v.resources[i] for v in nodes]
        if any(r.advertised for r in verdicts):
            continue
        why = verdicts[0].why or ""
        message = (
            f"resource {resource.resource!r} of the {report.kind}: upstream advertises 0 on all"
            f" {len(nodes)} nodes with an inventory ({nodes[0].node}: {why})"
        )
        out.append(
            _finding(
                RULE_MATCHES_NOTHING,
                "warning",
                f"{subject}/{resource.resource.split('/')[-1]}",
                message,
                None,
                path="spec.rdmaSharedDevicePlugin.config",
                reason=why,
                resource=resource.resource,
            )
        )
    return out


def _differs(report: PolicyAudit, subject: str) -> list[Finding]:
    out = []
    for verdict in report.nodes:
        for r in verdict.resources:
            if r.nicfleet is None:
                continue
            message = (
                f"{r.resource}: upstream advertises {r.advertised}, nicfleet would advertise"
                f" {r.nicfleet} ({r.nicfleet_why})"
            )
            out.append(
                _finding(
                    RULE_DIFFERS,
                    "warning",
                    subject,
                    message,
                    verdict.node,
                    path="spec.rdmaSharedDevicePlugin.config",
                    reason=message,
                    resource=r.resource,
                )
            )
    return out


def _finding(
    rule: AuditRule,
    severity: str,
    subject: str,
    message: str,
    node: str | None,
    *,
    path: str,
    reason: str,
    resource: str | None = None,
) -> Finding:
    return Finding(
        rule=rule,
        severity="critical" if severity == "critical" else "warning",
        node=node,
        subject=subject,
        message=message,
        evidence={
            "path": path,
            "reason": reason,
            "resource": resource,
            "fatal": severity == "critical",
        },
    )
