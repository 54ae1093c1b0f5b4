"""Reward plugins for tests/test_faults.py: a slow reward for the reward server, and rewards that end or
stall rank 1 of a multi-process run in the middle of training, as an out-of-memory kill, a crash or a
hang would."""

import os
import signal
import sys
import time

from alignment.rewards import register_reward

SLOW_ITEM_S = 1.0  # a request of 8 items takes 8 s, well over the trainer's reward_server_timeout in the test
calls = 0  # per process: this rank's scoring calls so far (one per item)


@register_reward("slow_one", "sleeps SLOW_ITEM_S seconds per item, then 1.0")
def slow_one(completion, sample):
    time.sleep(SLOW_ITEM_S)
    return 1.0


def _on_rank_1_in_step_2() -> bool:
    """True on rank 1 from its first item of step 2 on (per_device_prompt_batch_size 2 x rollout_n 4 = 8
    items a step), so step 1 completes on both ranks before one of them dies."""
    global calls
    calls += 1
    return os.environ.get("PADDLE_TRAINER_ID") == "1" and calls > 8


@register_reward("rank_1_killed", "rank 1 is killed by SIGKILL in step 2 (as the kernel's OOM killer does)")
def rank_1_killed(completion, sample):
    if _on_rank_1_in_step_2():
        os.kill(os.getpid(), signal.SIGKILL)
    return 1.0


@register_reward("rank_1_exits", "rank 1 exits with an error message in step 2")
def rank_1_exits(completion, sample):
    if _on_rank_1_in_step_2():
        sys.exit("rank 1: simulated fatal error in step 2")  # SystemExit: not an item error, it ends the process
    return 1.0


@register_reward("rank_1_hangs", "rank 1 hangs (sleeps for an hour) in step 2, alive but silent")
def rank_1_hangs(completion, sample):
    if _on_rank_1_in_step_2():
        time.sleep(3600)
    return 1.0
