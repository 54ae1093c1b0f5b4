"""Rollout processes beside the training process (rollout_workers): who is who, what passes between them, and
in which order.

Under `paddle.distributed.launch --nproc_per_node 1+N`, rank 0 trains and ranks 1..N only generate, each with
its own copy of the weights in its rollout engine. Two channels:

- a connection from the trainer to each rollout process (multiprocessing.connection over TCP, its address and key
  left in the launcher's store) carries the small things: the run's plan, every rollout (pickled, about a
  megabyte), the trainer's word after a step (go or stop), a failure's message. A process that waits, waits on
  its connection, never inside a collective (gloo ends one that waits more than 30 s, and a real model's step
  takes longer), and learns at once when the other side dies: the kernel closes a dead process's sockets;
- the collective (gloo on CPU, NCCL on GPU) carries the weights: after a go word, broadcasts of every trained
  parameter from rank 0, which the rollout processes enter as soon as the word arrives.

The order of rollouts and words (rollout_order, words_after) is what keeps the two sides in step. A batch's
staleness is the number of optimizer steps between the weights that generated it and those it trains: 0 when
synchronous (the trainer waits for step s's rollout from the weights of step s - 1), 1 one step off
(async_generate: step s + 1's rollout is generated while step s trains).
"""

import json
import os
import pickle
import secrets
import socket
import time
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from typing import Optional

import numpy as np
import paddle
import paddle.distributed as dist

from alignment.config import ConfigError
from alignment.rollout import Rollout

PENDING_FILE = "pending_rollout.pkl"  # in a checkpoint of a one-step-off run: the next step's rollout, received
BUCKET_BYTES = 64 << 20  # weights go in flat buffers of about this size: few collective calls, bounded extra memory
RELEASE_SECONDS = 600  # how long a failed rollout process waits for the trainer to save before it exits anyway


class RolloutWorkerError(RuntimeError):
    """A rollout process failed or died; the message names it."""


class TrainerGone(RuntimeError):
    """The training process stopped (its connection closed): a rollout process has nobody to serve."""


@dataclass(frozen=True)
class Placement:
    """This process's part in a launch with rollout processes: the last rollout_workers ranks generate."""

    rank: int
    processes: int
    rollout_workers: int

    @property
    def is_rollout_worker(self) -> bool:
        return self.rank >= self.processes - self.rollout_workers

    @property
    def worker_index(self) -> int:  # 0 .. rollout_workers - 1 on a rollout process
        return self.rank - (self.processes - self.rollout_workers)


def placement(rollout_workers: int) -> Placement:
    """The launch's layout from paddle.distributed.launch's environment; refuses anything but one training process
    plus the rollout processes (several training processes would need paddle sub-groups, which fail over gloo)."""
    processes = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    if rollout_workers and processes != rollout_workers + 1:
        raise ConfigError(
            f"rollout_workers = {rollout_workers} needs {rollout_workers + 1} processes (one training process and the "
            f"rollout processes: python -m paddle.distributed.launch --nproc_per_node {rollout_workers + 1} run_grpo.py ...), "
            f"not {processes}; several training processes beside rollout processes would need paddle sub-groups, which "
            f"fail to connect over gloo"
        )
    return Placement(int(os.environ.get("PADDLE_TRAINER_ID", "0")), processes, rollout_workers)


@dataclass(frozen=True)
class RunPlan:
    """What the trainer decided at its start (the checkpoint, the model folders, the steps), for the rollout
    processes to load the same."""

    tokenizer_folder: str
    weights_folder: str  # the checkpoint resumed from, or the actor's folder (a LoRA run: always the base)
    adapter_folder: Optional[str]  # a LoRA run's checkpoint resumed from, else None
    first_step: int  # the last finished step (0: a fresh start)
    total_steps: int
    pending: bool  # the checkpoint holds step first_step + 1's rollout (async_generate)
    trained_parameters: list  # names, in broadcast order: both sides must hold the same ones


@dataclass
class RolloutPart:
    """One rollout process's share of a step's completions."""

    step: int
    rollout: Rollout
    weights_step: int  # the optimizer step whose weights generated it (0: the starting weights)
    seconds: float  # generation time
    sync_seconds: float  # before it: the engine's refresh and check once the weights it came from arrived
    sync_gap: Optional[float] = None  # that check's largest |log-prob difference| from the actor (None: no check, or the eager engine)


def rollout_order(first_step: int, total_steps: int, async_generate: bool, pending: bool) -> list:
    """What a rollout process does, in order -> [(step to generate, the step whose word comes first, or None)].
    Synchronous: step s's rollout comes from the weights of step s - 1, so each waits for the word after that step.
    One step off: the first two rollouts (one, when the checkpoint holds the first) come from the starting weights,
    then step s's waits for the word after step s - 2, sent once step s - 1's rollout has arrived."""
    lag = int(async_generate)
    starting = [first_step + 1 + i for i in range(lag + 1)]
    if async_generate and pending:
        starting = starting[1:]
    starting = [step for step in starting if step <= total_steps]
    later = range(first_step + lag + 2, total_steps + 1)
    return [(step, None) for step in starting] + [(step, step - 1 - lag) for step in later]


def words_after(step: int, total_steps: int, async_generate: bool) -> bool:
    """Whether the trainer sends a word (and weights) after `step`: a rollout process is waiting for it exactly then."""
    return step + 1 + int(async_generate) <= total_steps


def buckets(parameters: list) -> list:
    """[(name, parameter)] -> lists of consecutive parameters of one dtype, about BUCKET_BYTES each: what one
    broadcast carries, flattened and concatenated (both sides cut them alike)."""
    groups, size = [], 0
    for _, parameter in parameters:
        nbytes = parameter.size * parameter.element_size()
        if not groups or size + nbytes > BUCKET_BYTES or parameter.dtype != groups[-1][0].dtype:
            groups.append([])
            size = 0
        groups[-1].append(parameter)
        size += nbytes
    return groups


def trained_parameters(model) -> list:
    """(name, parameter) of the parameters the optimizer changes: all of them, or the LoRA adapters."""
    return [(name, p) for name, p in model.named_parameters() if not p.stop_gradient]


@dataclass(frozen=True)
class Failure:
    """What a rollout process sends before it stops for an error."""

    text: str


def _quick(connection: Connection) -> Connection:
    """TCP_NODELAY on a connection's socket: small messages go out at once, not after the peer's delayed ACK
    (40 ms here, and paddle's store, which does not set it, takes 44-88 ms a call)."""
    with socket.fromfd(connection.fileno(), socket.AF_INET, socket.SOCK_STREAM) as duplicate:
        duplicate.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


class TrainerLink:
    """The training process's end: receives every step's rollout, sends its word and its weights after a step."""

    def __init__(self, rollout_workers: int, async_generate: bool):
        self.workers, self.async_generate = rollout_workers, async_generate
        self.connections: list = []  # one per rollout process, made in publish()
        self.pending: Optional[tuple] = None  # (step, [RolloutPart], seconds waited) received ahead of its step
        self.total_steps = 0
        self.broadcast_seconds = 0.0  # the last weights broadcast

    def publish(self, plan: RunPlan) -> None:
        """Connect to every rollout process (each listens once it starts, its address in the launcher's store) and
        send the plan."""
        from paddle.base import core

        store = core.create_or_get_global_tcp_store()
        self.total_steps = plan.total_steps
        for rank in range(1, self.workers + 1):
            while not store.add(f"grpo/address/{rank}", 0):  # add 0: read a counter without waiting
                time.sleep(0.05)
            host, port, key = json.loads(bytes(store.get(f"grpo/listener/{rank}")))
            self.connections.append(_quick(Client((host, port), authkey=bytes.fromhex(key))))
        for connection in self.connections:
            connection.send(plan)

    def take(self, step: int) -> tuple:
        """Step `step`'s rollout: the one received ahead (async_generate), or waited for now -> ([RolloutPart],
        seconds this process waited for it, seconds the last weights broadcast took)."""
        if self.pending is None or self.pending[0] != step:
            self.pending = self._receive(step)
        (_, parts, waited), self.pending = self.pending, None
        return parts, waited, self.broadcast_seconds

    def collect_ahead(self, step: int) -> None:
        """One step off: after step `step` trained, receive the next step's rollout (generated meanwhile), so that a
        checkpoint of this step holds it and the weights sent next meet a rollout process that is waiting."""
        if self.async_generate and step + 1 <= self.total_steps:
            self.pending = self._receive(step + 1)

    def pending_bytes(self) -> Optional[bytes]:
        return None if self.pending is None else pickle.dumps(self.pending[:2])

    def restore_pending(self, data: bytes, step: int) -> None:
        """A checkpoint's in-flight rollout (written by this run's lineage: pickle is trusted as paddle's optimizer
        file is), which must be the step after it."""
        due, parts = pickle.loads(data)
        if due != step:
            raise RolloutWorkerError(f"the checkpoint's {PENDING_FILE} holds step {due}'s rollout, not step {step}'s")
        self.pending = (due, parts, 0.0)

    def send_word(self, step: int, parameters: list, stop: bool) -> None:
        """After `step`: go with the new weights, or stop. Nothing when no rollout process waits for a word after
        this step (the last ones)."""
        if not words_after(step, self.total_steps, self.async_generate):
            return
        started = time.perf_counter()
        try:
            for connection in self.connections:
                connection.send(("word", step, stop))
            if not stop:
                for bucket in buckets(parameters):
                    dist.broadcast(paddle.concat([p.reshape([-1]) for p in bucket]), src=0)
        except Exception as error:
            raise self._failure() or RolloutWorkerError(f"sending the weights of step {step} to the rollout processes failed ({_last_line(error)})") from None
        self.broadcast_seconds = time.perf_counter() - started

    def wait_finished(self) -> None:
        """The end of the run: every rollout process says it is done before this process (and the launcher's store
        it serves) goes away."""
        for worker in range(self.workers):
            message = self._next(worker)
            if message != ("finished",):
                raise RolloutWorkerError(f"rollout process {worker + 1} sent {type(message).__name__} where its last word was due")

    def release(self) -> None:
        """After a rollout process's failure was handled (the last step saved): it may exit."""
        for connection in self.connections:
            try:
                connection.send(("released",))
            except OSError:
                pass  # that one is gone already

    def _receive(self, step: int) -> tuple:
        """-> (step, [RolloutPart] in rollout-process order, seconds waited)."""
        started = time.perf_counter()
        parts = []
        for worker in range(self.workers):
            part = self._next(worker)
            if not isinstance(part, RolloutPart) or part.step != step:
                raise RolloutWorkerError(f"rollout process {worker + 1} sent {getattr(part, 'step', part)!r} where step {step}'s rollout was due")
            parts.append(part)
        return step, parts, time.perf_counter() - started

    def _next(self, worker: int):
        """The next message of rollout process `worker` (0-based), waiting for it; its failure or death raised."""
        rank = worker + 1
        try:
            message = self.connections[worker].recv()
        except (EOFError, OSError):  # the kernel closes a dead process's sockets, whatever killed it
            raise RolloutWorkerError(
                f"rollout process {rank} died without a word (killed, or out of memory): its log <log_dir>/workerlog.{rank} "
                f"and the system log may say why"
            ) from None
        if isinstance(message, Failure):
            raise RolloutWorkerError(f"rollout process {rank} failed: {message.text} (its log: <log_dir>/workerlog.{rank})")
        return message

    def _failure(self) -> Optional[RolloutWorkerError]:
        """After a failed broadcast: the rollout process that reported an error or died, if one did."""
        for worker, connection in enumerate(self.connections):
            try:
                ready = connection.poll(1.0)
            except OSError:
                ready = True
            if ready:
                try:
                    self._next(worker)
                except RolloutWorkerError as failure:
                    return failure
        return None


class WorkerLink:
    """A rollout process's end: listens for the trainer, reads the plan, sends its rollouts, waits for the trainer's
    words and weights."""

    def __init__(self, place: Placement):
        from paddle.base import core

        self.place = place
        key = secrets.token_bytes(16)
        self.listener = Listener(("0.0.0.0", 0), authkey=key)
        host = os.environ.get("PADDLE_CURRENT_ENDPOINT", "127.0.0.1:0").rsplit(":", 1)[0]  # this process's address in the launch
        store = core.create_or_get_global_tcp_store()
        store.set(f"grpo/listener/{place.rank}", json.dumps([host, self.listener.address[1], key.hex()]).encode())
        store.add(f"grpo/address/{place.rank}", 1)
        self.connection: Optional[Connection] = None

    def plan(self) -> RunPlan:
        self.connection = _quick(self.listener.accept())
        self.listener.close()
        return self._next()

    def send(self, part: RolloutPart) -> None:
        try:
            self.connection.send(part)
        except OSError as error:
            raise TrainerGone(f"the training process stopped ({_last_line(error)}): its log <log_dir>/workerlog.0 says why") from None

    def receive_word(self, step: int, parameters: list) -> bool:
        """The trainer's word after `step` -> True (the weights, broadcast, are now in `parameters`) or False: stop."""
        word = self._next()
        if word[:2] != ("word", step):
            raise RuntimeError(f"the trainer sent {word!r} where its word after step {step} was due")
        if word[2]:
            return False
        try:
            for bucket in buckets(parameters):
                flat = paddle.empty([sum(p.size for p in bucket)], dtype=bucket[0].dtype)
                dist.broadcast(flat, src=0)
                for parameter, values in zip(bucket, paddle.split(flat, [p.size for p in bucket])):
                    parameter.set_value(values.reshape(parameter.shape))
        except Exception as error:
            raise TrainerGone(f"receiving the weights of step {step} failed ({_last_line(error)})") from None
        return True

    def report(self, error: BaseException) -> None:
        """Tell the trainer why this process stops, then wait (at most RELEASE_SECONDS) until it has saved its last
        finished step: the launcher stops every process a few seconds after one exits."""
        if self.connection is None:
            return  # the trainer never connected: it learns of this from the launcher
        try:
            self.connection.send(Failure(f"{type(error).__name__}: {_last_line(error)}"))
            if self.connection.poll(RELEASE_SECONDS):
                self.connection.recv()
        except (EOFError, OSError):
            pass  # the trainer is gone

    def finished(self) -> None:
        self.connection.send(("finished",))

    def _next(self):
        try:
            return self.connection.recv()
        except (EOFError, OSError):
            raise TrainerGone("the training process stopped: its log <log_dir>/workerlog.0 says why") from None


def worker_share(prompt_count: int, workers: int, worker: int) -> tuple:
    """The contiguous prompts [first, end) of a step's prompt_count that rollout process `worker` generates."""
    bounds = np.linspace(0, prompt_count, workers + 1).round().astype(int)
    return int(bounds[worker]), int(bounds[worker + 1])


def _last_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[-1] if text else type(error).__name__
