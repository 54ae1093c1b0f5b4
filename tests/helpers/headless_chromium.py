"""Headless Chromium on the DevTools protocol, for the tests that open pages: the dashboards and the docs site."""

import json
import os
import select
import subprocess
import time


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe): commands
    go in on its fd 3, replies and events come out on its fd 4, each a JSON text ended by a NUL byte."""

    def __init__(self, binary: str, folder):
        commands_in, self.commands = os.pipe()
        self.replies, replies_out = os.pipe()
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--window-size=1400,1000", f"--user-data-dir={folder / 'profile'}", "--remote-debugging-pipe"]
        self.log = folder / "chromium.txt"
        with open(self.log, "w") as log:
            # bash moves the pipe ends onto fds 3 and 4 (dash takes only one-digit fds), then becomes Chromium
            self.process = subprocess.Popen(
                ["bash", "-c", f'exec "$0" "$@" 3<&{commands_in} 4>&{replies_out}', binary, *flags],
                pass_fds=(commands_in, replies_out), stdout=log, stderr=subprocess.STDOUT)
        os.close(commands_in)
        os.close(replies_out)
        self.pending, self.last_id = b"", 0

    def call(self, method: str, session: str | None = None, timeout: float = 30.0, **params) -> dict:
        self.last_id += 1
        message = {"id": self.last_id, "method": method, "params": params} | ({"sessionId": session} if session else {})
        os.write(self.commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" not in self.pending:
                if not select.select([self.replies], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    raise TimeoutError(f"Chromium did not answer {method} within {timeout:g} s (log: {self.log})")
                chunk = os.read(self.replies, 1 << 16)
                if not chunk:
                    raise EOFError(f"Chromium closed its DevTools pipe (log: {self.log})")
                self.pending += chunk
            text, self.pending = self.pending.split(b"\0", 1)
            reply = json.loads(text)
            if reply.get("id") == self.last_id:  # anything else is an event, not needed here
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def open(self, url: str) -> str:
        target = self.call("Target.createTarget", url=url)["targetId"]
        return self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def evaluate(self, session: str, expression: str):
        result = self.call("Runtime.evaluate", session, expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}\n{result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        os.close(self.commands)  # Chromium exits when its DevTools pipe closes
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self.replies)
