"""Every wire message besides the snapshot: counters, events, device-plugin status,
desired config and alerts.

Each top-level message carries a `schema` tag and a `version`; fields added later must
have defaults so that older payloads keep decoding.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from proto.inventory import Base, PortStateName, ReadError

MESSAGES_VERSION = 1

Severity = Literal["critical", "warning", "info"]
AlertState = Literal["firing", "resolved"]
EventKind = Literal["port-state", "device-added", "device-removed", "link-state"]


class PortCounters(Base, frozen=True, kw_only=True):
    adapter: str
    port: int
    values: dict[str, int] = msgspec.field(default_factory=dict)


class CounterBatch(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.counter-batch"
):
    """One sampling round of every port's counters (core NATS, newest wins)."""

    version: int = MESSAGES_VERSION
    node: str
    seq: int
    collected_at: float
    ports: tuple[PortCounters, ...] = ()
    read_errors: tuple[ReadError, ...] = ()  # counter files that could not be read


class LinkEvent(Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.link-event"):
    """An immediate change the agent saw (port state, link, device add/remove)."""

    version: int = MESSAGES_VERSION
    node: str
    seq: int
    kind: EventKind
    adapter: str
    port: int | None = None
    old_state: PortStateName | None = None
    new_state: PortStateName | None = None
    phys_state: str | None = None
    observed_at: float  # unix seconds, when the agent saw the change


class ResourceStatus(Base, frozen=True, kw_only=True):
    name: str  # rdma/hca_shared_devices_a
    advertised: int = 0
    healthy: int = 0
    devices: tuple[str, ...] = ()


class DevicePluginStatus(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.device-plugin-status"
):
    version: int = MESSAGES_VERSION
    node: str
    config_generation: int = 0
    registered: bool = False
    resources: tuple[ResourceStatus, ...] = ()
    observed_at: float


class Selectors(Base, frozen=True, kw_only=True, rename="camel"):
    """k8s-rdma-shared-dev-plugin selectors, plus nicfleet's extra ones."""

    vendors: tuple[str, ...] = ()
    device_ids: tuple[str, ...] = msgspec.field(default=(), name="deviceIDs")
    drivers: tuple[str, ...] = ()
    if_names: tuple[str, ...] = ()
    link_types: tuple[str, ...] = ()
    pci_addresses: tuple[str, ...] = ()
    rdma_devices: tuple[str, ...] = ()
    numa_nodes: tuple[int, ...] = ()
    link_layers: tuple[str, ...] = ()


class ResourceConfig(Base, frozen=True, kw_only=True, rename="camel"):
    resource_name: str
    resource_prefix: str = "rdma"
    rdma_hca_max: int = 0
    selectors: Selectors = Selectors()
    devices: tuple[str, ...] = ()  # deprecated in the upstream plugin, still accepted


class DevicePluginConfig(Base, frozen=True, kw_only=True, rename="camel"):
    """The k8s-rdma-shared-dev-plugin config document, field names as upstream."""

    periodic_update_interval: int = 60
    config_list: tuple[ResourceConfig, ...] = ()


class DesiredConfig(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.desired-config"
):
    """What the aggregator wants a node's device plugin to advertise (KV nicfleet-config)."""

    version: int = MESSAGES_VERSION
    node: str
    generation: int
    device_plugin: DevicePluginConfig = DevicePluginConfig()


class Alert(Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.alert"):
    version: int = MESSAGES_VERSION
    rule: str
    severity: Severity
    state: AlertState
    node: str
    subject: str
    message: str
    evidence: dict[str, str] = msgspec.field(default_factory=dict)
    starts_at: float
    ends_at: float | None = None
    fingerprint: str
