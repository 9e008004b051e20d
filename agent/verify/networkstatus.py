"""Pure parsers for the pod's Multus attachments as the downward API shows them: the
annotations file (kubelet writes one `key="value"` line per annotation, the value quoted
the way Go's strconv.Quote does) and the `k8s.v1.cni.cncf.io/network-status` JSON with its
device-info (Network Plumbing WG device-info spec). No I/O: agent.verify.evidence reads.
"""

from __future__ import annotations

import json
import re
from typing import Final

from agent.errors import AgentError
from proto.messages.validation import AttachmentEvidence

NETWORK_STATUS: Final = "k8s.v1.cni.cncf.io/network-status"
_LINE: Final = re.compile(r'([^=\s][^=]*)="(.*)"', re.DOTALL)
_SIMPLE: Final = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}
_HEX_WIDTH: Final = {"x": 2, "u": 4, "U": 8}


class AnnotationsError(AgentError, ValueError):
    """The annotations file or the network-status value is not what kubelet/Multus write."""


def unquote_go(text: str) -> str:
    """The string a Go double-quoted literal (strconv.Quote's output, quotes stripped)
    stands for. \\xNN and octal escapes are bytes (Go strings are bytes), so the result is
    decoded as UTF-8 at the end; invalid bytes become U+FFFD."""
    out = bytearray()
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\":
            out += char.encode()
            i += 1
            continue
        if i + 1 >= len(text):
            raise AnnotationsError("a quoted value ends in a lone backslash")
        kind = text[i + 1]
        if kind in _SIMPLE:
            out.append(_SIMPLE[kind])
            i += 2
        elif kind in _HEX_WIDTH:
            digits = text[i + 2 : i + 2 + _HEX_WIDTH[kind]]
            value = _number(digits, 16, _HEX_WIDTH[kind])
            out += bytes([value]) if kind == "x" else _code_point(value)
            i += 2 + _HEX_WIDTH[kind]
        elif kind in "01234567":
            out.append(_number(text[i + 1 : i + 4], 8, 3) & 0xFF)
            i += 4
        else:
            raise AnnotationsError(f"unknown escape \\{kind} in a quoted value")
    return out.decode("utf-8", errors="replace")


def _number(digits: str, base: int, width: int) -> int:
    try:
        if len(digits) != width:
            raise ValueError(digits)
        return int(digits, base)
    except ValueError:
        raise AnnotationsError(f"bad escape digits {digits!r} in a quoted value") from None


def _code_point(value: int) -> bytes:
    try:
        return chr(value).encode("utf-8", errors="replace")
    except ValueError:
        raise AnnotationsError(f"escape names no code point: {value:#x}") from None


def parse_annotations_file(text: str) -> dict[str, str]:
    """`key="quoted value"` lines -> {key: value}. Blank lines are skipped; a line of any
    other shape raises AnnotationsError naming its number."""
    annotations: dict[str, str] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            raise AnnotationsError(f'line {number} is not key="value"')
        annotations[match.group(1)] = unquote_go(match.group(2))
    return annotations


def parse_network_status(value: str) -> tuple[AttachmentEvidence, ...]:
    """The network-status array, entry by entry. Unknown fields are ignored (the spec
    grows); an entry that is not an object with a string `name` raises AnnotationsError."""
    try:
        entries = json.loads(value)
    except ValueError as exc:
        raise AnnotationsError(f"{NETWORK_STATUS} is not JSON: {exc}") from None
    if not isinstance(entries, list):
        raise AnnotationsError(f"{NETWORK_STATUS} is not a JSON array")
    return tuple(_attachment(entry, index) for index, entry in enumerate(entries))


def _attachment(entry: object, index: int) -> AttachmentEvidence:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise AnnotationsError(f"{NETWORK_STATUS}[{index}] has no string name")
    info = entry.get("device-info")
    info = info if isinstance(info, dict) else {}
    device_type = _text(info.get("type"))
    # The spec keys the details by the type ("pci": {...}); only pci names an RDMA device.
    details = info.get(device_type) if device_type is not None else None
    details = details if isinstance(details, dict) else {}
    ips = entry.get("ips")
    return AttachmentEvidence(
        name=entry["name"],
        interface=_text(entry.get("interface")),
        ips=tuple(ip for ip in ips if isinstance(ip, str)) if isinstance(ips, list) else (),
        mac=_text(entry.get("mac")),
        default=entry.get("default") is True,
        device_type=device_type,
        pci_address=_text(details.get("pci-address")),
        pf_pci_address=_text(details.get("pf-pci-address")),
        rdma_device=_text(details.get("rdma-device")),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def attachments_from_annotations(text: str) -> tuple[AttachmentEvidence, ...]:
    """The attachments in an annotations file; () when it has no network-status (a pod
    Multus did not handle, or one with only the cluster network)."""
    value = parse_annotations_file(text).get(NETWORK_STATUS)
    return parse_network_status(value) if value is not None else ()
