"""The `pod-interface` link: which of the pod's own interfaces are the RDMA device's, from
the newest validation's `verify` evidence on this node (GID addresses, device/net,
network-status device-info), else from the chain pods' Multus `network-status`.

Pure: a function of the chain context and the newest finished validation. A broken link
needs the pod's own view (verify); network-status alone says ok (its device-info names an
adapter the resource selects) or stays unknown: a missing entry is the `attachment` link's.
"""

from __future__ import annotations

from typing import Any, Final

from aggregator import podnetworks
from aggregator.trace.attachment import NETWORKS_ANNOTATION, chain_pods
from aggregator.trace.host import ChainContext, link_broken, link_ok, link_unknown
from aggregator.trace.tested import RECENT_S
from proto.http import Link, ValidationRecord
from proto.messages.validation import Reason, ValidationResult

POD_INTERFACE_LINK: Final = "pod-interface"
RESOURCE_ANNOTATION: Final = "k8s.v1.cni.cncf.io/resourceName"
FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})

# verify's reasons about the pod's interfaces (agent/verify: verdict, identify), with the fix;
# its other reasons (ports, verbs, char devices) belong to the links above or the tested path.
_FIXES: Final = {
    "no-rdma-device-in-pod": "the pod got no RDMA device at all: fix the device-plugin, "
    "advertised and allocatable links above; a pod gets one only through {resource} in its "
    "limits",
    "primary-interface-only": "request the RDMA network in `" + NETWORKS_ANNOTATION + "` "
    "(a NetworkAttachmentDefinition on the adapter's netdev; for a validation: nicfleetctl "
    "validate A B --resource {resource} --network NAD)",
    "gid-not-on-pod-interface": "attach the pod's secondary network to the allocated "
    "adapter: the NAD's master must be one of its netdevs (the attachment link lists them) "
    "or its `" + RESOURCE_ANNOTATION + "` must be {resource}",
    "attachment-not-allocated": "annotate the NAD with `" + RESOURCE_ANNOTATION + ": "
    "{resource}` so Multus hands the CNI the device the kubelet allocated to the pod",
    "attachment-interface-missing": "the CNI's result names an interface the pod does not "
    "have: check the CNI plugin's log on the node and recreate the pod",
}


def pod_interface_link(ctx: ChainContext, validation: ValidationRecord | None) -> Link:
    """verify's evidence broken -> broken; verify identified interfaces -> ok; a chain pod's
    network-status device-info on a selected adapter -> ok; otherwise unknown."""
    name = POD_INTERFACE_LINK
    command = f"nicfleetctl validate {ctx.node} <other-node> --resource {ctx.resource}"
    evidence: dict[str, Any] = {}
    seen = _network_status(ctx)
    if seen:
        evidence["network_status"] = seen
    sides = _sides(validation, ctx.node)
    if validation is None:
        evidence |= {"validated": "never validated", "command": command}
    elif not sides:
        evidence |= {
            "validation": validation.id,
            "note": f"validation {validation.id} ({validation.phase}) has no verify result "
            f"from {ctx.node}: {validation.reason or 'no reason given'}",
            "command": command,
        }
    for record, result in sides:
        verified = _verified(record, result, ctx.now)
        reasons = [r for r in result.reasons if r.code in _FIXES]
        if reasons:
            first = reasons[0]
            return link_broken(
                name,
                f"verify in {verified['pod']}: {first.message}",
                _FIXES[first.code].format(resource=ctx.resource),
                **verified,
                **evidence,
            )
        evidence.setdefault("verified", []).append(verified)
    proven = [v for v in evidence.get("verified", ()) if v["interfaces"] or v.get("infiniband")]
    fresh = [v for v in proven if v["age_s"] <= RECENT_S]
    if fresh:
        return link_ok(name, interfaces=fresh[0]["interfaces"], **evidence)
    matched = [s for s in seen if s.get("adapter_selected") is True]
    if matched:
        return link_ok(name, interfaces=[s["interface"] for s in matched], **evidence)
    if proven:
        age = proven[0]["age_s"] / 3600
        evidence["note"] = f"verify identified them {age:.0f}h ago; re-run: {command}"
    elif "verified" in evidence:
        evidence["note"] = "verify identified no pod interface as an RDMA device's"
    return link_unknown(name, **evidence)


def _sides(
    validation: ValidationRecord | None, node: str
) -> list[tuple[ValidationRecord, ValidationResult]]:
    """This node's verify results in the validation (both when it validated with itself)."""
    if validation is None:
        return []
    server, client = validation.nodes
    found = [validation.server if server == node else None]
    found.append(validation.client if client == node else None)
    return [(validation, r) for r in found if r is not None]


def _verified(record: ValidationRecord, result: ValidationResult, now: float) -> dict[str, Any]:
    """What one side's verify found: the pod's RDMA interfaces with their sources."""
    sources: dict[str, list[str]] = {}
    devices: dict[str, list[str]] = {}
    for found in result.evidence.rdma_interfaces:
        have = sources.setdefault(found.interface, [])
        have.extend(s for s in found.sources if s not in have)
        devices.setdefault(found.interface, []).append(found.device)
    verified: dict[str, Any] = {
        "validation": record.id,
        "pod": f"{record.namespace}/{result.pod or result.role or '?'}",
        "verdict": result.verdict,
        "interfaces": [f"{i} ({', '.join(s)})" for i, s in sources.items()],
        "devices": devices,
        "pod_interfaces": [i.name for i in result.evidence.interfaces],
        "age_s": now - (record.finished_at or record.updated_at),
    }
    reasons = [_reason(r) for r in result.reasons if r.code in _FIXES]
    if reasons:
        verified["reasons"] = reasons
    if not sources and result.verdict == "rdma-path" and _infiniband(result):
        # InfiniBand verbs address the port by LID/GID: a pod needs no RDMA netdev for them.
        verified["infiniband"] = "verify proved the RDMA path with no RDMA netdev in the pod"
    return verified


def _reason(reason: Reason) -> dict[str, str]:
    return {"code": reason.code, "message": reason.message}


def _infiniband(result: ValidationResult) -> bool:
    ports = [p for d in result.evidence.devices for p in d.ports]
    return bool(ports) and all(p.link_layer == "InfiniBand" for p in ports)


def _network_status(ctx: ChainContext) -> list[dict[str, Any]]:
    """Each interface the chain pods got for a secondary network, and whether its
    device-info names an adapter the resource selects (None: names none, no inventory)."""
    devices = ctx.selected if ctx.snapshot is not None else ()
    seen: list[dict[str, Any]] = []
    for pod in chain_pods(ctx):
        if pod.phase in FINISHED_PHASES:
            continue
        for status in pod.network_status:
            if not status.interface:
                continue
            device = status.rdma_device or status.pci_address
            matches = (
                podnetworks.device_matches(status.pci_address, status.rdma_device, devices)
                if devices
                else None
            )
            seen.append(
                {
                    "pod": f"{pod.namespace}/{pod.name}",
                    "network": status.name,
                    "interface": status.interface + (f" (device-info: {device})" if device else ""),
                    "ips": list(status.ips),
                    "adapter_selected": matches,
                }
            )
    return seen
