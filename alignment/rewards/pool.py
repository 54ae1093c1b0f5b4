"""Worker processes that score items, each under a time limit: the reward server scores every request
through a pool, and the trainer scores in process through one (use_rm_server false).

A job (one request, one batch) is cut into chunks, one message per chunk to a worker; the worker answers
one message per item, so the parent always knows which item is running. An item that outlives its limit
cannot be interrupted (math checking can hang inside C code), so its worker is killed and replaced, the
item gets an error, and the rest of its chunk goes to the fresh worker.

Jobs share the workers: a free worker takes its next chunk from the job with the fewest chunks running,
and one job holds at most `job_workers` workers at once, so a large or slow request does not make the
others wait for all of it. A job that ends early (its client went away, its time budget ran out) gives
its unstarted items an error, and the workers still scoring its items are killed and replaced.

Plugins are executed from the text the parent read (alignment/basics/plugins.py), in every worker,
replacements included: an edited or deleted plugin file changes nothing while the pool runs.

Messages are pickled: the workers are this process's own children, as this user, on a socket pair it
made, no other process can write to it, and what a client sent the reward server arrives parsed from
JSON. Pickling recurses once a level, so a sample nested past MAX_SAMPLE_DEPTH gets an error and is
not sent.
"""

import asyncio
import ctypes
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from alignment.basics.json_depth import MAX_JSON_DEPTH
from alignment.rewards import RewardSettings, ScoreTable, available_rewards, score_completions
from alignment.rewards.registry import prepare_rewards
from alignment.basics.plugins import PluginSource, load_plugin_sources

# Large enough that IPC is a small part of the cost (an item scores in ~30 us), small enough that a
# big request does not hold a worker while other requests wait; huge completions make smaller chunks.
MAX_CHUNK = 64
MAX_CHUNK_CHARS = 256_000
START_TIMEOUT_S = 60.0  # a worker imports the rewards (sympy, math-verify: ~0.3 s) and runs the plugins
STOP_TIMEOUT_S = 5.0
TICK_S = 0.1  # how often a busy worker's thread checks whether its job has ended
# A sample holds JSON read under MAX_JSON_DEPTH (dataset rows, tool calls) a few levels down (sample -> tool_calls ->
# call -> arguments); pickling recurses about twice a level and failed at 600 under Python's limit of 1,000 frames.
MAX_SAMPLE_DEPTH = MAX_JSON_DEPTH + 8

PREPARED = "prepared"  # a worker's answer to a job before its items: the functions' one-time work is done
# (weighted total, one value per function, error): None where the item could not be scored
ItemResult = tuple[float | None, tuple[float | None, ...], str | None]


def _serve() -> None:
    """A worker's main: python -c "...; _serve()" FD PARENT_PID, FD one end of a socket pair to the parent."""
    conn = Connection(int(sys.argv[1]))
    _die_with(int(sys.argv[2]))
    try:
        load_plugin_sources(conn.recv())
    except Exception as exc:
        conn.send(f"{type(exc).__name__}: {exc}")
        return
    conn.send([spec.name for spec in available_rewards()])  # ready, with what it can score
    try:
        while (job := conn.recv()) is not None:
            names, weights, settings, completions, samples = job
            prepare_rewards(names)  # imports of seconds (the instruction verifiers' nltk), outside any item's time limit
            conn.send(PREPARED)
            for completion, sample in zip(completions, samples, strict=True):
                conn.send(_score_one(completion, sample, names, weights, settings))
    except EOFError:  # the parent is gone
        pass


def _die_with(parent_pid: int) -> None:
    # A worker busy in a hanging item (a regex holding the GIL, say) never reads the EOF its parent's death
    # leaves: have the kernel kill it when the thread that started it ends (PR_SET_PDEATHSIG; Linux).
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # it ended before the line above
        os._exit(1)


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
    """One scoring process. A fresh interpreter, not a fork: the parent may hold threads and a model, and
    multiprocessing's spawn and forkserver would run the parent's main script again (run_grpo.py imports
    paddle). Its own session: Ctrl-C at the terminal is for the parent, which stops its workers."""

    def __init__(self, plugins: list[PluginSource]):
        self.plugins = plugins
        self.process: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.rewards: frozenset[str] = frozenset()  # the reward functions registered in it

    def ensure_started(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        self.conn, child_conn = multiprocessing.Pipe()
        fd = child_conn.fileno()
        main = "from alignment.rewards.pool import _serve; _serve()"
        command = [sys.executable, "-c", main, str(fd), str(os.getpid())]
        self.process = subprocess.Popen(command, pass_fds=[fd], env=_worker_env(), start_new_session=True)
        child_conn.close()  # so that recv sees EOF when the worker dies
        try:
            self.conn.send(self.plugins)
            ready = self.conn.poll(START_TIMEOUT_S)
            reply = self.conn.recv() if ready else f"no answer within {START_TIMEOUT_S:g} s"
        except (EOFError, OSError):
            reply = f"it exited with code {self.exit_code()}"
        if isinstance(reply, str):
            self.kill()
            raise RuntimeError(f"reward worker failed to start: {reply}")
        self.rewards = frozenset(reply)

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            self.conn.send(None)
            self.process.wait(STOP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass  # dead already, or stuck: killed below
        self.kill()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.conn.close()

    def exit_code(self) -> int | None:
        try:
            return self.process.wait(1.0)
        except subprocess.TimeoutExpired:
            return None


def _worker_env() -> dict:
    # The worker imports this package from where the parent found it, whatever its working directory.
    root = str(Path(__file__).resolve().parents[2])
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


@dataclass(eq=False)
class Job:
    """One batch being scored (ScoringPool.submit); table() waits for it. Guarded by the pool's lock."""

    names: list[str]
    weights: list[float]
    settings: RewardSettings
    completions: list[str]
    samples: list[Mapping]
    results: list[ItemResult | None]
    refused: dict[int, str] = field(default_factory=dict)  # the batch's items never sent (by index in the batch): errors
    done: Future = field(default_factory=Future)  # resolved (None) once every item has a result
    started: int = 0  # items handed to workers so far (they are handed out in order)
    running: int = 0  # chunks being scored
    scored: int = 0

    def table(self) -> ScoreTable:
        """Waits until every item has a result; raises what made the job fail (a worker that cannot start)."""
        self.done.result()
        sent, empty = iter(self.results), (None,) * len(self.names)
        items = range(len(self.results) + len(self.refused))
        return _table(self.names, [(None, empty, self.refused[i]) if i in self.refused else next(sent) for i in items])


def _deeper_than(value, most: int) -> bool:
    """Whether `value` nests mappings, lists and tuples more than `most` deep; walked a level at a time, not recursively."""
    level = [value]
    for _ in range(most + 1):
        containers = [item for item in level if isinstance(item, (Mapping, list, tuple))]
        if not containers:
            return False
        level = [child for item in containers for child in (item.values() if isinstance(item, Mapping) else item)]
    return True


def _table(names: list[str], results: list[ItemResult]) -> ScoreTable:
    return ScoreTable(
        totals=[total for total, _, _ in results],
        columns={name: [values[j] for _, values, _ in results] for j, name in enumerate(names)},
        errors=[error for _, _, error in results],
    )


@dataclass
class _Chunk:
    job: Job
    start: int
    end: int


class ScoringPool:
    def __init__(self, workers: int, item_timeout: float, plugins: list[PluginSource], job_workers: int | None = None):
        if workers < 1 or not item_timeout > 0:
            raise ValueError(f"need workers >= 1 and item_timeout > 0, got {workers} and {item_timeout}")
        self.workers, self.item_timeout, self.plugins = workers, item_timeout, list(plugins)
        self.job_workers = workers if job_workers is None else max(1, min(job_workers, workers))
        self._lock = threading.Condition()
        self._jobs: list[Job] = []  # not finished, oldest first
        self._closing = False
        self._threads: list[threading.Thread] = []
        self.rewards: frozenset[str] = frozenset()  # what the workers can score, once started

    def start(self) -> None:
        """Starts the workers and returns once all are ready (plugins loaded); raises if one cannot start."""
        started = []
        for _ in range(self.workers):
            # One thread per worker starts it (and its replacements: the kernel kills a worker when the
            # thread that started it ends), feeds it chunks and waits on it, releasing the GIL.
            started.append(Future())
            worker = _Worker(self.plugins)
            thread = threading.Thread(target=self._drive, args=(worker, started[-1]), daemon=True, name="reward-worker")
            thread.start()
            self._threads.append(thread)
        failures = [failure for future in started if (failure := future.exception()) is not None]
        if failures:
            self.close()
            raise failures[0]
        self.rewards = started[0].result()

    def close(self) -> None:
        """Ends every job still running (its items get an error) and stops the workers."""
        with self._lock:
            self._closing = True
            jobs = list(self._jobs)
            self._lock.notify_all()
        for job in jobs:
            self.end(job, "the scoring pool was closed")
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def submit(
        self,
        completions: list[str],
        samples: list[Mapping],
        names: list[str],
        weights: list[float],
        settings: RewardSettings = RewardSettings(),
    ) -> Job:
        """Queues a batch to score like score_completions; raises ValueError for a bad one."""
        score_completions([], [], names, weights)  # the same name and weight checks as in-process scoring
        if len(completions) != len(samples):
            raise ValueError(f"{len(completions)} completions but {len(samples)} samples")
        refused = {i: f"the sample nests more than {MAX_SAMPLE_DEPTH} levels deep (MAX_SAMPLE_DEPTH); it was not scored"
                   for i, sample in enumerate(samples) if _deeper_than(sample, MAX_SAMPLE_DEPTH)}
        if refused:
            completions = [c for i, c in enumerate(completions) if i not in refused]
            samples = [s for i, s in enumerate(samples) if i not in refused]
        job = Job(names, weights, settings, completions, samples, [None] * len(completions), refused)
        if not completions:
            job.done.set_result(None)
            return job
        with self._lock:
            if self._closing:
                raise RuntimeError("the scoring pool is closed")
            self._jobs.append(job)
            self._lock.notify_all()
        return job

    async def score(
        self,
        completions: list[str],
        samples: list[Mapping],
        names: list[str],
        weights: list[float],
        settings: RewardSettings = RewardSettings(),
        budget: float | None = None,
    ) -> ScoreTable:
        """submit + table off the event loop. Items not scored within `budget` seconds get an error;
        when the caller is cancelled (its client went away), so is the job."""
        job = self.submit(completions, samples, names, weights, settings)
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job.done)), budget)
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            self.end(job, f"not scored within the request's time budget of {budget:g} s")
        except asyncio.CancelledError:
            self.end(job, "cancelled")
            raise
        return job.table()

    def end(self, job: Job, reason: str) -> None:
        """Stops a job: its items without a result get `reason` as their error, and the workers still
        scoring its items are killed (and replaced)."""
        with self._lock:
            if job.done.done():
                return
            empty = (None,) * len(job.names)
            job.results = [(None, empty, reason) if r is None else r for r in job.results]
            self._finish(job)

    def _fail(self, job: Job, exc: Exception) -> None:
        with self._lock:
            if not job.done.done():
                self._jobs.remove(job)
                job.done.set_exception(exc)

    def _finish(self, job: Job) -> None:
        self._jobs.remove(job)
        job.done.set_result(None)

    def _next_chunk(self) -> _Chunk | None:
        """Blocks until a job has items for a worker; None once the pool closes."""
        with self._lock:
            while not self._closing:
                ready = [j for j in self._jobs if j.started < len(j.completions) and j.running < self.job_workers]
                if ready:
                    job = min(ready, key=lambda j: j.running)  # min keeps the oldest among equals
                    return self._cut(job)
                self._lock.wait()
            return None

    def _cut(self, job: Job) -> _Chunk:
        left = len(job.completions) - job.started
        size = min(MAX_CHUNK, max(1, math.ceil(left / self.job_workers)))
        start = end = job.started
        chars = 0
        while end < start + size and (end == start or chars + len(job.completions[end]) <= MAX_CHUNK_CHARS):
            chars += len(job.completions[end])
            end += 1
        job.started, job.running = end, job.running + 1
        return _Chunk(job, start, end)

    def _drive(self, worker: _Worker, started: Future) -> None:
        try:
            worker.ensure_started()
        except Exception as exc:
            started.set_exception(exc)
            return
        started.set_result(worker.rewards)
        while (chunk := self._next_chunk()) is not None:
            try:
                self._run(worker, chunk)
            except Exception as exc:  # a worker that cannot be replaced fails its job, not silently
                self._fail(chunk.job, exc)
            finally:
                with self._lock:
                    chunk.job.running -= 1
                    self._lock.notify_all()  # the job may take another worker now
        worker.stop()

    def _run(self, worker: _Worker, chunk: _Chunk) -> None:
        job, item = chunk.job, chunk.start
        while item < chunk.end and not job.done.done():
            worker.ensure_started()  # a fresh one after a kill
            rest = slice(item, chunk.end)
            worker.conn.send((job.names, job.weights, job.settings, job.completions[rest], job.samples[rest]))
            if not worker.conn.poll(START_TIMEOUT_S) or worker.conn.recv() != PREPARED:
                raise RuntimeError(f"a reward worker did not prepare {', '.join(job.names)} within {START_TIMEOUT_S:g} s")
            while item < chunk.end:
                outcome = self._wait_for_item(worker, job)
                if outcome is None:  # the job ended: what the worker is doing is wasted
                    worker.kill()
                    return
                result, healthy = outcome
                self._record(job, item, result)
                item += 1
                if not healthy:
                    worker.kill()
                    break  # the rest of the chunk goes to a fresh worker

    def _wait_for_item(self, worker: _Worker, job: Job) -> tuple[ItemResult, bool] | None:
        """(the item's result, whether its worker can go on), or None once the job has ended."""
        deadline = time.monotonic() + self.item_timeout
        failed = (None, (None,) * len(job.names))
        try:
            while not job.done.done():
                if worker.conn.poll(max(0.0, min(TICK_S, deadline - time.monotonic()))):
                    return worker.conn.recv(), True
                if time.monotonic() >= deadline:
                    return (*failed, f"timed out after {self.item_timeout:g} s"), False
        except (EOFError, OSError):  # killed from outside, out of memory, os._exit in a plugin
            return (*failed, f"reward worker died (exit code {worker.exit_code()})"), False
        return None

    def _record(self, job: Job, item: int, result: ItemResult) -> None:
        with self._lock:
            if job.done.done():
                return
            job.results[item] = result
            job.scored += 1
            if job.scored == len(job.results):
                self._finish(job)
