"""Every wire message besides the snapshot: counters, events, device-plugin status,
desired config, alerts and validation results.

Each top-level message carries a `schema` tag and a `version`; fields added later must
have defaults so that older payloads keep decoding.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from proto.inventory import Base, Gid, ReadError

MESSAGES_VERSION = 1

Severity = Literal["critical", "warning", "info"]
AlertState = Literal["firing", "resolved"]
# port-state: an RDMA port's state/phys_state changed (sysfs);
# netdev-state / netdev-mtu / netdev-address: a netdev changed (netlink);
# device-added / device-removed: an RDMA device appeared or vanished.
EventKind = Literal[
    "port-state", "netdev-state", "netdev-mtu", "netdev-address", "device-added", "device-removed"
]


class PortCounters(Base, frozen=True, kw_only=True):
    """One port's cumulative counters (raw kernel values) and their rates."""

    device: str
    port: int
    counters: dict[str, int] = msgspec.field(default_factory=dict)
    counters_ext: dict[str, int] = msgspec.field(default_factory=dict)
    hw_counters: dict[str, int] = msgspec.field(default_factory=dict)
    rx_bytes: int | None = None
    tx_bytes: int | None = None
    # Per second since the previous sample, keyed "<group>/<name>" (group: counters,
    # counters_ext, hw_counters) plus "rx_bytes" and "tx_bytes". A counter that is
    # saturated or was reset has no rate this round; it is named below instead.
    rates: dict[str, float] = msgspec.field(default_factory=dict)
    saturated: tuple[str, ...] = ()
    resets: tuple[str, ...] = ()
    # Only in a delta batch (see CounterBatch.base_seq): keys that the base batch had and
    # this round has not — "<group>/<name>", "rates/<rate key>", "rx_bytes", "tx_bytes".
    removed: tuple[str, ...] = ()


class CounterBatch(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.CounterBatch"
):
    """One sampling round of every port's counters (core NATS, newest wins).

    A full batch (`base_seq` None) lists every port. A delta batch names the seq of the
    last full batch it is relative to and lists only the ports that differ from it, each
    with only the values that differ (plus its whole `saturated`/`resets` and `removed`);
    see docs/wire.md, "Counter deltas".
    """

    version: int = MESSAGES_VERSION
    node: str
    seq: int
    collected_at: float
    interval_s: float | None = None  # seconds since the previous sample (None: first)
    ports: tuple[PortCounters, ...] = ()
    errors: tuple[ReadError, ...] = ()  # counter files that could not be read
    base_seq: int | None = None  # delta against this full batch; None: a full batch


class LinkEvent(Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.LinkEvent"):
    """An immediate change the agent saw (port state, netdev, device add/remove)."""

    version: int = MESSAGES_VERSION
    node: str
    seq: int
    kind: EventKind
    device: str | None = None  # RDMA device, when the change maps to one
    port: int | None = None
    netdev: str | None = None
    old_state: str | None = None  # port: PortStateName; netdev: operstate; mtu: number
    new_state: str | None = None
    phys_state: str | None = None
    observed_at: float  # unix seconds, when the agent saw the change


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
    # starting | waiting | registering | registered | retrying | rejected | stopped; a plain
    # string on the wire so that a state added later never fails an older decoder.
    registration: str = "starting"
    registration_mode: str | None = None  # legacy | watcher
    registration_error: str | None = None  # the last failure, kept while retrying
    registration_attempts: int = 0  # failed attempts since the last success
    endpoint: str | None = None  # the plugin's socket path


class DevicePluginStatus(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.DevicePluginStatus"
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


class Alert(Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.Alert"):
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


ResyncReason = Literal["start", "reconnect", "slow-consumer", "shard-takeover"]
# The longest window an agent accepts for spreading its answer (docs/wire.md, "Resync").
MAX_RESYNC_SPREAD_S = 300.0


class ResyncRequest(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.ResyncRequest"
):
    """The aggregator may have missed messages: every agent re-publishes its state once.

    Broadcast on `nicfleet.v1.control.resync`. `spread_s` widens the agents' random delay
    for large fleets (the agent's own `resync_jitter_s` is the minimum).
    """

    version: int = MESSAGES_VERSION
    reason: str = "reconnect"  # ResyncReason; a plain string so new reasons still decode
    spread_s: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_RESYNC_SPREAD_S)] = 0.0
    requested_at: float
    # Scoped (sharded takeover, docs/scaling.md): only agents whose node is in one of
    # `partitions` of `partition_count` (proto.subjects.partition_of) answer; 0: every agent.
    # Agents that predate these fields ignore them and answer, as for a broadcast.
    partition_count: Annotated[int, msgspec.Meta(ge=0)] = 0
    partitions: tuple[int, ...] = ()


# The verdict of `nicfleet-agent verify` (docs/verify.md): rdma-path only when every piece
# of evidence is there; ordinary-interface-only when the pod got no RDMA device at all;
# broken when it got some but a piece is missing or wrong.
Verdict = Literal["rdma-path", "ordinary-interface-only", "broken"]
ValidationRole = Literal["server", "client"]
PairTestMethod = Literal["pyverbs", "perftest"]


class CharDeviceEvidence(Base, frozen=True, kw_only=True):
    """An RDMA char device in the container (/dev/infiniband/uverbs0, rdma_cm, umad0)."""

    path: str  # as the container sees it, e.g. /dev/infiniband/uverbs0
    openable: bool = False  # open(O_RDWR|O_NONBLOCK) succeeded
    error: str | None = None  # errno name when it could not be opened


class PortEvidence(Base, frozen=True, kw_only=True):
    port: int
    state: str = "UNKNOWN"  # PortStateName
    phys_state: str | None = None
    link_layer: str = "Unknown"  # InfiniBand | Ethernet | Unknown
    rate_gbps: float | None = None
    lid: int | None = None
    gids: tuple[Gid, ...] = ()  # non-zero GIDs with type and ndev (gid_attrs)


class DeviceEvidence(Base, frozen=True, kw_only=True):
    """An RDMA device visible in /sys/class/infiniband of the pod."""

    name: str
    netdevs: tuple[str, ...] = ()
    char_devices: tuple[str, ...] = ()  # its uverbs/umad nodes per sysfs (+ rdma_cm)
    ports: tuple[PortEvidence, ...] = ()


class InterfaceEvidence(Base, frozen=True, kw_only=True):
    """A network interface of the pod's namespace (netlink), loopback excluded."""

    name: str
    operstate: str | None = None
    mtu: int | None = None
    addresses: tuple[str, ...] = ()  # "10.0.0.5/24", "fd00::5/64"


class GidMatch(Base, frozen=True, kw_only=True):
    """A RoCE GID entry and the pod interface it belongs to (by gid_attrs/ndevs or IP)."""

    device: str
    port: int
    index: int
    gid: str
    type: str | None = None  # "RoCE v2"
    ndev: str | None = None  # gid_attrs/ndevs
    ip: str | None = None  # the IPv4/IPv6 address the GID encodes
    interface: str | None = None  # the pod interface it matches, None: none


class InjectedEvidence(Base, frozen=True, kw_only=True):
    """What the device plugin injected (env) against what the pod can see."""

    rdma_devices: tuple[str, ...] | None = None  # NICFLEET_RDMA_DEVICES; None: not set
    netdevs: tuple[str, ...] | None = None  # NICFLEET_NETDEVS; None: not set
    missing_devices: tuple[str, ...] = ()  # injected but not in /sys/class/infiniband
    missing_netdevs: tuple[str, ...] = ()  # injected but not a pod interface
    matches: bool | None = None  # None when nothing was injected


class VerbsEvidence(Base, frozen=True, kw_only=True):
    """Whether pyverbs opened each device context and queried its ports."""

    checked: bool = True  # False: not looked at (`verify --verbs off`, lab trees)
    available: bool = False
    detail: str = ""  # "ok: 2 devices" or "verbs unavailable: <reason>"
    opened: tuple[str, ...] = ()  # devices whose context opened and ports answered
    failed: dict[str, str] = msgspec.field(default_factory=dict)  # device -> why


class Evidence(Base, frozen=True, kw_only=True):
    char_devices: tuple[CharDeviceEvidence, ...] = ()
    devices: tuple[DeviceEvidence, ...] = ()
    interfaces: tuple[InterfaceEvidence, ...] = ()
    gid_matches: tuple[GidMatch, ...] = ()  # RoCE GIDs only
    injected: InjectedEvidence = InjectedEvidence()
    verbs: VerbsEvidence = VerbsEvidence()
    errors: tuple[ReadError, ...] = ()  # reads that failed


class Reason(Base, frozen=True, kw_only=True):
    """Why the verdict is not rdma-path: `code` is stable, `missing` names the evidence."""

    code: str  # e.g. no-char-devices, port-down, gid-not-on-pod-interface
    missing: str  # the evidence that is missing or wrong, e.g. "/dev/infiniband/uverbs*"
    message: str


class LatencySummary(Base, frozen=True, kw_only=True):
    samples: int
    p50_us: float
    p99_us: float
    min_us: float | None = None
    max_us: float | None = None


class PairTestResult(Base, frozen=True, kw_only=True):
    """The data-path test between two pods; no numbers unless it really ran."""

    method: PairTestMethod
    peer: str | None = None  # host:port of the other side
    message_size: int | None = None  # bytes per RDMA write / send
    iterations: int | None = None
    bytes_per_second: float | None = None  # RDMA write bandwidth
    latency: LatencySummary | None = None  # send/recv round trip / 2
    local_device: str | None = None
    local_port: int | None = None
    local_gid: str | None = None
    remote_device: str | None = None
    remote_gid: str | None = None
    error: str | None = None  # why it did not run or did not finish


class ValidationResult(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.ValidationResult"
):
    """One side's answer to a validation (`nicfleet.v1.validation.<id>`) or `verify -o json`.

    `validation_id` and `role` are set in a validation pod; a plain `verify` leaves them
    None. `pair_test` is None when no pair test was asked for (or the evidence failed first).
    """

    version: int = MESSAGES_VERSION
    validation_id: str | None = None
    role: ValidationRole | None = None
    node: str | None = None  # NODE_NAME (downward API), None when unknown
    pod: str | None = None  # POD_NAME, else the hostname
    verdict: Verdict
    reasons: tuple[Reason, ...] = ()
    evidence: Evidence = Evidence()
    pair_test: PairTestResult | None = None
    started_at: float
    finished_at: float


class ShardVote(Base, frozen=True, array_like=True):
    """Nodes of one partition casting `value` in a fleet-level rule's group (rules/peers)."""

    partition: int
    rule: str
    group: object  # str, int, None or a list of them (a tuple on the sender's side)
    value: object
    count: int


MAX_STALE_NAMES: Final = 20_000  # ~300 KB of names: well inside NATS's 1 MB max payload


class ShardSummary(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.ShardSummary"
):
    """A sharded aggregator replica's vote counts per partition it holds, on
    `nicfleet.v1.shard.<replica>.summary` (docs/scaling.md)."""

    version: int = MESSAGES_VERSION
    replica: str
    partitions: tuple[int, ...] = ()
    nodes: int = 0
    votes: tuple[ShardVote, ...] = ()
    sent_at: float
    api_url: str = ""  # the replica's HTTP API, for forwarding node requests to their holder
    # Its nodes it has heard nothing from within stale_after (sorted, at most
    # MAX_STALE_NAMES): the leader's policy status counts them as Stale.
    stale: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_STALE_NAMES)] = ()
