"""The `attachment` link: the NetworkAttachmentDefinitions the resource's pods request exist
where Multus looks, parse, attach a netdev of an adapter the resource selects (with or
without the `resourceName` annotation), and the pods' `network-status` shows them attached
to such an adapter.

Pure: a function of the chain context (cluster view, the node's selected adapters); the
judging of NADs is `aggregator.podnetworks`, shared with the rules.
"""

from __future__ import annotations

from typing import Any, Final

from aggregator import podnetworks
from aggregator.cluster import PodRequest
from aggregator.trace.host import ChainContext, link_broken, link_ok, link_unknown
from proto.http import Link
from proto.inventory import Device

ATTACHMENT_LINK: Final = "attachment"
RESOURCE_ANNOTATION: Final = "k8s.v1.cni.cncf.io/resourceName"
NETWORKS_ANNOTATION: Final = "k8s.v1.cni.cncf.io/networks"


def chain_pods(ctx: ChainContext) -> list[PodRequest]:
    """The pods a chain is about: the traced pod, else the resource's pods on the node."""
    if ctx.pod is not None:
        return [ctx.pod]
    return podnetworks.requesting(ctx.resource, ctx.node, ctx.cluster.pods)


def attachment_link(ctx: ChainContext) -> Link:
    name = ATTACHMENT_LINK
    if not ctx.cluster.present:
        return link_unknown(name, cluster="no cluster")
    pods = chain_pods(ctx)
    uses = podnetworks.nad_uses(ctx.resource, pods, ctx.cluster)
    devices = ctx.selected if ctx.snapshot is not None else ()
    evidence: dict[str, Any] = {
        "attachments": [_nad_evidence(u) for u in uses],
        "netdevs": sorted(podnetworks.selected_netdevs(devices)),
        "interfaces": [
            {"pod": f"{p.namespace}/{p.name}", "network": s.name, "interface": s.interface,
             "ips": list(s.ips), "pci_address": s.pci_address, "rdma_device": s.rdma_device}
            for p in pods for s in p.network_status
        ],
    }  # fmt: skip
    bad_annotation = next((p for p in pods if p.networks_error), None)
    if bad_annotation is not None:
        return link_broken(
            name,
            f"pod {bad_annotation.namespace}/{bad_annotation.name}: "
            f"{bad_annotation.networks_error}",
            f"write {NETWORKS_ANNOTATION} as a comma list (ns/name@ifname) or a JSON list "
            "of {name, namespace, interface}",
            **evidence,
        )
    if not uses:
        return link_unknown(
            name,
            reason=f"no pod of {ctx.resource} here requests a secondary network and no "
            f"NetworkAttachmentDefinition names {ctx.resource}",
            **evidence,
        )
    for use in uses:
        problem = _problem(ctx, use, devices)
        if problem is not None:
            return link_broken(name, *problem, **evidence)
    for pod in pods:
        problem = _status_problem(pod, devices)
        if problem is not None:
            return link_broken(name, *problem, **evidence)
    if ctx.snapshot is None:
        return link_unknown(name, reason="no inventory snapshot: masters not checked", **evidence)
    return link_ok(name, **evidence)


def _nad_evidence(use: podnetworks.NadUse) -> dict[str, Any]:
    a = use.attachment
    found: dict[str, Any] = {"name": use.key, "found": a is not None}
    if use.requested_by:
        found["requested_by"] = list(use.requested_by)
    if a is not None:
        found |= {
            "type": a.cni_type, "master": a.master, "ipam": a.ipam_type,
            RESOURCE_ANNOTATION: a.resource_name,
        }  # fmt: skip
        if a.config_error:
            found["config_error"] = a.config_error
    return found


def _problem(
    ctx: ChainContext, use: podnetworks.NadUse, devices: tuple[Device, ...]
) -> tuple[str, str] | None:
    """(cause, fix) of the first thing wrong with one NAD, else None."""
    nad = use.attachment
    pods = ", ".join(use.requested_by)
    if nad is None:
        namespace, nad_name = use.key.split("/", 1)
        also = f" (there is one in {', '.join(use.elsewhere)})" if use.elsewhere else ""
        return (
            f"pod {pods} requests NetworkAttachmentDefinition {use.key}, which does not "
            f"exist{also}: Multus cannot create the pod's sandbox",
            f"create {nad_name} in namespace {namespace} (a name without 'ns/' is looked up "
            "in the pod's own namespace) or fix the pod's networks annotation",
        )
    if nad.config_error is not None:
        return (
            f"NetworkAttachmentDefinition {use.key}: {nad.config_error}",
            "fix spec.config: a JSON CNI config (or conflist) with a type and, for "
            "macvlan/ipoib, a master",
        )
    if nad.resource_name is not None and nad.resource_name != ctx.resource and use.requested_by:
        return (
            f"NetworkAttachmentDefinition {use.key} is annotated {RESOURCE_ANNOTATION}="
            f"{nad.resource_name}, but pod {pods} requests {ctx.resource}: Multus takes the "
            f"device of {nad.resource_name}",
            f"set the annotation to {ctx.resource} or make the pod request {nad.resource_name}",
        )
    rdma = nad.cni_type in podnetworks.RDMA_CNI_TYPES or nad.resource_name == ctx.resource
    if rdma and ctx.snapshot is not None:
        selected = podnetworks.master_selected(nad, devices)
        if selected is False:
            netdevs = sorted(podnetworks.selected_netdevs(devices))
            what = f"master {nad.master!r}" if nad.pci_address is None else nad.pci_address
            return (
                f"NetworkAttachmentDefinition {use.key} uses {what}, not a netdev of the "
                f"adapters selected for {ctx.resource} on {ctx.node}",
                f"set its master to one of {', '.join(netdevs) or '(none)'}, or change the "
                f"selectors of {ctx.resource} to include the adapter of {nad.master}",
            )
    return None


def _status_problem(pod: PodRequest, devices: tuple[Device, ...]) -> tuple[str, str] | None:
    """What a running pod's network-status says against the NADs it asked for."""
    if pod.phase != "Running":
        return None
    ref = f"{pod.namespace}/{pod.name}"
    by_name = {s.name: s for s in pod.network_status}
    for key in pod.networks:
        status = by_name.get(key)
        if status is None:
            return (
                f"pod {ref} runs but its network-status has no entry for {key}: the network "
                "was not attached (or Multus is not the cluster's CNI)",
                "check Multus runs on the node (kubectl -n kube-system get pods -l "
                "app=multus) and the pod's events; recreate the pod",
            )
        if not status.interface:
            return (
                f"pod {ref}: network-status of {key} shows no interface",
                "check the CNI plugin's log on the node (Multus logs each delegate's result)",
            )
        if not devices:
            continue  # no inventory: nothing to match the device-info against
        matches = podnetworks.device_matches(status.pci_address, status.rdma_device, devices)
        if matches is False:
            device = status.rdma_device or status.pci_address
            return (
                f"pod {ref}: {key} is attached to {device}, not an adapter the resource "
                "selects on this node",
                "make the NAD's resourceName annotation name the resource the pod requests "
                "(Multus takes the device the kubelet allocated for it)",
            )
    return None
