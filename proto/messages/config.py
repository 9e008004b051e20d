"""The device-plugin config the aggregator wants a node to serve (k8s-rdma-shared-dev-plugin
format) and the `DesiredConfig` envelope it travels in.
"""

from __future__ import annotations

import msgspec

from proto.inventory import Base
from proto.messages import MESSAGES_VERSION


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
    selectors: Selectors | None = None
    devices: tuple[str, ...] = ()  # deprecated in the upstream plugin, still accepted
    exclusive: bool = False  # nicfleet: one device ID per adapter instead of shared slots


class DevicePluginConfig(Base, frozen=True, kw_only=True, rename="camel"):
    """The k8s-rdma-shared-dev-plugin config document, field names as upstream."""

    periodic_update_interval: int = 60
    config_list: tuple[ResourceConfig, ...] = ()
    kubelet_root_dir: str | None = None  # newer upstream ConfigMaps carry it


class DesiredConfig(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.DesiredConfig"
):
    """What the aggregator wants a node's device plugin to advertise (KV nicfleet-config)."""

    version: int = MESSAGES_VERSION
    node: str
    generation: int
    device_plugin: DevicePluginConfig = DevicePluginConfig()
