"""A small Chrome DevTools Protocol client over aiohttp's websocket client, for the browser tests.

`Browser.start()` runs Debian's `chromium` headless with `--remote-debugging-port=0` and a fresh
profile, reads the DevTools address it prints, opens one page target and returns a `Page`:
`call(method, **params)` sends a command and awaits its reply; `wait_event(name)` awaits the
next event of that name (events are queued as they arrive, so none is lost between a command and
the wait). No sleeps: every wait is on a message from the browser (with a timeout as a guard).

`find_chromium()`: `$PROMPTCACHE_CHROMIUM`, else `chromium` / `chromium-browser` on `PATH`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import re
import shutil
import tempfile
from collections import defaultdict, deque
from typing import Any

import aiohttp
import orjson

from proxy.aio import create_task

TIMEOUT = 60.0
_LISTENING = re.compile(rb"DevTools listening on (ws://[^\s]+)")


def find_chromium() -> str | None:
    configured = os.environ.get("PROMPTCACHE_CHROMIUM")
    if configured:
        return configured
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


class CDPError(RuntimeError):
    pass


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._events: dict[str, deque[dict[str, Any]]] = defaultdict(deque)
        self._waiters: dict[str, list[asyncio.Future[dict[str, Any]]]] = defaultdict(list)
        self.log: list[tuple[str, dict[str, Any]]] = []
        """Every event received, in order."""

    async def pump(self) -> None:
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = orjson.loads(message.data)
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    if "error" in data:
                        future.set_exception(CDPError(str(data["error"])))
                    else:
                        future.set_result(data.get("result", {}))
            else:
                name, params = data.get("method", ""), data.get("params", {})
                self.log.append((name, params))
                waiters = self._waiters.get(name)
                if waiters:
                    waiters.pop(0).set_result(params)
                else:
                    self._events[name].append(params)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(CDPError("browser connection closed"))

    async def call(self, method: str, **params: Any) -> Any:
        ident = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        await self.ws.send_str(orjson.dumps({"id": ident, "method": method, "params": params}).decode())
        return await asyncio.wait_for(future, TIMEOUT)

    def clear(self, name: str) -> None:
        self._events[name].clear()

    async def wait_event(self, name: str) -> dict[str, Any]:
        queued = self._events[name]
        if queued:
            return queued.popleft()
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[name].append(future)
        return await asyncio.wait_for(future, TIMEOUT)

    async def goto(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self.clear("Page.loadEventFired")
        result = await self.call("Page.navigate", url=url)
        if result.get("errorText"):
            raise CDPError(f"navigation to {url} failed: {result['errorText']}")
        await self.wait_event("Page.loadEventFired")

    async def js(self, expression: str) -> Any:
        """Evaluate `expression` in the page; its value (JSON-able) or a `CDPError`."""
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if result.get("exceptionDetails"):
            raise CDPError(str(result["exceptionDetails"]))
        return result["result"].get("value")

    async def key(self, key: str, code: str, key_code: int) -> None:
        """Press and release one key (Input.dispatchKeyEvent)."""
        for kind in ("rawKeyDown", "keyUp"):
            await self.call(
                "Input.dispatchKeyEvent",
                type=kind,
                key=key,
                code=code,
                windowsVirtualKeyCode=key_code,
                nativeVirtualKeyCode=key_code,
            )

    async def drag(self, x0: float, y0: float, x1: float, y1: float) -> None:
        """Press the left button at (x0, y0), move to (x1, y1) in two steps, release there."""
        await self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x0, y=y0)
        await self.call("Input.dispatchMouseEvent", type="mousePressed", x=x0, y=y0, button="left", clickCount=1)
        mid = (x0 + x1) / 2
        await self.call("Input.dispatchMouseEvent", type="mouseMoved", x=mid, y=y1, button="left", buttons=1)
        await self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x1, y=y1, button="left", buttons=1)
        await self.call("Input.dispatchMouseEvent", type="mouseReleased", x=x1, y=y1, button="left", clickCount=1)

    async def screenshot(self) -> bytes:
        result = await self.call("Page.captureScreenshot", format="png")
        return base64.b64decode(result["data"])


class Browser:
    def __init__(self, process: asyncio.subprocess.Process, profile: str, http: aiohttp.ClientSession) -> None:
        self.process = process
        self.profile = profile
        self.http = http
        self._tasks: list[asyncio.Task[None]] = []
        self._sockets: list[aiohttp.ClientWebSocketResponse] = []

    @classmethod
    async def start(cls, executable: str, width: int = 1300, height: int = 1000) -> Browser:
        profile = tempfile.mkdtemp(prefix="promptcache-chromium-")
        process = await asyncio.create_subprocess_exec(
            executable,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--window-size={width},{height}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        assert process.stderr is not None
        url = None
        seen = b""
        while url is None:
            line = await asyncio.wait_for(process.stderr.readline(), TIMEOUT)
            if not line:
                raise CDPError(f"chromium exited before DevTools listened: {seen[-2000:]!r}")
            seen += line
            found = _LISTENING.search(line)
            if found:
                url = found.group(1).decode()
        http = aiohttp.ClientSession()
        browser = cls(process, profile, http)
        browser.width, browser.height = width, height
        browser._tasks.append(create_task(browser._drain(process.stderr), name="chromium-stderr"))
        browser.base = "http://" + url.split("//", 1)[1].split("/", 1)[0]
        return browser

    @staticmethod
    async def _drain(stream: asyncio.StreamReader) -> None:
        while await stream.readline():
            pass

    async def new_page(self) -> Page:
        async with self.http.put(self.base + "/json/new?about:blank") as r:
            target = await r.json(content_type=None)
        ws = await self.http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
        self._sockets.append(ws)
        page = Page(ws)
        self._tasks.append(create_task(page.pump(), name="cdp-pump"))
        await page.call("Page.enable")
        await page.call("Runtime.enable")
        await page.call("Network.enable")
        await page.call(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return page

    async def close(self) -> None:
        for ws in self._sockets:
            await ws.close()
        await self.http.close()
        if self.process.returncode is None:
            self.process.terminate()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.process.wait(), TIMEOUT)
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        shutil.rmtree(self.profile, ignore_errors=True)
