"""Which addresses an IPAM plugin may hand a pod, as integer intervals: NV-IPAM's per-node
range (an IPPool block, a CIDRPool prefix) without its gateway and exclusions, and how many
blocks/prefixes a pool has; whereabouts' range (range_start, range_end, exclude) and its
Fast-IPAM node slices, and the names of the IPPools it keeps them in.

Pure, stdlib only. The rules are the upstream allocators' (Mellanox/nvidia-k8s-ipam
pkg/ipam-node/allocator and pkg/ipam-controller; k8snetworkplumbingwg/whereabouts
pkg/allocate, pkg/iphelpers, pkg/storage/kubernetes), each cited where it is applied.
"""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from aggregator.errors import AggregatorError

Net = ipaddress.IPv4Network | ipaddress.IPv6Network
# Counting every block of a pool walks them; past this many, holes are not looked for.
MAX_WALK: Final = 1 << 16


class AddressSet(msgspec.Struct, frozen=True):
    """lo..hi (inclusive) minus `holes` (merged, inside lo..hi, sorted)."""

    version: int
    lo: int
    hi: int
    holes: tuple[tuple[int, int], ...] = ()

    def __contains__(self, address: object) -> bool:
        return (
            isinstance(address, int)
            and self.lo <= address <= self.hi
            and not any(a <= address <= b for a, b in self.holes)
        )

    def __len__(self) -> int:
        return self.hi - self.lo + 1 - sum(b - a + 1 for a, b in self.holes)

    def label(self) -> str:
        return f"{_text(self.version, self.lo)}-{_text(self.version, self.hi)}"


class IpamError(AggregatorError, ValueError):
    """The plugin would refuse this configuration for every pod; the message says why."""


def parse_ip(text: str | None) -> tuple[int, int] | None:
    """(version, integer) of "a.b.c.d" or "a.b.c.d/nn" (network-status writes either)."""
    if not text:
        return None
    try:
        address = ipaddress.ip_address(text.split("/", 1)[0].strip())
    except ValueError:
        return None
    return address.version, int(address)


def address_set(version: int, lo: int, hi: int, out: Iterable[tuple[int, int]]) -> AddressSet:
    """lo..hi without every (a, b) of `out`, clipped to lo..hi and merged."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in out if a <= hi and b >= lo):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return AddressSet(version, lo, hi, tuple(merged))


# --- NV-IPAM ---------------------------------------------------------------------------------


def _p2p_or_single(net: Net) -> bool:
    return net.prefixlen >= net.max_prefixlen - 1


def _nv_last(net: Net) -> int:
    """pkg/ip LastIP: the last address, less the broadcast for IPv4 wider than /31."""
    last = int(net.broadcast_address)
    return last - 1 if net.version == 4 and not _p2p_or_single(net) else last


def _overlap_check(ranges: Sequence[tuple[int, int]], version: int) -> None:
    """The node agent puts the exclusions in one RangeSet and Canonicalize refuses any two
    sharing an address ("subnets ... overlap"): every allocation from the pool then fails.
    The webhook does not look for overlaps."""
    ordered = sorted(ranges)
    for (a1, b1), (a2, b2) in itertools.pairwise(ordered):
        if a2 <= b1:
            raise IpamError(
                f"exclusions {_text(version, a1)}-{_text(version, b1)} and "
                f"{_text(version, a2)}-{_text(version, b2)} overlap: NV-IPAM's node agent "
                "refuses the pool's exclusion set, so every allocation from it fails"
            )


def _ranges(version: int, pairs: Iterable[tuple[str, str]]) -> list[tuple[int, int]]:
    found = []
    for start, end in pairs:
        a, b = parse_ip(start), parse_ip(end)
        if a is None or b is None or a[0] != version or b[0] != version:
            continue
        found.append((a[1], b[1]))
    return found


def _clamp(ranges: Iterable[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """apis ClampExcludeRanges: those touching lo..hi, cut to it."""
    return [(max(a, lo), min(b, hi)) for a, b in ranges if not (a > hi or b < lo)]


def nv_ippool_block(
    first: str, last: str, *, gateway: str | None, exclusions: Iterable[tuple[str, str]],
    per_node: Iterable[tuple[int, int]],
) -> AddressSet:  # fmt: skip
    """A node's IPPool block as the node agent serves it: startIP..endIP, the gateway
    skipped, spec.exclusions as written and perNodeExclusions counted from startIP (clamped
    to the block). Raises IpamError for a block that does not parse or refused exclusions."""
    a, b = parse_ip(first), parse_ip(last)
    if a is None or b is None or a[0] != b[0] or b[1] < a[1]:
        raise IpamError(f"the block {first}-{last} does not parse")
    version, lo, hi = a[0], a[1], b[1]
    out = _ranges(version, exclusions)
    out += _clamp(((lo + s, lo + e) for s, e in per_node), lo, hi)
    _overlap_check(out, version)
    gw = parse_ip(gateway)
    holes = out + ([(gw[1], gw[1])] if gw is not None and gw[0] == version else [])
    return address_set(version, lo, hi, holes)


def nv_cidrpool_block(
    prefix: str, *, gateway: str | None, exclusions: Iterable[tuple[str, str]],
    per_node: Iterable[tuple[int, int]],
) -> AddressSet:  # fmt: skip
    """A node's CIDRPool prefix as the node agent serves it (pkg/ipam-node/controllers/
    cidrpool): network+1 (the network itself for /31, /32, /127, /128) to LastIP, the
    allocation's gateway skipped; a spec exclusion counts only with an end inside the
    prefix (the other end cut to the range); perNodeExclusions count from the network
    address."""
    try:
        net = ipaddress.ip_network(prefix, strict=False)
    except ValueError as exc:
        raise IpamError(f"the prefix {prefix} does not parse") from exc
    version, network = net.version, int(net.network_address)
    lo = network if _p2p_or_single(net) else network + 1
    hi = _nv_last(net)
    out = []
    for a, b in _ranges(version, exclusions):
        has_a, has_b = (
            network <= a <= int(net.broadcast_address),
            (network <= b <= int(net.broadcast_address)),
        )
        if has_a or has_b:
            out.append((a if has_a else lo, b if has_b else hi))
    out += _clamp(((network + s, network + e) for s, e in per_node), network, hi)
    _overlap_check(out, version)
    gw = parse_ip(gateway)
    holes = out + ([(gw[1], gw[1])] if gw is not None and gw[0] == version else [])
    return address_set(version, lo, hi, holes)


def _fully_excluded(lo: int, hi: int, out: Iterable[tuple[int, int]]) -> bool:
    """The controller's isEntireRangeExcluded: the merged exclusions cover lo..hi."""
    holes = address_set(0, lo, hi, out).holes
    return len(holes) == 1 and holes[0] == (lo, hi)


def nv_ippool_block_count(
    subnet: str, block_size: int, *, gateway: str | None,
    exclusions: Iterable[tuple[str, str]], per_node: Iterable[tuple[int, int]],
) -> int | None:  # fmt: skip
    """How many blocks the controller can hand out (pkg/ipam-controller/allocator): from
    network+1 (the network for /31, /32), perNodeBlockSize apart, the last one ending
    inside the subnet and not on the IPv4 broadcast; less the blocks wholly excluded and,
    with a block size of 1, the gateway's. None when the subnet does not parse."""
    try:
        net = ipaddress.ip_network(subnet, strict=False)
    except ValueError:
        return None
    if block_size <= 0:
        return None
    first = int(net.network_address) + (0 if _p2p_or_single(net) else 1)
    end_max = int(net.broadcast_address)
    if net.version == 4 and not _p2p_or_single(net):
        end_max -= 1
    count = max((end_max - first + 1) // block_size, 0)
    if count > MAX_WALK:
        return count
    spec = _ranges(net.version, exclusions)
    nodes = tuple(per_node)
    gw = parse_ip(gateway)
    usable = 0
    for i in range(count):
        lo = first + i * block_size
        hi = lo + block_size - 1
        if block_size == 1 and gw is not None and gw[1] == lo:
            continue
        if _fully_excluded(lo, hi, spec + [(lo + s, lo + e) for s, e in nodes]):
            continue
        usable += 1
    return usable


def nv_cidrpool_prefix_count(
    cidr: str, node_prefix: int, *, exclusions: Iterable[tuple[str, str]],
    per_node: Iterable[tuple[int, int]],
) -> int | None:  # fmt: skip
    """How many per-node prefixes the controller can hand out: every /node_prefix of the
    CIDR less those wholly excluded (network address .. LastIP). None when it does not
    parse or the prefix is shorter than the CIDR's."""
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return None
    if not net.prefixlen <= node_prefix <= net.max_prefixlen:
        return None
    count = 1 << (node_prefix - net.prefixlen)
    if count > MAX_WALK:
        return count
    spec = _ranges(net.version, exclusions)
    nodes = tuple(per_node)
    usable = 0
    for sub in net.subnets(new_prefix=node_prefix):
        lo = int(sub.network_address)
        hi = _nv_last(sub)
        if not _fully_excluded(lo, hi, spec + [(lo + s, lo + e) for s, e in nodes]):
            usable += 1
    return usable


# --- whereabouts -----------------------------------------------------------------------------


def _usable(net: Net) -> tuple[int, int]:
    """iphelpers First/LastUsableIP: network+1 .. broadcast-1, IPv6 alike; a subnet with at
    most one host bit has none."""
    if net.max_prefixlen - net.prefixlen <= 1:
        raise IpamError(f"{net} has no usable addresses (whereabouts needs 2 host bits)")
    return int(net.network_address) + 1, int(net.broadcast_address) - 1


def whereabouts_range(
    cidr: str, range_start: str | None, range_end: str | None, exclude: Iterable[str]
) -> AddressSet:
    """What whereabouts' IterateForAssignment walks: the usable addresses of the range,
    narrowed by range_start and range_end (inclusive, each ignored unless it lies inside
    the range so far: GetIPRange), less every exclude entry (a CIDR, network and broadcast
    included, or one address)."""
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError as exc:
        raise IpamError(f"ipam.range {cidr!r} is not a CIDR") from exc
    lo, hi = _usable(net)
    start, end = parse_ip(range_start), parse_ip(range_end)
    if start is not None and start[0] == net.version and lo <= start[1] <= hi:
        lo = start[1]
    if end is not None and end[0] == net.version and lo <= end[1] <= hi:
        hi = end[1]
    holes = []
    for entry in exclude:
        try:
            excluded = ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError as exc:
            # parseExcludedRange fails the allocation: every pod of the NAD is refused.
            raise IpamError(f"ipam.exclude entry {entry!r} is neither a CIDR nor an IP") from exc
        if excluded.version == net.version:
            holes.append((int(excluded.network_address), int(excluded.broadcast_address)))
    return address_set(net.version, lo, hi, holes)


def whereabouts_slice(cidr: str, slice_range: str) -> AddressSet:
    """A node's Fast-IPAM slice: its usable addresses as range_start/range_end over the
    whole range (IPManagementKubernetesUpdate). The range's `exclude` is not carried into
    the slice's range configuration upstream, so it does not apply here either."""
    try:
        piece = ipaddress.ip_network(slice_range, strict=False)
    except ValueError as exc:
        raise IpamError(f"the slice {slice_range!r} is not a CIDR") from exc
    lo, hi = _usable(piece)
    return whereabouts_range(cidr, _text(piece.version, lo), _text(piece.version, hi), ())


def whereabouts_slice_count(cidr: str, slice_size: int) -> int | None:
    """DivideRangeBySize: 2^(slice size - range prefix) slices; None when it cannot."""
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return None
    if not net.prefixlen <= slice_size <= net.max_prefixlen:
        return None
    return 1 << (slice_size - net.prefixlen)


def whereabouts_pool_name(ip_range: str, network_name: str | None, node: str | None) -> str:
    """IPPoolName: the normalized range ("10.0.0.0-24", IPv6 ':' -> '-'), after the
    network_name and, for a node slice, the node's name."""
    text = ip_range + "0" if ip_range.endswith(":") else ip_range
    normalized = text.replace(":", "-").replace("/", "-")
    return "-".join(p for p in (network_name, node, normalized) if p)


def _text(version: int, value: int) -> str:
    return str(ipaddress.IPv4Address(value) if version == 4 else ipaddress.IPv6Address(value))
