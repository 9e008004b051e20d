"""DRA API objects (plain JSON dicts) -> the cluster view's DRA Structs: a Pod's
spec.resourceClaims and the kubelet's per-device health of them, ResourceClaims,
ResourceSlices and DeviceClasses of resource.k8s.io/v1, every driver's.

Pure: `aggregator.kube.client` lists the objects. A malformed object or entry is skipped,
never raised; lists are capped so one hostile object cannot make the view huge. Slices and
classes go through `aggregator.dra.objects` (the explainer's parser), so attribute names
are qualified and values read one way only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from aggregator.cluster import (
    ClaimHealth,
    DraClaim,
    DraDevice,
    DraDeviceClass,
    DraResult,
    PodClaim,
)
from aggregator.dra.claims import pinned_nodes
from aggregator.dra.objects import InvalidObject, parse_class, parse_slice

# The API's own limits where it has them (resource/v1 types.go: 32 allocation results,
# 256 reservedFor entries, 128 devices per slice); the rest only bound hostile input.
MAX_POD_CLAIMS: Final = 128
MAX_HEALTH_ENTRIES: Final = 256  # allocatedResourcesStatus entries, and resources of each
# Every container's devices together: 32 results per claim over a few claims and
# containers is far below; the per-list caps alone multiply to millions.
MAX_POD_HEALTH: Final = 4_096
MAX_RESULTS: Final = 32
MAX_RESERVED: Final = 256
MAX_SLICE_DEVICES: Final = 128
MAX_CLAIMS: Final = 50_000
MAX_DEVICES: Final = 100_000
MAX_CLASSES: Final = 4_096
MAX_NAME: Final = 253  # a DNS subdomain: object, pool and driver names
HEALTH_STATES: Final = frozenset({"Healthy", "Unhealthy", "Unknown"})
CLAIM_PREFIX: Final = "claim:"  # the kubelet's allocatedResourcesStatus name for DRA


# --- Pods -------------------------------------------------------------------------------


def pod_claims(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[PodClaim, ...]:
    """spec.resourceClaims, each with the ResourceClaim it names: resourceClaimName, or for
    resourceClaimTemplateName the name the resourceclaim controller generated and wrote
    into status.resourceClaimStatuses (None until it has)."""
    generated: dict[str, str | None] = {}
    for entry in _mappings(status.get("resourceClaimStatuses"), MAX_POD_CLAIMS):
        name = _name(entry.get("name"))
        if name is not None:
            generated[name] = _name(entry.get("resourceClaimName"))
    found: list[PodClaim] = []
    seen: set[str] = set()
    for entry in _mappings(spec.get("resourceClaims"), MAX_POD_CLAIMS):
        name = _name(entry.get("name"))
        claim = _name(entry.get("resourceClaimName"))
        template = _name(entry.get("resourceClaimTemplateName"))
        # The API requires exactly one source and unique entry names; anything else is
        # not a pod the API server accepted, so not one to explain.
        if name is None or name in seen or (claim is None) == (template is None):
            continue
        seen.add(name)
        if template is not None:
            claim = generated.get(name)
        found.append(PodClaim(name=name, claim=claim, template=template))
    return tuple(found)


def claim_health(status: Mapping[str, Any]) -> tuple[ClaimHealth, ...]:
    """The kubelet's allocatedResourcesStatus entries named `claim:<entry>[/<request>]`
    (KEP-4680), containers' and init containers', one ClaimHealth per device, at most
    MAX_POD_HEALTH in all."""
    found: list[ClaimHealth] = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in _mappings(status.get(key), MAX_POD_CLAIMS):
            name = _name(container.get("name"))
            if name is None:
                continue
            entries = _mappings(container.get("allocatedResourcesStatus"), MAX_HEALTH_ENTRIES)
            for entry in entries:
                found.extend(_entry_health(name, entry))
                if len(found) >= MAX_POD_HEALTH:
                    return tuple(found[:MAX_POD_HEALTH])
    return tuple(found)


def _entry_health(container: str, entry: Mapping[str, Any]) -> list[ClaimHealth]:
    label = entry.get("name")
    if not isinstance(label, str) or not label.startswith(CLAIM_PREFIX):
        return []  # a device plugin's resource ("nvidia.com/gpu"): not a claim
    claim, _, request = label.removeprefix(CLAIM_PREFIX).partition("/")
    if not claim:
        return []
    found = []
    for resource in _mappings(entry.get("resources"), MAX_HEALTH_ENTRIES):
        resource_id = resource.get("resourceID")
        if not isinstance(resource_id, str) or not resource_id:
            continue
        health = resource.get("health")
        found.append(
            ClaimHealth(
                container=container,
                entry=claim,
                request=request or None,
                resource_id=resource_id,
                # omitempty upstream: no health reported reads as Unknown, as kubectl shows it
                health=health if health in HEALTH_STATES else "Unknown",
            )
        )
    return found


# --- ResourceClaims ---------------------------------------------------------------------


def claim_from_object(obj: object) -> DraClaim | None:
    """A ResourceClaim with every driver's allocation results, the node its allocation is
    pinned to and the pods it is reserved for; None without a namespace and name."""
    if not isinstance(obj, Mapping):
        return None
    metadata = _mapping(obj.get("metadata"))
    namespace, name = _name(metadata.get("namespace")), _name(metadata.get("name"))
    if namespace is None or name is None:
        return None
    status = _mapping(obj.get("status"))
    allocation = status.get("allocation")
    allocated = isinstance(allocation, Mapping)
    allocation = _mapping(allocation)
    results = _mappings(_mapping(allocation.get("devices")).get("results"), MAX_RESULTS)
    # The scheduler pins node-local devices with one `metadata.name In [node]` term.
    pinned = pinned_nodes(allocation.get("nodeSelector"))
    spec = obj.get("spec")
    return DraClaim(
        namespace=namespace,
        name=name,
        uid=_name(metadata.get("uid")) or "",
        spec=dict(spec) if isinstance(spec, Mapping) else {},
        allocated=allocated,
        results=tuple(r for r in map(_result, results) if r is not None),
        node=next(iter(pinned)) if pinned is not None and len(pinned) == 1 else None,
        reserved_for=tuple(
            f"{namespace}/{ref['name']}"
            for ref in _mappings(status.get("reservedFor"), MAX_RESERVED)
            if ref.get("resource") == "pods"
            and not ref.get("apiGroup")
            and _name(ref.get("name")) is not None
        ),
        deleting=bool(metadata.get("deletionTimestamp")),
    )


def _result(raw: Mapping[str, Any]) -> DraResult | None:
    request, driver = _name(raw.get("request")), _name(raw.get("driver"))
    pool, device = _name(raw.get("pool")), _name(raw.get("device"))
    if request is None or driver is None or pool is None or device is None:
        return None
    return DraResult(
        request=request, driver=driver, pool=pool, device=device,
        share_id=_name(raw.get("shareID")),
    )  # fmt: skip


def claims_from(items: Iterable[object]) -> tuple[DraClaim, ...]:
    """Every parseable claim of a list, by namespace and name, at most MAX_CLAIMS."""
    found = [c for c in map(claim_from_object, items) if c is not None]
    return tuple(sorted(found, key=lambda c: (c.namespace, c.name))[:MAX_CLAIMS])


# --- ResourceSlices ---------------------------------------------------------------------


def devices_from_slice(obj: object) -> tuple[DraDevice, ...]:
    """The devices of one ResourceSlice of any driver; a device that does not parse is
    skipped alone (its neighbours stay), a slice without driver or pool gives none."""
    if not isinstance(obj, Mapping):
        return ()
    name = _name(_mapping(obj.get("metadata")).get("name")) or ""
    spec = _mapping(obj.get("spec"))
    found: list[DraDevice] = []
    for entry in _mappings(spec.get("devices"), MAX_SLICE_DEVICES):
        # List items carry no `kind`; one device per parse so a bad one hides no other.
        one = {"kind": "ResourceSlice", "spec": {**spec, "devices": [entry]}}
        try:
            parsed = parse_slice(one, f"ResourceSlice {name}", any_node=True)
        except InvalidObject:
            continue
        found.extend(
            DraDevice(
                driver=d.driver,
                pool=d.pool,
                node=d.node,
                name=d.name,
                slice=name,
                attributes=dict(d.attributes),
                capacity=dict(d.capacity),
            )
            for d in parsed
        )
    return tuple(found)


def devices_from(items: Iterable[object]) -> tuple[DraDevice, ...]:
    """Every device of every slice, by driver, pool, name, at most MAX_DEVICES."""
    found = [d for item in items for d in devices_from_slice(item)]
    found.sort(key=lambda d: (d.driver, d.pool, d.name, d.slice))
    return tuple(found[:MAX_DEVICES])


# --- DeviceClasses ----------------------------------------------------------------------


def device_class_from_object(obj: object) -> DraDeviceClass | None:
    """A DeviceClass's name and CEL selectors; None when it does not parse (a class with a
    selector dropped would match devices the API server's would not)."""
    if not isinstance(obj, Mapping):
        return None
    try:
        parsed = parse_class({**obj, "kind": "DeviceClass"}, "DeviceClass")
    except InvalidObject:
        return None
    return DraDeviceClass(name=parsed.name, selectors=tuple(s.expression for s in parsed.selectors))


def classes_from(items: Iterable[object]) -> tuple[DraDeviceClass, ...]:
    found = [c for c in map(device_class_from_object, items) if c is not None]
    return tuple(sorted(found, key=lambda c: c.name)[:MAX_CLASSES])


# --- shapes -----------------------------------------------------------------------------


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _mappings(value: object, limit: int) -> list[Mapping[str, Any]]:
    """The mappings of a list, at most `limit` entries read; anything else: none."""
    if not isinstance(value, list):
        return []
    return [item for item in value[:limit] if isinstance(item, Mapping)]


def _name(value: object) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_NAME else None
