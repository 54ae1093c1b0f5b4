"""Reward server throughput and latency: batches of 64 GSM8K solutions, 1, 8 and 32 concurrent clients.

    .venv/bin/python bench/bench_reward_server.py [--seconds 15] [--workers N]

Starts reward_server/reward_server.py on a free loopback port (accuracy + format), then for each client
count posts batches to POST /v1/score for --seconds and prints one JSON line: items per second and
p50 / p99 request latency. Clients run in this process on one event loop with pre-encoded bodies,
so their cost is small, but on a small machine they share its cores with the server.
"""

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO.parent / "shared" / "data" / "gsm8k" / "example_model_solutions.jsonl"
SOLVERS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")
BATCH = 64
REWARD_FUNCS = ["accuracy", "format"]


def batches() -> list[bytes]:
    if not SOLUTIONS.is_file():
        sys.exit(f"GSM8K model solutions not found at {SOLUTIONS} (they live in ../shared beside the checkout)")
    items = []
    with open(SOLUTIONS) as f:
        for line in f:
            row = json.loads(line)
            items += [
                {"prompt": row["question"], "answer": row["ground_truth"], "completion": row[solver]["solution"]}
                for solver in SOLVERS
            ]
    return [
        json.dumps({"items": items[i : i + BATCH], "reward_funcs": REWARD_FUNCS}).encode()
        for i in range(0, len(items) - BATCH + 1, BATCH)
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run(url: str, bodies: list[bytes], clients: int, seconds: float) -> dict:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:

        async def client(k: int) -> None:
            i = k
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                response = await http.post(
                    "/v1/score", content=bodies[i % len(bodies)], headers={"content-type": "application/json"}
                )
                response.raise_for_status()
                if any(error is not None for error in response.json()["errors"]):
                    raise RuntimeError(f"item errors in a benchmark batch: {response.json()['errors']}")
                latencies.append(time.perf_counter() - started)
                i += clients

        started = time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(clients)))
        elapsed = time.perf_counter() - started
    ms = np.array(latencies) * 1000
    return {
        "clients": clients,
        "batch": BATCH,
        "items_per_second": round(len(latencies) * BATCH / elapsed, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p99_ms": round(float(np.percentile(ms, 99)), 1),
        "requests": len(latencies),
        "reward_funcs": REWARD_FUNCS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured time per client count")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="the server's scoring processes")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    bodies = batches()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "reward_server" / "reward_server.py"),
                "--port",
                str(port),
                "--workers",
                str(args.workers),
                "--reward_funcs",
                *REWARD_FUNCS,
                "--log_file",
                f"{tmp}/server.log",
            ],
            cwd=REPO,
        )
        try:
            wait_for(url, server)
            asyncio.run(run(url, bodies, 8, 2.0))  # warm-up: math-verify's first calls, connections
            for clients in args.clients:
                print(json.dumps(asyncio.run(run(url, bodies, clients, args.seconds))), flush=True)
        finally:
            server.terminate()
            server.wait(timeout=30)


def wait_for(url: str, server: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the reward server exited with code {server.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    sys.exit(f"the reward server did not answer /health within {timeout:g} s")


if __name__ == "__main__":
    main()
