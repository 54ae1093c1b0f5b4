"""Starting the real reward server for a test: `python reward_server/reward_server.py` on a free
loopback port, waited for through /health, stopped afterwards."""

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers.processes import stop

REPO = Path(__file__).resolve().parents[2]
API_KEY_ENV = "GRPO_REWARD_SERVER_API_KEY"


@dataclass
class Server:
    url: str
    log: Path
    process: subprocess.Popen  # for a test that kills the server
    output: Path  # its stdout and stderr

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(port: int, *flags: str) -> list[str]:
    return [sys.executable, "reward_server/reward_server.py", "--port", str(port), *flags]


@contextmanager
def reward_server(folder: Path, *flags: str, env: dict | None = None, port: int | None = None):
    port = port or free_port()
    log, output_path = folder / f"requests-{port}.log", folder / f"output-{port}.txt"
    environment = {k: v for k, v in os.environ.items() if k != API_KEY_ENV} | (env or {})
    with open(output_path, "w+") as output:
        process = subprocess.Popen(
            server_command(port, "--log_file", str(log), *flags),
            cwd=REPO,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_healthy(url, process, output)
            yield Server(url, log, process, output_path)
        finally:
            stop(process, timeout=30)


def wait_until_healthy(url: str, process: subprocess.Popen, output, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output.seek(0)
            pytest.fail(f"reward server exited with code {process.returncode}:\n{output.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"reward server at {url} did not answer /health within {timeout:g} s")


@contextmanager
def foreign_server(answer: dict | list[dict], write_body=None, received: list | None = None):
    """A server on loopback that is not ours (PaddleNLP's own, a broken or a slow one): every POST gets 200
    and `answer` as JSON (a list: one answer per request in turn, the last one repeated), written by
    write_body(wfile, body) (default: all at once). Each request's JSON body is appended to `received`.
    Yields its URL."""
    answers = answer if isinstance(answer, list) else [answer]
    bodies = [] if received is None else received

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            body = json.dumps(answers[min(len(bodies), len(answers)) - 1]).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            (write_body or type(self.wfile).write)(self.wfile, body)

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}"
        finally:
            httpd.shutdown()
