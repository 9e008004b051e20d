"""The ends of a pod claim's DRA chain (`aggregator.trace.dra`): `claim` (the ResourceClaim
exists), `prepared` (the node's agent prepared it for the kubelet) and `pod` (the pod runs
with it) — and `ClaimContext`, what every link of that chain reads.

Pure: each link is a function of the context (the pod, its claim entry, the claim, the
cluster view, the fleet records and `now`); no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

from aggregator.cluster import ClusterView, DraClaim, DraDevice, DraResult, PodClaim, PodRequest
from aggregator.fleet.state import NodeRecord
from aggregator.trace.host import link_broken, link_degraded, link_ok, link_unknown
from proto.dranames import DRIVER, InvalidDeviceName, rdma_device_of
from proto.http import Link
from proto.messages.status import DraClaimState

CLAIM_LINK: Final = "claim"
PREPARED_LINK: Final = "prepared"
POD_LINK: Final = "pod"
UNHEALTHY: Final = "Unhealthy"  # ClaimHealth.health as the kubelet reports it
# A finished pod's claims are released: the resourceclaim controller drops the pod from
# reservedFor and deletes a template's claim, the kubelet unprepares them. Not faults.
FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})
NO_DRA: Final = (
    "the aggregator sees no resource.k8s.io/v1 API (the cluster does not serve it, or the "
    "aggregator may not list ResourceClaims)"
)


@dataclass(frozen=True, kw_only=True)
class ClaimContext:
    pod: PodRequest
    entry: PodClaim
    claim: DraClaim | None  # None: not generated, not found, or no DRA API
    cluster: ClusterView
    fleet: Mapping[str, NodeRecord]
    now: float
    stale_after: float

    @cached_property
    def published(self) -> Mapping[tuple[str, str, str], DraDevice]:
        """Every driver's published devices by (driver, pool, name): built once per chain,
        read by several links."""
        return {(d.driver, d.pool, d.name): d for d in self.cluster.dra_devices}

    @property
    def pod_ref(self) -> str:
        return f"{self.pod.namespace}/{self.pod.name}"

    @property
    def released(self) -> str | None:
        """Why the pod's claim may be gone or unprepared: the pod finished (else None)."""
        phase = self.pod.phase
        if phase not in FINISHED_PHASES:
            return None
        return f"the pod is {phase}: its claim is released (unreserved, unprepared; a claim "
        "made from a template is deleted)"

    @property
    def ours(self) -> tuple[DraResult, ...]:
        """The claim's allocated rdma.nicfleet.io devices."""
        results = self.claim.results if self.claim is not None else ()
        return tuple(r for r in results if r.driver == DRIVER)

    @property
    def node(self) -> str | None:
        """Where the claim's devices are: the allocation's node, else the pod's."""
        pinned = self.claim.node if self.claim is not None else None
        return pinned or self.pod.node

    def unhealthy_by_kubelet(self, result: DraResult) -> list[str]:
        """The containers whose allocatedResourcesStatus says `result`'s device Unhealthy."""
        resource_id = f"{result.driver}/{result.pool}/{result.device}"
        return sorted(
            h.container
            for h in self.pod.claim_health
            if h.entry == self.entry.name and h.resource_id == resource_id
            and h.health == UNHEALTHY
        )  # fmt: skip


def rdma_name(device: str) -> str:
    """The RDMA device a DRA device name stands for (degraded links name RDMA devices)."""
    try:
        return rdma_device_of(device)[0]
    except InvalidDeviceName:
        return device


def claim_link(ctx: ClaimContext) -> Link:
    """`claim`: the pod's entry resolved to a ResourceClaim that is there and not going."""
    entry, ns = ctx.entry, ctx.pod.namespace
    evidence: dict[str, Any] = {
        "entry": entry.name,
        "claim": entry.claim,
        "template": entry.template,
    }
    if not ctx.cluster.dra_present:
        return link_unknown(CLAIM_LINK, reason=NO_DRA, **evidence)
    if entry.claim is None and entry.template is not None:
        return link_broken(
            CLAIM_LINK,
            f"the resourceclaim controller has not created the claim of template "
            f"{ns}/{entry.template} for {ctx.pod_ref}",
            f"check the template exists (kubectl get resourceclaimtemplate -n {ns} "
            f"{entry.template}) and kube-controller-manager runs with DynamicResourceAllocation "
            "(its log names why it did not create the claim)",
            **evidence,
        )
    if entry.claim is None:
        return link_broken(
            CLAIM_LINK,
            f"the pod's resourceClaims entry {entry.name} names neither a ResourceClaim nor a "
            "template",
            "set resourceClaimName or resourceClaimTemplateName on the entry",
            **evidence,
        )
    claim = ctx.claim
    if ctx.released is not None and (claim is None or claim.deleting):
        return link_unknown(CLAIM_LINK, reason=ctx.released, **evidence)
    if claim is None:
        return link_broken(
            CLAIM_LINK,
            f"ResourceClaim {ns}/{entry.claim} not found: the pod cannot start without it",
            f"create it (kubectl get resourceclaim -n {ns} {entry.claim}), or name a template "
            "so one is made for the pod",
            **evidence,
        )
    evidence |= {"uid": claim.uid, "allocated": claim.allocated, "node": claim.node}
    if claim.deleting:
        return link_broken(
            CLAIM_LINK,
            f"ResourceClaim {ns}/{claim.name} is being deleted",
            "delete and recreate the pod (a template's claim is made again), or recreate the "
            "claim once it is gone",
            **evidence,
        )
    return link_ok(CLAIM_LINK, **evidence)


def _claim_state(states: tuple[DraClaimState, ...], uid: str) -> DraClaimState | None:
    return next((s for s in states if s.uid == uid), None)


def prepared_link(ctx: ClaimContext) -> Link:
    """`prepared`: the node's agent (its DRA plugin) reports the claim prepared, or why not."""
    claim, node = ctx.claim, ctx.node
    if claim is None:
        return link_unknown(PREPARED_LINK, reason="no ResourceClaim")
    if node is None or not claim.allocated:
        return link_unknown(PREPARED_LINK, reason="the claim is not allocated to a node yet")
    record = ctx.fleet.get(node)
    evidence: dict[str, Any] = {"node": node, "uid": claim.uid}
    if record is None:
        return link_broken(
            PREPARED_LINK,
            f"no agent has ever reported from {node}, so no DRA plugin prepares claims there",
            f"check the nicfleet-agent pod on {node} (kubectl get pods -A -o wide "
            f"--field-selector spec.nodeName={node}) and its NATS connection",
            **evidence,
        )
    plugin = record.device_plugin
    dra = plugin.dra if plugin is not None else None
    if dra is None:
        return link_broken(
            PREPARED_LINK,
            f"the agent on {node} does not run the DRA plugin: nothing prepares "
            f"{DRIVER} claims there",
            "run the agent with --dra (deploy/overlays/dra)",
            **evidence,
        )
    evidence |= {"plugin_state": dra.state, "plugin_error": dra.error, "endpoint": dra.endpoint}
    # What was prepared stays prepared (checkpoint) while the plugin re-registers after an
    # agent or kubelet restart: the claim's own record decides before the plugin's state.
    done = _claim_state(dra.prepared, claim.uid)
    if done is not None:
        return link_ok(
            PREPARED_LINK, devices=list(done.devices), cdi_ids=list(done.cdi_ids),
            prepared_at=done.at, **evidence,
        )  # fmt: skip
    failed = _claim_state(dra.failed, claim.uid)
    if failed is not None:
        return link_broken(
            PREPARED_LINK,
            f"the agent on {node} failed to prepare the claim: {failed.error or 'no error given'}",
            "fix what the error names; the kubelet retries NodePrepareResources while the pod "
            "waits (nicfleet-agent's log has the attempt)",
            failed_at=failed.at,
            **evidence,
        )
    if ctx.released is not None:
        return link_unknown(PREPARED_LINK, reason=ctx.released, **evidence)
    running = ctx.pod.phase == "Running"
    if dra.state != "registered" and not running:
        error = f": {dra.error}" if dra.error else ""
        return link_broken(
            PREPARED_LINK,
            f"the DRA plugin on {node} is not registered with the kubelet ({dra.state}{error})",
            "check that the agent mounts the kubelet's plugins_registry and plugins "
            "directories and the kubelet's log for the registration",
            **evidence,
        )
    if running:
        return link_unknown(PREPARED_LINK, reason="not reported by the agent", **evidence)
    return link_unknown(PREPARED_LINK, reason="the kubelet has not asked yet", **evidence)


def pod_link(ctx: ClaimContext) -> Link:
    """`pod`: the claim is reserved for the pod and the pod runs without Unhealthy devices."""
    pod, claim = ctx.pod, ctx.claim
    evidence: dict[str, Any] = {"pod": ctx.pod_ref, "phase": pod.phase, "node": pod.node}
    if claim is None:
        return link_unknown(POD_LINK, reason="no ResourceClaim", **evidence)
    evidence["reserved_for"] = list(claim.reserved_for)
    if pod.node is None:
        return link_unknown(
            POD_LINK, reason="the pod is not scheduled (see scheduling)", **evidence
        )
    if claim.allocated and ctx.pod_ref not in claim.reserved_for:
        if ctx.released is not None:
            return link_unknown(POD_LINK, reason=ctx.released, **evidence)
        if pod.phase == "Running":
            # The kubelet prepares a claim only for a pod in its reservedFor: a running pod
            # was reserved; the claim was listed before (pods and claims are listed apart).
            return link_unknown(
                POD_LINK,
                reason="the pod runs, but the claim as last listed is not reserved for it "
                "(listed before its reservation; the next list shows it)",
                **evidence,
            )
        return link_broken(
            POD_LINK,
            f"the claim is not reserved for the pod: {claim.name}'s reservedFor lists "
            f"{', '.join(claim.reserved_for) or 'no pod'}",
            "the scheduler reserves a claim for the pod it places; a pod bound without it "
            "(spec.nodeName set by hand) or a claim shared past its reservations is not: "
            "let the scheduler place the pod, or give it a claim of its own",
            **evidence,
        )
    bad = {r.device: ctx.unhealthy_by_kubelet(r) for r in ctx.ours}
    bad = {device: containers for device, containers in bad.items() if containers}
    if bad:
        named = "; ".join(f"{d} in {', '.join(c)}" for d, c in sorted(bad.items()))
        return link_degraded(
            POD_LINK,
            f"the pod runs but the kubelet reports its devices Unhealthy ({named})",
            "see device-healthy above; the pod keeps the device until it is restarted",
            sorted(rdma_name(d) for d in bad),
            **evidence,
        )
    if pod.phase == "Running":
        return link_ok(POD_LINK, **evidence)
    if pod.phase == "Pending":
        return link_unknown(
            POD_LINK,
            reason=f"Pending on {pod.node}: its containers have not started (see prepared)",
            **evidence,
        )
    return link_unknown(POD_LINK, reason=f"the pod is {pod.phase or 'in no phase'}", **evidence)
