"""The JSON body bounds: depth counted outside strings, size, not-JSON; each names its bound."""

from __future__ import annotations

import pytest

from aggregator.api.jsonbody import MAX_DEPTH, BodyError, parse_body, too_deep


@pytest.mark.parametrize(
    ("raw", "deep"),
    [
        pytest.param(b'{"nodes": ["a", "b"]}', False, id="validation-request"),
        pytest.param(b"[" * 4096, True, id="4KiB-of-brackets"),
        pytest.param(b"[" * 3 + b"]" * 3, False, id="at-3-of-3"),
        pytest.param(b"[" * 4 + b"]" * 4, True, id="over-3"),
        pytest.param(b'["[[[[[[["]', False, id="brackets-in-a-string"),
        pytest.param(b'["\\"[[[[["]', False, id="escaped-quote-keeps-the-string-open"),
        pytest.param(b'[[["\\\\"],[[[]]]]]', True, id="escaped-backslash-ends-the-string"),
        pytest.param(b"[][][][][]", False, id="siblings-do-not-add-up"),
    ],
)
def test_too_deep(raw: bytes, deep: bool) -> None:
    assert too_deep(raw, 3) is deep


def test_parse_body_names_each_bound() -> None:
    with pytest.raises(BodyError, match=f"deeper than {MAX_DEPTH} levels"):
        parse_body(b"[" * 4096)
    with pytest.raises(BodyError, match="at most 10 bytes"):
        parse_body(b"[" * 11, max_bytes=10)
    with pytest.raises(BodyError, match="not JSON"):
        parse_body(b"{nope")
    with pytest.raises(BodyError, match="not JSON"):
        parse_body(b"\xff\xfe")
    assert parse_body(b'{"a": [[1]]}') == {"a": [[1]]}
