"""Pages of sorted API lists: the `limit` bound and the opaque `continue` cursor.

A cursor is the sort key of the last item returned plus a digest of the list and its
filters, base64url-encoded with a checksum; the next page starts after that key, so
items inserted or removed meanwhile shift nothing. Pure: no I/O, no clock, no aiohttp.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Final

import msgspec

from aggregator.errors import AggregatorError

Key = tuple[str | int, ...]
TOKEN_VERSION: Final = 1
MAX_TOKEN_LENGTH: Final = 2048  # far above any key the API sorts by (node names <= 253)
_CHECK_LENGTH: Final = 12  # hex digits of the checksum: catches edits, it is no secret


class PagingError(AggregatorError, ValueError):
    """A bad `limit`, `offset` or `continue`; `field` names the query parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True, kw_only=True)
class PageLimits:
    default: int = 500
    maximum: int = 5000


@dataclass(frozen=True, kw_only=True)
class Window:
    """Items `start:end` of the matching keys; `after` is the next page's cursor key."""

    start: int
    end: int
    total: int
    after: Key | None  # None: this is the last page


def parse_limit(raw: str | None, limits: PageLimits) -> int:
    if raw is None:
        return limits.default
    # int() also accepts " 7", "+7" and "1_000"; a query parameter should be plain digits.
    if (
        not raw.isascii()
        or not raw.isdigit()
        or len(raw) > 9
        or not 1 <= int(raw) <= limits.maximum
    ):
        raise PagingError(
            "limit", f"limit must be an integer from 1 to {limits.maximum}, got {raw!r}"
        )
    return int(raw)


def query_digest(kind: str, filters: Mapping[str, str | None]) -> str:
    """What a cursor is bound to: the list (`kind`) and its filter values, not the page size."""
    canonical = msgspec.json.encode([kind, sorted((k, v) for k, v in filters.items() if v)])
    return hashlib.sha256(canonical).hexdigest()[:16]


def encode_continue(key: Key, digest: str) -> str:
    body = msgspec.json.encode([TOKEN_VERSION, digest, list(key)])
    check = hashlib.sha256(body).hexdigest()[:_CHECK_LENGTH].encode()
    return base64.urlsafe_b64encode(check + body).rstrip(b"=").decode()


def decode_continue(token: str, digest: str, shape: tuple[type, ...]) -> Key:
    """The key `token` continues after; PagingError("continue") unless `encode_continue`
    made it for the same list and filters and its key has `shape` (element types)."""
    if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        raise _bad_token("not a continue token")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError) as exc:
        raise _bad_token("not a continue token") from exc
    check, body = raw[:_CHECK_LENGTH], raw[_CHECK_LENGTH:]
    if check != hashlib.sha256(body).hexdigest()[:_CHECK_LENGTH].encode():
        raise _bad_token("not a continue token, or a changed one")
    try:
        version, bound, key = msgspec.json.decode(body, type=tuple[int, str, list[str | int]])
    except msgspec.DecodeError as exc:
        raise _bad_token("not a continue token") from exc
    if version != TOKEN_VERSION:
        raise _bad_token(f"token version {version} is not {TOKEN_VERSION}")
    if bound != digest:
        raise _bad_token("the token belongs to another list or other filters")
    if len(key) != len(shape) or not all(
        type(part) is kind for part, kind in zip(key, shape, strict=True)
    ):
        raise _bad_token("the token's position does not fit this list")
    return tuple(key)


def _bad_token(why: str) -> PagingError:
    return PagingError(
        "continue",
        f"continue: {why}; pass the `continue` value of the previous page unchanged, "
        "with the same filters, or leave it out to start again",
    )


def window(keys: Sequence[Key], after: Key | None, limit: int, offset: int = 0) -> Window:
    """The page of sorted `keys` that starts `offset` items after key `after` (None: at
    the start) and holds at most `limit` items. O(log n)."""
    start = 0 if after is None else bisect_right(keys, after)
    start = min(start + offset, len(keys))
    end = min(start + limit, len(keys))
    more = end < len(keys) and end > 0
    return Window(start=start, end=end, total=len(keys), after=keys[end - 1] if more else None)


class NameIndex:
    """The names of a mapping as sorted 1-tuple keys, sorted again only when the set of
    names changes (a set comparison per call, in C; no sort per request)."""

    def __init__(self) -> None:
        self._names: frozenset[str] = frozenset()
        self._keys: tuple[Key, ...] = ()

    def keys(self, mapping: Mapping[str, object]) -> tuple[Key, ...]:
        names = mapping.keys()
        if len(names) != len(self._names) or names != self._names:
            self._names = frozenset(names)
            self._keys = tuple((name,) for name in sorted(self._names))
        return self._keys


def is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def select_names(keys: Sequence[Key], pattern: str) -> Sequence[Key]:
    """Sorted name keys matching `pattern`: a glob (`*`, `?`, `[...]`) on the whole name,
    otherwise a prefix (a slice found by bisection)."""
    if is_glob(pattern):
        return [k for k in keys if fnmatchcase(str(k[0]), pattern)]
    # Every name with the prefix sorts between the prefix and the prefix + the top code point.
    return keys[bisect_left(keys, (pattern,)) : bisect_left(keys, (pattern + "\U0010ffff",))]
