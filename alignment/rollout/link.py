"""Rollout processes beside the training process (rollout_workers): who is who, what passes between them, and
in which order.

Under `paddle.distributed.launch --nproc_per_node 1+N`, rank 0 trains and ranks 1..N only generate, each with
its own copy of the weights in its rollout engine. Two channels:

- a connection from each rollout process to the trainer (multiprocessing.connection over TCP) carries the small
  things: the run's plan, every rollout (JSON and raw arrays, alignment/rollout/wire.py: nothing on it is ever
  unpickled), the trainer's word after a step (go or stop), a failure's message. A process that waits, waits on
  its connection, never inside a collective (gloo ends one that waits more than 30 s, and a real model's step
  takes longer), and learns at once when the other side dies: the kernel closes a dead process's sockets;
- the collective (gloo on CPU, NCCL on GPU) carries the weights: after a go word, broadcasts of every trained
  parameter from rank 0, which the rollout processes enter as soon as the word arrives.

Who may connect: both ends of a connection prove that they hold the run's link key (multiprocessing's HMAC
handshake, both ways), keyed also by the trainer's address, so that a process relaying between the two cannot pass
it. On one machine the trainer makes a new key for each run and leaves it, with its address, in a file only its user
can read (<output_dir>/.rollout_link.json, mode 0600), which the rollout processes check is theirs before they use
it; the launcher's store, which any process that reaches it can read and write, holds only a counter that says the
file is ready. Across machines the key is the user's, in a file only they can read (GRPO_ROLLOUT_LINK_KEY_FILE names
it, the same key on every machine; refused without one, and the key itself in GRPO_ROLLOUT_LINK_KEY is refused: the
launcher writes the environment to its log folder) and the trainer's address comes from the store, where a forged
one fails the handshake.

The order of rollouts and words (rollout_order, words_after) is what keeps the two sides in step. A batch's
staleness is the number of optimizer steps between the weights that generated it and those it trains: 0 when
synchronous (the trainer waits for step s's rollout from the weights of step s - 1), 1 one step off
(async_generate: step s + 1's rollout is generated while step s trains).
"""

import hashlib
import hmac
import json
import os
import queue
import secrets
import socket
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from multiprocessing.connection import AuthenticationError, Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Optional

import numpy as np
import paddle
import paddle.distributed as dist

from alignment.errors import CheckpointError, ConfigError, RolloutWorkerError, TrainerGone, WireError
from alignment.key_files import read_key_file
from alignment.rollout.wire import RolloutPart, load_parts, parts_from_record, parts_record, pending_bytes, receive_message, send_message

PENDING_FILE = "pending_rollout.safetensors"  # in a checkpoint of a one-step-off run: the next step's rollout, received
BUCKET_BYTES = 64 << 20  # weights go in flat buffers of about this size: few collective calls, bounded extra memory
RELEASE_SECONDS = 600  # how long a failed rollout process waits for the trainer to save before it exits anyway
HANDSHAKE_SECONDS = 10  # a connection that has not proved its key by then is closed (each is served in a thread of its own)
KEY_FILE_VARIABLE = "GRPO_ROLLOUT_LINK_KEY_FILE"  # across machines: a file only its user can read holding the link key
PLAIN_KEY_VARIABLE = "GRPO_ROLLOUT_LINK_KEY"  # refused: the launcher writes every environment variable to its log folder
LINK_FILE = ".rollout_link.json"  # in output_dir, on one machine: the trainer's address and the run's key, mode 0600


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


def one_machine() -> bool:
    """Whether every process of the launch runs on this machine (paddle.distributed.launch's endpoints)."""
    endpoints = os.environ.get("PADDLE_TRAINER_ENDPOINTS", "127.0.0.1:0").split(",")
    return len({endpoint.rsplit(":", 1)[0] for endpoint in endpoints}) == 1


def shared_key() -> Optional[bytes]:
    """The key in the file GRPO_ROLLOUT_LINK_KEY_FILE names (this user's, mode 0600), or None; a launch over several
    machines without it is refused, and so is the key in GRPO_ROLLOUT_LINK_KEY itself: paddle.distributed.launch writes
    every environment variable to log/envlog.N and backup_env.N.json, which any user may read."""
    if PLAIN_KEY_VARIABLE in os.environ:
        raise ConfigError(
            f"{PLAIN_KEY_VARIABLE} is set: paddle.distributed.launch writes the environment, key included, to its log folder "
            f"(envlog.N, backup_env.N.json); unset it, make a new key, put it in a file only you can read (chmod 600) on every "
            f"machine and set {KEY_FILE_VARIABLE} to the file's path"
        )
    path = os.environ.get(KEY_FILE_VARIABLE)
    if path is None and not one_machine():
        raise ConfigError(
            f"rollout_workers on several machines: set {KEY_FILE_VARIABLE} to a file only you can read (chmod 600) that holds "
            "the same secret on every machine (at least 16 characters, e.g. python -c 'import secrets; "
            "print(secrets.token_hex(32))' > FILE); the rollout link refuses processes that do not hold it"
        )
    key = None if path is None else read_key_file(path, KEY_FILE_VARIABLE)
    if key is not None and len(key) < 16:
        raise ConfigError(f"{KEY_FILE_VARIABLE} = {path}: the key is {len(key)} characters long: use at least 16")
    return None if key is None else key.encode()


def _authkey(key: bytes, host: str, port: int) -> bytes:
    """The handshake's key: the run's key bound to the trainer's address, so that a connection relayed through
    another address cannot prove itself."""
    return hmac.new(key, f"grpo rollout link {host}:{port}".encode(), hashlib.sha256).digest()


def _shut(connection: Connection) -> None:
    with socket.fromfd(connection.fileno(), socket.AF_INET, socket.SOCK_STREAM) as duplicate:
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _handshake(connection: Connection, authkey: bytes, trainer: bool) -> None:
    """Both ends prove the key (multiprocessing's HMAC challenge, each way). The trainer gives a peer
    HANDSHAKE_SECONDS, then cuts it off (its reads end), so that one that stalls cannot hold it; a rollout process
    waits as long as the trainer takes to load its model. Raises AuthenticationError, EOFError, OSError."""
    timer = threading.Timer(HANDSHAKE_SECONDS, _shut, [connection])
    if trainer:
        timer.start()
    try:
        if trainer:
            deliver_challenge(connection, authkey)
            answer_challenge(connection, authkey)
        else:
            answer_challenge(connection, authkey)
            deliver_challenge(connection, authkey)
    finally:
        timer.cancel()
    with socket.fromfd(connection.fileno(), socket.AF_INET, socket.SOCK_STREAM) as duplicate:
        # small messages go out at once, not after the peer's delayed ACK (40 ms here)
        duplicate.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _accept_workers(server: socket.socket, authkey: bytes, workers: int) -> list:
    """One connection per rollout process, in rank order: each proves the key and says its rank; anything else is
    turned away and the trainer goes on waiting. Every connection is served in a thread of its own with
    HANDSHAKE_SECONDS to do so, so that peers which stay silent or fail hold up no other (served one at a time, two
    silent connections held a run's start for two minutes). Closes `server` once every rank is in."""
    arrived: queue.Queue = queue.Queue()  # (peer, connection, rank) of a connection that proved the key

    def serve(sock: socket.socket, peer: tuple) -> None:
        connection = Connection(sock.detach())
        try:
            _handshake(connection, authkey, trainer=True)
            kind, fields, _ = receive_message(connection)
            rank = fields.get("rank")
            if kind != "hello" or type(rank) is not int or not 1 <= rank <= workers:
                raise WireError(f"a hello with rank {rank!r} from a run of {workers} rollout process(es)")
            arrived.put((peer, connection, rank))
        except (AuthenticationError, EOFError, OSError, WireError) as error:
            _turn_away(connection, peer, error)

    slots: dict = {}
    server.settimeout(0.05)  # between accepts, the connections that finished their handshake are taken in
    while len(slots) < workers:
        try:
            sock, peer = server.accept()
            threading.Thread(target=serve, args=(sock, peer), daemon=True, name=f"rollout link {peer[0]}:{peer[1]}").start()
        except TimeoutError:
            pass
        except OSError as error:  # out of file descriptors, say: the connections in flight end by their deadline
            warnings.warn(f"rollout link: could not accept a connection ({error})")
            time.sleep(0.05)
        while not arrived.empty():
            peer, connection, rank = arrived.get()
            if rank in slots:
                _turn_away(connection, peer, WireError(f"a second hello with rank {rank}"))
            else:
                slots[rank] = connection
    server.close()
    return [slots[rank] for rank in sorted(slots)]


def _turn_away(connection: Connection, peer: tuple, error: BaseException) -> None:
    warnings.warn(f"rollout link: turned away a connection from {peer[0]}:{peer[1]} ({type(error).__name__}: {_last_line(error)})")
    connection.close()


def _join(host: str, port: int, key: bytes, rank: int) -> Connection:
    """A rollout process's connection to the trainer at host:port: both ends prove the key, then it says its rank."""
    connection = Connection(socket.create_connection((host, port)).detach())
    try:
        _handshake(connection, _authkey(key, host, port), trainer=False)
    except (AuthenticationError, EOFError, OSError) as error:
        raise TrainerGone(
            f"the rollout link to {host}:{port} did not prove the run's key ({type(error).__name__}): not this run's trainer"
        ) from None
    send_message(connection, "hello", {"rank": rank})
    return connection


def _write_private(path: Path, record: dict) -> None:
    """A file only this user can read, written whole (made afresh, so no earlier file's mode carries over)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    staging.unlink(missing_ok=True)
    descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as f:
        json.dump(record, f)
    os.replace(staging, path)


def _read_private(path: Path) -> dict:
    """The trainer's link file, refused unless this user wrote it and nobody else can read it."""
    status = path.stat()
    if status.st_uid != os.getuid() or status.st_mode & 0o077:
        raise RolloutWorkerError(
            f"{path} is not private to this user (owner {status.st_uid}, mode {status.st_mode & 0o777:o}): "
            "the rollout link's key must be readable by this user only"
        )
    return json.loads(path.read_text())


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
            _write_private(self.link_file, {"address": [host, port], "key": key.hex()})
        else:
            self.link_file = None
            store.set("grpo/link_address", json.dumps([host, port]).encode())
        self.authkey = _authkey(key, host, port)
        store.add("grpo/link_ready", 1)  # the rollout processes wait for this before they read the address

    def publish(self, plan: RunPlan) -> None:
        """Accept every rollout process, then send each the plan."""
        self.total_steps = plan.total_steps
        self.connections = _accept_workers(self.server, self.authkey, self.workers)
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
                f"sending the weights of step {step} to the rollout processes failed ({_last_line(error)})"
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


class WorkerLink:
    """A rollout process's end: connects to the trainer, reads the plan, sends its rollouts, waits for the trainer's
    words and weights."""

    def __init__(self, place: Placement, output_dir: str):
        from paddle.base import core

        self.place = place
        key = shared_key()
        store = core.create_or_get_global_tcp_store()
        while not store.add("grpo/link_ready", 0):  # add 0: read the counter without waiting
            time.sleep(0.05)
        if key is None:
            record = _read_private(Path(output_dir) / LINK_FILE)
            (host, port), key = record["address"], bytes.fromhex(record["key"])
        else:
            host, port = json.loads(bytes(store.get("grpo/link_address")))
        self.connection = _join(host, port, key, place.rank)

    def plan(self) -> RunPlan:
        kind, fields, _ = self._next()
        if kind != "plan":
            raise RuntimeError(f"the trainer sent a {kind!r} message where the plan was due")
        return RunPlan(**fields)

    def send(self, part: RolloutPart) -> None:
        try:
            send_message(self.connection, "rollout", *parts_record(part.step, [part]))
        except OSError as error:
            raise TrainerGone(f"the training process stopped ({_last_line(error)}): its log <log_dir>/workerlog.0 says why") from None

    def receive_word(self, step: int, parameters: list) -> bool:
        """The trainer's word after `step` -> True (the weights, broadcast, are now in `parameters`) or False: stop."""
        kind, word, _ = self._next()
        if kind != "word" or word.get("step") != step:
            raise RuntimeError(f"the trainer sent {kind!r} {word!r} where its word after step {step} was due")
        if word["stop"]:
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
        try:
            send_message(self.connection, "failure", {"text": f"{type(error).__name__}: {_last_line(error)}"})
            if self.connection.poll(RELEASE_SECONDS):
                self.connection.recv_bytes(1 << 16)
        except (EOFError, OSError):
            pass  # the trainer is gone

    def finished(self) -> None:
        send_message(self.connection, "finished", {})

    def _next(self) -> tuple:
        try:
            return receive_message(self.connection)
        except (EOFError, OSError):
            raise TrainerGone("the training process stopped: its log <log_dir>/workerlog.0 says why") from None


def worker_share(prompt_count: int, workers: int, worker: int) -> tuple:
    """The contiguous prompts [first, end) of a step's prompt_count that rollout process `worker` generates."""
    bounds = np.linspace(0, prompt_count, workers + 1).round().astype(int)
    return int(bounds[worker]), int(bounds[worker + 1])


def _last_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[-1] if text else type(error).__name__
