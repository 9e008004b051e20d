"""nicfleetctl's HTTP client for the aggregator API (httpx, sync).

Turns transport failures and API error bodies into `CtlError`s a person can act on,
each carrying the process exit code:

CtlError (aggregator.errors.AggregatorError, click.ClickException)
├── ApiError       the server answered with an error or an unreadable body  (exit 1)
│   ├── NodeNotFound  a node the aggregator does not know, with close matches
│   └── names.UnknownName  a filter's node, rule or resource it does not know
├── BadInput       the request was rejected as invalid (HTTP 400)            (exit 2)
├── Unreachable    no answer: refused, DNS, timeout                          (exit 3)
└── AuthRefused    the token was missing, unknown or lacks scope (401/403)   (exit 4)
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final

import click
import httpx
import msgspec

from aggregator.ctl.config import DEFAULT_SERVER as DEFAULT_SERVER
from aggregator.ctl.config import Settings
from aggregator.errors import AggregatorError
from proto.http import NodeDetail, NodeSummary

DEFAULT_TIMEOUT: Final = 10.0
MAX_PAGES: Final = 10_000  # a server that never ends its `continue` chain is an error
SHARDS_PATH: Final = "/api/v1/shards"  # served by a sharded replica only (docs/scaling.md)
# Where the `cli` group leaves the token (`--token-file`) for every command's client.
TOKEN_META_KEY: Final = "nicfleet.token"
# ... and the resolved Settings (server, token file and where each came from).
SETTINGS_META_KEY: Final = "nicfleet.settings"


class CtlError(AggregatorError, click.ClickException):
    exit_code = 1


class ApiError(CtlError):
    exit_code = 1


class BadInput(CtlError):
    exit_code = 2


class Unreachable(CtlError, retryable=True):
    exit_code = 3


class AuthRefused(CtlError):
    exit_code = 4


class NodeNotFound(ApiError):
    """A node the aggregator does not know, with close matches from the node list."""

    def __init__(self, node: str, suggestions: tuple[str, ...], known: int | None = None) -> None:
        self.node, self.suggestions = node, suggestions
        message = f"unknown node {node!r}"
        if suggestions:
            message += f"; did you mean: {', '.join(suggestions)}?"
        elif known == 0:
            message += "; the aggregator knows no node yet (see `nicfleetctl nodes`)"
        elif known is not None:
            message += f"; none of the {known} known nodes is close (see `nicfleetctl nodes`)"
        super().__init__(message)


def read_token_file(path: str, source: str = "--token-file") -> str:
    """The bearer token in `path` (the whole file, surrounding whitespace stripped);
    `source` (flag, env var or context) names where the path came from in errors."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as file:
            token = file.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{source}: cannot read {path}: {_reason(exc)}") from exc
    if not token or any(c.isspace() for c in token):
        raise BadInput(f"{source}: {path} must hold exactly one token and nothing else")
    return token


def current_token() -> str | None:
    """The token the running `nicfleetctl` invocation was given, if any."""
    ctx = click.get_current_context(silent=True)
    token = ctx.meta.get(TOKEN_META_KEY) if ctx is not None else None
    return token if isinstance(token, str) else None


def current_settings() -> Settings | None:
    """How the running `nicfleetctl` invocation chose its server and token file, if known."""
    ctx = click.get_current_context(silent=True)
    settings = ctx.meta.get(SETTINGS_META_KEY) if ctx is not None else None
    return settings if isinstance(settings, Settings) else None


def unreachable(server: str, exc: Exception) -> Unreachable:
    """The error for a server that did not answer: the URL tried, where it came from and how
    to choose another one."""
    settings = current_settings()
    source = settings.server_source if settings is not None else None
    origin = f" (from {source})" if source else ""
    return Unreachable(
        f"cannot reach nicfleet aggregator at {server}{origin}: {_reason(exc)}.\n"
        "Is the aggregator running there? Choose the server with --server URL, the "
        "NICFLEET_SERVER environment variable, or a context "
        "(`nicfleetctl config set-context NAME --server URL --use`)."
    )


def token_hint() -> str:
    """Which token file this invocation sent, for an authentication error."""
    settings = current_settings()
    if settings is None or settings.token_file is None:
        if current_token() is not None:
            return "check --token-file (or NICFLEET_TOKEN_FILE)"
        return (
            "no token was sent: check --token-file (or NICFLEET_TOKEN_FILE, or the "
            "token-file of a context: `nicfleetctl config get-contexts`)"
        )
    return (
        f"check --token-file (or NICFLEET_TOKEN_FILE): sent the token in "
        f"{settings.token_file} (from {settings.token_source})"
    )


def auth_headers(token: str | None = None) -> dict[str, str]:
    """`Authorization: Bearer …` for `token` (default: `current_token()`), or nothing."""
    token = token if token is not None else current_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


class AggregatorClient:
    """Sync client for `/api/v1`; use as a context manager so the connection pool closes."""

    def __init__(
        self,
        server: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        token: str | None = None,  # default: the one given to this nicfleetctl (--token-file)
    ) -> None:
        self.server = server.rstrip("/")
        self._timeout, self._token = timeout, token
        self._http = httpx.Client(
            base_url=self.server,
            timeout=timeout,
            transport=transport,
            headers={"Accept": "application/json", **auth_headers(token)},
        )

    def __enter__(self) -> AggregatorClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def list_nodes(self, *, state: str | None = None) -> dict[str, Any]:
        params = {"state": state} if state is not None else {}
        return self.get_fleet("/api/v1/nodes", params, key=lambda item: str(item.get("name")))

    def get_fleet(
        self, path: str, params: dict[str, str], *, key: Callable[[dict[str, Any]], Any]
    ) -> dict[str, Any]:
        """`get_all`, across a sharded fleet: a sharded replica lists its own share only
        (docs/scaling.md), so the same list is read from every live replica its
        `/api/v1/shards` names (at its URL in `api_urls`) and merged, sorted by `key`,
        each key once (a partition changing hands is listed by both for up to a
        heartbeat). The answer then has `replicas` (read) and `missing` (replica, url,
        reason: not read). Against an aggregator that is not sharded, exactly `get_all`."""
        body = self.get_all(path, params)
        shards = self._shards()
        if shards is None:
            return body
        me = str(shards.get("replica"))
        urls = {str(r): str(u) for r, u in (shards.get("api_urls") or {}).items()}
        items: dict[Any, Any] = {}
        for item in body["items"]:
            items.setdefault(key(item), item)
        read, missing = [me], []
        # The live replicas only: a dead one's partitions are listed by their new holders
        # (its API URL lingers in the view until its heartbeat entry expires).
        for replica in sorted(set(map(str, shards.get("live") or ())) - {me}):
            url = urls.get(replica)
            if url is None:
                reason = "its API URL is not known yet (its next heartbeat has it)"
                missing.append({"replica": replica, "url": None, "reason": reason})
                continue
            try:
                with AggregatorClient(url, timeout=self._timeout, token=self._token) as peer:
                    for item in peer.get_all(path, params)["items"]:
                        items.setdefault(key(item), item)
            except CtlError as exc:
                missing.append({"replica": replica, "url": url, "reason": exc.message})
                continue
            read.append(replica)
        merged = [items[k] for k in sorted(items)]
        return {**body, "items": merged, "count": len(merged), "replicas": sorted(read),
                "missing": missing}  # fmt: skip

    def _shards(self) -> dict[str, Any] | None:
        """This server's `/api/v1/shards` view; None when it is not a sharded replica."""
        response = self._response(SHARDS_PATH, {})
        return None if response.status_code == 404 else self._body(response)

    def get_all(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        """A paged list (`items`, `continue`) followed to its last page: the last page's
        body with every page's items, `count` = all of them and no `continue`. Pages of
        the server's default size, so a one-page answer is exactly the API's JSON."""
        items: list[Any] = []
        query = dict(params)
        for _ in range(MAX_PAGES):
            body = self._get(path, query)
            page = body.get("items")
            items.extend(page if isinstance(page, list) else ())
            token = body.pop("continue", None)
            if not isinstance(token, str):
                return {**body, "items": items, "count": len(items)}
            query = {**query, "continue": token}
        raise ApiError(f"{self.server}{path} kept answering `continue` for {MAX_PAGES} pages")

    def get_node(self, name: str) -> dict[str, Any]:
        return self._get(f"/api/v1/nodes/{name}", {})

    def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        return self._body(self._response(path, params))

    def _response(self, path: str, params: dict[str, str]) -> httpx.Response:
        try:
            return self._http.get(path, params=params)
        except (httpx.ConnectError, httpx.TimeoutException) as exc:
            raise unreachable(self.server, exc) from exc
        except httpx.HTTPError as exc:
            raise ApiError(
                f"error talking to nicfleet aggregator at {self.server}: {_reason(exc)}"
            ) from exc

    def _body(self, response: httpx.Response) -> dict[str, Any]:
        body = _json_object(response)
        if response.is_success and body is not None:
            return body
        error = _api_error(self.server, response, body)
        if isinstance(error, NodeNotFound) and not error.suggestions:
            error = self._with_close_matches(error)
        raise error

    def version(self) -> str:
        """The aggregator's version, from its OpenAPI document."""
        info = self._get("/api/v1/openapi.json", {}).get("info")
        version = info.get("version") if isinstance(info, dict) else None
        if not isinstance(version, str):
            raise ApiError(f"{self.server} serves no version in its OpenAPI document")
        return version

    def node_names(self) -> list[str]:
        return [
            str(i.get("name")) for i in self.list_nodes().get("items") or () if isinstance(i, dict)
        ]

    def _with_close_matches(self, error: NodeNotFound) -> NodeNotFound:
        try:
            names = self.node_names()
        except CtlError:
            return error
        close = tuple(difflib.get_close_matches(error.node, names, n=3, cutoff=0.5))
        return NodeNotFound(error.node, close, known=len(names))


def fail_if_partial(body: dict[str, Any]) -> None:
    """After printing a list merged across a sharded fleet (`get_fleet`): exit 1 naming
    each replica whose share is missing from it."""
    missing = body.get("missing") or ()
    if not missing:
        return
    shares = "; ".join(
        f"{m.get('replica')} ({m.get('url') or 'no URL'}): {m.get('reason')}" for m in missing
    )
    raise ApiError(
        f"the list lacks the share of {len(missing)} of "
        f"{len(missing) + len(body.get('replicas') or ())} replicas: {shares}. "
        "Ask each replica with --server, or run nicfleetctl where their API URLs are reachable"
    )


def parse_summaries(body: dict[str, Any]) -> tuple[NodeSummary, ...]:
    """The `items` of a /api/v1/nodes answer as typed summaries."""
    try:
        return msgspec.convert(body.get("items"), tuple[NodeSummary, ...])
    except msgspec.ValidationError as exc:
        raise ApiError(f"unexpected node list from the aggregator: {exc}") from exc


def parse_detail(body: dict[str, Any]) -> NodeDetail:
    """A /api/v1/nodes/{node} answer as a typed NodeDetail."""
    try:
        return msgspec.convert(body, NodeDetail)
    except msgspec.ValidationError as exc:
        raise ApiError(f"unexpected node detail from the aggregator: {exc}") from exc


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _json_object(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _api_error(server: str, response: httpx.Response, body: dict[str, Any] | None) -> CtlError:
    error = body.get("error") if body is not None else None
    if response.status_code in (401, 403):
        said = error.get("message") if isinstance(error, dict) else None
        return AuthRefused(
            f"authentication refused by {server}: "
            f"{said if isinstance(said, str) else f'HTTP {response.status_code}'}; "
            f"{token_hint()}"
        )
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        kind = response.headers.get("content-type", "no content type")
        return ApiError(
            f"unexpected answer from {server}{response.request.url.path}: "
            f"HTTP {response.status_code} ({kind}); is this a nicfleet aggregator?"
        )
    message: str = error["message"]
    if response.status_code == 404 and error.get("field") == "node":
        # /nodes/{node} names it in the path, /trace?node= in the query.
        url = response.request.url
        name = url.params.get("node") or url.path.rsplit("/", 1)[-1]
        suggestions = tuple(s for s in error.get("suggestions") or () if isinstance(s, str))
        return NodeNotFound(name, suggestions)
    if response.status_code == 400:
        return BadInput(message)
    return ApiError(f"aggregator answered HTTP {response.status_code}: {message}")
