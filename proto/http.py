"""The aggregator's HTTP API response types: what `/api/v1/*` serves and `nicfleetctl` reads.

The API encodes these Structs and the CLI decodes the same ones, so the two cannot drift.
Imports only msgspec, the standard library and the wire modules of `proto`.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from proto.inventory import Base, NodeSnapshot
from proto.messages.counters import CounterBatch
from proto.messages.status import DevicePluginStatus
from proto.messages.validation import ValidationResult

NodeState = Literal["ready", "stale", "no-snapshot"]
NODE_STATES: Final[tuple[NodeState, ...]] = ("ready", "stale", "no-snapshot")


class NodeSummary(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    state: NodeState
    devices: int
    ports_total: int
    ports_active: int
    ports_down: tuple[str, ...]  # "mlx5_3/1" for every port not ACTIVE/ACTIVE_DEFER
    link_layers: tuple[str, ...]
    max_rate_gbps: float | None
    gpus: int
    firmware: tuple[str, ...]
    agent_version: str | None
    errors: int  # files the agent could not read (device and host level)
    last_seen: float
    age_s: float


class EventView(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    kind: str
    device: str | None
    port: int | None
    netdev: str | None
    old_state: str | None
    new_state: str | None
    phys_state: str | None
    observed_at: float
    received_at: float
    latency_ms: float  # received_at - observed_at; negative means clock skew


# The GPUDirect RDMA memory-registration paths a node can use: dma-buf (open NVIDIA kernel
# modules, Linux 5.12+), peermem (nvidia_peermem / nv_peer_mem loaded), both, none, or
# unknown (the snapshot cannot tell). The IOMMU's DMA mode for the GPUs and adapters.
GpuDirectPathState = Literal["both", "dma-buf", "peermem", "none", "unknown"]
IommuMode = Literal["off", "passthrough", "translated", "unknown"]


class GpuDirect(msgspec.Struct, frozen=True, kw_only=True):
    """A node's GPUDirect facts as the tuned-host rules judge them (peermem-missing,
    iommu-translated), computed by the aggregator from the node's snapshot."""

    path: GpuDirectPathState
    paths: tuple[Literal["dma-buf", "peermem"], ...]  # usable, preferred first
    path_reason: str  # one sentence: why this path, or why none / unknown
    iommu: IommuMode
    iommu_reason: str  # where the mode comes from (group types, command line)
    nvidia_kernel_module: Literal["open", "proprietary"] | None
    kernel_release: str | None


class NodeDetail(msgspec.Struct, frozen=True, kw_only=True):
    summary: NodeSummary
    first_seen: float
    snapshot: NodeSnapshot | None
    snapshot_received_at: float | None
    counters: CounterBatch | None
    counters_received_at: float | None
    device_plugin: DevicePluginStatus | None
    events: tuple[EventView, ...]  # oldest first
    gpudirect: GpuDirect | None = None  # None: no snapshot yet (or an older aggregator)


class ResourceOnNode(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    state: NodeState | None  # None: known to the cluster only, no agent
    configured: bool  # a policy selecting the node configures the resource
    advertised: int | None  # None: the agent does not report the resource
    healthy: int | None
    registration: str | None
    allocatable: int | None  # None: no cluster, or the kubelet does not list it
    # registration "config-invalid": the agent leaves this configList entry out (it serves
    # the config's valid ones); the field at fault (configList[1].resourcePrefix) and why.
    config_path: str | None = None
    config_error: str | None = None
    # Why every device is Unhealthy whatever the adapters' health (ResourceStatus's).
    unhealthy_reason: str | None = None


class ResourceSummary(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # rdma/hca_shared_devices_a
    nodes_selected: int  # configured by a policy or served by the agent
    nodes_advertising: int  # non-stale nodes advertising > 0
    capacity: int  # sum of advertised over non-stale nodes
    healthy: int
    allocatable: int | None  # sum of node allocatable; None without a cluster
    # Where resource-zero fires (aggregator.fleet.servable): advertising 0, or not serving
    # it; no healthy device. Nodes that report no plugin status yet are not judged.
    zero_nodes: tuple[str, ...]
    unhealthy_nodes: tuple[str, ...]  # advertising, but no healthy device (allocatable 0)
    stale_nodes: tuple[str, ...]
    nodes: tuple[ResourceOnNode, ...]


# degraded: the link holds with reduced capacity (some adapters unhealthy or down, named in
# its cause and evidence); unknown: it could not be judged (no cluster, never validated).
LinkStatus = Literal["ok", "degraded", "broken", "unknown"]
# A chain's verdict, worst first: broken (a link or `components` is) > degraded > unknown
# (nothing broken or degraded, some link not judged) > ok (every link ok).
Verdict = Literal["ok", "degraded", "broken", "unknown"]
VERDICTS: Final[tuple[Verdict, ...]] = ("broken", "degraded", "unknown", "ok")


class Link(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    status: LinkStatus
    evidence: dict[str, Any] = msgspec.field(default_factory=dict)
    cause: str | None = None  # broken links only: the likely cause ...
    fix: str | None = None  # ... and what to do about it


class Trace(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    resource: str
    checked_at: float
    verdict: Verdict = "unknown"  # absent from an older aggregator's answer: not judged here
    # One sentence behind the verdict, the same the CLI and the status page show: the broken
    # link, the adapters that reduce capacity, or the links not judged.
    verdict_reason: str = ""
    ok: bool  # verdict == "ok": every link ok, and `components` (kept for older clients)
    first_broken: int | None  # index into links
    links: tuple[Link, ...]
    # What the cluster must run on the node (DaemonSets, NicClusterPolicy, Node conditions):
    # a precondition of every link, kept out of `links` so their indices stay stable.
    components: Link | None = None


class PodTrace(msgspec.Struct, frozen=True, kw_only=True):
    """One pod's own chain (`GET /api/v1/trace?pod=NS/NAME`): where it is, what it
    requests, its scheduling link and, once on a node, the chain of each resource there."""

    namespace: str
    name: str
    node: str | None  # None: not scheduled (`scheduling` says why)
    phase: str | None
    requests: dict[str, int]  # resource -> count
    checked_at: float
    ok: bool  # scheduling is not broken and no link of any resource's chain is
    scheduling: Link
    traces: tuple[Trace, ...]  # one per requested resource, by name; () when unscheduled
    # Requested resources with no RDMA chain to trace, and why (another device plugin's: a
    # GPU, an SR-IOV pool nicfleet does not serve).
    untraced: dict[str, str] = msgspec.field(default_factory=dict)
    # Why a scheduled pod has no RDMA chain at all (None when it has one, or is pending).
    no_chain: str | None = None
    # DRA: one chain per entry of the pod's spec.resourceClaims that asks for (or was
    # allocated) an rdma.nicfleet.io device, by entry name (aggregator.trace.dra). Each is
    # a Trace whose `resource` is "claim/<entry>" and whose `node` is the pod's node ("" while
    # the pod is pending); `ok` above also requires none of them broken.
    claims: tuple[Trace, ...] = ()


Phase = Literal["pending", "pods-created", "running", "collecting", "done", "failed", "timed-out"]


PHASES: Final[tuple[Phase, ...]] = (
    "pending", "pods-created", "running", "collecting", "done", "failed", "timed-out",
)  # fmt: skip


FINAL_PHASES: Final[frozenset[Phase]] = frozenset({"done", "failed", "timed-out"})


class ValidationRecord(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.stored-validation"
):
    """One validation as stored in KV `nicfleet-validations` (key: id) and served."""

    version: int = 1
    id: str
    nodes: tuple[str, str]  # (server, client)
    resource: str
    network: str | None = None
    namespace: str
    runner: str = ""  # the aggregator replica that runs it
    phase: Phase
    reason: str | None = None  # why it is where it is (always set once final)
    passed: bool = False  # done, both sides rdma-path with a pair test result
    created_at: float
    updated_at: float
    phase_since: float
    finished_at: float | None = None
    server_ip: str | None = None
    server: ValidationResult | None = None
    client: ValidationResult | None = None
    bytes_per_second: float | None = None  # the best bandwidth either side measured
    latency_p50_us: float | None = None
    pods_deleted: bool = False
