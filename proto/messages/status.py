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


class DraClaimState(Base, frozen=True, kw_only=True):
    """One ResourceClaim the agent's DRA plugin prepared (from its checkpoint) or failed to
    prepare on its last attempt (`error` set, nothing written)."""

    uid: str
    namespace: str
    name: str
    devices: tuple[str, ...] = ()  # DRA device names (mlx5-0, mlx5-0-s1), prepared only
    cdi_ids: tuple[str, ...] = ()  # what NodePrepareResources answered, prepared only
    error: str | None = None  # the per-claim error of the last failed prepare
    at: float = 0.0  # agent clock: when it was prepared, or when the prepare failed


class DraSliceConfig(Base, frozen=True, kw_only=True):
    """How the agent's devices are to be published (proto.draslices.SliceSettings), so
    that the aggregator's publisher and API build the node's slices as the node asks."""

    sharing: str = "exclusive"  # exclusive | copies | consumable (a plain string on the wire)
    share: int = 1  # --dra-share: allocations one RDMA device may serve at once
    rails: dict[str, int] = msgspec.field(default_factory=dict)  # RDMA device -> rail, given


class DraPluginStatus(Base, frozen=True, kw_only=True):
    """The agent's DRA kubelet plugin (`--dra`): registration, what it prepared, what failed."""

    # starting | waiting | registered | rejected | retrying | stopped (DraPlugin.state)
    state: str = "starting"
    error: str | None = None
    endpoint: str | None = None  # dra.sock path
    slices: DraSliceConfig = msgspec.field(default_factory=DraSliceConfig)
    prepared: tuple[DraClaimState, ...] = ()  # the checkpoint's claims, by UID
    # The newest failed prepares of claims not prepared since, newest first, at most 32.
    failed: tuple[DraClaimState, ...] = ()
    unhealthy: dict[str, str] = msgspec.field(default_factory=dict)  # DRA device -> why


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
    # The DRA kubelet plugin, when the agent runs one (`--dra`); None: off. An agent running
    # only the DRA plugin sends this message with `resources` empty.
    dra: DraPluginStatus | None = None
