"""What to write so the API server holds each node's rdma.nicfleet.io ResourceSlices: the
desired pools (proto.draslices.build_slices) diffed against the observed slices into
create, update (with the observed resourceVersion) and delete actions. Each pool is built
with its node's own slice settings (sharing, rails) and owned by its Node object
(`metadata.ownerReferences`, so the garbage collector removes the slices of a deleted Node).

Pure: no I/O, no clock (staleness and the Node's uid are the caller's). Only slices with
`spec.driver == rdma.nicfleet.io` whose pool is named after their `spec.nodeName` are
ever planned over; any other slice, even one in a pool of the same name, is invisible here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from proto import dranames
from proto.draslices import PortStates, SliceSettings, build_slices
from proto.inventory import NodeSnapshot, PortStateName

# A stale node's ports: not known to be up, so every device reads unhealthy (the device
# plugin's rule wants ACTIVE) while the pool and its allocations stay in place.
STALE_STATE: Final[PortStateName] = "UNKNOWN"
# Metadata the server owns and a replace must not send back.
_SERVER_FIELDS: Final = ("managedFields",)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSource:
    """One node as the fleet holds it: its latest snapshot (link events already patched
    in by the fleet), whether it went quiet past the policy's staleAfter, the slice
    settings its agent asked for (None: the plan's) and its Node object's uid (None: not
    known, so no owner reference is written — never a wrong one)."""

    snapshot: NodeSnapshot
    stale: bool = False
    settings: SliceSettings | None = None
    node_uid: str | None = None


@dataclass(frozen=True, slots=True)
class Create:
    body: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


@dataclass(frozen=True, slots=True)
class Update:
    """A replace (PUT) guarded by `resource_version`: the server answers 409 when the
    slice changed since it was observed."""

    name: str
    resource_version: str | None
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Delete:
    name: str
    resource_version: str | None


Action = Create | Update | Delete


def owner_reference(node: str, uid: str) -> dict[str, Any]:
    """The slice's controller reference to its Node, as upstream's resourceslice
    controller writes it (no blockOwnerDeletion: that would need delete on nodes)."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}


def pool_of(obj: Mapping[str, Any]) -> str | None:
    """The pool a slice (or a planned body) belongs to."""
    pool = (obj.get("spec") or {}).get("pool")
    name = pool.get("name") if isinstance(pool, Mapping) else None
    return name if isinstance(name, str) else None


def owned(obj: Mapping[str, Any], driver: str = dranames.DRIVER) -> bool:
    """A slice this publisher may write: our driver, a node's own pool."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or spec.get("driver") != driver:
        return False
    pool = spec.get("pool")
    node = spec.get("nodeName")
    return isinstance(pool, Mapping) and isinstance(node, str) and pool.get("name") == node


def observed_pools(
    observed: Iterable[Mapping[str, Any]], driver: str = dranames.DRIVER
) -> dict[str, list[Mapping[str, Any]]]:
    """The owned slices by pool (= node) name; every other slice is dropped."""
    pools: dict[str, list[Mapping[str, Any]]] = {}
    for obj in observed:
        if owned(obj, driver):
            pools.setdefault(str(obj["spec"]["pool"]["name"]), []).append(obj)
    return pools


def stale_states(snapshot: NodeSnapshot) -> PortStates:
    return {(d.name, p.port): (STALE_STATE, None) for d in snapshot.devices for p in d.ports}


def plan(
    sources: Mapping[str, PoolSource],
    observed: Iterable[Mapping[str, Any]],
    *,
    cluster_nodes: Collection[str] | None,
    settings: SliceSettings,
    only: Collection[str] | None = None,
) -> list[Action]:
    """Every action, pool by pool in name order. `cluster_nodes`: the Node objects the API
    holds (None: not known, so nothing is deleted for want of a node); `only`: plan just
    these pools (the nodes a change named), None: all."""
    pools = observed_pools(observed, settings.driver)
    names = set(sources) | set(pools)
    if only is not None:
        names &= set(only)
    actions: list[Action] = []
    for node in sorted(names):
        gone = cluster_nodes is not None and node not in cluster_nodes
        actions.extend(
            plan_pool(node, sources.get(node), pools.get(node, []), gone=gone, settings=settings)
        )
    return actions


def plan_pool(
    node: str,
    source: PoolSource | None,
    observed: Sequence[Mapping[str, Any]],
    *,
    gone: bool,
    settings: SliceSettings,
) -> list[Action]:
    """One pool's actions: deletes, then updates, then creates (obsolete devices leave
    first, as upstream's resourceslice controller does).

    A node without a record (never heard, or forgotten) keeps its slices until its Node
    object is `gone`; then they are deleted. The pool's generation is the highest observed
    one, bumped when the device set changes, a slice is added or removed, or more than
    one slice changes — a single slice replaced in one call is never seen half-done, so
    an attribute change (a port going down) keeps it. A bump rewrites every slice. A
    slice whose owner reference to the Node is missing or names another uid is replaced
    too, without a bump (the devices are unchanged)."""
    if source is None or gone:
        return [Delete(_name(o), _version(o)) for o in observed] if gone else []
    states = stale_states(source.snapshot) if source.stale else {}
    current = max((_generation(o) for o in observed), default=0)
    desired = build_slices(source.snapshot, states, source.settings or settings)
    by_name = {_name(o): o for o in observed}
    wanted = {_name(d) for d in desired}
    obsolete = [o for o in observed if _name(o) not in wanted]
    new = [d for d in desired if _name(d) not in by_name]
    kept = [d for d in desired if _name(d) in by_name]
    changed = {
        _name(d)
        for d in kept
        if _content(by_name[_name(d)]) != _content(d) or _generation(by_name[_name(d)]) != current
    }
    bump = (
        current == 0
        or bool(obsolete)
        or bool(new)
        or len(changed) > 1
        or _device_names(observed) != _device_names(desired)
    )
    generation = max(current + 1, settings.generation) if bump else current
    actions: list[Action] = [Delete(_name(o), _version(o)) for o in obsolete]
    for body in kept:
        old = by_name[_name(body)]
        metadata = _metadata(old, node, source.node_uid)
        if bump or _name(body) in changed or metadata != _metadata(old, node, None):
            actions.append(Update(_name(body), _version(old), _with(body, generation, metadata)))
    for body in new:
        metadata = _metadata(body, node, source.node_uid)
        actions.append(Create(_with(body, generation, metadata)))
    return actions


def _with(body: Mapping[str, Any], generation: int, metadata: Mapping[str, Any]) -> dict[str, Any]:
    spec = dict(body["spec"])
    spec["pool"] = {**spec["pool"], "generation": generation}
    return {**body, "metadata": dict(metadata), "spec": spec}


def _metadata(old: Mapping[str, Any], node: str, uid: str | None) -> dict[str, Any]:
    """`old`'s metadata to write back: what others set (labels, their owner references)
    and the version the PUT is guarded by kept; with `uid`, the Node reference set to
    exactly that Node (any other Node reference dropped), without one left as found."""
    meta = {k: v for k, v in (old.get("metadata") or {}).items() if k not in _SERVER_FIELDS}
    if uid is None:
        return meta
    found = meta.get("ownerReferences")
    refs = list(found) if isinstance(found, list) else []
    ours = owner_reference(node, uid)
    # In place of the first Node reference, so an unchanged list compares equal.
    at = next((i for i, r in enumerate(refs) if _is_node(r)), len(refs))
    meta["ownerReferences"] = [*refs[:at], ours, *(r for r in refs[at:] if not _is_node(r))]
    return meta


def _is_node(ref: Any) -> bool:
    return isinstance(ref, Mapping) and ref.get("kind") == "Node" and ref.get("apiVersion") == "v1"


def _content(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    spec = obj.get("spec") or {}
    pool = spec.get("pool") or {}
    return (
        spec.get("driver"),
        spec.get("nodeName"),
        pool.get("name"),
        pool.get("resourceSliceCount"),
        spec.get("devices") or [],
        spec.get("allNodes"),
        spec.get("nodeSelector"),
        spec.get("sharedCounters"),
        spec.get("perDeviceNodeSelection"),
    )


def _device_names(slices: Iterable[Mapping[str, Any]]) -> set[str]:
    return {str(d.get("name")) for s in slices for d in (s.get("spec") or {}).get("devices") or []}


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _version(obj: Mapping[str, Any]) -> str | None:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return version if isinstance(version, str) else None


def _generation(obj: Mapping[str, Any]) -> int:
    value = ((obj.get("spec") or {}).get("pool") or {}).get("generation")
    return value if isinstance(value, int) else 0
