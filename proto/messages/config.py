"""The device-plugin config the aggregator wants a node to serve (k8s-rdma-shared-dev-plugin
format), the `DesiredConfig` it is stored in (KV nicfleet-config) and the `DesiredUpdate`
that carries a node's stored entry to its agent over core NATS (docs/wire.md).
"""

from __future__ import annotations

from typing import Annotated

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


class DesiredUpdate(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.DesiredUpdate"
):
    """A node's entry of KV nicfleet-config, announced on `nicfleet.v1.desired.<node>` after
    each write and sent in answer to `nicfleet.v1.desired.<node>.get`.

    `revision` is the entry's KV revision (the bucket stream's sequence, so it grows with
    every write to any key; 0: the key holds nothing, never written or history gone): an
    agent applies an update only when it is newer than the last one it applied. `config`
    is the stored value as is (an encoded `DesiredConfig`, decoded and validated by the
    agent); None: the entry was deleted or never written.
    """

    version: int = MESSAGES_VERSION
    node: str
    revision: Annotated[int, msgspec.Meta(ge=0)] = 0
    config: bytes | None = None
