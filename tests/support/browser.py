"""A headless Chromium driven over the Chrome DevTools protocol (CDP), for
tests of the server's pages: the system's Chromium (Debian's `chromium`
package, or $LLMINFER_CHROMIUM), its page target reached with the
`websockets` package's synchronous client; nothing is downloaded.

    with Chromium(tmp_path) as b:
        b.goto(url)
        b.wait("document.title !== ''")
        value = b.eval("1 + 1")
        b.screenshot(tmp_path / "page.png")
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request

NAMES = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    given = os.environ.get("LLMINFER_CHROMIUM")
    if given:
        return given
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    for path in ("/usr/lib/chromium/chromium", "/usr/lib/chromium/headless_shell"):
        if os.access(path, os.X_OK):
            return path
    return None


class CDPError(RuntimeError):
    pass


class Chromium:
    def __init__(self, tmp_path, width=1000, height=760):
        from websockets.sync.client import connect

        exe = find_chromium()
        if exe is None:
            raise FileNotFoundError("no Chromium")
        self.log = tmp_path / "chromium.log"
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                 f"--user-data-dir={tmp_path / 'profile'}", "--remote-debugging-port=0",
                 "--remote-allow-origins=*", f"--window-size={width},{height}", "about:blank"],
                stdout=subprocess.DEVNULL, stderr=err)
        try:
            port = self._port()
            deadline = time.monotonic() + 30
            while True:
                targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    break
                if time.monotonic() > deadline:
                    raise CDPError("Chromium opened no page")
                time.sleep(0.1)
            self._conn = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
            self.ws = self._conn.__enter__()
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        self._id = 0
        self.console = []  # console messages and uncaught exceptions of the page
        self.call("Runtime.enable")
        self.call("Page.enable")

    def _port(self) -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = re.search(rb"DevTools listening on ws://[^:]+:(\d+)/", self.log.read_bytes())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise CDPError(f"Chromium exited ({self.proc.returncode}): {tail}")
            time.sleep(0.05)
        raise CDPError("Chromium did not open its DevTools port")

    def call(self, method: str, **params):
        self._id += 1
        me = self._id
        self.ws.send(json.dumps({"id": me, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=120))
            if msg.get("id") == me:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if msg.get("method") == "Runtime.consoleAPICalled":
                args = msg["params"]["args"]
                self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
            elif msg.get("method") == "Runtime.exceptionThrown":
                self.console.append("exception: " + json.dumps(msg["params"]["exceptionDetails"])[:500])

    def eval(self, expression: str):
        """The value of a JavaScript expression in the page (a promise awaited)."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise CDPError(f"{expression[:80]!r} threw: {json.dumps(r['exceptionDetails'])[:800]}")
        return r["result"].get("value")

    def wait(self, expression: str, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while True:
            v = self.eval(expression)
            if v:
                return v
            if time.monotonic() > deadline:
                raise TimeoutError(f"never true: {expression} (console: {self.console[-5:]})")
            time.sleep(0.05)

    def goto(self, url: str):
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete' && location.href !== 'about:blank'")

    def screenshot(self, path) -> str:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return str(path)

    def close(self):
        try:
            self._conn.__exit__(None, None, None)
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
