"""PCI Vital Product Data: the read-only keywords of a function's binary `vpd` file.

Pure: bytes in, keywords out. The format is the PCI Local Bus spec's (resource tags:
0x82 identifier string, 0x90 VPD-R, 0x91 VPD-W, small tag 0x78 end; VPD-R holds 2-letter
keywords each with a one-byte length). A torn or truncated image yields what parsed
before the damage, never an exception: VPD comes from card EEPROMs and is often sloppy.
"""

from __future__ import annotations

from typing import Final

_LARGE: Final = 0x80
_ID_STRING: Final = 0x82
_READ_ONLY: Final = 0x90
_END: Final = 0x78  # small resource, tag 0x0f, length 0


def read_only_keywords(data: bytes) -> dict[str, str]:
    """Keyword -> value (ASCII, trailing NULs and blanks stripped) of the VPD-R section."""
    found: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        tag = data[pos]
        if tag == _END:
            break
        if tag & _LARGE:
            if pos + 3 > len(data):
                break
            size = int.from_bytes(data[pos + 1 : pos + 3], "little")
            body = data[pos + 3 : pos + 3 + size]
            if tag == _READ_ONLY:
                found.update(_keywords(body))
            pos += 3 + size
        else:
            pos += 1 + (tag & 0x07)
    return found


def _keywords(body: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos + 3 <= len(body):
        key, size = body[pos : pos + 2], body[pos + 2]
        if pos + 3 + size > len(body):
            break  # a value cut short is not the value
        value = body[pos + 3 : pos + 3 + size]
        pos += 3 + size
        if not key.isascii() or not key.isalnum():
            break
        name = key.decode()
        if name == "RV":  # checksum and padding: the end of VPD-R
            break
        text = value.decode("ascii", "replace").rstrip("\0 ")
        if text:
            out[name] = text
    return out
