"""The training process's end of the rollout link (alignment/rollout/link.py): it listens for the rollout processes,
receives every step's rollout, and sends its word and its weights after a step; and a checkpoint's rollout in flight,
read back."""

import json
import os
import secrets
import socket
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import paddle
import paddle.distributed as dist

from alignment.basics.errors import CheckpointError, RolloutWorkerError, WireError
from alignment.rollout.link import RunPlan, buckets, last_line, words_after
from alignment.rollout.link_handshake import LINK_FILE, accept_workers, address_bound_key, one_machine, shared_key, write_private
from alignment.rollout.wire import load_parts, parts_from_record, pending_bytes, receive_message, send_message

PENDING_FILE = "pending_rollout.safetensors"  # in a checkpoint of a one-step-off run: the next step's rollout, received


class TrainerLink:
    """The training process's end: listens for the rollout processes, receives every step's rollout, sends its word
    and its weights after a step."""

    def __init__(self, rollout_workers: int, async_generate: bool, output_dir: str):
        from paddle.base import core

        self.workers, self.async_generate = rollout_workers, async_generate
        self.connections: list = []  # one per rollout process, in rank order, made in publish()
        self.pending: Optional[tuple] = None  # (step, [RolloutPart], seconds waited) received ahead of its step
        self.total_steps = 0
        self.broadcast_seconds = 0.0  # the last weights broadcast
        key = shared_key()
        host = "127.0.0.1" if one_machine() else os.environ["PADDLE_CURRENT_ENDPOINT"].rsplit(":", 1)[0]
        self.server = socket.create_server((host, 0))
        port = self.server.getsockname()[1]
        store = core.create_or_get_global_tcp_store()
        if key is None:  # one machine: a key of this run's, in a file only this user reads
            key = secrets.token_bytes(32)
            self.link_file = Path(output_dir) / LINK_FILE
            write_private(self.link_file, {"address": [host, port], "key": key.hex()})
        else:
            self.link_file = None
            store.set("grpo/link_address", json.dumps([host, port]).encode())
        self.authkey = address_bound_key(key, host, port)
        store.add("grpo/link_ready", 1)  # the rollout processes wait for this before they read the address

    def publish(self, plan: RunPlan) -> None:
        """Accept every rollout process, then send each the plan."""
        self.total_steps = plan.total_steps
        self.connections = accept_workers(self.server, self.authkey, self.workers)
        if self.link_file is not None:
            self.link_file.unlink(missing_ok=True)  # read by every rollout process by now
        for connection in self.connections:
            send_message(connection, "plan", asdict(plan))

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
        return None if self.pending is None else pending_bytes(*self.pending[:2])

    def restore_pending(self, checkpoint: Path, step: int, trust_pickle: bool, rows: int, group_size: int, vocab_size: int) -> None:
        """A checkpoint's in-flight rollout, if it holds one (read_pending)."""
        if (pending := read_pending(checkpoint, step, trust_pickle, rows, group_size, vocab_size)) is not None:
            self.pending = (*pending, 0.0)

    def send_word(self, step: int, parameters: list, stop: bool) -> None:
        """After `step`: go with the new weights, or stop. Nothing when no rollout process waits for a word after
        this step (the last ones)."""
        if not words_after(step, self.total_steps, self.async_generate):
            return
        started = time.perf_counter()
        try:
            for connection in self.connections:
                send_message(connection, "word", {"step": step, "stop": stop})
            if not stop:
                for bucket in buckets(parameters):
                    dist.broadcast(paddle.concat([p.reshape([-1]) for p in bucket]), src=0)
        except Exception as error:
            raise self._failure() or RolloutWorkerError(
                f"sending the weights of step {step} to the rollout processes failed ({last_line(error)})"
            ) from None
        self.broadcast_seconds = time.perf_counter() - started

    def wait_finished(self) -> None:
        """The end of the run: every rollout process says it is done before this process (and the launcher's store
        it serves) goes away."""
        for worker in range(self.workers):
            kind, _, _ = self._next(worker)
            if kind != "finished":
                raise RolloutWorkerError(f"rollout process {worker + 1} sent a {kind!r} message where its last word was due")

    def release(self) -> None:
        """After a rollout process's failure was handled (the last step saved): it may exit."""
        for connection in self.connections:
            try:
                send_message(connection, "released", {})
            except OSError:
                pass  # that one is gone already

    def _receive(self, step: int) -> tuple:
        """-> (step, [RolloutPart] in rollout-process order, seconds waited)."""
        started = time.perf_counter()
        parts = []
        for worker in range(self.workers):
            kind, fields, arrays = self._next(worker)
            try:
                if kind != "rollout":
                    raise WireError(f"a {kind!r} message")
                sent, (part,) = parts_from_record(fields, arrays)
            except (WireError, ValueError) as error:
                raise RolloutWorkerError(f"rollout process {worker + 1} sent something else than step {step}'s rollout: {error}") from None
            if sent != step or part.step != step:
                raise RolloutWorkerError(f"rollout process {worker + 1} sent step {sent}'s rollout where step {step}'s was due")
            parts.append(part)
        return step, parts, time.perf_counter() - started

    def _next(self, worker: int) -> tuple:
        """The next message (kind, fields, arrays) of rollout process `worker` (0-based), waiting for it; its failure
        or death raised."""
        rank = worker + 1
        try:
            kind, fields, arrays = receive_message(self.connections[worker])
        except (EOFError, OSError):  # the kernel closes a dead process's sockets, whatever killed it
            raise RolloutWorkerError(
                f"rollout process {rank} died without a word (killed, or out of memory): its log <log_dir>/workerlog.{rank} "
                f"and the system log may say why"
            ) from None
        except WireError as error:
            raise RolloutWorkerError(f"rollout process {rank} sent something that is not a message: {error}") from None
        if kind == "failure":
            raise RolloutWorkerError(f"rollout process {rank} failed: {fields.get('text')} (its log: <log_dir>/workerlog.{rank})")
        return kind, fields, arrays

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


def read_pending(checkpoint: Path, step: int, trust_pickle: bool, rows: int, group_size: int, vocab_size: int) -> Optional[tuple]:
    """A checkpoint's rollout in flight -> (step, [RolloutPart]), or None where it holds none. It must be the step
    after the checkpoint's and of the run's shape: `rows` completions in groups of `group_size`, token ids below
    vocab_size (CheckpointError naming the file otherwise). An earlier version's pickle only when trust_pickle
    (start_point refused it otherwise)."""
    file = checkpoint / PENDING_FILE
    if file.is_file():
        try:
            due, parts = load_parts(file, vocab_size)
        except WireError as error:
            raise CheckpointError(f"the checkpoint's rollout in flight cannot be read: {error}") from None
    elif trust_pickle and (checkpoint / "pending_rollout.pkl").is_file():
        import pickle

        file = checkpoint / "pending_rollout.pkl"
        due, parts = pickle.loads(file.read_bytes())
    else:
        return None
    if due != step:
        raise CheckpointError(f"{file} holds step {due}'s rollout, not step {step}'s")
    held, groups = sum(len(part.rollout.prompt_ids) for part in parts), {part.rollout.group_size for part in parts}
    if held != rows or groups != {group_size}:
        raise CheckpointError(
            f"{file} holds {held} completions in groups of {', '.join(map(str, sorted(groups)))}, not this run's {rows} in "
            f"groups of {group_size} (rollout_n)"
        )
    return due, parts

