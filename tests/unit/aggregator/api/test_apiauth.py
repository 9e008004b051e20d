"""The API token file parser and the pure pieces of bearer authentication (aggregator.api.auth)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.api.auth import (
    ApiAuth,
    ApiToken,
    TokenFileError,
    bearer_token,
    load_token_file,
    parse_token_file,
)

READ = "r" * 20
ADMIN = "A1b2-C3d4.E5f6_G7h8~i9+j0/k=="


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(f"read {READ}\n", (("read", READ),), id="one-read"),
        pytest.param(
            f"# ops team\n\nread {READ}\n  admin   {ADMIN}  \n",
            (("read", READ), ("admin", ADMIN)),
            id="comments-blank-and-spacing",
        ),
        pytest.param(f"admin\t{ADMIN}\r\n", (("admin", ADMIN),), id="tab-and-crlf"),
        pytest.param(f"read {READ}\n   # indented comment\n", (("read", READ),), id="indented-#"),
    ],
)
def test_parse_good_files(text: str, expected: tuple[tuple[str, str], ...]) -> None:
    auth = parse_token_file(text, source="tokens")
    assert tuple((t.scope, t.secret) for t in auth.tokens) == expected
    assert auth.metrics_public is False


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        pytest.param(f"read {READ}\nwrite {ADMIN}\n", 2, "scope must be one of", id="bad-scope"),
        pytest.param(f"READ {READ}\n", 1, "scope must be one of", id="scope-is-case-sensitive"),
        pytest.param("# c\nread\n", 2, "got 1 fields", id="no-token"),
        pytest.param(f"read {READ} extra\n", 1, "got 3 fields", id="three-fields"),
        pytest.param(f"{READ}\n", 1, "got 1 fields", id="token-without-scope"),
        pytest.param("read short-token\n", 1, "shorter than 16", id="too-short"),
        pytest.param("read " + "x" * 15 + "\n", 1, "shorter than 16", id="15-chars"),
        pytest.param("read " + "é" * 20 + "\n", 1, "may only hold", id="non-ascii"),
        pytest.param("read " + "a" * 16 + '"q"\n', 1, "may only hold", id="quote"),
        pytest.param("read " + "a=b" * 8 + "\n", 1, "may only hold", id="inner-equals"),
        pytest.param(f"read {READ}\n\nadmin {READ}\n", 3, "first on line 1", id="repeated"),
    ],
)
def test_bad_lines_name_the_line_never_the_token(text: str, line: int, fragment: str) -> None:
    with pytest.raises(TokenFileError) as caught:
        parse_token_file(text, source="/etc/nicfleet/tokens")
    assert caught.value.line == line
    message = str(caught.value)
    assert message.startswith(f"/etc/nicfleet/tokens:{line}: ")
    assert fragment in message
    for word in text.split():
        if len(word) >= 15:
            assert word not in message


@pytest.mark.parametrize(
    "text", ["", "\n\n", "# only a comment\n"], ids=["empty", "blank", "comment"]
)
def test_a_file_without_tokens_is_refused(text: str) -> None:
    with pytest.raises(TokenFileError, match=r"^tokens: no tokens"):
        parse_token_file(text, source="tokens")


def test_load_token_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"admin {ADMIN}\n")
    auth = load_token_file(path, metrics_public=True)
    assert auth.counts() == {"read": 0, "admin": 1}
    assert auth.metrics_public and auth.source == str(path)
    with pytest.raises(TokenFileError, match="cannot read"):
        load_token_file(tmp_path / "missing")
    (tmp_path / "binary").write_bytes(b"\xff\xfe read")
    with pytest.raises(TokenFileError, match="cannot read"):
        load_token_file(tmp_path / "binary")


def test_scope_of_compares_against_every_token() -> None:
    auth = ApiAuth(tokens=(ApiToken("read", READ), ApiToken("admin", ADMIN)))
    assert auth.scope_of(READ) == "read"
    assert auth.scope_of(ADMIN) == "admin"
    assert auth.scope_of(READ[:-1]) is None
    assert auth.scope_of(READ + "r") is None
    assert auth.scope_of("") is None
    assert auth.scope_of("ü" * 20) is None  # non-ASCII is compared as bytes, never raises


def test_tokens_are_not_in_reprs() -> None:
    auth = ApiAuth(tokens=(ApiToken("read", READ), ApiToken("admin", ADMIN)))
    assert READ not in repr(auth) and ADMIN not in repr(auth)


@pytest.mark.parametrize("path", ["/healthz", "/readyz"], ids=["healthz", "readyz"])
def test_probes_are_always_open(path: str) -> None:
    assert ApiAuth(tokens=()).is_open(path)


def test_metrics_open_only_when_public() -> None:
    assert not ApiAuth(tokens=()).is_open("/metrics")
    assert ApiAuth(tokens=(), metrics_public=True).is_open("/metrics")
    assert not ApiAuth(tokens=(), metrics_public=True).is_open("/metrics/")
    assert not ApiAuth(tokens=()).is_open("/api/v1/nodes")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        pytest.param(None, None, id="absent"),
        pytest.param(f"Bearer {READ}", READ, id="bearer"),
        pytest.param(f"bearer {READ}", READ, id="scheme-case-insensitive"),
        pytest.param(f"  Bearer   {READ}  ", READ, id="extra-spaces"),
        pytest.param("Bearer", None, id="no-credential"),
        pytest.param("Bearer ", None, id="empty-credential"),
        pytest.param(f"Basic {READ}", None, id="basic-scheme"),
        pytest.param(READ, None, id="no-scheme"),
    ],
)
def test_bearer_token(header: str | None, expected: str | None) -> None:
    assert bearer_token(header) == expected
