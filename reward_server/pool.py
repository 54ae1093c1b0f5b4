"""Worker processes that score items, with a time limit per item.

A request's items are cut into chunks, one message per chunk to a worker; the worker answers one
message per item, so the parent always knows which item is running. An item that outlives its limit
cannot be interrupted (math checking can hang inside C code), so its worker is killed and replaced,
the item gets an error, and the rest of its chunk goes to the fresh worker.
"""

import asyncio
import math
import multiprocessing
import queue
import signal
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass

from alignment.rewards import RewardSettings, ScoreTable, score_completions
from alignment.rewards.plugins import load_plugins

# Large enough that IPC is a small part of the cost (an item scores in ~30 us), small enough that a
# big request does not hold a worker while other requests wait.
MAX_CHUNK = 64
START_TIMEOUT_S = 60.0  # forkserver has the rewards imported already; this covers the plugins
STOP_TIMEOUT_S = 5.0

# (weighted total, one value per function, error): None where the item could not be scored
ItemResult = tuple[float | None, tuple[float | None, ...], str | None]


def _serve(conn, plugins: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which stops its workers
    try:
        load_plugins(plugins)
    except Exception as exc:
        conn.send(f"{type(exc).__name__}: {exc}")
        return
    conn.send(None)  # ready
    try:
        while (job := conn.recv()) is not None:
            names, weights, settings, completions, samples = job
            for completion, sample in zip(completions, samples, strict=True):
                conn.send(_score_one(completion, sample, names, weights, settings))
    except EOFError:  # the server is gone
        pass


def _score_one(
    completion: str, sample: Mapping, names: list[str], weights: list[float], settings: RewardSettings
) -> ItemResult:
    table = score_completions([completion], [sample], names, weights, settings=settings)
    total, error = table.totals[0], table.errors[0]
    if total is not None and not math.isfinite(total):  # finite values, huge weights: JSON has no inf
        total, error = None, f"weighted total overflowed to {total}"
    if error is not None:
        # A plugin's message may quote the completion with lone surrogates, which no JSON encoder takes.
        error = error.encode("utf-8", "backslashreplace").decode("utf-8")
    return total, tuple(table.columns[name][0] for name in names), error


class _Worker:
    def __init__(self, context, plugins: list[str]):
        self._context, self._plugins = context, plugins
        self.process = self.conn = None

    def start(self) -> None:
        self.conn, child_conn = self._context.Pipe()
        self.process = self._context.Process(target=_serve, args=(child_conn, self._plugins), daemon=True)
        self.process.start()
        child_conn.close()  # so that recv sees EOF when the worker dies
        try:
            ready = self.conn.poll(START_TIMEOUT_S)
            failure = self.conn.recv() if ready else f"no answer within {START_TIMEOUT_S:g} s"
        except EOFError:
            failure = f"it exited with code {self.exit_code()}"
        if failure is not None:
            self.kill()
            raise RuntimeError(f"reward worker failed to start: {failure}")

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass  # already dead
        self.process.join(STOP_TIMEOUT_S)
        self.kill()

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()

    def exit_code(self) -> int | None:
        self.process.join(1.0)
        return self.process.exitcode


@dataclass
class _Chunk:
    names: list[str]
    weights: list[float]
    settings: RewardSettings
    completions: list[str]
    samples: list[Mapping]
    future: Future


class ScoringPool:
    def __init__(self, workers: int, item_timeout: float, plugins: list[str]):
        if workers < 1 or not item_timeout > 0:
            raise ValueError(f"need workers >= 1 and item_timeout > 0, got {workers} and {item_timeout}")
        self.workers, self.item_timeout, self.plugins = workers, item_timeout, list(plugins)
        # forkserver: a replacement for a killed worker forks from a process that has already imported
        # the rewards (sympy, math-verify), in milliseconds, instead of importing them again for seconds.
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(["reward_server.pool"])
        self._queue: queue.SimpleQueue[_Chunk | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Starts the workers and returns once all are ready (plugins loaded); raises if one cannot start."""
        workers = []
        try:
            for _ in range(self.workers):
                workers.append(_Worker(self._context, self.plugins))
                workers[-1].start()
        except Exception:
            for worker in workers[:-1]:
                worker.kill()
            raise
        for worker in workers:
            # One thread per worker feeds it chunks and waits on it; waiting on a pipe releases the GIL.
            thread = threading.Thread(target=self._drive, args=(worker,), daemon=True, name="reward-worker")
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    async def score(
        self,
        completions: list[str],
        samples: list[Mapping],
        names: list[str],
        weights: list[float],
        settings: RewardSettings = RewardSettings(),
    ) -> ScoreTable:
        """Scores like score_completions, off the event loop; raises ValueError for a bad request."""
        score_completions([], [], names, weights)  # the same name and weight checks as in-process scoring
        size = min(MAX_CHUNK, max(1, math.ceil(len(completions) / self.workers)))
        futures = []
        for start in range(0, len(completions), size):
            future: Future = Future()
            end = start + size
            self._queue.put(_Chunk(names, weights, settings, completions[start:end], samples[start:end], future))
            futures.append(asyncio.wrap_future(future))
        results = [result for chunk in await asyncio.gather(*futures) for result in chunk]
        return ScoreTable(
            totals=[total for total, _, _ in results],
            columns={name: [values[j] for _, values, _ in results] for j, name in enumerate(names)},
            errors=[error for _, _, error in results],
        )

    def _drive(self, worker: _Worker) -> None:
        while (chunk := self._queue.get()) is not None:
            try:
                chunk.future.set_result(self._run(worker, chunk))
            except Exception as exc:  # a worker that cannot be replaced fails its request, not silently
                chunk.future.set_exception(exc)
        worker.stop()

    def _run(self, worker: _Worker, chunk: _Chunk) -> list[ItemResult]:
        if not worker.process.is_alive():  # its replacement failed to start last time: try again
            worker.start()
        results: list[ItemResult] = []
        while len(results) < len(chunk.completions):
            done = len(results)
            job = (chunk.names, chunk.weights, chunk.settings, chunk.completions[done:], chunk.samples[done:])
            worker.conn.send(job)
            while len(results) < len(chunk.completions):
                try:
                    if worker.conn.poll(self.item_timeout):
                        results.append(worker.conn.recv())
                        continue
                    failure = f"timed out after {self.item_timeout:g} s"
                except (EOFError, OSError):  # killed from outside, out of memory, os._exit in a plugin
                    failure = f"reward worker died (exit code {worker.exit_code()})"
                results.append((None, (None,) * len(chunk.names), failure))
                worker.kill()
                worker.start()
                break  # the rest of the chunk goes to the fresh worker
        return results
