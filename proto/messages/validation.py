"""In-pod RDMA evidence, the verdict's reasons, the pair test's result and the
`ValidationResult` a validator pod publishes.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from proto.inventory import Base, Gid, ReadError
from proto.messages import MESSAGES_VERSION

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
    netdevs: tuple[str, ...] = ()  # device/net/: netdevs of the pod's namespace only
    char_devices: tuple[str, ...] = ()  # its uverbs/umad nodes per sysfs (+ rdma_cm)
    ports: tuple[PortEvidence, ...] = ()
    pci_address: str | None = None  # the function behind it (device -> ../0000:1a:00.0)


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


class SriovEnvEvidence(Base, frozen=True, kw_only=True):
    """One `PCIDEVICE_<RESOURCE>` variable the SR-IOV network device plugin injected."""

    variable: str  # e.g. PCIDEVICE_NVIDIA_COM_MLNX_SRIOV_RDMA
    device_ids: tuple[str, ...] = ()  # as written: PCI functions, or auxiliary devices (SFs)
    pci_addresses: tuple[str, ...] = ()  # the device IDs that are PCI functions
    # From `<variable>_INFO`: an RDMA allocation (an rdma entry for a device); None: no _INFO
    rdma: bool | None = None
    rdma_devices: tuple[str, ...] = ()  # the _INFO's rdma_dev names
    missing_pci_addresses: tuple[str, ...] = ()  # RDMA allocation, no visible device has it
    info_error: str | None = None  # `<variable>_INFO` present but unreadable


class InjectedEvidence(Base, frozen=True, kw_only=True):
    """What the device plugin injected (env) against what the pod can see."""

    rdma_devices: tuple[str, ...] | None = None  # NICFLEET_RDMA_DEVICES; None: not set
    # NICFLEET_NETDEVS: *host* netdev names, informational (a pod's are net1, ...)
    netdevs: tuple[str, ...] | None = None
    missing_devices: tuple[str, ...] = ()  # injected but not in /sys/class/infiniband
    missing_netdevs: tuple[str, ...] = ()  # retired: host names are not checked, always ()
    matches: bool | None = None  # None when nothing was injected
    pci_addresses: tuple[str, ...] | None = None  # NICFLEET_PCI_ADDRESSES; None: not set
    missing_pci_addresses: tuple[str, ...] = ()  # injected, no visible RDMA device has it
    sriov: tuple[SriovEnvEvidence, ...] = ()  # the SR-IOV device plugin's PCIDEVICE_* env


class AttachmentEvidence(Base, frozen=True, kw_only=True):
    """One entry of the pod's Multus `k8s.v1.cni.cncf.io/network-status` annotation, with
    its device-info (Network Plumbing WG device-info spec) when the CNI reported one."""

    name: str  # the network, "<namespace>/<net-attach-def>" or the default network's
    interface: str | None = None  # net1; None when the CNI did not say
    ips: tuple[str, ...] = ()
    mac: str | None = None
    default: bool = False  # the pod's primary (cluster) network
    device_type: str | None = None  # device-info "type": pci, vdpa, vhost-user, ...
    pci_address: str | None = None  # device-info pci.pci-address
    pf_pci_address: str | None = None  # device-info pci.pf-pci-address (a VF's PF)
    rdma_device: str | None = None  # device-info pci.rdma-device


PodInterfaceSource = Literal["gid-address", "gid-ndev", "device-net", "device-info"]


class RdmaInterface(Base, frozen=True, kw_only=True):
    """A pod interface identified as an RDMA device's, and every piece of evidence that
    says so (docs/verify.md, "How the pod's RDMA interfaces are found")."""

    interface: str
    device: str
    sources: tuple[PodInterfaceSource, ...] = ()


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
    # the downward-API annotations file read; None: absent (no network-status known)
    annotations_file: str | None = None
    attachments: tuple[AttachmentEvidence, ...] = ()  # network-status, in its order
    rdma_interfaces: tuple[RdmaInterface, ...] = ()  # which pod interfaces are RDMA, why


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
