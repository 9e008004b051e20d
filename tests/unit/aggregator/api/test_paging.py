"""aggregator.api.paging: limits, continue tokens, windows over sorted keys, the name index."""

from __future__ import annotations

import base64

import pytest

from aggregator.api.paging import (
    MAX_TOKEN_LENGTH,
    Key,
    NameIndex,
    PageLimits,
    PagingError,
    decode_continue,
    encode_continue,
    parse_limit,
    query_digest,
    select_names,
    window,
)

LIMITS = PageLimits(default=500, maximum=5000)
NODES = query_digest("nodes", {"state": None, "name": None})
NAMES: tuple[Key, ...] = tuple((f"gpu-{i:03}",) for i in range(1, 11))  # gpu-001 .. gpu-010


@pytest.mark.parametrize(
    ("raw", "limit"),
    [
        pytest.param(None, 500, id="default"),
        pytest.param("1", 1, id="one"),
        pytest.param("5000", 5000, id="maximum"),
        pytest.param("0042", 42, id="leading-zeros"),
    ],
)
def test_parse_limit(raw: str | None, limit: int) -> None:
    assert parse_limit(raw, LIMITS) == limit


@pytest.mark.parametrize(
    "raw",
    ["0", "-1", "5001", "999999999999", "1.5", "abc", "", " 7", "+7", "1_000", "٣"],
    ids=["zero", "negative", "over", "huge", "fraction", "word", "empty", "space", "plus",
         "underscore", "arabic-digit"],
)  # fmt: skip
def test_bad_limits_name_limit(raw: str) -> None:
    with pytest.raises(PagingError) as caught:
        parse_limit(raw, LIMITS)
    assert caught.value.field == "limit"
    assert "1 to 5000" in caught.value.message


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(("gpu-001",), id="node"),
        pytest.param((0, "", "rail-mismatch", "fleet"), id="finding-fleet-wide"),
        pytest.param((2, "gpu-001", "port-down", "mlx5_0/1"), id="finding"),
        pytest.param(("ü/ß",), id="non-ascii-key"),
    ],
)
def test_token_round_trip(key: Key) -> None:
    token = encode_continue(key, NODES)
    assert token.isascii() and "=" not in token and len(token) <= MAX_TOKEN_LENGTH
    shape = tuple(type(part) for part in key)
    assert decode_continue(token, NODES, shape) == key


def _reencoded(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


GOOD = encode_continue(("gpu-005",), NODES)
GOOD_RAW = base64.urlsafe_b64decode(GOOD + "=" * (-len(GOOD) % 4))


@pytest.mark.parametrize(
    ("token", "why"),
    [
        pytest.param("", "not a continue token", id="empty"),
        pytest.param("garbage!", "not a continue token", id="not-base64"),
        pytest.param("abc", "not a continue token", id="too-short"),
        pytest.param("x" * (MAX_TOKEN_LENGTH + 1), "not a continue token", id="too-long"),
        pytest.param("ü" * 8, "not a continue token", id="non-ascii"),
        pytest.param(GOOD[:-3], "not a continue token", id="truncated"),
        pytest.param(
            _reencoded(GOOD_RAW.replace(b"gpu-005", b"gpu-007")), "changed one", id="edited-key"
        ),
        pytest.param(_reencoded(b"0" * 12 + b"[1]"), "changed one", id="forged-check"),
        pytest.param(
            encode_continue(("gpu-005",), query_digest("nodes", {"state": "ready"})),
            "other filters",
            id="other-filter",
        ),
        pytest.param(
            encode_continue(("gpu-005",), query_digest("findings", {})),
            "other filters",
            id="other-list",
        ),
        pytest.param(encode_continue((3, "a", "b", "c"), NODES), "does not fit", id="wrong-shape"),
        pytest.param(encode_continue((5,), NODES), "does not fit", id="wrong-type"),
    ],
)
def test_bad_tokens_name_continue(token: str, why: str) -> None:
    with pytest.raises(PagingError) as caught:
        decode_continue(token, NODES, (str,))
    assert caught.value.field == "continue"
    assert why in caught.value.message


def test_digest_ignores_unset_filters_and_their_order() -> None:
    assert query_digest("nodes", {"state": None, "name": "gpu"}) == query_digest(
        "nodes", {"name": "gpu"}
    )
    a = query_digest("findings", {"node": "n1", "rule": "r"})
    assert a == query_digest("findings", {"rule": "r", "node": "n1"})
    assert a != query_digest("findings", {"node": "r", "rule": "n1"})


@pytest.mark.parametrize(
    ("after", "limit", "offset", "start", "end", "next_after"),
    [
        pytest.param(None, 3, 0, 0, 3, ("gpu-003",), id="first-page"),
        pytest.param(("gpu-003",), 3, 0, 3, 6, ("gpu-006",), id="second-page"),
        pytest.param(("gpu-009",), 3, 0, 9, 10, None, id="last-page-short"),
        pytest.param(("gpu-007",), 3, 0, 7, 10, None, id="last-page-exact"),
        pytest.param(None, 10, 0, 0, 10, None, id="all-in-one"),
        pytest.param(None, 500, 0, 0, 10, None, id="limit-over-total"),
        pytest.param(("gpu-010",), 3, 0, 10, 10, None, id="after-the-end"),
        pytest.param(("gpu-0045",), 2, 0, 4, 6, ("gpu-006",), id="cursor-key-was-removed"),
        pytest.param(("a",), 2, 0, 0, 2, ("gpu-002",), id="cursor-before-everything"),
        pytest.param(None, 3, 2, 2, 5, ("gpu-005",), id="offset"),
        pytest.param(("gpu-003",), 3, 2, 5, 8, ("gpu-008",), id="offset-after-cursor"),
        pytest.param(None, 3, 50, 10, 10, None, id="offset-past-the-end"),
    ],
)
def test_window(
    after: Key | None, limit: int, offset: int, start: int, end: int, next_after: Key | None
) -> None:
    page = window(NAMES, after, limit, offset)
    assert (page.start, page.end, page.total, page.after) == (start, end, 10, next_after)


def test_window_of_nothing() -> None:
    page = window((), None, 5)
    assert (page.start, page.end, page.total, page.after) == (0, 0, 0, None)


def test_walk_under_concurrent_inserts_and_removals() -> None:
    """A walk sees every key present from start to end exactly once, never one twice."""
    names = sorted(f"n{i:04}" for i in range(0, 100, 2))  # even numbers
    always = set(names[10:40])  # never removed during the walk
    seen: list[str] = []
    after: Key | None = None
    step = 0
    while True:
        keys = [(n,) for n in names]
        page = window(keys, after, 7)
        seen.extend(str(k[0]) for k in keys[page.start : page.end])
        if page.after is None:
            break
        after = page.after
        step += 1
        names = sorted({*names, f"n{step * 9 + 1:04}", f"n{99 - step:04}"} - {names[step]})
    assert len(seen) == len(set(seen))
    assert always <= set(seen)
    assert seen == sorted(seen)


def test_name_index_sorts_again_only_when_names_change() -> None:
    index = NameIndex()
    fleet: dict[str, object] = {"b": 1, "a": 2}
    first = index.keys(fleet)
    assert first == (("a",), ("b",))
    fleet["a"] = 3  # a changed record, same names
    assert index.keys(fleet) is first
    del fleet["b"]
    fleet["c"] = 4  # same size, other names
    assert index.keys(fleet) == (("a",), ("c",))
    assert index.keys({}) == ()


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        pytest.param("gpu-00", [f"gpu-00{i}" for i in range(1, 10)], id="prefix"),
        pytest.param("gpu-010", ["gpu-010"], id="whole-name"),
        pytest.param("x", [], id="no-match"),
        pytest.param("*0", ["gpu-010"], id="glob-suffix"),
        pytest.param("gpu-00[13]", ["gpu-001", "gpu-003"], id="glob-class"),
        pytest.param("gpu-00[!1-8]", ["gpu-009"], id="glob-negated"),
        pytest.param("gpu-0?0", ["gpu-010"], id="glob-one-char"),
        pytest.param("gpu-00", [f"gpu-00{i}" for i in range(1, 10)], id="prefix-is-not-glob"),
        pytest.param("gpu-0[", [], id="unbalanced-bracket-is-literal"),
    ],
)
def test_select_names(pattern: str, names: list[str]) -> None:
    assert [k[0] for k in select_names(NAMES, pattern)] == names
