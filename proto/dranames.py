"""DRA device names for RDMA devices (driver `rdma.nicfleet.io`): pure, shared by the agent
(ResourceSlices, NodePrepareResources) and the aggregator (claim explanations).

A DRA device name is a DNS label (lowercase alphanumerics and '-', at most 63 characters),
so an RDMA device name's '_' becomes '-' (`mlx5_bond_0` -> `mlx5-bond-0`); where shared use
is published as N devices per adapter, copy i is `<name>-s<i>`. RDMA device names never
contain '-' (the kernel's names are `<driver><n>` or `<driver>_<word>_<n>`), so the mapping
can be reversed.
"""

from __future__ import annotations

import re
from typing import Final

from proto.errors import ProtoError

DRIVER: Final = "rdma.nicfleet.io"
MAX_NAME: Final = 63
_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SHARE: Final = re.compile(r"^(?P<base>.+)-s(?P<index>0|[1-9][0-9]*)$")


class InvalidDeviceName(ProtoError, ValueError):
    """A name that is not (or cannot become) a DRA device name, with the reason."""


def device_name(rdma_device: str, share: int | None = None) -> str:
    """The DRA device name of `rdma_device` (copy `share` of it when shared as N devices)."""
    if "-" in rdma_device:
        raise InvalidDeviceName(f"{rdma_device!r}: RDMA device names have no '-'")
    name = rdma_device.replace("_", "-")
    if _SHARE.match(name):  # `foo_s1` would read back as copy 1 of `foo`
        raise InvalidDeviceName(f"{rdma_device!r} ends like a share copy ('_s<i>')")
    if share is not None:
        if share < 0:
            raise InvalidDeviceName(f"share index {share} is negative")
        name = f"{name}-s{share}"
    if len(name) > MAX_NAME or not _LABEL.match(name):
        raise InvalidDeviceName(f"{name!r} is not a DNS label of at most {MAX_NAME} characters")
    return name


def rdma_device_of(name: str) -> tuple[str, int | None]:
    """The RDMA device and share index a DRA device name stands for (the reverse)."""
    if len(name) > MAX_NAME or not _LABEL.match(name):
        raise InvalidDeviceName(f"{name!r} is not a DNS label of at most {MAX_NAME} characters")
    match = _SHARE.match(name)
    if match is not None:
        return match["base"].replace("-", "_"), int(match["index"])
    return name.replace("-", "_"), None
