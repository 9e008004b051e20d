"""aggregator.ipam (pure): the addresses NV-IPAM and whereabouts may hand a pod, table tests
from the upstream allocators' rules, and properties against a brute-force walk of the
addresses (the way the allocators iterate them)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregator import ipam

V4 = ipaddress.IPv4Address


def a(text: str) -> int:
    return int(ipaddress.ip_address(text))


# --- the interval arithmetic -------------------------------------------------------------------


@given(
    lo=st.integers(0, 64),
    span=st.integers(0, 64),
    out=st.lists(st.tuples(st.integers(-8, 140), st.integers(0, 16)), max_size=6),
)
def test_address_set_counts_as_a_walk_does(lo: int, span: int, out: list[tuple[int, int]]) -> None:
    hi = lo + span
    holes = [(start, start + width) for start, width in out]
    got = ipam.address_set(4, lo, hi, holes)
    walk = [x for x in range(lo, hi + 1) if not any(s <= x <= e for s, e in holes)]
    assert len(got) == len(walk)
    assert all((x in got) == (x in walk) for x in range(lo - 2, hi + 3))


# --- NV-IPAM -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "gateway", "exclusions", "per_node", "expected"),
    [
        pytest.param("10.0.0.0/24", None, (), (), 254, id="v4-without-network-and-broadcast"),
        pytest.param("10.0.0.0/24", "10.0.0.1", (), (), 253, id="gateway-skipped"),
        pytest.param("fd00::/120", None, (), (), 255, id="v6-network-skipped-last-kept"),
        pytest.param("10.0.0.4/31", None, (), (), 2, id="point-to-point"),
        pytest.param("10.0.0.4/32", None, (), (), 1, id="single"),
        # An exclusion with neither end inside the prefix is dropped (buildExclusions).
        pytest.param("10.0.0.0/29", None, (("9.255.255.0", "10.0.1.0"),), (), 6,
                     id="exclusion-around-the-prefix-ignored"),
        pytest.param("10.0.0.0/29", None, (("10.0.0.5", "10.0.1.0"),), (), 4,
                     id="exclusion-cut-to-the-range"),
        # perNodeExclusions count from the network address: index 1 is .1.
        pytest.param("10.0.0.0/29", None, (), ((0, 1),), 5, id="per-node-from-network"),
    ],
)  # fmt: skip
def test_cidrpool_block(
    prefix: str,
    gateway: str | None,
    exclusions: tuple[tuple[str, str], ...],
    per_node: tuple[tuple[int, int], ...],
    expected: int,
) -> None:
    block = ipam.nv_cidrpool_block(
        prefix, gateway=gateway, exclusions=exclusions, per_node=per_node
    )
    assert len(block) == expected


def test_ippool_block_counts_per_node_exclusions_from_its_start() -> None:
    block = ipam.nv_ippool_block(
        "192.168.0.9", "192.168.0.16", gateway="192.168.0.10",
        exclusions=(("192.168.0.15", "192.168.0.20"),), per_node=((0, 0), (3, 3)),
    )  # fmt: skip
    # Out of 8: .9 (index 0), .12 (index 3), .10 (the gateway), .15-.16 (the exclusion).
    assert len(block) == 3
    assert a("192.168.0.11") in block
    assert a("192.168.0.9") not in block
    assert block.label() == "192.168.0.9-192.168.0.16"


def test_overlapping_exclusions_are_refused_as_the_node_agent_does() -> None:
    with pytest.raises(ipam.IpamError, match="overlap"):
        ipam.nv_ippool_block(
            "192.168.0.1", "192.168.0.8", gateway=None,
            exclusions=(("192.168.0.2", "192.168.0.4"), ("192.168.0.4", "192.168.0.6")),
            per_node=(),
        )  # fmt: skip
    # Adjacent ranges share no address: accepted.
    block = ipam.nv_ippool_block(
        "192.168.0.1", "192.168.0.8", gateway=None,
        exclusions=(("192.168.0.2", "192.168.0.3"), ("192.168.0.4", "192.168.0.6")),
        per_node=(),
    )  # fmt: skip
    assert len(block) == 3


@given(
    start=st.integers(0, 200),
    size=st.integers(1, 40),
    gateway=st.one_of(st.none(), st.integers(0, 255)),
    exclusion=st.one_of(st.none(), st.tuples(st.integers(0, 255), st.integers(0, 20))),
)
def test_ippool_block_counts_as_the_node_iterator_walks(
    start: int, size: int, gateway: int | None, exclusion: tuple[int, int] | None
) -> None:
    base = a("10.1.0.0")
    lo, hi = base + start, base + start + size - 1
    out = [] if exclusion is None else [(base + exclusion[0], base + exclusion[0] + exclusion[1])]
    block = ipam.nv_ippool_block(
        str(V4(lo)), str(V4(hi)),
        gateway=None if gateway is None else str(V4(base + gateway)),
        exclusions=[(str(V4(s)), str(V4(e))) for s, e in out], per_node=(),
    )  # fmt: skip
    # RangeIter: every address lo..hi but the gateway, then the exclusion set's Contains.
    walk = [
        x for x in range(lo, hi + 1)
        if (gateway is None or x != base + gateway) and not any(s <= x <= e for s, e in out)
    ]  # fmt: skip
    assert len(block) == len(walk)


@pytest.mark.parametrize(
    ("subnet", "size", "gateway", "exclusions", "expected"),
    [
        pytest.param("192.168.0.0/24", 8, None, (), 31, id="from-network-plus-one"),
        pytest.param("192.168.0.0/24", 8, None, (("192.168.0.1", "192.168.0.8"),), 30,
                     id="wholly-excluded-block-skipped"),
        pytest.param("192.168.0.0/24", 8, None, (("192.168.0.1", "192.168.0.7"),), 31,
                     id="partly-excluded-block-kept"),
        pytest.param("192.168.0.0/24", 1, "192.168.0.1", (), 253, id="gateway-block-of-one"),
        pytest.param("fd00::/120", 16, None, (), 15, id="v6-no-broadcast"),
        pytest.param("192.168.0.0/31", 1, None, (), 2, id="point-to-point"),
    ],
)  # fmt: skip
def test_ippool_block_count(
    subnet: str, size: int, gateway: str | None,
    exclusions: tuple[tuple[str, str], ...], expected: int,
) -> None:  # fmt: skip
    got = ipam.nv_ippool_block_count(
        subnet, size, gateway=gateway, exclusions=exclusions, per_node=()
    )
    assert got == expected


def test_cidrpool_prefix_count_skips_wholly_excluded_prefixes() -> None:
    assert ipam.nv_cidrpool_prefix_count("10.0.0.0/16", 24, exclusions=(), per_node=()) == 256
    # 10.0.0.0 .. LastIP(10.0.0.0/24) = .254 covers the first prefix.
    whole = (("10.0.0.0", "10.0.0.254"),)
    assert ipam.nv_cidrpool_prefix_count("10.0.0.0/16", 24, exclusions=whole, per_node=()) == 255
    assert ipam.nv_cidrpool_prefix_count("10.0.0.0/16", 8, exclusions=(), per_node=()) is None


# --- whereabouts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cidr", "start", "end", "exclude", "expected"),
    [
        pytest.param("192.168.1.0/24", None, None, (), 254, id="usable"),
        pytest.param("192.168.1.0/24", "192.168.1.10", "192.168.1.20", (), 11,
                     id="start-end-inclusive"),
        pytest.param("192.168.1.0/24", "192.168.1.0", None, (), 254,
                     id="start-on-the-network-ignored"),
        pytest.param("192.168.1.0/24", "192.168.1.50", "192.168.1.20", (), 205,
                     id="end-before-start-ignored"),
        pytest.param("192.168.1.0/24", None, None, ("192.168.1.0/30",), 251,
                     id="exclude-cidr-whole"),
        pytest.param("192.168.1.0/24", None, None, ("192.168.1.7",), 253, id="exclude-one-ip"),
        pytest.param("fd00::/126", None, None, (), 2, id="v6-broadcast-skipped-too"),
        pytest.param("fd00::/120", None, None, ("192.168.1.0/24",), 254,
                     id="other-family-exclude-ignored"),
    ],
)  # fmt: skip
def test_whereabouts_range(
    cidr: str, start: str | None, end: str | None, exclude: tuple[str, ...], expected: int
) -> None:
    assert len(ipam.whereabouts_range(cidr, start, end, exclude)) == expected


@pytest.mark.parametrize(
    ("cidr", "exclude"),
    [
        pytest.param("192.168.1.0/31", (), id="no-usable"),
        pytest.param("not-a-cidr", (), id="bad-range"),
        pytest.param("192.168.1.0/24", ("nope",), id="bad-exclude"),
    ],
)
def test_whereabouts_refusals(cidr: str, exclude: tuple[str, ...]) -> None:
    with pytest.raises(ipam.IpamError):
        ipam.whereabouts_range(cidr, None, None, exclude)


@given(
    prefix=st.integers(24, 30),
    start=st.one_of(st.none(), st.integers(-4, 260)),
    end=st.one_of(st.none(), st.integers(-4, 260)),
    excludes=st.lists(st.tuples(st.integers(0, 255), st.integers(26, 32)), max_size=3),
)
def test_whereabouts_range_counts_as_iterate_for_assignment_walks(
    prefix: int, start: int | None, end: int | None, excludes: list[tuple[int, int]]
) -> None:
    net = ipaddress.ip_network(f"10.9.0.0/{prefix}")
    base = int(net.network_address)
    size = net.num_addresses
    first, last = base + 1, base + size - 2
    # GetIPRange: each bound only when inside the range so far.
    if start is not None and first <= base + start <= last:
        first = base + start
    if end is not None and first <= base + end <= last:
        last = base + end
    excluded = [ipaddress.ip_network(f"{V4(base + o)}/{p}", strict=False) for o, p in excludes]
    walk = [
        x for x in range(first, last + 1)
        if not any(V4(x) in e for e in excluded)
    ]  # fmt: skip
    got = ipam.whereabouts_range(
        str(net),
        None if start is None else str(V4(base + start)),
        None if end is None else str(V4(base + end)),
        [str(e) for e in excluded],
    )
    assert len(got) == len(walk)


def test_whereabouts_slice_is_its_usable_addresses() -> None:
    got = ipam.whereabouts_slice("10.0.0.0/24", "10.0.0.64/26")
    assert (len(got), got.label()) == (62, "10.0.0.65-10.0.0.126")
    assert ipam.whereabouts_slice_count("10.0.0.0/24", 26) == 4


@pytest.mark.parametrize(
    ("ip_range", "network", "node", "expected"),
    [
        pytest.param("10.0.0.0/24", None, None, "10.0.0.0-24", id="range"),
        pytest.param("10.0.0.0/24", "net1", None, "net1-10.0.0.0-24", id="network-name"),
        pytest.param("10.0.0.64/26", "net1", "gpu-001", "net1-gpu-001-10.0.0.64-26",
                     id="node-slice"),
        pytest.param("10.0.0.64/26", None, "gpu-001", "gpu-001-10.0.0.64-26",
                     id="node-slice-unnamed"),
        pytest.param("fd00::/64", None, None, "fd00---64", id="v6"),
    ],
)  # fmt: skip
def test_whereabouts_pool_name(
    ip_range: str, network: str | None, node: str | None, expected: str
) -> None:
    assert ipam.whereabouts_pool_name(ip_range, network, node) == expected
