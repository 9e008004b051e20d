"""Kubernetes API objects (plain JSON dicts) -> nicfleet's cluster model, and API statuses
-> KubeErrors. Pure: `aggregator.kube.client` does the I/O. Turns a NicFleetPolicy into a `Policy`
(or a `PolicyObjectError` naming the field), Nodes, Pods and NetworkAttachmentDefinitions
into cluster Structs. A malformed object never raises: it is skipped or reported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from aggregator.cluster import (
    AppliedState,
    ClusterNode,
    ComponentRole,
    DaemonSetState,
    NetworkAttachment,
    NodeCondition,
    OperatorStatus,
    PodRequest,
    SchedulingEvent,
)
from aggregator.errors import KubeError, KubeNotFoundError, KubeUnavailableError
from aggregator.kube import draobjects, networks
from aggregator.placement import required_affinity_from, taints_from, tolerations_from
from proto.policy import Policy, PolicyError, load_policies

RESOURCE_NAME_ANNOTATION: Final = "k8s.v1.cni.cncf.io/resourceName"
NETWORKS_ANNOTATION: Final = "k8s.v1.cni.cncf.io/networks"
LABEL_PREFIX: Final = "nicfleet.io/"
_DOCUMENT_PREFIX: Final = "document 0: "

WatchKind = Literal["ADDED", "MODIFIED", "DELETED"]


class WatchEvent(msgspec.Struct, frozen=True, kw_only=True):
    type: WatchKind
    object: dict[str, Any]


class Listing(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[dict[str, Any], ...]
    resource_version: str | None


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """coordination.k8s.io/v1 Lease spec, the part leader election reads and writes."""

    holder: str | None
    duration_s: int | None = None
    renew_time: str | None = None  # RFC 3339 MicroTime, as the server stores it
    transitions: int | None = None
    resource_version: str | None = None  # optimistic concurrency on replace


def listing_from(raw: object) -> Listing:
    """A list response's items (dicts only) and resourceVersion."""
    if not isinstance(raw, dict):
        return Listing(items=(), resource_version=None)
    items = tuple(item for item in raw.get("items") or () if isinstance(item, dict))
    metadata = raw.get("metadata") or {}
    version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    return Listing(items=items, resource_version=version if isinstance(version, str) else None)


def error_from_status(
    what: str, status: int | None, reason: str | None, body: bytes | str | None
) -> KubeError:
    """The KubeError for an HTTP status; the message of a Status body when there is one."""
    message = reason or ""
    try:
        decoded = json.loads(body) if body else {}
        message = decoded.get("message") or message
    except (ValueError, TypeError, AttributeError):
        pass
    text = f"{what}: {status} {message}".strip()
    if status == 404:
        return KubeNotFoundError(text, status=status)
    if status is None or status >= 500 or status == 429:
        return KubeUnavailableError(text, status=status)
    return KubeError(text, status=status)


class PolicyObjectError(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # the object's metadata.name ("" when even that is missing)
    path: str  # field path, e.g. "$.spec.expect.mtu"
    reason: str
    generation: int | None = None

    def __str__(self) -> str:
        return f"NicFleetPolicy {self.name}: {self.path}: {self.reason}"


class PolicyObject(msgspec.Struct, frozen=True, kw_only=True):
    """One NicFleetPolicy as the API server holds it: parsed, or the reason it is not."""

    name: str
    generation: int | None = None  # metadata.generation, for status.observedGeneration
    uid: str | None = None
    policy: Policy | None = None
    error: PolicyObjectError | None = None


def policy_from_object(obj: Mapping[str, Any]) -> PolicyObject:
    """Validate a NicFleetPolicy object with the same loader as `--policy FILE`."""
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    raw_name = metadata.get("name")
    name = raw_name if isinstance(raw_name, str) else ""
    generation = metadata.get("generation")
    generation = generation if isinstance(generation, int) else None
    uid = metadata.get("uid") if isinstance(metadata.get("uid"), str) else None
    # Only what the policy model knows: the server adds uid, resourceVersion, managedFields
    # and the status subresource, none of which is the user's document.
    document: dict[str, Any] = {
        key: value for key, value in obj.items() if key not in ("metadata", "status")
    }
    document["metadata"] = {
        key: metadata[key] for key in ("name", "labels") if metadata.get(key) is not None
    }
    try:
        (policy,) = load_policies(json.dumps(document), source=f"NicFleetPolicy/{name}")
    except PolicyError as exc:
        path = exc.path.removeprefix(_DOCUMENT_PREFIX)
        error = PolicyObjectError(name=name, path=path, reason=exc.reason, generation=generation)
        return PolicyObject(name=name, generation=generation, uid=uid, error=error)
    except (TypeError, ValueError) as exc:  # not JSON-serializable: cannot come from the API
        error = PolicyObjectError(name=name, path="$", reason=str(exc), generation=generation)
        return PolicyObject(name=name, generation=generation, uid=uid, error=error)
    return PolicyObject(name=name, generation=generation, uid=uid, policy=policy)


def node_from_object(obj: Mapping[str, Any]) -> ClusterNode | None:
    """A Node's name, uid, labels, allocatable and capacity; None without a name."""
    metadata = _mapping(obj.get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return None
    status = _mapping(obj.get("status"))
    uid = metadata.get("uid")
    return ClusterNode(
        name=name,
        uid=uid if isinstance(uid, str) and uid else None,
        labels=_strings(metadata.get("labels")),
        allocatable=_strings(status.get("allocatable")),
        capacity=_strings(status.get("capacity")),
        conditions=tuple(
            NodeCondition(
                type=str(c["type"]),
                status=str(c.get("status") or "Unknown"),
                reason=_opt_text(c.get("reason")),
                message=_opt_text(c.get("message")),
            )
            for c in map(_mapping, _list(status.get("conditions")))
            if isinstance(c.get("type"), str)
        ),
        taints=taints_from(_mapping(obj.get("spec")).get("taints")),
    )


def pod_request_from_object(obj: Mapping[str, Any], prefixes: tuple[str, ...]) -> PodRequest | None:
    """A Pod asking for a resource under one of `prefixes` ("rdma/") or any device-plugin
    (extended) resource, attaching a network (`k8s.v1.cni.cncf.io/networks`) or naming
    DRA claims (spec.resourceClaims); else None: a pod with none has no RDMA chain."""
    metadata = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    requests: dict[str, int] = {}
    containers = [*_list(spec.get("containers")), *_list(spec.get("initContainers"))]
    for container in containers:
        resources = _mapping(_mapping(container).get("resources"))
        # Extended resources must be requested in limits (requests default to them).
        for section in ("limits", "requests"):
            for resource, amount in _mapping(resources.get(section)).items():
                if not (str(resource).startswith(prefixes) or extended_resource(str(resource))):
                    continue
                count = _quantity(amount)
                if count is not None:
                    requests[resource] = max(requests.get(resource, 0), count)
    annotations = _strings(metadata.get("annotations"))
    status = _mapping(obj.get("status"))
    claims = draobjects.pod_claims(spec, status)
    if not requests and not claims and not annotations.get(NETWORKS_ANNOTATION, "").strip():
        return None
    namespace = str(metadata.get("namespace") or "default")
    node = spec.get("nodeName")
    phase = status.get("phase")
    # The scheduler's PodScheduled=False/Unschedulable condition outlives its Events (1 h).
    scheduled = _condition(status, "PodScheduled")
    unschedulable = (
        _opt_text(scheduled.get("message")) or "Unschedulable"
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
        else None
    )
    return PodRequest(
        namespace=namespace,
        name=str(metadata.get("name") or ""),
        node=node if isinstance(node, str) else None,
        phase=phase if isinstance(phase, str) else None,
        requests=requests,
        networks=parse_networks(annotations.get(NETWORKS_ANNOTATION, ""), namespace),
        networks_error=networks_error(annotations.get(NETWORKS_ANNOTATION, "")),
        network_status=networks.parse_network_status(
            annotations.get(networks.NETWORK_STATUS_ANNOTATION)
            or annotations.get(networks.OLD_NETWORK_STATUS_ANNOTATION)
        ),
        unschedulable=unschedulable,
        claims=claims,
        claim_health=draobjects.claim_health(status) if claims else (),
    )


def extended_resource(name: str) -> bool:
    """A device plugin's (extended) resource, as Kubernetes tells them from native ones
    (v1helper.IsExtendedResourceName): a domain-prefixed name outside kubernetes.io, not a
    quota's `requests.` name. cpu, memory, hugepages-2Mi: native."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


# --- the components the chain needs (aggregator.trace.components) ------------------------

# How the Network Operator (manifests/state-*/), Multus and NV-IPAM name their DaemonSets:
# exact names first, then the operator's labels (the OFED/DOCA driver's name has the OS in it).
COMPONENT_NAMES: Final[Mapping[str, ComponentRole]] = {
    "kube-multus-ds": "multus",
    "nv-ipam-node": "nv-ipam",
    "whereabouts": "whereabouts",
    "cni-plugins-ds": "cni-plugins",
    "rdma-shared-dp-ds": "rdma-shared-dp",
}
OFED_LABEL: Final = "nvidia.com/ofed-driver"  # on the mofed-<os><ver>-ds DaemonSet and its pods
FAILED_SCHEDULING: Final = "FailedScheduling"


def component_role(name: str, labels: Mapping[str, str]) -> ComponentRole | None:
    """Which component of the chain a DaemonSet is, by its name or labels; None: not ours."""
    if name in COMPONENT_NAMES:
        return COMPONENT_NAMES[name]
    if OFED_LABEL in labels or (name.startswith("mofed-") and name.endswith("-ds")):
        return "driver"
    if name == "doca-driver" or name.startswith("doca-driver-"):
        return "driver"
    app = labels.get("app")
    if app == "rdma-shared-dp":
        return "rdma-shared-dp"
    if app == "multus":
        return "multus"
    return None


class DaemonPod(msgspec.Struct, frozen=True, kw_only=True):
    """A pod a DaemonSet owns: which node it is on and whether it is Ready."""

    namespace: str
    owner: str  # the DaemonSet's name (ownerReferences, kind DaemonSet, controller)
    node: str
    ready: bool


def daemon_pod_from_object(obj: Mapping[str, Any]) -> DaemonPod | None:
    """A pod controlled by a DaemonSet and bound to a node, else None."""
    metadata = _mapping(obj.get("metadata"))
    owner = next(
        (
            ref.get("name")
            for ref in map(_mapping, _list(metadata.get("ownerReferences")))
            if ref.get("kind") == "DaemonSet" and ref.get("controller") is not False
        ),
        None,
    )
    node = _mapping(obj.get("spec")).get("nodeName")
    if not isinstance(owner, str) or not isinstance(node, str) or not node:
        return None
    ready = _condition(_mapping(obj.get("status")), "Ready").get("status") == "True"
    return DaemonPod(
        namespace=str(metadata.get("namespace") or "default"), owner=owner, node=node, ready=ready
    )


def daemonset_from_object(
    obj: Mapping[str, Any], pods: tuple[DaemonPod, ...]
) -> DaemonSetState | None:
    """A DaemonSet of the chain with its status counts and the nodes of its `pods`; None
    when it is none of the components the chain needs."""
    metadata = _mapping(obj.get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return None
    role = component_role(name, _strings(metadata.get("labels")))
    if role is None:
        return None
    namespace = str(metadata.get("namespace") or "default")
    status = _mapping(obj.get("status"))
    template = _mapping(_mapping(_mapping(obj.get("spec")).get("template")).get("spec"))
    mine = [p for p in pods if p.namespace == namespace and p.owner == name]
    ready = {p.node for p in mine if p.ready}
    return DaemonSetState(
        namespace=namespace,
        name=name,
        role=role,
        node_selector=_strings(template.get("nodeSelector")),
        affinity=required_affinity_from(template.get("affinity")),
        tolerations=tolerations_from(template.get("tolerations")),
        host_network=template.get("hostNetwork") is True,
        template_node=_opt_text(template.get("nodeName")),
        desired=_count(status.get("desiredNumberScheduled")),
        ready=_count(status.get("numberReady")),
        available=_count(status.get("numberAvailable")),
        updated=_count(status.get("updatedNumberScheduled")),
        ready_nodes=tuple(sorted(ready)),
        unready_nodes=tuple(sorted({p.node for p in mine} - ready)),
    )


def scheduling_event_from_object(obj: Mapping[str, Any]) -> SchedulingEvent | None:
    """A FailedScheduling Event about a Pod, core/v1 (involvedObject, count, lastTimestamp)
    or events.k8s.io/v1 (regarding, note, series, eventTime) shaped; else None."""
    if obj.get("reason") != FAILED_SCHEDULING:
        return None
    about = _mapping(obj.get("involvedObject") or obj.get("regarding"))
    name = about.get("name")
    if about.get("kind") != "Pod" or not isinstance(name, str):
        return None
    message = obj.get("message") if "message" in obj else obj.get("note")
    series = _mapping(obj.get("series"))
    count = series.get("count") if series else obj.get("count")
    last = (
        obj.get("lastTimestamp")
        or series.get("lastObservedTime")
        or obj.get("eventTime")
        or obj.get("deprecatedLastTimestamp")
    )
    metadata = _mapping(obj.get("metadata"))
    return SchedulingEvent(
        namespace=str(about.get("namespace") or metadata.get("namespace") or "default"),
        pod=name,
        message=str(message or ""),
        count=count if isinstance(count, int) and count > 0 else 1,
        last_seen=last if isinstance(last, str) else None,
    )


def operator_status_from_object(obj: Mapping[str, Any] | None) -> OperatorStatus | None:
    """`status` of a NicClusterPolicy: state, reason and appliedStates[]; None without one."""
    if obj is None:
        return None
    status = _mapping(obj.get("status"))
    applied = tuple(
        AppliedState(
            name=str(a["name"]),
            state=str(a.get("state") or ""),
            message=_opt_text(a.get("message")),
        )
        for a in map(_mapping, _list(status.get("appliedStates")))
        if isinstance(a.get("name"), str)
    )
    return OperatorStatus(
        state=_opt_text(status.get("state")),
        reason=_opt_text(status.get("reason")),
        applied=applied,
    )


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return next(
        (c for c in map(_mapping, _list(status.get("conditions"))) if c.get("type") == kind), {}
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _opt_text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def attachment_from_object(obj: Mapping[str, Any]) -> NetworkAttachment | None:
    """A NetworkAttachmentDefinition: its resourceName annotation and CNI `master`."""
    metadata = _mapping(obj.get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return None
    annotations = _strings(metadata.get("annotations"))
    config = networks.parse_cni_config(_mapping(obj.get("spec")).get("config"))
    return NetworkAttachment(
        namespace=str(metadata.get("namespace") or "default"),
        name=name,
        resource_name=annotations.get(RESOURCE_NAME_ANNOTATION),
        master=config.master,
        pci_address=config.pci_address,
        cni_type=config.cni_type,
        ipam_type=config.ipam_type,
        ipam_pools=config.ipam_pools,
        ipam_pool_type=config.ipam_pool_type,
        ipam_range=config.ipam_range,
        config_error=config.error,
        ipam_ranges=config.ipam_ranges,
        ipam_network_name=config.ipam_network_name,
        ipam_node_slice_size=config.ipam_node_slice_size,
        config_name=config.config_name,
    )


def networks_error(annotation: str) -> str | None:
    """Why Multus would refuse the `networks` annotation (a JSON list that is not one)."""
    text = annotation.strip()
    if not text.startswith("["):
        return None
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"{NETWORKS_ANNOTATION} is not valid JSON ({exc.msg})"
    if not isinstance(items, list) or not all(
        isinstance(i, Mapping) and isinstance(i.get("name"), str) for i in items
    ):
        return f"{NETWORKS_ANNOTATION} is not a list of {{name, namespace, interface}}"
    return None


def parse_networks(annotation: str, namespace: str) -> tuple[str, ...]:
    """`k8s.v1.cni.cncf.io/networks`: "a, ns/b" or a JSON list of {name, namespace}."""
    text = annotation.strip()
    if not text:
        return ()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            return ()
        found = []
        for item in items if isinstance(items, list) else []:
            if isinstance(item, Mapping) and isinstance(item.get("name"), str):
                found.append(f"{item.get('namespace') or namespace}/{item['name']}")
        return tuple(found)
    names = []
    for part in text.split(","):
        part = part.strip().split("@", 1)[0]  # "name@ifname"
        if part:
            names.append(part if "/" in part else f"{namespace}/{part}")
    return tuple(names)


def _quantity(value: object) -> int | None:
    """Extended resources are whole numbers ("1", 1); anything else is not a count."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _strings(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in _mapping(value).items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class TokenReviewResult:
    """`status` of one TokenReview as the API server answered it."""

    authenticated: bool
    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()
    audiences: tuple[str, ...] = ()
    error: str = ""  # the authenticator's reason when not authenticated
    # user.extra, e.g. `authentication.kubernetes.io/node-name` of a node-bound SA token.
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def result_from_review(raw: Any) -> TokenReviewResult:
    """The `status` of a TokenReview object; ValueError when it is not one."""
    if not isinstance(raw, dict):
        raise ValueError("answer is not an object")
    status = raw.get("status")
    if not isinstance(status, dict):
        raise ValueError("answer has no status")
    user = status.get("user") or {}
    if not isinstance(user, dict):
        raise ValueError("status.user is not an object")
    return TokenReviewResult(
        authenticated=status.get("authenticated") is True,
        username=_text(user.get("username")),
        uid=_text(user.get("uid")),
        groups=_texts(user.get("groups")),
        audiences=_texts(status.get("audiences")),
        error=_text(status.get("error")),
        extra={str(k): _texts(v) for k, v in _mapping(user.get("extra")).items()},
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _texts(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(item for item in value if isinstance(item, str))
