"""A small Chrome DevTools Protocol client for browser tests: starts Debian's headless
`chromium` on a fresh profile, opens a page, evaluates JavaScript in it and takes PNG
screenshots over the DevTools websocket (aiohttp's client). Waits poll the page's DOM
with a deadline; page exceptions are collected so a test can assert there were none."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium")
# Headless on a closed network: no GPU, no QUIC, no background fetches, no sync/update.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
START_TIMEOUT = 30.0
COMMAND_TIMEOUT = 30.0


class CdpError(RuntimeError):
    """A DevTools command failed, or JavaScript in the page threw."""


class Page:
    """One tab: commands go over the browser connection with this tab's session id."""

    def __init__(self, browser: Browser, session_id: str) -> None:
        self.browser = browser
        self.session_id = session_id
        self.exceptions: list[str] = []  # uncaught page errors, as Chromium describes them

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        return await self.browser.send(method, session_id=self.session_id, **params)

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'", what=f"{url} loaded")

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of `expression` (promises awaited); CdpError if it throws."""
        reply = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CdpError(f"{expression!r} threw: {text}")
        return reply["result"].get("value")

    async def wait_for(self, expression: str, *, timeout: float = 20.0, what: str = "") -> Any:
        """Poll `expression` until its JSON value is truthy (a DOM node is `{}`: use `!!`);
        return that value. AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what or expression}")
            await asyncio.sleep(0.05)

    async def set_viewport(self, width: int, height: int) -> None:
        """Resize the page's viewport (as a resized window would), then let it lay out."""
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        await self.evaluate(
            "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
        )

    async def type_text(self, selector: str, text: str) -> None:
        """Focus `selector` and type `text` as keyboard input."""
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        await self.send("Input.insertText", text=text)

    async def screenshot(self, path: Path, selector: str | None = None) -> Path:
        """The whole page (not only the viewport), or the element `selector`, as a PNG."""
        if selector is None:
            size = (await self.send("Page.getLayoutMetrics"))["cssContentSize"]
            box = {"x": 0, "y": 0, "width": size["width"], "height": size["height"]}
        else:
            box = await self.evaluate(
                f"(r => ({{x: r.left + scrollX, y: r.top + scrollY, width: r.width, "
                f"height: r.height}}))(document.querySelector({json.dumps(selector)})"
                ".getBoundingClientRect())"
            )
        clip = {**box, "scale": 1}
        shot = await self.send(
            "Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True
        )
        await asyncio.to_thread(_write, path, base64.b64decode(shot["data"]))
        return path


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


class Browser:
    """The browser-level DevTools connection; replies matched to commands by id."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.pages: dict[str, Page] = {}

    async def send(
        self, method: str, *, session_id: str | None = None, **params: Any
    ) -> dict[str, Any]:
        message_id = next(self.ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params}
        if session_id is not None:
            message["sessionId"] = session_id
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[message_id] = reply
        try:
            await self.ws.send_str(json.dumps(message))
            answer = await asyncio.wait_for(reply, COMMAND_TIMEOUT)
        finally:
            self.pending.pop(message_id, None)
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error'].get('message')}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def read(self) -> None:
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            if "id" in data:
                reply = self.pending.get(data["id"])
                if reply is not None and not reply.done():
                    reply.set_result(data)
            elif data.get("method") == "Runtime.exceptionThrown":
                page = self.pages.get(data.get("sessionId", ""))
                if page is not None:
                    details = data["params"]["exceptionDetails"]
                    text = details.get("exception", {}).get("description") or details["text"]
                    page.exceptions.append(text)
        for reply in self.pending.values():
            if not reply.done():
                reply.set_exception(CdpError("the browser closed the DevTools connection"))

    async def new_page(self, width: int, height: int) -> Page:
        target = await self.send("Target.createTarget", url="about:blank")
        attached = await self.send(
            "Target.attachToTarget", targetId=target["targetId"], flatten=True
        )
        page = Page(self, attached["sessionId"])
        self.pages[page.session_id] = page
        await page.send("Runtime.enable")
        await page.send("Page.enable")
        await page.set_viewport(width, height)
        return page


async def _debugger_address(profile: Path, proc: asyncio.subprocess.Process, log: Path) -> str:
    """Chromium writes `<port>\\n<browser websocket path>` to the profile once it listens."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        address = _active_port(profile)
        if address is not None:
            return address
        if proc.returncode is not None:
            raise CdpError(f"chromium exited with {proc.returncode}: {_tail(log)}")
        if time.monotonic() > deadline:
            raise CdpError(f"chromium did not open its DevTools port in {START_TIMEOUT}s")
        await asyncio.sleep(0.05)


def _active_port(profile: Path) -> str | None:
    try:
        lines = (profile / "DevToolsActivePort").read_text().splitlines()
    except FileNotFoundError:
        return None
    return f"ws://127.0.0.1:{lines[0]}{lines[1]}" if len(lines) >= 2 else None


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


@asynccontextmanager
async def open_page(workdir: Path, *, width: int = 1500, height: int = 1000) -> AsyncIterator[Page]:
    """A headless chromium (profile and log in `workdir`) and one page in it."""
    if CHROMIUM is None:
        raise CdpError("chromium is not installed")
    profile = workdir / "profile"
    profile.mkdir(parents=True)
    log = workdir / "chromium.log"
    with log.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
        )
    try:
        url = await _debugger_address(profile, proc, log)
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(url, max_msg_size=0) as ws,
            asyncio.TaskGroup() as tasks,
        ):
            browser = Browser(ws)
            reader = tasks.create_task(browser.read())
            try:
                yield await browser.new_page(width, height)
            finally:
                with contextlib.suppress(CdpError, TimeoutError, ConnectionError):
                    await asyncio.wait_for(browser.send("Browser.close"), 10)
                await ws.close()
                reader.cancel()
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
