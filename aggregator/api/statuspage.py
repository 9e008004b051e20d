"""The status page: the static files of `aggregator/api/ui/` served at `/ui/` (no build step),
and `/` redirecting there, so the API's bare address in a browser opens the page.

The files are read from the package once, when the routes are added; a request picks one
by name from that table, never from a filesystem path. The page holds no data — it reads
the JSON API with the bearer token the user gives it — so these routes are open
(`apiauth.is_ui_path`) and left out of the OpenAPI document of the JSON API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Final

from aiohttp import web

from aggregator.api.auth import ROOT_PATH, UI_PATH

INDEX: Final = "index.html"
CONTENT_TYPES: Final[Mapping[str, str]] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",  # ES modules need a JavaScript MIME type
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# Everything from our own origin only: no inline script, no frames, no other hosts, so
# even a string that slipped past the page's escaping could not run or call out.
SECURITY_HEADERS: Final[Mapping[str, str]] = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    content_type: str


def load_files(package: str = "aggregator.api", folder: str = "ui") -> dict[str, StaticFile]:
    """The servable files of `package/folder` by name (types from `CONTENT_TYPES` only)."""
    files: dict[str, StaticFile] = {}
    for entry in resources.files(package).joinpath(folder).iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        content_type = CONTENT_TYPES.get(suffix)
        if entry.is_file() and content_type is not None:
            files[entry.name] = StaticFile(entry.read_bytes(), content_type)
    if INDEX not in files:
        raise FileNotFoundError(f"{package}/{folder}/{INDEX} is missing from the package")
    return files


def add_ui_routes(app: web.Application, files: Mapping[str, StaticFile] | None = None) -> None:
    """`/` and `/ui` (redirect to `/ui/`), `/ui/` (the page) and `/ui/{file}`."""
    table = dict(files) if files is not None else load_files()

    def respond(name: str) -> web.Response:
        found = table.get(name)
        if found is None:
            raise web.HTTPNotFound()  # the API's error middleware answers in JSON
        return web.Response(
            body=found.body, headers={"Content-Type": found.content_type, **SECURITY_HEADERS}
        )

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(UI_PATH + "/")

    async def index(request: web.Request) -> web.Response:
        return respond(INDEX)

    async def static(request: web.Request) -> web.Response:
        return respond(request.match_info["file"])

    app.router.add_get(ROOT_PATH, redirect)
    app.router.add_get(UI_PATH, redirect)
    app.router.add_get(UI_PATH + "/", index)
    app.router.add_get(UI_PATH + "/{file}", static)
