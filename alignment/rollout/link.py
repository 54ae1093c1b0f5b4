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

Who may connect is alignment/rollout/link_handshake.py's; the two ends are trainer_link.py (TrainerLink) and
worker_link.py (WorkerLink).

The order of rollouts and words (rollout_order, words_after) is what keeps the two sides in step. A batch's
staleness is the number of optimizer steps between the weights that generated it and those it trains: 0 when
synchronous (the trainer waits for step s's rollout from the weights of step s - 1), 1 one step off
(async_generate: step s + 1's rollout is generated while step s trains).
"""

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from alignment.basics.errors import ConfigError

BUCKET_BYTES = 64 << 20  # weights go in flat buffers of about this size: few collective calls, bounded extra memory


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


def worker_share(prompt_count: int, workers: int, worker: int) -> tuple:
    """The contiguous prompts [first, end) of a step's prompt_count that rollout process `worker` generates."""
    bounds = np.linspace(0, prompt_count, workers + 1).round().astype(int)
    return int(bounds[worker]), int(bounds[worker + 1])


def last_line(error: BaseException) -> str:
    """An error's last line (its message may quote a remote traceback): what a one-line message names."""
    text = str(error).strip()
    return text.splitlines()[-1] if text else type(error).__name__
