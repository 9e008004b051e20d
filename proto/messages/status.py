"""The device plugin's applied config and advertised counts, per resource."""

from __future__ import annotations

import msgspec

from proto.inventory import Base
from proto.messages import MESSAGES_VERSION


class ResourceStatus(Base, frozen=True, kw_only=True):
    """One advertised resource as the agent's device plugin serves it."""

    name: str  # rdma/hca_shared_devices_a
    advertised: int = 0  # device IDs in the ListAndWatch list
    healthy: int = 0
    devices: tuple[str, ...] = ()  # selected adapters (RDMA device names)
    exclusive: bool = False  # one device ID per adapter instead of shared slots
    excluded: dict[str, str] = msgspec.field(default_factory=dict)  # matched, unusable: why
    unmatched: dict[str, str] = msgspec.field(default_factory=dict)  # adapter -> failed selector
    unhealthy: dict[str, str] = msgspec.field(default_factory=dict)  # selected adapter -> why
    # Why every device is Unhealthy whatever its adapters' health, e.g. "netns-exclusive: …"
    # (a shared resource on a node in exclusive RDMA netns mode); None otherwise.
    unhealthy_reason: str | None = None
    # starting | waiting | registering | registered | retrying | rejected | stopped, or
    # config-invalid (never served, see config_error); a plain string on the wire so that
    # a state added later never fails an older decoder.
    registration: str = "starting"
    registration_mode: str | None = None  # legacy | watcher
    registration_error: str | None = None  # the last failure, kept while retrying
    registration_attempts: int = 0  # failed attempts since the last success
    endpoint: str | None = None  # the plugin's socket path
    # A configList entry that is not served: the field at fault (configList[2].resourcePrefix)
    # and why; None for a served resource. The config's valid entries are served.
    config_path: str | None = None
    config_error: str | None = None


class DevicePluginStatus(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.DevicePluginStatus"
):
    version: int = MESSAGES_VERSION
    node: str
    config_generation: int = 0
    registered: bool = False
    resources: tuple[ResourceStatus, ...] = ()
    observed_at: float
    # The agent process that sent it (docs/wire.md, "Ordering"): its start in unix ns by
    # its own clock, the same in every message of one process; 0: an agent older than epochs.
    epoch: int = 0
