"""Pure device-plugin decisions: device IDs, health, NUMA topology, Allocate contents.

Takes a resource's config, its selection, the snapshot and the latest port states; returns
plain frozen values that the gRPC layer turns into messages. No I/O, no clock, no logging:
everything here is a function of its arguments and is table-tested.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Final, Literal

from agent.deviceplugin.selectors import SelectedDevice, Selection
from agent.errors import AgentError
from proto.dpconfig import resource_full_name
from proto.ibta import ACTIVE_STATES
from proto.inventory import Device, NodeSnapshot, Platform, PortStateName
from proto.messages.config import ResourceConfig

Health = Literal["Healthy", "Unhealthy"]
HEALTHY: Final[Health] = "Healthy"
UNHEALTHY: Final[Health] = "Unhealthy"
# (device, port) -> (state, phys_state): the agent's cheap port-state poll.
PortStates = Mapping[tuple[str, int], tuple[PortStateName, str | None]]

RDMA_CM_NAME: Final = "rdma_cm"
# Per-adapter char devices a container needs: verbs, MADs (ibstat, UD QP1 users), and the
# subnet-manager bit. rdma_cm is node-wide and added once.
ADAPTER_CHAR_PREFIXES: Final = ("uverbs", "umad", "issm")
# What a container is told about its adapters: names it can check from inside (RDMA device
# names and PCI addresses, both visible in its /sys/class/infiniband) and, for
# compatibility, the host's netdev names, which the pod does not hold (Multus gives it net1).
ENV_RDMA_DEVICES: Final = "NICFLEET_RDMA_DEVICES"
ENV_PCI_ADDRESSES: Final = "NICFLEET_PCI_ADDRESSES"
ENV_NETDEVS: Final = "NICFLEET_NETDEVS"
CDI_KIND: Final = "nicfleet.io/rdma"
DEVICE_PERMISSIONS: Final = "rw"
# Bad-input bounds: kubelet never sends more IDs than the plugin advertised, nor IDs longer
# than the API's 63 characters; anything past these is refused before any work is done.
MAX_ID_LENGTH: Final = 63
MAX_CONTAINERS: Final = 256
# A shared resource on a node whose RDMA subsystem is in exclusive netns mode: every device
# is advertised Unhealthy with this reason (ResourceStatus.unhealthy_reason).
NETNS_EXCLUSIVE_REASON: Final = (
    "netns-exclusive: the RDMA subsystem is in exclusive netns mode (ib_core netns_mode=N), "
    "so a pod in its own network namespace gets EPERM opening a shared adapter's "
    "/dev/infiniband/uverbsN; every device is advertised Unhealthy (hostNetwork pods "
    "included: the kubelet allocates no Unhealthy device). Use an exclusive: true resource "
    "with rdma-cni, or set the mode to shared"
)


class InvalidRequest(AgentError, ValueError):
    """A kubelet request that cannot be honoured; the message names the offending value."""


@dataclass(frozen=True, slots=True)
class Adapter:
    name: str
    pci_address: str | None
    numa_node: int | None
    netdevs: tuple[str, ...]
    char_devices: tuple[str, ...]  # host paths, rdma_cm included when present
    chain: tuple[str, ...]  # (host bridge, bridges..., address); () when unknown
    healthy: bool
    reason: str | None = None  # why it is unhealthy


@dataclass(frozen=True, slots=True)
class PluginDevice:
    id: str
    health: Health
    numa_nodes: tuple[int, ...]  # empty: no topology sent
    adapters: tuple[str, ...]


@dataclass(frozen=True)
class ResourcePlan:
    resource: str  # <prefix>/<name>
    exclusive: bool
    devices: tuple[PluginDevice, ...]
    adapters: tuple[Adapter, ...]
    excluded: tuple[tuple[str, str], ...] = ()  # (adapter, reason): matched but unusable
    unmatched: tuple[tuple[str, str], ...] = ()  # (adapter, the selector it failed)
    # Why every device is Unhealthy whatever the adapters' own health (netns-exclusive).
    unhealthy_reason: str | None = None

    @property
    def healthy_count(self) -> int:
        return sum(1 for d in self.devices if d.health == HEALTHY)

    @functools.cached_property
    def by_id(self) -> dict[str, PluginDevice]:
        """Device lookup for request validation (kubelet asks once per container)."""
        return {d.id: d for d in self.devices}


@dataclass(frozen=True, slots=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = DEVICE_PERMISSIONS


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    envs: tuple[tuple[str, str], ...]
    device_nodes: tuple[DeviceNode, ...]
    cdi_devices: tuple[str, ...]


def empty_plan(config: ResourceConfig) -> ResourcePlan:
    return ResourcePlan(
        resource=resource_full_name(config), exclusive=config.exclusive, devices=(), adapters=()
    )


def adapter_health(
    device: Device | None, port_states: PortStates, ports: Collection[int] = ()
) -> tuple[bool, str | None]:
    """Healthy when one of `ports` (all ports when empty: the resource's selected ones) is
    ACTIVE with phys LinkUp and the adapter has a uverbs node.

    `port_states` (fresher than the snapshot) wins for the ports it lists; an empty mapping
    means no poll yet. A device the poll no longer lists has gone away.
    """
    if device is None:
        return False, "not in the snapshot"
    if not any(PurePosixPath(c).name.startswith("uverbs") for c in device.char_devices):
        return False, "no uverbs char device"
    polled = [key for key in port_states if key[0] == device.name]
    if port_states and not polled:
        return False, "RDMA device gone"
    states = {p.port: (p.state, p.phys_state) for p in device.ports}
    states.update({port: port_states[(name, port)] for name, port in polled})
    if ports:
        states = {n: v for n, v in states.items() if n in ports}
    if not states:
        return False, "no ports"
    for state, phys in states.values():
        if state in ACTIVE_STATES and phys in (None, "LinkUp"):
            return True, None
    shown = ", ".join(f"{n}:{s}/{p or '?'}" for n, (s, p) in sorted(states.items()))
    return False, f"no port ACTIVE/LinkUp ({shown})"


def plan_resource(
    config: ResourceConfig,
    selection: Selection,
    snapshot: NodeSnapshot,
    port_states: PortStates,
    *,
    topology: bool = True,
) -> ResourcePlan:
    """The devices to advertise for one resource and their health.

    Shared (default): `rdmaHcaMax` interchangeable IDs "0".."N-1" (the upstream plugin's
    IDs, so kubelet checkpoints survive a switch), Healthy while any selected adapter is;
    nothing is advertised when no adapter is selected. Exclusive: one ID per adapter (its
    PCI address), each with its own health and NUMA node. A shared resource on a node in
    exclusive RDMA netns mode keeps its IDs, all Unhealthy (netns_unhealthy_reason).
    """
    by_name = {d.name: d for d in snapshot.devices}
    adapters = tuple(_adapter(s, by_name.get(s.name), port_states) for s in selection.selected)
    excluded = tuple((e.device, e.reason) for e in selection.excluded)
    unmatched = tuple((e.device, e.reason) for e in selection.unmatched)
    name = resource_full_name(config)
    blocked = netns_unhealthy_reason(config, snapshot.platform) if adapters else None
    if config.exclusive:
        devices = tuple(
            PluginDevice(
                id=exclusive_id(a),
                health=HEALTHY if a.healthy else UNHEALTHY,
                numa_nodes=_numa((a,)) if topology else (),
                adapters=(a.name,),
            )
            for a in adapters
        )
    elif adapters:
        usable = blocked is None and any(a.healthy for a in adapters)
        health = HEALTHY if usable else UNHEALTHY
        numa = _numa(adapters) if topology else ()
        names = tuple(a.name for a in adapters)
        devices = tuple(
            PluginDevice(id=str(n), health=health, numa_nodes=numa, adapters=names)
            for n in range(config.rdma_hca_max)
        )
    else:
        devices = ()
    return ResourcePlan(
        resource=name,
        exclusive=config.exclusive,
        devices=devices,
        adapters=adapters,
        excluded=excluded,
        unmatched=unmatched,
        unhealthy_reason=blocked,
    )


def netns_unhealthy_reason(config: ResourceConfig, platform: Platform) -> str | None:
    """Why a shared resource's devices cannot be used by pods on this node, or None.

    In exclusive mode an RDMA device belongs to one netns (the host's until rdma-cni moves
    it) and ib_uverbs_open refuses a process of any other netns (EPERM). Shared slots hand
    the same adapters to many pods, so none can be moved: only hostNetwork pods could open
    them, and a device plugin never learns whether a pod is one (Allocate carries device
    IDs, not the pod). Advertising them Unhealthy rather than withholding the resource keeps
    it on the node (capacity N, allocatable 0, the pod Pending "Insufficient") and lets it
    come back without re-registration when the mode turns shared. An exclusive resource is
    left alone: rdma-cni moves its adapter into the pod's netns. Mode unknown (kernel before
    5.2, no ib_core parameter): as before.
    """
    if config.exclusive or platform.rdma_netns_mode != "exclusive":
        return None
    return NETNS_EXCLUSIVE_REASON


def exclusive_id(adapter: Adapter) -> str:
    # The PCI address survives RDMA device renames across reboots; the name is a fallback.
    return adapter.pci_address or adapter.name


def _adapter(selected: SelectedDevice, device: Device | None, port_states: PortStates) -> Adapter:
    healthy, reason = adapter_health(device, port_states, selected.ports)
    chain: tuple[str, ...] = ()
    if device is not None and device.pci_path and device.pci_address:
        chain = (*device.pci_path, device.pci_address)
    return Adapter(
        name=selected.name,
        pci_address=selected.pci_address,
        numa_node=selected.numa_node,
        netdevs=tuple(selected.netdevs),
        char_devices=tuple(selected.char_devices),
        chain=chain,
        healthy=healthy,
        reason=reason,
    )


def _numa(adapters: Sequence[Adapter]) -> tuple[int, ...]:
    return tuple(
        sorted({a.numa_node for a in adapters if a.numa_node is not None and a.numa_node >= 0})
    )


def validate_ids(plan: ResourcePlan, ids: Sequence[str], *, what: str) -> None:
    """Refuse empty, oversized, duplicate or unknown ID lists; messages name the ID."""
    if not ids:
        raise InvalidRequest(f"{what}: no device IDs")
    if len(ids) > len(plan.devices):
        raise InvalidRequest(
            f"{what}: {len(ids)} device IDs requested, {plan.resource} advertises "
            f"{len(plan.devices)}"
        )
    known = plan.by_id
    seen: set[str] = set()
    for device_id in ids:
        if len(device_id) > MAX_ID_LENGTH or device_id not in known:
            raise InvalidRequest(
                f"{what}: unknown device ID {device_id[:80]!r} for {plan.resource}"
            )
        if device_id in seen:
            raise InvalidRequest(f"{what}: device ID {device_id!r} listed twice")
        seen.add(device_id)


def plan_allocation(plan: ResourcePlan, ids: Sequence[str], *, cdi: bool) -> ContainerAllocation:
    """What one container gets for `ids` (validated here).

    Shared: every selected adapter (the IDs are slots, not adapters); exclusive: the
    adapters behind the IDs. Device nodes (uverbs/umad/issm per adapter, rdma_cm once) or,
    with CDI, the adapters' CDI names; the env (allocation_envs) is the same either way.
    """
    validate_ids(plan, ids, what="Allocate")
    if plan.exclusive:
        wanted = {name for i in ids for name in plan.by_id[i].adapters}
        adapters = [a for a in plan.adapters if a.name in wanted]
    else:
        adapters = list(plan.adapters)
    envs = allocation_envs(adapters)
    if cdi:
        return ContainerAllocation(
            envs=envs, device_nodes=(), cdi_devices=tuple(cdi_name(a.name) for a in adapters)
        )
    return ContainerAllocation(envs=envs, device_nodes=device_nodes(adapters), cdi_devices=())


def allocation_envs(adapters: Sequence[Adapter]) -> tuple[tuple[str, str], ...]:
    """The env of one container, in adapter order: RDMA device names, PCI addresses (only
    those known; an adapter without one adds nothing) and the host netdev names.

    Sent in the Allocate response in both modes, never in the CDI spec: CDI merges every
    requested device's edits, and per-device values of one list variable would overwrite
    each other instead of joining.
    """
    return (
        (ENV_RDMA_DEVICES, ",".join(a.name for a in adapters)),
        (ENV_PCI_ADDRESSES, ",".join(a.pci_address for a in adapters if a.pci_address)),
        (ENV_NETDEVS, ",".join(n for a in adapters for n in a.netdevs)),
    )


def cdi_name(adapter: str) -> str:
    return f"{CDI_KIND}={adapter}"


def adapter_char_devices(adapter: Adapter) -> tuple[str, ...]:
    """The adapter's own nodes (uverbs, umad, issm), without the node-wide rdma_cm."""
    return tuple(
        c for c in adapter.char_devices if PurePosixPath(c).name.startswith(ADAPTER_CHAR_PREFIXES)
    )


def rdma_cm_node(adapters: Sequence[Adapter]) -> str | None:
    """The node-wide rdma_cm path when the selection carries it (rdma_ucm loaded)."""
    return next(
        (c for a in adapters for c in a.char_devices if PurePosixPath(c).name == RDMA_CM_NAME),
        None,
    )


def device_nodes(adapters: Sequence[Adapter]) -> tuple[DeviceNode, ...]:
    nodes = [DeviceNode(c, c) for a in adapters for c in adapter_char_devices(a)]
    cm = rdma_cm_node(adapters)
    if cm is not None:
        nodes.append(DeviceNode(cm, cm))
    return tuple(nodes)
