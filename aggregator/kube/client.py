"""Every Kubernetes API call the aggregator makes, via the official client's asyncio flavour
(`kubernetes.aio` in kubernetes 37.0.2); the only module importing `kubernetes`. Owns
connecting, list/watch of policies, nodes, pods, NADs and IP pools, the read-only lists
behind the trace's scheduling and components links (FailedScheduling Events, DaemonSets,
the NicClusterPolicy's status), every driver's DRA claims, slices and device classes
(read only), the few writes (policy status, Events, `nicfleet.io/*` labels, the leader
Lease, pair-validation Pods, rdma.nicfleet.io ResourceSlices), TokenReviews of API bearer
tokens, and turning client errors into KubeErrors. The bodies it sends and the decoding
of the answers are pure, in payloads.py; every call stays here.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, cast

import aiohttp

from aggregator.cluster import (
    DaemonSetState,
    DraClaim,
    DraDevice,
    DraDeviceClass,
    HeldAddresses,
    IpPool,
    NetworkAttachment,
    OperatorStatus,
    PodRequest,
    PoolKind,
    SchedulingEvent,
)
from aggregator.errors import KubeError, KubeNotFoundError, KubeUnavailableError
from aggregator.kube import draobjects, payloads
from aggregator.kube.networks import held_addresses_from_object, ip_pool_from_object
from aggregator.kube.objects import (
    LeaseRecord,
    Listing,
    TokenReviewResult,
    WatchEvent,
    attachment_from_object,
    daemon_pod_from_object,
    daemonset_from_object,
    listing_from,
    operator_status_from_object,
    pod_request_from_object,
    result_from_review,
    scheduling_event_from_object,
)
from proto import dranames

if TYPE_CHECKING:  # imported when connecting: `kubernetes` costs ~0.4 s at every start
    from kubernetes.aio import client as k8s

GROUP: Final = "nicfleet.io"
VERSION: Final = "v1alpha1"
PLURAL: Final = "nicfleetpolicies"
NAD = ("k8s.cni.cncf.io", "v1", "network-attachment-definitions")
NV_IPAM_IPPOOLS = ("nv-ipam.nvidia.com", "v1alpha1", "ippools")
NV_IPAM_CIDRPOOLS = ("nv-ipam.nvidia.com", "v1alpha1", "cidrpools")
WHEREABOUTS_IPPOOLS = ("whereabouts.cni.cncf.io", "v1alpha1", "ippools")
WHEREABOUTS_NODESLICEPOOLS = ("whereabouts.cni.cncf.io", "v1alpha1", "nodeslicepools")
NIC_CLUSTER_POLICY = ("mellanox.com", "v1alpha1", "nicclusterpolicies", "nic-cluster-policy")
RESOURCE_CLAIMS = ("resource.k8s.io", "v1", "resourceclaims")  # DRA (aggregator.dra.claims)
# DRA ResourceSlices: the aggregator publishes its driver's (aggregator.dra.publisher) and
# reads every driver's into the cluster view (the trace, the DRA rules).
RESOURCE_SLICES = ("resource.k8s.io", "v1", "resourceslices")
DEVICE_CLASSES = ("resource.k8s.io", "v1", "deviceclasses")  # the cluster view, read only
MERGE_PATCH: Final = "application/merge-patch+json"


@dataclass(frozen=True, kw_only=True)
class KubeSettings:
    """How to reach the API server; exactly one of host/kubeconfig/in_cluster is used."""

    host: str | None = None  # explicit URL (tests, `kubectl proxy`), no credentials
    kubeconfig: Path | None = None
    context: str | None = None
    in_cluster: bool = False
    event_namespace: str = "default"  # Events about cluster-scoped objects (Node, policy)
    lease_namespace: str = "nicfleet-system"
    request_timeout_s: float = 10.0
    watch_timeout_s: int = 300  # server-side end of one watch; then list again
    resource_prefixes: tuple[str, ...] = ("rdma/",)  # which pod requests matter
    validation_namespace: str = "nicfleet-system"  # pair-validation pods (docs/validation.md)


class KubeClient:
    """One API connection. Build with `await KubeClient.connect(settings)`, then `close()`."""

    def __init__(self, api: k8s.ApiClient, settings: KubeSettings) -> None:
        from kubernetes.aio import client as k8s

        self._api: Any = api
        self._settings = settings
        self._core = k8s.CoreV1Api(api)
        self._apps = k8s.AppsV1Api(api)
        self._custom = k8s.CustomObjectsApi(api)
        self._leases = k8s.CoordinationV1Api(api)
        self._authn = k8s.AuthenticationV1Api(api)

    @classmethod
    async def connect(cls, settings: KubeSettings) -> KubeClient:
        from kubernetes.aio import client as k8s
        from kubernetes.aio import config

        k8s_config: Any = config  # no annotations in this part of the client
        configuration = k8s.Configuration()
        try:
            if settings.host is not None:
                configuration.host = settings.host.rstrip("/")
            elif settings.in_cluster:
                k8s_config.load_incluster_config(client_configuration=configuration)
            else:
                await k8s_config.load_kube_config(
                    config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                    context=settings.context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (k8s_config.ConfigException, OSError, ValueError) as exc:
            raise KubeError(f"cannot load Kubernetes configuration: {exc}") from exc
        return cls(k8s.ApiClient(configuration), settings)

    async def close(self) -> None:
        await self._api.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- NicFleetPolicy -----------------------------------------------------------------

    async def list_policies(self) -> Listing:
        raw = await self._json(
            "list NicFleetPolicies",
            self._custom.list_cluster_custom_object_without_preload_content(
                GROUP, VERSION, PLURAL, **self._timeout()
            ),
        )
        return listing_from(raw)

    def watch_policies(self, resource_version: str | None) -> AsyncIterator[WatchEvent]:
        return self._watch(
            "watch NicFleetPolicies",
            self._custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            PLURAL,
            resource_version=resource_version,
        )

    async def patch_policy_status(self, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch `status` (the status subresource) of NicFleetPolicy `name`.

        `status` is the CRD's status shape: observedGeneration, conditions[], nodes{}.
        A merge patch replaces lists whole, so pass every condition each time."""
        await self._json(
            f"patch status of NicFleetPolicy {name}",
            self._custom.patch_cluster_custom_object_status_without_preload_content(
                GROUP,
                VERSION,
                PLURAL,
                name,
                {"status": dict(status)},
                _content_type=MERGE_PATCH,
                **self._timeout(),
            ),
        )

    # --- Nodes, Pods, NetworkAttachmentDefinitions ---------------------------------------

    async def list_nodes(self) -> Listing:
        raw = await self._json(
            "list nodes", self._core.list_node_without_preload_content(**self._timeout())
        )
        return listing_from(raw)

    def watch_nodes(self, resource_version: str | None) -> AsyncIterator[WatchEvent]:
        return self._watch("watch nodes", self._core.list_node, resource_version=resource_version)

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        """Set (str) or remove (None) `nicfleet.io/*` labels of node `name`; other keys
        are refused (ValueError) so nicfleet never touches labels it does not own."""
        payloads.check_node_labels(labels)
        await self._json(
            f"patch labels of node {name}",
            self._core.patch_node_without_preload_content(
                name,
                {"metadata": {"labels": dict(labels)}},
                _content_type=MERGE_PATCH,
                **self._timeout(),
            ),
        )

    async def list_pod_requests(self) -> tuple[PodRequest, ...]:
        """Pods (all namespaces) requesting a resource under `resource_prefixes`."""
        requests, _ = await self.list_pods_and_components()
        return requests

    async def list_pods_and_components(
        self,
    ) -> tuple[tuple[PodRequest, ...], tuple[DaemonSetState, ...]]:
        """`list_pods_components_and_addresses` without the addresses."""
        requests, sets, _ = await self.list_pods_components_and_addresses()
        return requests, sets

    async def list_pods_components_and_addresses(
        self,
    ) -> tuple[tuple[PodRequest, ...], tuple[DaemonSetState, ...], tuple[HeldAddresses, ...]]:
        """One list of every pod, read three times: the pods requesting a resource under
        `resource_prefixes`, (with one DaemonSet list, all namespaces) the chain's
        components with the nodes their pods are ready on, and every unfinished pod's
        secondary-network addresses (NV-IPAM's per-node use)."""
        raw = await self._json(
            "list pods",
            self._core.list_pod_for_all_namespaces_without_preload_content(**self._timeout()),
        )
        items = listing_from(raw).items
        prefixes = self._settings.resource_prefixes
        found = (pod_request_from_object(item, prefixes) for item in items)
        requests = tuple(pod for pod in found if pod is not None)
        daemon_pods = tuple(p for p in map(daemon_pod_from_object, items) if p is not None)
        held = tuple(h for h in map(held_addresses_from_object, items) if h is not None)
        try:
            raw_sets = await self._json(
                "list DaemonSets",
                self._apps.list_daemon_set_for_all_namespaces_without_preload_content(
                    **self._timeout()
                ),
            )
        except KubeError as exc:
            # 404: no apps/v1 (test emulators); 403: an older ClusterRole. The pods still count.
            if exc.status not in (403, 404):
                raise
            return requests, (), held
        sets = (daemonset_from_object(item, daemon_pods) for item in listing_from(raw_sets).items)
        return requests, tuple(s for s in sets if s is not None), held

    async def list_scheduling_events(self) -> tuple[SchedulingEvent, ...]:
        """The scheduler's `FailedScheduling` Events (all namespaces), oldest first."""
        raw = await self._json(
            "list FailedScheduling Events",
            self._core.list_event_for_all_namespaces_without_preload_content(
                field_selector="reason=FailedScheduling", **self._timeout()
            ),
        )
        found = (scheduling_event_from_object(item) for item in listing_from(raw).items)
        return tuple(e for e in found if e is not None)

    async def list_network_attachments(self) -> tuple[NetworkAttachment, ...]:
        """Every NetworkAttachmentDefinition; () when Multus' CRD is not installed."""
        try:
            raw = await self._json(
                "list NetworkAttachmentDefinitions",
                self._custom.list_cluster_custom_object_without_preload_content(
                    *NAD, **self._timeout()
                ),
            )
        except KubeNotFoundError:
            return ()
        found = (attachment_from_object(item) for item in listing_from(raw).items)
        return tuple(nad for nad in found if nad is not None)

    async def list_ip_pools(self) -> tuple[IpPool, ...]:
        """NV-IPAM IPPools and CIDRPools and whereabouts IPPools and NodeSlicePools (Fast
        IPAM), all namespaces; a kind whose CRD is not installed contributes nothing."""
        kinds: tuple[tuple[PoolKind, str, Callable[[], Awaitable[Any]]], ...] = (
            ("nv-ipam-ippool", "list NV-IPAM IPPools", lambda: (
                self._custom.list_cluster_custom_object_without_preload_content(
                    *NV_IPAM_IPPOOLS, **self._timeout()))),
            ("nv-ipam-cidrpool", "list NV-IPAM CIDRPools", lambda: (
                self._custom.list_cluster_custom_object_without_preload_content(
                    *NV_IPAM_CIDRPOOLS, **self._timeout()))),
            ("whereabouts", "list whereabouts IPPools", lambda: (
                self._custom.list_cluster_custom_object_without_preload_content(
                    *WHEREABOUTS_IPPOOLS, **self._timeout()))),
            ("whereabouts-nodeslice", "list whereabouts NodeSlicePools", lambda: (
                self._custom.list_cluster_custom_object_without_preload_content(
                    *WHEREABOUTS_NODESLICEPOOLS, **self._timeout()))),
        )  # fmt: skip
        found: list[IpPool] = []
        for kind, what, call in kinds:
            try:
                raw = await self._json(what, call())
            except KubeNotFoundError:
                continue
            pools = (ip_pool_from_object(kind, item) for item in listing_from(raw).items)
            found.extend(pool for pool in pools if pool is not None)
        return tuple(found)

    async def read_nic_cluster_policy(self) -> dict[str, Any] | None:
        """NVIDIA's `NicClusterPolicy/nic-cluster-policy`, read only; None when absent."""
        group, version, plural, name = NIC_CLUSTER_POLICY
        try:
            raw = await self._json(
                "read NicClusterPolicy",
                self._custom.get_cluster_custom_object_without_preload_content(
                    group, version, plural, name, **self._timeout()
                ),
            )
        except KubeNotFoundError:
            return None
        return raw if isinstance(raw, dict) else None

    async def read_operator_status(self) -> OperatorStatus | None:
        """`status` of `nic-cluster-policy` (state, appliedStates); None when it is absent
        or this ServiceAccount may not read it (the overlay `nicclusterpolicy-import`)."""
        try:
            obj = await self.read_nic_cluster_policy()
        except KubeError as exc:
            if exc.status == 403:
                return None
            raise
        return operator_status_from_object(obj)

    # --- Pair-validation Pods (aggregator.validations.runner) ------------------------------------

    async def create_pod(self, body: Mapping[str, Any]) -> None:
        """Create a Pod in `validation_namespace`; only pair-validation pods are made."""
        namespace = self._settings.validation_namespace
        name = (body.get("metadata") or {}).get("name", "?")
        await self._json(
            f"create Pod {namespace}/{name}",
            self._core.create_namespaced_pod_without_preload_content(
                namespace, _model("V1Pod", dict(body)), **self._timeout()
            ),
        )

    async def read_pod(self, name: str) -> dict[str, Any] | None:
        """Pod `name` of `validation_namespace` as a plain object; None when it is gone."""
        namespace = self._settings.validation_namespace
        try:
            raw = await self._json(
                f"read Pod {namespace}/{name}",
                self._core.read_namespaced_pod_without_preload_content(
                    name, namespace, **self._timeout()
                ),
            )
        except KubeNotFoundError:
            return None
        return raw if isinstance(raw, dict) else None

    async def delete_pod(self, name: str) -> bool:
        """Delete Pod `name` of `validation_namespace`; False when it was already gone."""
        namespace = self._settings.validation_namespace
        try:
            await self._json(
                f"delete Pod {namespace}/{name}",
                self._core.delete_namespaced_pod_without_preload_content(
                    name, namespace, **self._timeout()
                ),
            )
        except KubeNotFoundError:
            return False
        return True

    # --- Events ------------------------------------------------------------------------

    async def create_event(
        self,
        *,
        kind: Literal["Node", "NicFleetPolicy"],
        name: str,
        reason: str,
        message: str,
        type: payloads.EventType = "Normal",
        uid: str | None = None,
        instance: str = "",
    ) -> None:
        """A core/v1 Event about a Node or a NicFleetPolicy (`kubectl describe` shows it).

        `reason` is an UpperCamelCase code (e.g. "ResourceNotAdvertised") that tools
        filter on; `message` is one sentence for humans."""
        namespace = self._settings.event_namespace
        event = payloads.event_body(
            api_version="v1" if kind == "Node" else f"{GROUP}/{VERSION}",
            kind=kind,
            name=name,
            reason=reason,
            message=message,
            type=type,
            uid=uid,
            instance=instance,
            namespace=namespace,
            now=dt.datetime.now(dt.UTC),
            suffix=uuid.uuid4().hex[:16],
        )
        body = _model("CoreV1Event", event)
        await self._json(
            f"create Event {reason} on {kind} {name}",
            self._core.create_namespaced_event_without_preload_content(
                namespace, body, **self._timeout()
            ),
        )

    # --- Lease (leader election) -------------------------------------------------------

    async def read_lease(self, name: str) -> LeaseRecord | None:
        try:
            raw = await self._json(
                f"read Lease {name}",
                self._leases.read_namespaced_lease_without_preload_content(
                    name, self._settings.lease_namespace, **self._timeout()
                ),
            )
        except KubeNotFoundError:
            return None
        return payloads.lease_from(name, raw)

    async def write_lease(self, name: str, record: LeaseRecord, *, create: bool) -> bool:
        """Create, or merge-patch with `record.resource_version` as precondition (the
        server answers 409 when the Lease changed since it was read); False when someone
        else won (409), KubeError for anything else."""
        namespace = self._settings.lease_namespace
        body = payloads.lease_body(name, namespace, record, create=create)
        call = (
            self._leases.create_namespaced_lease_without_preload_content(
                namespace, _model("V1Lease", body), **self._timeout()
            )
            if create
            else self._leases.patch_namespaced_lease_without_preload_content(
                name, namespace, body, _content_type=MERGE_PATCH, **self._timeout()
            )
        )
        try:
            await self._json(f"write Lease {name}", call)
        except KubeError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    # --- TokenReview (API authentication) ------------------------------------------------

    async def review_token(self, token: str, audiences: tuple[str, ...] = ()) -> TokenReviewResult:
        """Ask the API server who `token` belongs to (`authentication.k8s.io/v1` TokenReview).

        Nothing is stored server-side. The token goes only into the request body: never
        into `what`, so no KubeError message can carry it."""
        body: Any = payloads.token_review_body(token, audiences)
        what = "create TokenReview"
        raw = await self._json(
            what, self._authn.create_token_review_without_preload_content(body, **self._timeout())
        )
        try:
            return result_from_review(raw)
        except ValueError as exc:
            raise KubeUnavailableError(f"{what}: not a TokenReview: {exc}") from None

    # --- DRA ResourceClaims (all namespaces; read-only) ------------------------------------

    async def list_resource_claims(self) -> Listing:
        raw = await self._json(
            "list ResourceClaims",
            self._custom.list_cluster_custom_object_without_preload_content(
                *RESOURCE_CLAIMS, **self._timeout()
            ),
        )
        return listing_from(raw)

    def watch_resource_claims(self, resource_version: str | None) -> AsyncIterator[WatchEvent]:
        return self._watch(
            "watch ResourceClaims",
            self._custom.list_cluster_custom_object,
            *RESOURCE_CLAIMS,
            resource_version=resource_version,
        )

    async def list_dra_claims(self) -> tuple[DraClaim, ...]:
        """Every ResourceClaim (all namespaces, every driver) as the cluster view keeps it."""
        return draobjects.claims_from((await self.list_resource_claims()).items)

    # --- DRA ResourceSlices and DeviceClasses of every driver (the cluster view) ----------

    async def list_dra_devices(self) -> tuple[DraDevice, ...]:
        """The devices of every ResourceSlice, every driver's (no field selector: a GPU
        driver's devices are half of a GPU + NIC claim)."""
        raw = await self._json(
            "list ResourceSlices",
            self._custom.list_cluster_custom_object_without_preload_content(
                *RESOURCE_SLICES, **self._timeout()
            ),
        )
        return draobjects.devices_from(listing_from(raw).items)

    async def list_device_classes(self) -> tuple[DraDeviceClass, ...]:
        raw = await self._json(
            "list DeviceClasses",
            self._custom.list_cluster_custom_object_without_preload_content(
                *DEVICE_CLASSES, **self._timeout()
            ),
        )
        return draobjects.classes_from(listing_from(raw).items)

    # --- DRA ResourceSlices (aggregator.dra.publisher; rdma.nicfleet.io only) ------------

    async def list_resource_slices(self) -> list[dict[str, Any]]:
        """Every rdma.nicfleet.io ResourceSlice as plain objects (the server filters by
        the `spec.driver` field selector; the publisher filters again, so no other
        driver's slice is ever acted on)."""
        raw = await self._json(
            f"list ResourceSlices of {dranames.DRIVER}",
            self._custom.list_cluster_custom_object_without_preload_content(
                *RESOURCE_SLICES,
                field_selector=f"spec.driver={dranames.DRIVER}",
                **self._timeout(),
            ),
        )
        return [dict(item) for item in listing_from(raw).items]

    async def create_resource_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a ResourceSlice; the stored object (its resourceVersion) comes back."""
        _check_slice(body)
        name = (body.get("metadata") or {}).get("name", "?")
        raw = await self._json(
            f"create ResourceSlice {name}",
            self._custom.create_cluster_custom_object_without_preload_content(
                *RESOURCE_SLICES, dict(body), **self._timeout()
            ),
        )
        return raw if isinstance(raw, dict) else {}

    async def replace_resource_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Replace ResourceSlice `name` (PUT); `metadata.resourceVersion` in `body` makes
        the server answer 409 (KubeError, status 409) when it changed since it was read."""
        _check_slice(body)
        raw = await self._json(
            f"replace ResourceSlice {name}",
            self._custom.replace_cluster_custom_object_without_preload_content(
                *RESOURCE_SLICES, name, dict(body), **self._timeout()
            ),
        )
        return raw if isinstance(raw, dict) else {}

    async def delete_resource_slice(self, name: str, resource_version: str | None) -> bool:
        """Delete ResourceSlice `name`, guarded by `resource_version` when given (409 when it
        changed); False when it was already gone."""
        options: dict[str, Any] = (
            {"preconditions": {"resourceVersion": resource_version}} if resource_version else {}
        )
        try:
            await self._json(
                f"delete ResourceSlice {name}",
                self._custom.delete_cluster_custom_object_without_preload_content(
                    *RESOURCE_SLICES,
                    name,
                    body=_model("V1DeleteOptions", options),
                    **self._timeout(),
                ),
            )
        except KubeNotFoundError:
            return False
        return True

    # --- plumbing ------------------------------------------------------------------------

    def _timeout(self) -> dict[str, Any]:
        return {"_request_timeout": self._settings.request_timeout_s}

    async def _json(self, what: str, call: Awaitable[Any]) -> Any:
        """Send, read the whole body, raise KubeError for non-2xx, decode JSON.

        The raw (`*_without_preload_content`) calls skip the client's model classes: one
        malformed object in a list must not fail the whole list (a pydantic error would)."""
        async with _translated(what):
            response = await call
            try:
                body = await response.read()
            finally:
                response.release()
        return payloads.decode_answer(what, response.status, response.reason, body)

    async def _watch(
        self, what: str, func: Callable[..., Any], *args: Any, resource_version: str | None
    ) -> AsyncIterator[WatchEvent]:
        """One watch session; ends when the server closes it (then list again)."""
        kwargs = payloads.watch_params(self._settings.watch_timeout_s, resource_version)
        # return_type "object": events stay plain dicts (no model validation to fail on).
        from kubernetes.aio import watch

        watcher = cast(Any, watch).Watch(return_type="object")  # the module has no annotations
        async with _translated(what), watcher.stream(func, *args, **kwargs) as stream:
            async for event in stream:
                found = payloads.watch_event(event)
                if found is not None:
                    yield found


@asynccontextmanager
async def _translated(what: str) -> AsyncIterator[None]:
    from kubernetes.aio.client import ApiException

    try:
        yield
    except ApiException as exc:
        raise payloads.translated(what, exc) from exc
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise KubeUnavailableError(f"{what}: {type(exc).__name__}: {exc}") from exc


def _check_slice(body: Mapping[str, Any]) -> None:
    """ValueError unless `body` is an rdma.nicfleet.io slice of its node's own pool: the
    aggregator writes no other driver's slices (a second guard behind the planner's)."""
    spec = body.get("spec") or {}
    pool = spec.get("pool") or {}
    if spec.get("driver") != dranames.DRIVER or pool.get("name") != spec.get("nodeName"):
        raise ValueError(f"only {dranames.DRIVER} slices of a node's own pool may be written")


def _model(name: str, data: dict[str, Any]) -> Any:
    """`kubernetes.aio.client.<name>` built from `data` (a class of the client's models)."""
    from kubernetes.aio import client

    model = getattr(client, name).from_dict(data)
    if model is None:  # from_dict answers None only for None input
        raise ValueError(f"cannot build {name}")
    return model
