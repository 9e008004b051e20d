"""PCI config space decoding: the ACS extended capability found by walking the list from
0x100, on hand-built 4096-byte images (the captured `config` files lost their length in
the archive, see the fixtures README), truncated reads and junk."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.errors import ParseError
from agent.host import pciconfig

AER, ACS, ARI, SRIOV = 0x0001, 0x000D, 0x000E, 0x0010


def image(*caps: tuple[int, int, int, bytes], size: int = 4096) -> bytes:
    """Config space with extended capabilities (offset, id, next offset, body after the
    4-byte header). Capability header: id bits 0-15, version 16-19, next 20-31."""
    buf = bytearray(size)
    buf[0:4] = (0x1021 << 16 | 0x15B3).to_bytes(4, "little")
    for offset, cap_id, next_offset, body in caps:
        header = cap_id | 1 << 16 | next_offset << 20
        buf[offset : offset + 4] = header.to_bytes(4, "little")
        buf[offset + 4 : offset + 4 + len(body)] = body
    return bytes(buf)


def acs_body(control: int, capability: int = 0x5F) -> bytes:
    return capability.to_bytes(2, "little") + control.to_bytes(2, "little")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(image((0x100, ACS, 0, acs_body(0x1D))), 0x1D, id="acs-first-enabled"),
        pytest.param(image((0x100, ACS, 0, acs_body(0))), 0, id="acs-first-disabled"),
        pytest.param(
            image((0x100, AER, 0x148, b""), (0x148, ACS, 0, acs_body(0x5))), 0x5,
            id="acs-after-aer",
        ),
        pytest.param(
            image((0x100, AER, 0x150, b""), (0x150, ARI, 0x160, b""),
                  (0x160, SRIOV, 0x1A0, b""), (0x1A0, ACS, 0, acs_body(0x18))),
            0x18, id="acs-fourth",
        ),
        pytest.param(image((0x100, AER, 0x150, b""), (0x150, ARI, 0, b"")), None,
                     id="no-acs-in-list"),
        pytest.param(image(), None, id="no-extended-capabilities"),
        pytest.param(image()[:0x100] + b"\xff" * 0xF00, None, id="all-ones-device-gone"),
        pytest.param(image((0x100, AER, 0x40, b"")), None, id="next-below-0x100-ends-list"),
        pytest.param(image(size=256), None, id="conventional-pci-256-bytes"),
        pytest.param(image((0x100, ACS, 0, acs_body(0x1D)), size=0x108), 0x1D,
                     id="short-but-complete"),
    ],
)  # fmt: skip
def test_parse_acs_control(config: bytes, expected: int | None) -> None:
    assert pciconfig.parse_acs_control(config) == expected


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        pytest.param(b"", "only 0 bytes", id="empty"),
        pytest.param(image(size=40), "only 40 bytes", id="shorter-than-header"),
        pytest.param(image(size=64), "needs CAP_SYS_ADMIN", id="unprivileged-read"),
        pytest.param(image(size=128), "needs CAP_SYS_ADMIN", id="cardbus-unprivileged"),
        pytest.param(image(size=100), "truncated to 100 bytes", id="cut-mid-header"),
        pytest.param(image((0x100, AER, 0x200, b""), size=0x180), "capability at 0x200",
                     id="next-past-the-data"),
        pytest.param(image((0x100, AER, 0x100, b"")), "loops", id="points-to-itself"),
        pytest.param(image((0x100, AER, 0x140, b""), (0x140, ARI, 0x100, b"")), "loops",
                     id="two-cycle"),
        pytest.param(image((0x100, ACS, 0, b""), size=0x106), "cut short", id="acs-cut-short"),
    ],
)  # fmt: skip
def test_unusable_config_space_is_a_parse_error(config: bytes, reason: str) -> None:
    with pytest.raises(ParseError, match=reason):
        pciconfig.parse_acs_control(config)


@pytest.mark.parametrize(
    ("control", "redirects"),
    [
        pytest.param(0x1D, True, id="linux-enabled-sv-rr-cr-uf"),
        pytest.param(0x01, True, id="source-validation"),
        pytest.param(0x04, True, id="request-redirect"),
        pytest.param(0x08, True, id="completion-redirect"),
        pytest.param(0x00, False, id="disabled"),
        pytest.param(0x02, False, id="translation-blocking-only"),
        pytest.param(0x10, False, id="upstream-forwarding-only"),
        pytest.param(0x40, False, id="direct-translated-only"),
    ],
)
def test_acs_redirects(control: int, redirects: bool) -> None:
    assert pciconfig.acs_redirects(control) is redirects


@given(st.binary(max_size=4200))
def test_junk_never_raises_anything_but_parse_error(config: bytes) -> None:
    try:
        control = pciconfig.parse_acs_control(config)
    except ParseError:
        return
    assert control is None or 0 <= control <= 0xFFFF


@given(st.lists(st.integers(min_value=0, max_value=0xFFFFFFFF), min_size=1, max_size=960))
def test_random_capability_headers_terminate(headers: list[int]) -> None:
    data = bytes(256) + b"".join(h.to_bytes(4, "little") for h in headers)
    with contextlib.suppress(ParseError):
        pciconfig.find_ext_capability(data.ljust(4096, b"\0"), ACS)


@pytest.mark.parametrize(
    ("size", "header_only"),
    [(64, True), (128, True), (63, False), (65, False), (127, False), (255, False)],
)
def test_only_an_unprivileged_read_size_is_header_only(size: int, header_only: bool) -> None:
    """HeaderOnly is the type callers report as missing privilege; other truncations
    stay plain ParseErrors (a broken file, not a permission)."""
    with pytest.raises(ParseError) as raised:
        pciconfig.parse_acs_control(image((0x100, ACS, 0, acs_body(0x1D)))[:size])
    assert isinstance(raised.value, pciconfig.HeaderOnly) is header_only
