"""Reads the in-pod RDMA evidence from explicit roots: char devices under `--dev-root`,
RDMA devices and ports from `--sysfs-root`, the pod's interfaces (netlink), the env the
device plugin injected, the Multus network-status in the downward-API annotations file,
and verbs. It decides nothing: agent.verify.identify and agent.verify.verdict judge.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from agent.counters import reader as counters
from agent.deviceplugin.plan import ENV_RDMA_DEVICES
from agent.errors import AgentError, ReadErrorLog
from agent.host import devices
from agent.host.sysfs import Sysfs, errno_name
from agent.host.verbs import query_devices
from agent.links.netdevs import netdevs_from_dump
from agent.links.netlink import NetlinkUnavailable, NetlinkWatcher
from agent.verify import identify, networkstatus, verdict
from proto.inventory import Device, ReadError
from proto.messages.validation import (
    AttachmentEvidence,
    CharDeviceEvidence,
    DeviceEvidence,
    Evidence,
    InterfaceEvidence,
    PortEvidence,
    VerbsEvidence,
)

# What an RDMA workload needs from /dev/infiniband: uverbsN (verbs), rdma_cm (RDMA CM),
# umadN (MADs: ibstat, perftest's IB path queries). issmN is for subnet managers only.
_CHAR_NAME: Final = re.compile(r"(?:uverbs|umad)[0-9]+|rdma_cm", re.ASCII)
# O_NONBLOCK: a FIFO standing in for a device (tests) must not wait for a writer.
_NUMBERED: Final = re.compile(r"([a-z_]+?)([0-9]+)", re.ASCII)
_OPEN_FLAGS: Final = os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
LOOPBACK: Final = "lo"
# Where pod specs conventionally mount `metadata.annotations` with a downwardAPI volume.
DEFAULT_ANNOTATIONS: Final = Path("/etc/podinfo/annotations")


@dataclass(frozen=True, kw_only=True)
class EvidenceSettings:
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    netns: str | None = None  # None: the namespace verify runs in (the pod's)
    verbs: bool = True
    verbs_path: Path | None = None
    environ: Mapping[str, str] = field(default_factory=dict)
    annotations: Path | None = DEFAULT_ANNOTATIONS  # None: do not look for network-status


def read_char_devices(dev_root: Path) -> tuple[CharDeviceEvidence, ...]:
    """Every RDMA char device under <dev_root>/infiniband, opened read-write and closed."""
    base = dev_root / "infiniband"
    try:
        names = [n for n in os.listdir(base) if _CHAR_NAME.fullmatch(n)]
    except FileNotFoundError:
        return ()
    except OSError as exc:
        return (CharDeviceEvidence(path="/dev/infiniband", error=errno_name(exc)),)
    found: list[CharDeviceEvidence] = []
    for name in sorted(names, key=_char_order):
        path = f"/dev/infiniband/{name}"
        try:
            fd = os.open(base / name, _OPEN_FLAGS)
        except OSError as exc:
            found.append(CharDeviceEvidence(path=path, error=errno_name(exc)))
        else:
            os.close(fd)
            found.append(CharDeviceEvidence(path=path, openable=True))
    return tuple(found)


def _char_order(name: str) -> tuple[int, int]:
    """uverbsN first (in number order), then rdma_cm, then umadN."""
    match = _NUMBERED.fullmatch(name)
    number = int(match.group(2)) if match else -1
    return (0 if name.startswith("uverbs") else 1 if name == "rdma_cm" else 2), number


def read_rdma_devices(sysfs: Sysfs) -> tuple[tuple[DeviceEvidence, ...], tuple[ReadError, ...]]:
    """The RDMA devices of /sys/class/infiniband with ports, GIDs and char devices."""
    errors = ReadErrorLog()
    chars = devices.char_devices(sysfs, errors)
    found: list[DeviceEvidence] = []
    for name in counters.device_names(sysfs, errors):
        device = devices.read_device(sysfs, name, chars).device
        found.append(_device_evidence(device))
        for error in device.errors:
            errors.record(error.path, error.error)
    return tuple(found), errors.to_tuple()


def _device_evidence(device: Device) -> DeviceEvidence:
    return DeviceEvidence(
        name=device.name,
        netdevs=device.netdevs,
        char_devices=device.char_devices,
        ports=tuple(
            PortEvidence(
                port=p.port,
                state=p.state,
                phys_state=p.phys_state,
                link_layer=p.link_layer,
                rate_gbps=p.rate_gbps,
                lid=p.lid,
                gids=p.gids,
            )
            for p in device.ports
        ),
        pci_address=device.pci_address,
    )


def read_attachments(
    path: Path | None,
) -> tuple[str | None, tuple[AttachmentEvidence, ...], ReadError | None]:
    """(the file read, its network-status entries, the error). A missing file is no error:
    most pods do not mount their annotations, and then no network-status is known."""
    if path is None:
        return None, (), None
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None, (), None
    except OSError as exc:
        return None, (), ReadError(path=str(path), error=errno_name(exc))
    try:
        return str(path), networkstatus.attachments_from_annotations(text), None
    except networkstatus.AnnotationsError as exc:
        return str(path), (), ReadError(path=str(path), error=str(exc))


async def read_interfaces(netns: str | None) -> tuple[InterfaceEvidence, ...]:
    """The interfaces and addresses of the namespace (loopback left out), via netlink.

    Raises NetlinkUnavailable when netlink cannot be used.
    """
    async with NetlinkWatcher(netns=netns) as watcher:
        table = netdevs_from_dump(await watcher.dump())
    return tuple(
        InterfaceEvidence(
            name=n.name, operstate=n.operstate, mtu=n.mtu, addresses=tuple(sorted(n.ips))
        )
        for _, n in sorted(table.items())
        if n.name != LOOPBACK
    )


async def collect_evidence(settings: EvidenceSettings) -> Evidence:
    """Everything `verify` judges. Raises SysfsRootError for a bad --sysfs-root."""
    sysfs = Sysfs(settings.sysfs_root)
    char_devices = read_char_devices(settings.dev_root)
    rdma, errors = read_rdma_devices(sysfs)
    read_errors = list(errors)
    try:
        interfaces = await read_interfaces(settings.netns)
    except (NetlinkUnavailable, AgentError) as exc:
        interfaces = ()
        read_errors.append(ReadError(path="netlink", error=str(exc)))
    annotations_file, attachments, annotations_error = read_attachments(settings.annotations)
    if annotations_error is not None:
        read_errors.append(annotations_error)
    names = [d.name for d in rdma]
    if settings.verbs:
        targets = verdict.parse_env_list(settings.environ.get(ENV_RDMA_DEVICES))
        found = await asyncio.to_thread(
            query_devices, targets or names, search_path=settings.verbs_path
        )
        verbs = VerbsEvidence(
            available=found.available, detail=found.detail, opened=found.opened, failed=found.failed
        )
    else:
        verbs = VerbsEvidence(checked=False, detail="not checked (--verbs off)")
    gid_matches = verdict.match_gids(rdma, interfaces)
    return Evidence(
        char_devices=char_devices,
        devices=rdma,
        interfaces=interfaces,
        gid_matches=gid_matches,
        injected=verdict.injected_evidence(settings.environ, rdma),
        verbs=verbs,
        errors=tuple(read_errors),
        annotations_file=annotations_file,
        attachments=attachments,
        rdma_interfaces=identify.identify_interfaces(rdma, interfaces, gid_matches, attachments),
    )
