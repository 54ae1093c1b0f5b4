"""A rollout process's end of the rollout link (alignment/rollout/link.py): it connects to the trainer, reads the
plan, sends its rollouts, and waits for the trainer's words and weights."""

import json
import time
from pathlib import Path

import paddle
import paddle.distributed as dist

from alignment.basics.errors import TrainerGone
from alignment.rollout.link import Placement, RunPlan, buckets, last_line
from alignment.rollout.link_handshake import LINK_FILE, join_trainer, read_private, shared_key
from alignment.rollout.wire import RolloutPart, parts_record, receive_message, send_message

RELEASE_SECONDS = 600  # how long a failed rollout process waits for the trainer to save before it exits anyway


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
            record = read_private(Path(output_dir) / LINK_FILE)
            (host, port), key = record["address"], bytes.fromhex(record["key"])
        else:
            host, port = json.loads(bytes(store.get("grpo/link_address")))
        self.connection = join_trainer(host, port, key, place.rank)

    def plan(self) -> RunPlan:
        kind, fields, _ = self._next()
        if kind != "plan":
            raise RuntimeError(f"the trainer sent a {kind!r} message where the plan was due")
        return RunPlan(**fields)

    def send(self, part: RolloutPart) -> None:
        try:
            send_message(self.connection, "rollout", *parts_record(part.step, [part]))
        except OSError as error:
            raise TrainerGone(f"the training process stopped ({last_line(error)}): its log <log_dir>/workerlog.0 says why") from None

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
            raise TrainerGone(f"receiving the weights of step {step} failed ({last_line(error)})") from None
        return True

    def report(self, error: BaseException) -> None:
        """Tell the trainer why this process stops, then wait (at most RELEASE_SECONDS) until it has saved its last
        finished step: the launcher stops every process a few seconds after one exits."""
        try:
            send_message(self.connection, "failure", {"text": f"{type(error).__name__}: {last_line(error)}"})
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

