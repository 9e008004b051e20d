"""kmock as the API server is for ResourceSlices, shared by the publisher's integration
tests, the DRA end-to-end test and bench/dra_latency.py; `aggregator_api` declares what
the AggregatorService lists and watches besides (with `dra`, the DRA objects too).

kmock stores objects but knows no resourceVersion and no PUT: `ApiServer` adds what the
API server does for ResourceSlices (a new resourceVersion on every write, 409 for a
replace or delete whose version is stale, replace = the whole object), answers the next
writes with injected statuses, and tells `on_write` of every slice it stored (the bench
times the publisher by it).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any, Final

import aiohttp.web
import attrs
import kmock

SLICES = "resource.k8s.io/v1/resourceslices"
CLAIMS = "resource.k8s.io/v1/resourceclaims"
CLASSES = "resource.k8s.io/v1/deviceclasses"
PATH = f"/apis/{SLICES}"
# What an AggregatorService with `kube` lists and watches: (path, kind, namespaced).
AGGREGATOR_RESOURCES: Final = (
    (SLICES, "ResourceSlice", False),
    ("nicfleet.io/v1alpha1/nicfleetpolicies", "NicFleetPolicy", False),
    ("v1/nodes", "Node", False),
    ("v1/pods", "Pod", True),
    ("v1/events", "Event", True),
    ("coordination.k8s.io/v1/leases", "Lease", True),
)
# Its DRA lists (the claim answerer's watch, the trace's claims and classes): without
# both, the cluster view has no DRA (`dra_present` False).
DRA_RESOURCES: Final = (
    (CLAIMS, "ResourceClaim", True),
    (CLASSES, "DeviceClass", False),
)


def status(code: int, reason: str) -> aiohttp.web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
    return aiohttp.web.json_response({**body, "reason": reason}, status=code)


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    fail_writes: list[int] = attrs.field(factory=list)  # statuses for the next writes
    # Called with each ResourceSlice as stored by a create or replace.
    on_write: Callable[[dict[str, Any]], None] | None = None
    _versions: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1000))

    def stored(self, name: str) -> dict[str, Any] | None:
        key = (kmock.resource("resource.k8s.io", "v1", "resourceslices"), None, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return dict(self.objects[key].raw)

    def put_slice(self, obj: dict[str, Any]) -> None:
        """Store `obj` as the API server would hand it out (server-set metadata added)."""
        obj = copy.deepcopy(obj)
        obj["metadata"].update(
            uid=f"uid-{obj['metadata']['name']}",
            resourceVersion=str(next(self._versions)),
            generation=1,
            creationTimestamp="2026-12-02T04:00:00Z",
            managedFields=[{"manager": "someone", "operation": "Update"}],
        )
        self.objects[SLICES, None, obj["metadata"]["name"]] = obj

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        if not request.url.path.startswith(PATH) or request.method == "GET":
            return await super()._handle(request)
        if self.fail_writes:
            code = self.fail_writes.pop(0)
            return status(code, "Conflict" if code == 409 else "InternalError")
        name = request.url.path.removeprefix(PATH).strip("/")
        if request.method == "POST":
            request.data.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
            response = await super()._handle(request)
            self._written(str(request.data["metadata"].get("name", "")))
            return response
        old = self.stored(name)
        if old is None:
            return status(404, "NotFound")
        wanted = (
            request.data.get("metadata", {}).get("resourceVersion")
            if request.method == "PUT"
            else (request.data or {}).get("preconditions", {}).get("resourceVersion")
        )
        if wanted is not None and wanted != old["metadata"]["resourceVersion"]:
            return status(409, "Conflict")
        if request.method == "DELETE":
            return await super()._handle(request)
        new = copy.deepcopy(request.data)
        new["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[SLICES, None, name] = new  # a replace: nothing of the old is kept
        self._written(name)
        return aiohttp.web.json_response(new)

    def _written(self, name: str) -> None:
        stored = self.stored(name)
        if self.on_write is not None and stored is not None:
            self.on_write(stored)


def slices_api() -> ApiServer:
    api = ApiServer()
    api.resources[SLICES] = kmock.ResourceInfo(kind="ResourceSlice", namespaced=False)
    return api


def aggregator_api(node: str, *, node_uid: str | None = None, dra: bool = False) -> ApiServer:
    """kmock with what the aggregator lists and watches (with `dra`, ResourceClaims and
    DeviceClasses too) and `node`'s Node object (the slices' owner when it has `node_uid`)."""
    api = ApiServer()
    for path, kind, namespaced in (*AGGREGATOR_RESOURCES, *(DRA_RESOURCES if dra else ())):
        api.resources[path] = kmock.ResourceInfo(kind=kind, namespaced=namespaced)
    metadata = {"name": node} | ({"uid": node_uid} if node_uid is not None else {})
    api.objects["v1/nodes", None, node] = {"apiVersion": "v1", "kind": "Node", "metadata": metadata}
    return api


def port_state(obj: dict[str, Any] | None, device: str) -> str | None:
    """The slice's `portState` of DRA device `device`; None without the slice or device."""
    if obj is None:
        return None
    entry = [d for d in obj["spec"]["devices"] if d["name"] == device]
    return str(entry[0]["attributes"]["portState"]["string"]) if entry else None
