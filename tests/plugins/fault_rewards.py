"""Reward plugins for tests/e2e/test_faults.py: a slow reward for the reward server, and rewards that end or
stall rank 1 of a multi-process run in the middle of training, as an out-of-memory kill, a crash or a
hang would.

A rank scores in its scoring worker processes (alignment/rewards/pool.py), whose parent is the rank: the
rank_1_* functions act on it, since a worker's own death or hang is only an item error."""

import os
import signal
import sys
import time
from pathlib import Path

from alignment.rewards import register_reward

SLOW_ITEM_S = 1.0  # a request of 8 items takes 8 s, well over the trainer's reward_server_timeout in the test


@register_reward("slow_one", "sleeps SLOW_ITEM_S seconds per item, then 1.0")
def slow_one(completion, sample):
    time.sleep(SLOW_ITEM_S)
    return 1.0


def _on_rank_1_in_step_2() -> bool:
    """True on rank 1 from its first item of step 2 on (per_device_prompt_batch_size 2 x rollout_n 4 = 8
    items a step), so step 1 completes on both ranks before one of them dies. The rank's items are counted
    in a file of the run's output_dir, one byte each, since they may be spread over several workers."""
    if os.environ.get("PADDLE_TRAINER_ID") != "1":
        return False
    arguments = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\0")
    output_dir = Path(arguments[arguments.index("--output_dir") + 1])
    output_dir.mkdir(parents=True, exist_ok=True)  # rank 1 may score step 1 before rank 0 has made the folder
    with open(output_dir / "fault_rewards_rank_1_calls", "ab") as calls:
        calls.write(b".")
        return calls.tell() > 8


@register_reward("rank_1_killed", "rank 1 is killed by SIGKILL in step 2 (as the kernel's OOM killer does)")
def rank_1_killed(completion, sample):
    if _on_rank_1_in_step_2():
        os.kill(os.getppid(), signal.SIGKILL)
    return 1.0


@register_reward("rank_1_exits", "rank 1 aborts with an error message in step 2")
def rank_1_exits(completion, sample):
    if _on_rank_1_in_step_2():
        print("rank 1: simulated fatal error in step 2", file=sys.stderr, flush=True)  # the rank's log
        os.kill(os.getppid(), signal.SIGABRT)  # as a fatal C++ error in paddle ends the process
    return 1.0


@register_reward("rank_1_hangs", "rank 1 hangs (is stopped) in step 2, alive but silent")
def rank_1_hangs(completion, sample):
    if _on_rank_1_in_step_2():
        os.kill(os.getppid(), signal.SIGSTOP)
    return 1.0
