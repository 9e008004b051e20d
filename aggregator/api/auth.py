"""Bearer-token authentication of the aggregator's HTTP API: the token file and the middleware.

`parse_token_file` is pure (text in, `ApiAuth` out, errors name the line, never the token);
`auth_middleware` tries the file (`hmac.compare_digest` against every token), then TokenReview
(`aggregator.api.tokenreview`), answering 401/403/503 in the `httperrors` shape. Tokens are never
logged, repr'd or counted; metric labels are the method and the result only. Without
tokens, `same_origin_middleware` refuses cross-origin and non-JSON state-changing requests.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter

from aggregator.api.errors import error_response
from aggregator.api.tokenreview import Allowed, Refused, TokenReviewer, Unavailable
from aggregator.errors import AggregatorError

log = logging.getLogger(__name__)

Scope = Literal["read", "admin"]
SCOPES: Final[tuple[Scope, ...]] = ("read", "admin")
MIN_TOKEN_LENGTH: Final = 16
# RFC 6750 b64token: the characters a Bearer credential may hold in a header.
_TOKEN_RE: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
# Open without a token: probes, and /metrics when `metrics_public`.
OPEN_PATHS: Final = frozenset({"/healthz", "/readyz"})
METRICS_PATH: Final = "/metrics"
# The status page's static files (aggregator.api.statuspage) hold no data: open, one level deep.
UI_PATH: Final = "/ui"
ROOT_PATH: Final = "/"  # redirects to the page: no data either
# Methods a read token may use; every other method needs an admin token.
READ_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
REALM: Final = 'Bearer realm="nicfleet"'

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TokenFileError(AggregatorError, ValueError):
    """A token file that cannot be used; the message names the line, never the token."""

    def __init__(self, source: str, line: int | None, message: str) -> None:
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")
        self.source = source
        self.line = line


@dataclass(frozen=True)
class ApiToken:
    scope: Scope
    secret: str = field(repr=False)


@dataclass(frozen=True, kw_only=True)
class ApiAuth:
    """Configured tokens (none: TokenReview only); `metrics_public` leaves /metrics open."""

    tokens: tuple[ApiToken, ...]
    metrics_public: bool = False
    source: str = ""

    def scope_of(self, presented: str) -> Scope | None:
        """The scope of `presented`, comparing in constant time against every token."""
        wanted = presented.encode()
        found: Scope | None = None
        for token in self.tokens:  # no early exit: the time does not depend on which matched
            if hmac.compare_digest(wanted, token.secret.encode()):
                found = token.scope
        return found

    def counts(self) -> dict[Scope, int]:
        return {scope: sum(t.scope == scope for t in self.tokens) for scope in SCOPES}

    def is_open(self, path: str) -> bool:
        return (
            path in OPEN_PATHS or (self.metrics_public and path == METRICS_PATH) or is_ui_path(path)
        )


def is_ui_path(path: str) -> bool:
    """`/`, `/ui`, `/ui/` or `/ui/<name>`: the status page's redirects and files (the page
    asks for a token)."""
    prefix = UI_PATH + "/"
    return path in (ROOT_PATH, UI_PATH) or (
        path.startswith(prefix) and "/" not in path[len(prefix) :]
    )


def parse_token_file(text: str, *, source: str, metrics_public: bool = False) -> ApiAuth:
    """`<scope> <token>` per line (scope read|admin); blank lines and `#` comments skipped."""
    tokens: list[ApiToken] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 2:
            raise TokenFileError(
                source, number, f"expected '<scope> <token>', got {len(fields)} fields"
            )
        scope, secret = fields
        if scope not in SCOPES:
            raise TokenFileError(source, number, f"scope must be one of {list(SCOPES)}")
        if len(secret) < MIN_TOKEN_LENGTH:
            raise TokenFileError(
                source, number, f"token shorter than {MIN_TOKEN_LENGTH} characters"
            )
        if not _TOKEN_RE.fullmatch(secret):
            raise TokenFileError(
                source, number, "token may only hold letters, digits and -._~+/ (then =)"
            )
        if secret in seen:
            raise TokenFileError(source, number, f"token repeated (first on line {seen[secret]})")
        seen[secret] = number
        tokens.append(ApiToken("read" if scope == "read" else "admin", secret))
    if not tokens:
        raise TokenFileError(source, None, "no tokens (every request would be refused)")
    return ApiAuth(tokens=tuple(tokens), metrics_public=metrics_public, source=source)


def load_token_file(path: Path, *, metrics_public: bool = False) -> ApiAuth:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(str(path), None, f"cannot read: {exc}") from exc
    return parse_token_file(text, source=str(path), metrics_public=metrics_public)


def bearer_token(header: str | None) -> str | None:
    """The credential of an `Authorization: Bearer <token>` header (scheme case-insensitive)."""
    if header is None:
        return None
    scheme, _, credential = header.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        return None
    return credential


AuthMethod = Literal["none", "file", "tokenreview"]
AuthResult = Literal["ok", "unauthenticated", "forbidden", "unavailable"]


def auth_middleware(
    auth: ApiAuth,
    *,
    review: TokenReviewer | None = None,
    registry: CollectorRegistry | None = None,
) -> Middleware:
    """The token file first (constant time), then TokenReview when `review` is given.

    401 without a known token, 403 for a scope that does not cover the method (or an
    identity in no configured group), 503 when TokenReview cannot answer; else the handler.
    `nicfleet_api_auth_total{method,result}` counts every decision on a protected path."""
    outcomes = Counter(
        "nicfleet_api_auth",
        "API authentication decisions, by method (none: no bearer token) and result.",
        ("method", "result"),
        registry=registry,
    )

    def count(method: AuthMethod, result: AuthResult) -> None:
        outcomes.labels(method, result).inc()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if auth.is_open(request.path):
            return await handler(request)
        presented = bearer_token(request.headers.get("Authorization"))
        if presented is None:
            _refused(request, "no bearer token")
            count("none", "unauthenticated")
            return error_response(
                401,
                "unauthorized",
                "authentication required: send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": REALM},
            )
        method: AuthMethod = "file"
        scope = auth.scope_of(presented)
        who = "this token"
        if scope is None and review is not None and _TOKEN_RE.fullmatch(presented):
            method = "tokenreview"
            decision = await review.authenticate(presented)
            if isinstance(decision, Unavailable):
                log.warning("API request refused (%s): %s", decision.message, _describe(request))
                count(method, "unavailable")
                return error_response(503, "auth_unavailable", decision.message)
            if isinstance(decision, Refused) and decision.kind == "forbidden":
                _refused(request, decision.message)
                count(method, "forbidden")
                return error_response(
                    403,
                    "forbidden",
                    decision.message,
                    headers={"WWW-Authenticate": f'{REALM}, error="insufficient_scope"'},
                )
            if isinstance(decision, Allowed):
                scope = decision.scope
                who = f"{decision.username} (TokenReview)"
        elif scope is None and review is not None:
            method = "tokenreview"  # not even token-shaped: no review call
        if scope is None:
            _refused(request, "unknown token")
            count(method, "unauthenticated")
            return error_response(
                401,
                "unauthorized",
                "invalid bearer token",
                headers={"WWW-Authenticate": f'{REALM}, error="invalid_token"'},
            )
        if scope != "admin" and request.method not in READ_METHODS:
            _refused(request, f"{who} has the read scope, {request.method} needs admin")
            count(method, "forbidden")
            return error_response(
                403,
                "forbidden",
                f"{request.method} needs an admin token; {who} has the read scope",
                headers={"WWW-Authenticate": f'{REALM}, error="insufficient_scope"'},
            )
        count(method, "ok")
        return await handler(request)

    return middleware


JSON_TYPE: Final = "application/json"


def same_origin_middleware() -> Middleware:
    """No-token mode: a state-changing request (not GET/HEAD/OPTIONS) on a route must come
    from this API's own origin (or send no Origin: curl, nicfleetctl) and be JSON.

    Without tokens the only credential is reaching the socket, which a web page the
    operator opens can do through the browser: a cross-site form or `fetch` in no-cors
    mode sends a "simple" request (text/plain, form data) with no preflight. Refusing a
    foreign Origin (403) and every body type but JSON (415) leaves such a page nothing."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method in READ_METHODS or request.match_info.http_exception is not None:
            return await handler(request)  # reads, and unknown routes (their 404/405)
        origin = request.headers.get("Origin")
        own = f"{request.scheme}://{request.host}"
        if origin is not None and origin != own:
            _refused(request, f"cross-origin: Origin {origin!r}")
            return error_response(
                403,
                "cross_origin",
                f"cross-origin {request.method} refused: Origin {origin!r} is not this API's"
                f" origin {own!r} (without --api-token-file a state-changing request must come"
                " from the same origin, or send no Origin)",
            )
        if request.headers.get("Content-Type") is None or request.content_type != JSON_TYPE:
            _refused(request, f"content type {request.content_type!r}")
            return error_response(
                415,
                "unsupported_media_type",
                f"{request.method} needs 'Content-Type: {JSON_TYPE}' (without --api-token-file"
                " the API refuses the body types a cross-site page may send unasked)",
                headers={"Accept-Post": JSON_TYPE},
            )
        return await handler(request)

    return middleware


def _refused(request: web.Request, reason: str) -> None:
    log.info("API request refused (%s): %s", reason, _describe(request))


def _describe(request: web.Request) -> str:
    # Method, path and peer only: never the header or the token.
    return f"{request.method} {request.path} from {request.remote}"
