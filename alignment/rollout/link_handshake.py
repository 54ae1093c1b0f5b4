"""Who may connect over the rollout link (alignment/rollout/link.py): both ends of a connection prove that they hold
the run's link key (multiprocessing's HMAC handshake, both ways), keyed also by the trainer's address, so that a
process relaying between the two cannot pass it. On one machine the trainer makes a new key for each run and leaves
it, with its address, in a file only its user can read (<output_dir>/.rollout_link.json, mode 0600), which the
rollout processes check is theirs before they use it; the launcher's store, which any process that reaches it can
read and write, holds only a counter that says the file is ready. Across machines the key is the user's, in a file
only they can read (GRPO_ROLLOUT_LINK_KEY_FILE names it, the same key on every machine; refused without one, and the
key itself in GRPO_ROLLOUT_LINK_KEY is refused: the launcher writes the environment to its log folder) and the
trainer's address comes from the store, where a forged one fails the handshake.
"""

import hashlib
import hmac
import json
import os
import queue
import socket
import threading
import time
import warnings
from multiprocessing.connection import AuthenticationError, Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Optional

from alignment.basics.errors import ConfigError, RolloutWorkerError, TrainerGone, WireError
from alignment.basics.key_files import read_key_file
from alignment.rollout.link import last_line
from alignment.rollout.wire import receive_message, send_message

HANDSHAKE_SECONDS = 10  # a connection that has not proved its key by then is closed (each is served in a thread of its own)
KEY_FILE_VARIABLE = "GRPO_ROLLOUT_LINK_KEY_FILE"  # across machines: a file only its user can read holding the link key
PLAIN_KEY_VARIABLE = "GRPO_ROLLOUT_LINK_KEY"  # refused: the launcher writes every environment variable to its log folder
LINK_FILE = ".rollout_link.json"  # in output_dir, on one machine: the trainer's address and the run's key, mode 0600


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


def address_bound_key(key: bytes, host: str, port: int) -> bytes:
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


def accept_workers(server: socket.socket, authkey: bytes, workers: int) -> list:
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
    warnings.warn(f"rollout link: turned away a connection from {peer[0]}:{peer[1]} ({type(error).__name__}: {last_line(error)})")
    connection.close()


def join_trainer(host: str, port: int, key: bytes, rank: int) -> Connection:
    """A rollout process's connection to the trainer at host:port: both ends prove the key, then it says its rank."""
    connection = Connection(socket.create_connection((host, port)).detach())
    try:
        _handshake(connection, address_bound_key(key, host, port), trainer=False)
    except (AuthenticationError, EOFError, OSError) as error:
        raise TrainerGone(
            f"the rollout link to {host}:{port} did not prove the run's key ({type(error).__name__}): not this run's trainer"
        ) from None
    send_message(connection, "hello", {"rank": rank})
    return connection


def write_private(path: Path, record: dict) -> None:
    """A file only this user can read, written whole (made afresh, so no earlier file's mode carries over)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    staging.unlink(missing_ok=True)
    descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as f:
        json.dump(record, f)
    os.replace(staging, path)


def read_private(path: Path) -> dict:
    """The trainer's link file, refused unless this user wrote it and nobody else can read it."""
    status = path.stat()
    if status.st_uid != os.getuid() or status.st_mode & 0o077:
        raise RolloutWorkerError(
            f"{path} is not private to this user (owner {status.st_uid}, mode {status.st_mode & 0o777:o}): "
            "the rollout link's key must be readable by this user only"
        )
    return json.loads(path.read_text())

