"""Pure checks of a JSON request body before it is decoded: size and nesting depth.

`json.loads` recurses once per `[`/`{`: 4 KiB of `[` raise RecursionError (a 500), so
the depth is counted first, outside strings, stopping at the bound. Bytes in, a value or
`BodyError` (naming the bound) out; no I/O.
"""

from __future__ import annotations

import json
from typing import Final

from aggregator.errors import AggregatorError

MAX_BODY: Final = 4096  # bytes
MAX_DEPTH: Final = 16  # nested arrays/objects; a validation request needs 2
# Seconds for the whole body to arrive: one that trickles in holds an in-flight slot.
BODY_TIMEOUT: Final = 10.0
_OPEN: Final = frozenset(b"[{")
_CLOSE: Final = frozenset(b"]}")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


class BodyError(AggregatorError, ValueError):
    """A body over a bound or not JSON; the message names the bound."""


def too_deep(raw: bytes, max_depth: int) -> bool:
    """True when arrays/objects nest deeper than `max_depth` (strings are skipped)."""
    depth, in_string, escaped = 0, False, False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == _BACKSLASH:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            if depth > max_depth:
                return True
        elif byte in _CLOSE:
            depth -= 1
    return False


def parse_body(raw: bytes, *, max_bytes: int = MAX_BODY, max_depth: int = MAX_DEPTH) -> object:
    if len(raw) > max_bytes:
        raise BodyError(f"the body must be at most {max_bytes} bytes")
    if too_deep(raw, max_depth):
        raise BodyError(f"the body nests arrays/objects deeper than {max_depth} levels")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(f"the body is not JSON: {exc}") from exc
